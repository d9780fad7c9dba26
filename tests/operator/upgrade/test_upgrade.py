"""An upgrade never restarts a running job: the current operator adopts what an earlier version wrote.

The objects are the upgrade fixtures (`recorded/`, recorded by record.py from an earlier
operator): a running, a queued and a succeeded job with their RayJobs. They are made again in a fresh namespace
while the operator is stopped (job and RayJob through the real API server, with the current CRD and its CEL
rules; their statuses on the status subresource, the RayJob's as KubeRay's field manager), then the current
operator starts on them, as after `kubectl apply -k manifests/`.

- Adopted: no RayJob is written; each job's status converges (the running one keeps running and its progress,
  its GPU time goes on from the recorded count, and it is found stalled as its recorded progress is old; the
  queued one stays queued, the finished one keeps its phase).
- A change of `spec.lifecycle` is carried over as that field alone (the operator's field manager owns nothing
  else of the RayJob), never `suspend` of a queued RayJob (Kueue's), never a finished job's RayJob.
- A RayJob whose cluster and entrypoint an older render wrote keeps them while it runs; one `RenderChangeDeferred`
  event says the change applies to the next RayJob or run: once the RayJob is deleted, the next one is made from
  the current render, and once the job is suspended (KubeRay's `Suspended`, written here as KubeRay writes it),
  the current render is written onto the RayJob before it resumes, with a `RenderChangeApplied` event.

Lean control plane: no KubeRay controller, no Ray; nothing runs.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest
from operator_testkit import JOBS, OLDER_ENTRYPOINT, OLDER_IMAGE, Api, Operator, head_container, wait_until

from rocmtrain.api.condition_reasons import ConditionType
from rocmtrain.api.contract import OPERATOR_NAME
from rocmtrain.render.rayjob_update import APPLIED_REASON, DEFERRED_REASON, FIXED_FIELDS
from rocmtrain.status.accounting import FLUSH_SECONDS
from rocmtrain_testworld.kubecluster import KubeCluster
from upgrade.fixtures import CASES, recorded

pytestmark = pytest.mark.cluster

# The cases whose render changed since they were recorded, as a new version's render changes would make them:
# the operator announces those with a RenderChangeDeferred event (and keeps their RayJobs as they are).
RENDER_CHANGED_SINCE_RECORDING: set[str] = set()


def _make(kube: KubeCluster, api: Api, case: str, ns: str, older: bool = False) -> None:
    """The recorded job and RayJob of `case`, with their statuses, as the earlier operator and KubeRay left them
    (the RayJob as an older render wrote it, if `older`)."""
    job = recorded(case, ns)["job"]
    uid = kube.create({key: value for key, value in job.items() if key != "status"})["metadata"]["uid"]
    kube.request(
        "PATCH",
        JOBS.format(ns=ns) + f"/{case}/status",
        body={"status": job["status"]},
        content_type="application/merge-patch+json",
    )
    rayjob = recorded(case, ns, uid)["rayjob"]
    (owner,) = rayjob["metadata"]["ownerReferences"]
    owner["uid"] = uid
    if older:  # another image on the head, another entrypoint
        spec = rayjob["spec"]
        spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] = OLDER_IMAGE
        spec["entrypoint"] = OLDER_ENTRYPOINT
    kube.create({key: value for key, value in rayjob.items() if key != "status"})
    if rayjob.get("status"):
        api.fake_kuberay(ns, case, rayjob["status"])


Adopted = tuple[str, str, str, dict[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def adopted(kube: KubeCluster, api: Api, operator: Operator) -> Iterator[Adopted]:
    """(the recorded cases' namespace, two namespaces of the older render's running job, each RayJob as made), the
    operator started on them."""
    operator.stop()
    try:
        ns, older, retried = (kube.new_namespace(f"upgrade{suffix}") for suffix in ("", "-older", "-retried"))
        for case in CASES:
            _make(kube, api, case, ns)
        _make(kube, api, "running", older, older=True)
        _make(kube, api, "running", retried, older=True)
        made = {case: api.rayjob(ns, case) for case in CASES}
        made |= {"older": api.rayjob(older, "running"), "retried": api.rayjob(retried, "running")}
    finally:
        operator.start()
    yield ns, older, retried, {case: rayjob for case, rayjob in made.items() if rayjob is not None}


def _fixed(rayjob: dict[str, Any]) -> dict[str, Any]:
    return {key: rayjob["spec"].get(key) for key in FIXED_FIELDS}


def _seconds(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()


def _deferred(api: Api, ns: str, name: str) -> list[str]:
    return [message for _, reason, message in api.event_messages(ns, name) if reason == DEFERRED_REASON]


def test_the_operator_adopts_running_queued_and_finished_jobs_without_writing_their_rayjobs(
    api: Api, adopted: Adopted
) -> None:
    ns, _, _, made = adopted
    before = recorded("running", ns)["job"]["status"]
    # The recorded progress is older than the test operator's stall limit (3 s): the new operator says so.
    running = api.wait_status(
        ns,
        "running",
        "Stalled, computed by the new operator",
        lambda s: any(c["type"] == ConditionType.STALLED and c["status"] == "True" for c in s.get("conditions", [])),
        timeout=10,
    )
    assert (running["phase"], running["observedGeneration"], running["gpusHeld"]) == ("Running", 1, 16)
    assert running["progress"] == before["progress"] and running["metrics"] == before["metrics"]
    # The time the operator was away is counted once, at the rate last observed (a write is due after 300 s).
    since = _seconds(running["accountedUntil"]) - _seconds(before["accountedUntil"])
    assert running["gpuSeconds"] == before["gpuSeconds"] + 16 * since
    if time.time() - _seconds(before["accountedUntil"]) > FLUSH_SECONDS + 10:
        assert since > 0
    for case in CASES:
        status, was = api.status(ns, case), recorded(case, ns)["job"]["status"]
        assert (status["phase"], status.get("startTime")) == (was["phase"], was.get("startTime")), case
        live = api.rayjob(ns, case)
        assert live is not None
        assert live["metadata"]["resourceVersion"] == made[case]["metadata"]["resourceVersion"], case
        expected = [DEFERRED_REASON] if case in RENDER_CHANGED_SINCE_RECORDING else []
        assert [DEFERRED_REASON] * len(_deferred(api, ns, case)) == expected, (case, _deferred(api, ns, case))


@pytest.mark.parametrize("case", CASES)
def test_a_lifecycle_change_is_the_only_write_to_an_adopted_rayjob(api: Api, adopted: Adopted, case: str) -> None:
    ns, _, _, made = adopted
    api.patch_job(ns, case, {"spec": {"lifecycle": {"ttlSecondsAfterFinished": 600}}})
    status = api.wait_status(ns, case, "generation 2 observed", lambda s: s.get("observedGeneration") == 2, timeout=10)
    assert status["phase"] == recorded(case)["job"]["status"]["phase"]
    live = api.rayjob(ns, case)
    assert live is not None and _fixed(live) == _fixed(made[case])
    assert live["spec"]["suspend"] == made[case]["spec"]["suspend"]
    ours = [
        entry["fieldsV1"]
        for entry in live["metadata"]["managedFields"]
        if entry["manager"] == OPERATOR_NAME and entry.get("subresource") != "status"
    ]
    if case == "succeeded":  # a finished job's RayJob is left as it ended
        assert live["metadata"]["resourceVersion"] == made[case]["metadata"]["resourceVersion"]
        assert ours == []
    else:
        assert live["spec"]["ttlSecondsAfterFinished"] == 600
        assert ours == [{"f:spec": {"f:ttlSecondsAfterFinished": {}}}]


def test_an_older_render_is_kept_announced_once_and_replaced_by_the_next_rayjob(
    kube: KubeCluster, api: Api, adopted: Adopted
) -> None:
    _, ns, _, made = adopted
    (message,) = wait_until(lambda: _deferred(api, ns, "running"), timeout=10, what="the RenderChangeDeferred event")
    assert "(spec.entrypoint, spec.rayClusterSpec)" in message and "next RayJob" in message and "resumed" in message
    api.patch_job(ns, "running", {"spec": {"lifecycle": {"ttlSecondsAfterFinished": 600}}})
    live = wait_until(
        lambda: (r := api.rayjob(ns, "running")) and r["spec"].get("ttlSecondsAfterFinished") == 600 and r,
        timeout=10,
        what="the lifecycle carried over",
    )
    assert _fixed(live) == _fixed(made["older"])  # a running job keeps its cluster and its command
    assert len(_deferred(api, ns, "running")) == 1  # the same change is not announced again
    kube.delete(live)
    new = wait_until(
        lambda: (r := api.rayjob(ns, "running")) and r["metadata"]["uid"] != live["metadata"]["uid"] and r,
        timeout=10,
        what="the next RayJob",
    )
    head = head_container(new["spec"]["rayClusterSpec"])
    assert (
        new["spec"]["entrypoint"] != OLDER_ENTRYPOINT and head["image"] == recorded("running")["job"]["spec"]["image"]
    )
    assert new["spec"]["ttlSecondsAfterFinished"] == 600
    wait_until(lambda: ("Warning", "RayJobDeleted") in api.events(ns, "running"), what="the RayJobDeleted event")
    assert len(_deferred(api, ns, "running")) == 1


def test_an_older_render_reaches_the_run_after_a_suspension(api: Api, adopted: Adopted) -> None:
    _, _, ns, made = adopted
    wait_until(lambda: _deferred(api, ns, "running"), timeout=10, what="the RenderChangeDeferred event")
    api.patch_job(ns, "running", {"spec": {"suspend": True}})
    suspending = wait_until(
        lambda: (r := api.rayjob(ns, "running")) and r["spec"]["suspend"] and r, timeout=10, what="the RayJob suspended"
    )
    assert _fixed(suspending) == _fixed(made["retried"])  # kept while its Ray cluster is there
    api.fake_kuberay(ns, "running", {"jobDeploymentStatus": "Suspending"})
    time.sleep(1)
    assert _fixed(api.rayjob(ns, "running")) == _fixed(made["retried"])
    # KubeRay has deleted the Ray cluster: the next run's is made from the RayJob's spec once the job resumes.
    api.fake_kuberay(ns, "running", {"jobDeploymentStatus": "Suspended", "jobStatus": "", "rayClusterName": ""})
    live = wait_until(
        lambda: (r := api.rayjob(ns, "running")) and r["spec"]["entrypoint"] != OLDER_ENTRYPOINT and r,
        timeout=10,
        what="the current render on the RayJob",
    )
    assert (
        head_container(live["spec"]["rayClusterSpec"])["image"] == recorded("running")["job"]["spec"]["image"]
        and live["spec"]["suspend"]
    )
    assert live["metadata"]["uid"] == made["retried"]["metadata"]["uid"]
    (applied,) = wait_until(
        lambda: [m for _, reason, m in api.event_messages(ns, "running") if reason == APPLIED_REASON],
        timeout=10,
        what="the RenderChangeApplied event",
    )
    assert "is suspended" in applied and "(spec.entrypoint, spec.rayClusterSpec)" in applied
    # Resumed: only `suspend` changes, and nothing is announced again.
    api.patch_job(ns, "running", {"spec": {"suspend": False}})
    resumed = wait_until(
        lambda: (r := api.rayjob(ns, "running")) and not r["spec"]["suspend"] and r, timeout=10, what="resumed"
    )
    assert _fixed(resumed) == _fixed(live)
    assert [m for _, reason, m in api.event_messages(ns, "running") if reason == APPLIED_REASON] == [applied]
    assert len(_deferred(api, ns, "running")) == 1
