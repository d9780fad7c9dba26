"""The operator against the lean control plane (kube-apiserver, etcd, kube-controller-manager).

What needs no other controller is tested here: rendering and ownership, the API
server's CEL rules, pre-flight against plain nodes, KubeRay's CRD removed and
reinstalled, a RayJob deleted behind the operator's back, a job its driver's
pre-flight refused, many jobs at once, metrics, a queued job without Kueue installed. Real: the CRDs with their CEL
rules, RBAC (the operator runs as its ServiceAccount), owner references and the
garbage collector, watches and events.

No KubeRay controller runs here. The tests that write RayJob status by hand, as
KubeRay v1.5.1 does (`Api.fake_kuberay`), are those whose state needs a running
Ray, which the world does not have yet: a Ray job SUCCEEDED, FAILED by its
application or RUNNING (KubeRay reads those from the Ray dashboard). Everything
KubeRay decides without Ray is tested against the real KubeRay in
test_kuberay.py, test_pods.py and test_kueue.py.
"""

from __future__ import annotations

import datetime as dt
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes.client.exceptions import ApiException
from operator_testkit import (
    RAYJOBS,
    RUNNING_STEPS,
    STALL_SECONDS,
    SUCCEEDED_STEP,
    Api,
    Operator,
    job_manifest,
    not_in,
    wait_until,
)

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.validate import validate_job
from rocmtrain.render import render_rayjob
from rocmtrain_testworld.kubecluster import KUBERAY_CRDS_DIR, KubeCluster

pytestmark = pytest.mark.cluster

NOW = RUNNING_STEPS[0][0]["startTime"]


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- create, render, own -----------------------------------------------------------------


def test_job_gets_its_rendered_rayjob_with_owner_and_status(kube: KubeCluster, api: Api, ns: str):
    rayjob = api.create_job(ns, "bert")
    job = api.job(ns, "bert")
    valid, errors = validate_job(
        {key: job[key] for key in ("apiVersion", "kind", "metadata", "spec")}, context="cluster"
    )
    assert valid is not None, errors
    expected = render_rayjob(valid)
    assert not_in(expected["spec"], rayjob["spec"]) == []
    assert rayjob["metadata"]["labels"] == expected["metadata"]["labels"]
    (owner,) = rayjob["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "rocmtrain.dev/v1alpha1",
        "kind": "RocmTrainingJob",
        "name": "bert",
        "uid": job["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    wait_until(lambda: api.phase(ns, "bert") == "Pending", what="phase Pending")
    status = api.job(ns, "bert")["status"]
    assert status["rayJobName"] == "bert" and status["gpus"] == 16 and status["observedGeneration"] == 1
    assert "finalizers" not in api.job(ns, "bert")["metadata"]  # deletion is the garbage collector's
    wait_until(lambda: ("Normal", "Pending") in api.events(ns, "bert"), what="the Pending event")
    # Level-triggered: the operator writes the status and nothing else into the job (no bookkeeping
    # annotations, which would cost a second write per job and a watch event).
    assert api.job(ns, "bert")["metadata"].get("annotations") is None


# ---- status from the (fake) KubeRay controller ------------------------------------------------

RUNNING = RUNNING_STEPS
SEQUENCES = {
    "succeeded": (
        {},
        [
            *RUNNING,
            SUCCEEDED_STEP,
        ],
        {"Ready": ("True", Reason.SUCCEEDED), "Succeeded": ("True", Reason.SUCCEEDED)},
        ["Pending", "Initializing", "Running", "Succeeded"],
    ),
    "app-failed": (
        {},
        [
            *RUNNING,
            (
                {
                    "jobDeploymentStatus": "Failed",
                    "jobStatus": "FAILED",
                    "reason": "AppFailed",
                    "message": "Job entrypoint command failed with exit code 1",
                    "failed": 1,
                    "endTime": NOW,
                },
                "Failed",
            ),
        ],
        {"Ready": ("False", "AppFailed"), "Failed": ("True", "AppFailed")},
        ["Pending", "Initializing", "Running", "Failed"],
    ),
}


@pytest.mark.parametrize("case", list(SEQUENCES))
def test_status_follows_kuberay_within_two_seconds(kube: KubeCluster, api: Api, ns: str, case: str):
    """Hand-written: the Ray job's RUNNING, SUCCEEDED and FAILED come from a running Ray's dashboard."""
    spec, steps, final_conditions, story = SEQUENCES[case]
    api.create_job(ns, "bert", **spec)
    for status, phase in steps:
        api.fake_kuberay(ns, "bert", status)
        wait_until(lambda phase=phase: api.phase(ns, "bert") == phase, timeout=2, what=f"phase {phase} after {status}")
    job = wait_until(
        lambda: (j := api.job(ns, "bert")) and j["status"].get("restarts") == 0 and j,
        what="restarts",
    )
    conditions = {c["type"]: (c["status"], c["reason"]) for c in job["status"]["conditions"]}
    assert final_conditions.items() <= conditions.items()
    assert job["status"]["completionTime"]
    wait_until(lambda: [reason for _, reason in api.events(ns, "bert")] == story, what=f"events {story}")


def test_queued_job_without_kueue_installed_waits_queued(kube: KubeCluster, api: Api, ns: str):
    """No Kueue here (its CRDs are not installed): the operator's Workload watch waits, nothing breaks,
    and the job says it waits for Kueue. Kueue itself admits jobs in test_kueue.py."""
    rayjob = api.create_job(ns, "queued", scheduling={"queueName": "team-a"})
    assert rayjob["spec"]["suspend"] is True
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    wait_until(lambda: api.phase(ns, "queued") == "Queued", what="Queued")
    admitted = api.condition(ns, "queued", ConditionType.ADMITTED)
    assert (admitted["status"], admitted["reason"]) == ("False", Reason.QUEUED_BY_KUEUE)
    assert admitted["message"] == "waiting for Kueue to admit the workload (queue team-a)"


# ---- spec changes ------------------------------------------------------------------------------


def test_suspend_and_lifecycle_follow_the_job(kube: KubeCluster, api: Api, ns: str):
    api.create_job(ns, "bert")
    api.patch_job(ns, "bert", {"spec": {"suspend": True, "lifecycle": {"ttlSecondsAfterFinished": 120}}})
    rayjob = wait_until(
        lambda: (r := api.rayjob(ns, "bert")) and r["spec"].get("suspend") is True and r, what="RayJob suspended"
    )
    assert rayjob["spec"]["ttlSecondsAfterFinished"] == 120
    wait_until(lambda: api.job(ns, "bert")["status"].get("observedGeneration") == 2, what="observedGeneration 2")
    wait_until(lambda: api.phase(ns, "bert") == "Suspended", what="Suspended")
    api.patch_job(ns, "bert", {"spec": {"suspend": False}})
    wait_until(lambda: api.rayjob(ns, "bert")["spec"].get("suspend") is False, what="RayJob resumed")


def test_api_server_refuses_invalid_specs_with_field_paths(kube: KubeCluster, api: Api, ns: str):
    cases = [
        ({"resources": {"workers": 0}}, "spec.resources.workers"),
        ({"model": {"source": "org/model"}}, "numLabels is required when task is sequence-classification"),
        ({"model": {"source": "org/model; rm -rf /", "numLabels": 2}}, "spec.model.source"),
    ]
    for spec, expected in cases:
        with pytest.raises(ApiException) as info:
            kube.create(job_manifest("bad", ns, **spec))
        assert info.value.status == 422 and expected in info.value.body, info.value.body
    api.create_job(ns, "bert")
    with pytest.raises(ApiException) as info:
        api.patch_job(ns, "bert", {"spec": {"resources": {"workers": 4}}})
    assert info.value.status == 422 and "spec.resources" in info.value.body and "immutable" in info.value.body


def test_spec_the_crd_accepts_but_the_operator_refuses(kube: KubeCluster, api: Api, ns: str):
    kube.create(job_manifest("local", ns, data={"train": {"uri": "./data/train.jsonl"}}))
    wait_until(lambda: api.phase(ns, "local") == "Failed", what="phase Failed")
    ready = api.condition(ns, "local", ConditionType.READY)
    assert ready["status"] == "False" and ready["reason"] == Reason.INVALID_SPEC
    assert "spec.data.train.uri" in ready["message"]
    wait_until(lambda: ("Warning", "Failed") in api.events(ns, "local"), what="the Failed event")
    version = api.job(ns, "local")["metadata"]["resourceVersion"]
    time.sleep(2.5)  # no retry loop touches the job (retries come every second), and no RayJob appears
    assert api.job(ns, "local")["metadata"]["resourceVersion"] == version
    assert api.rayjob(ns, "local") is None


# ---- pre-flight and drift -------------------------------------------------------------------------


def test_unschedulable_job_waits_for_nodes(kube: KubeCluster, api: Api, ns: str):
    kube.create(job_manifest("big", ns, resources={"workers": 3, "gpusPerWorker": 8}))
    wait_until(
        lambda: api.condition(ns, "big", ConditionType.UNSCHEDULABLE).get("status") == "True", what="Unschedulable"
    )
    message = api.condition(ns, "big", ConditionType.UNSCHEDULABLE)["message"]
    assert message == "needs 3 workers with 8 amd.com/gpu each; the nodes can hold only 2 such workers"
    assert api.phase(ns, "big") == "Pending" and api.rayjob(ns, "big") is None
    kube.create(job_manifest("mi250", ns, resources={"gpu": {"productName": "AMD_Instinct_MI250X"}}))
    wait_until(
        lambda: api.condition(ns, "mi250", ConditionType.UNSCHEDULABLE).get("reason") == Reason.GPU_MODEL_UNAVAILABLE,
        what=Reason.GPU_MODEL_UNAVAILABLE,
    )
    nodes = kube.register_fake_nodes(count=len(kube.fake_nodes) + 1)
    try:
        wait_until(lambda: api.rayjob(ns, "big"), timeout=5, what="the RayJob once a third node joined")
        wait_until(
            lambda: api.condition(ns, "big", ConditionType.UNSCHEDULABLE).get("status") == "False",
            what=Reason.SCHEDULABLE,
        )
    finally:
        kube.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": nodes[-1]}})
        kube.fake_nodes = nodes[:-1]
    assert api.rayjob(ns, "mi250") is None


def test_rayjob_deleted_behind_the_operators_back_is_recreated(kube: KubeCluster, api: Api, ns: str):
    first = api.create_job(ns, "bert")
    kube.delete(first)
    second = wait_until(
        lambda: (r := api.rayjob(ns, "bert")) and r["metadata"]["uid"] != first["metadata"]["uid"] and r,
        what="a new RayJob",
    )
    assert second["metadata"]["ownerReferences"] == first["metadata"]["ownerReferences"]
    wait_until(lambda: ("Warning", "RayJobDeleted") in api.events(ns, "bert"), what="the RayJobDeleted event")


def test_a_job_its_driver_refuses_fails_at_once_and_its_rayjob_goes(kube: KubeCluster, api: Api, ns: str):
    """Hand-written: the driver's last report, as the progress endpoint writes it (status.preflightError; the
    endpoint itself is tests/progress'), on a RayJob whose Ray job runs (KubeRay's states need a running Ray)."""
    refusal = (
        f"spec.checkpoint.storagePath: s3://checkpoints/{ns}/nobucket/{ns}/nobucket is not writable: "
        "AWS Error ACCESS_DENIED during PutObject operation: Access Denied"
    )
    api.create_job(ns, "nobucket", faultTolerance={"jobRetries": 2})
    for step, _ in RUNNING_STEPS:
        api.fake_kuberay(ns, "nobucket", step)
    wait_until(lambda: api.phase(ns, "nobucket") == "Running", what="Running")
    kube.request(
        "PATCH",
        f"/apis/rocmtrain.dev/v1alpha1/namespaces/{ns}/rocmtrainingjobs/nobucket/status",
        body={"status": {"preflightError": refusal, "lastProgressTime": _now()}},
        content_type="application/merge-patch+json",
    )
    wait_until(lambda: api.phase(ns, "nobucket") == "Failed", what="Failed")
    failed = api.condition(ns, "nobucket", ConditionType.FAILED)
    assert (failed["reason"], failed["message"]) == (Reason.PREFLIGHT_FAILED, refusal)
    wait_until(lambda: api.rayjob(ns, "nobucket") is None, what="the RayJob deleted, and its Ray cluster with it")
    wait_until(lambda: ("Warning", "Failed") in api.events(ns, "nobucket"), what="the Failed event")
    time.sleep(2.5)  # retries come every second: none brings the RayJob back
    assert api.rayjob(ns, "nobucket") is None and ("Warning", "RayJobDeleted") not in api.events(ns, "nobucket")
    status = api.status(ns, "nobucket")
    assert status["restarts"] == 0 and status["preflightError"] == refusal and status["completionTime"]


# ---- stall ------------------------------------------------------------------------------------------


def test_running_job_without_progress_is_stalled(kube: KubeCluster, api: Api, ns: str):
    """Hand-written: a Ray job RUNNING needs a running Ray."""
    api.create_job(ns, "slow")
    api.fake_kuberay(ns, "slow", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    wait_until(lambda: api.phase(ns, "slow") == "Running", what="Running")
    stalled = wait_until(
        lambda: (
            api.condition(ns, "slow", ConditionType.STALLED).get("status") == "True"
            and api.condition(ns, "slow", ConditionType.STALLED)
        ),
        timeout=STALL_SECONDS + 4,
        what="Stalled=True",
    )
    assert stalled["reason"] == Reason.NO_PROGRESS
    wait_until(
        lambda: ("Warning", Reason.NO_PROGRESS) in api.events(ns, "slow"), timeout=2, what="the NoProgress event"
    )
    # The progress endpoint (issue 6) records reports as status.lastProgressTime.
    kube.request(
        "PATCH",
        f"/apis/rocmtrain.dev/v1alpha1/namespaces/{ns}/rocmtrainingjobs/slow/status",
        body={"status": {"lastProgressTime": _now()}},
        content_type="application/merge-patch+json",
    )
    wait_until(
        lambda: api.condition(ns, "slow", ConditionType.STALLED).get("status") == "False",
        timeout=3,
        what="Stalled=False",
    )


# ---- KubeRay missing (removes and reinstalls KubeRay's RayJob CRD, before the tests with many jobs) --


def test_kuberay_missing_waits_then_recovers(kube: KubeCluster, api: Api, ns: str):
    if kube.external:
        pytest.skip("removes KubeRay's RayJob CRD; only on the local test cluster")
    api.create_job(ns, "before")  # its RayJob goes with the CRD, while the job has not ended
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayjobs.ray.io"
    kube.request("DELETE", crd)
    try:
        wait_until(lambda: not _exists(kube, crd), timeout=30, interval=0.2, what="the RayJob CRD gone")
        kube.create(job_manifest("early", ns))
        for name in ("early", "before"):
            wait_until(
                lambda name=name: api.condition(ns, name, ConditionType.KUBERAY_MISSING).get("status") == "True",
                timeout=5,
                what=f"KubeRayMissing=True on {name}",
            )
            assert api.condition(ns, name, ConditionType.READY)["reason"] == Reason.KUBERAY_NOT_INSTALLED
            assert api.phase(ns, name) == "Pending"
    finally:
        kube.install_crds([KUBERAY_CRDS_DIR / "ray.io_rayjobs.yaml"])
    for name in ("early", "before"):
        wait_until(lambda name=name: api.rayjob(ns, name), timeout=20, interval=0.2, what=f"{name}'s RayJob back")
        wait_until(
            lambda name=name: api.condition(ns, name, ConditionType.KUBERAY_MISSING).get("status") == "False",
            what=f"KubeRayInstalled on {name}",
        )


def _exists(kube: KubeCluster, path: str) -> bool:
    try:
        kube.request("GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


# ---- operating the operator ------------------------------------------------------------------------


def test_two_hundred_jobs_at_once(kube: KubeCluster, api: Api, ns: str):
    names = [f"job-{i:03d}" for i in range(200)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda name: kube.create(job_manifest(name, ns)), names))

    def reconciled() -> bool:
        jobs = kube.request("GET", f"/apis/rocmtrain.dev/v1alpha1/namespaces/{ns}/rocmtrainingjobs")["items"]
        rayjobs = kube.request("GET", RAYJOBS.format(ns=ns))["items"]
        done = [j for j in jobs if (j.get("status") or {}).get("phase") == "Pending"]
        return len(done) == len(names) and len(rayjobs) == len(names)

    wait_until(reconciled, timeout=90, interval=0.5, what="200 jobs with RayJobs and status")


def test_metrics_and_liveness(api: Api, ns: str, operator: Operator, kube: KubeCluster):
    import urllib.request

    api.create_job(ns, "bert")
    wait_until(lambda: api.phase(ns, "bert") == "Pending", what="Pending")
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert 'rocmtrain_jobs{phase="Pending"}' in text
    assert "rocmtrain_gpus_requested" in text and "rocmtrain_reconcile_duration_seconds_bucket" in text
    assert "# TYPE rocmtrain_reconcile_errors_total counter" in text
    assert operator.healthy()
