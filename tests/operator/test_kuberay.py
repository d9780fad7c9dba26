"""The operator against the real KubeRay controller, kube-scheduler and kwok GPU nodes (the world).

Every state here is KubeRay's own: its RayCluster, its pods placed by the scheduler,
its submitter Job, its status and reasons. No Ray runs in the world (KubeRay's calls to
the Ray dashboard fail), so a RayJob reaches `Running` with no Ray job status: the job
shows `Initializing` (reason `Submitting`) until the submitter pod ends, which a test
makes happen through kwok. States that need a running Ray (`SUCCEEDED`, metrics) are
tested in test_cluster.py with hand-written RayJob status.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from operator_testkit import (
    OLDER_ENTRYPOINT,
    OLDER_IMAGE,
    SMALL,
    WORLD_TIMEOUT,
    Api,
    Operator,
    head_container,
    job_manifest,
    submitting,
    wait_until,
)

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.render.rayjob_update import APPLIED_REASON, DEFERRED_REASON
from rocmtrain_testworld import kuberay, kwok
from rocmtrain_testworld.nodes import MI250_LABELS, MI300X_LABELS, PRODUCT_LABEL
from rocmtrain_testworld.world import World

pytestmark = pytest.mark.cluster

MI300X, MI250 = MI300X_LABELS[PRODUCT_LABEL], MI250_LABELS[PRODUCT_LABEL]
TIMEOUT = WORLD_TIMEOUT
MERGE_PATCH = "application/merge-patch+json"


def raycluster(api: Api, ns: str, name: str) -> dict[str, Any]:
    return wait_until(lambda: kuberay.raycluster(api.kube, ns, name), timeout=TIMEOUT, what=f"{name}'s RayCluster")


def deployment(api: Api, ns: str, name: str) -> str | None:
    """KubeRay's jobDeploymentStatus of the RayJob."""
    return ((api.rayjob(ns, name) or {}).get("status") or {}).get("jobDeploymentStatus")


def phase_is(phase: str) -> Any:
    return lambda status: status.get("phase") == phase


# ---- create, place, delete -----------------------------------------------------------------------


def test_jobs_run_on_the_gpu_nodes_they_ask_for(world: World, world_api: Api, world_ns: str):
    api, ns = world_api, world_ns
    for name, workers, gpus, model in (("bert", 2, 8, MI300X), ("small", 1, 4, MI250)):
        resources = {"workers": workers, "gpusPerWorker": gpus, "gpu": {"productName": model}}
        api.create_job(ns, name, timeout=TIMEOUT, resources=resources)
    placed = {}
    for name, workers in (("bert", 2), ("small", 1)):
        done = api.wait_status(ns, name, "KubeRay's cluster up, the submitter started", submitting)
        cluster = raycluster(api, ns, name)
        assert done["rayClusterName"] == cluster["metadata"]["name"]
        assert done["workersReady"] == done["workersDesired"] == workers
        assert f"({workers}/{workers} workers ready)" in api.condition(ns, name, ConditionType.READY)["message"]
        pods = kuberay.ray_pods(api.kube, ns, cluster["metadata"]["name"], "worker")
        placed[name] = sorted(p["spec"]["nodeName"] for p in pods)
    # spec.resources.gpu became node affinity, which the scheduler followed: one 8-GPU worker per MI300X node.
    assert placed == {"bert": ["gpu-mi300x-0", "gpu-mi300x-1"], "small": ["gpu-mi250-0"]}
    # The operator's submitter retries reached KubeRay's submitter Job.
    job = api.kube.request("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/bert")
    assert job["spec"]["backoffLimit"] == 0
    wait_until(
        lambda: [r for _, r in api.events(ns, "bert")] == ["Pending", "Initializing"],
        timeout=WORLD_TIMEOUT,
        what="two events",
    )


def test_deleting_a_job_deletes_everything_kuberay_made(world: World, world_api: Api, world_ns: str):
    api, ns = world_api, world_ns
    api.create_job(ns, "bert", timeout=TIMEOUT, resources=SMALL)
    api.wait_status(ns, "bert", "submitting", submitting)
    made = {
        "rayclusters": f"/apis/ray.io/v1/namespaces/{ns}/rayclusters",
        "jobs": f"/apis/batch/v1/namespaces/{ns}/jobs",
        "services": f"/api/v1/namespaces/{ns}/services",
        "pods": f"/api/v1/namespaces/{ns}/pods",
    }
    counts = {kind: len(api.kube.request("GET", path)["items"]) for kind, path in made.items()}
    # The Ray cluster's head Service and the RayJob's; the head, worker and submitter pods.
    assert counts == {"rayclusters": 1, "jobs": 1, "services": 2, "pods": 3}
    api.kube.delete(api.job(ns, "bert"))
    wait_until(lambda: api.rayjob(ns, "bert") is None, timeout=TIMEOUT, what="the RayJob gone")
    for kind, path in made.items():
        wait_until(lambda p=path: not api.kube.request("GET", p)["items"], timeout=TIMEOUT, what=f"no {kind} left")


# ---- suspend, retries, deadline ------------------------------------------------------------------


def test_suspend_deletes_the_ray_cluster_and_resume_makes_a_new_one_of_the_current_render(
    world: World, world_api: Api, world_ns: str
):
    api, ns = world_api, world_ns
    api.create_job(ns, "bert", timeout=TIMEOUT, resources=SMALL)
    first = api.wait_status(ns, "bert", "submitting", submitting)["rayClusterName"]
    rayjob = api.rayjob(ns, "bert")
    current = head_container(rayjob["spec"]["rayClusterSpec"])["image"]
    # The RayJob as an older operator version rendered it: another head image and entrypoint. KubeRay disregards
    # a change of the cluster spec while its Ray cluster exists; it makes the next one from the RayJob's spec.
    containers = [{**head_container(rayjob["spec"]["rayClusterSpec"]), "image": OLDER_IMAGE}]
    head = {"headGroupSpec": {"template": {"spec": {"containers": containers}}}}
    older = {"spec": {"entrypoint": OLDER_ENTRYPOINT, "rayClusterSpec": head}}
    api.kube.request("PATCH", kuberay.RAYJOBS.format(ns=ns) + "/bert", body=older, content_type=MERGE_PATCH)

    api.patch_job(ns, "bert", {"spec": {"suspend": True}})
    api.wait_status(ns, "bert", "Suspended", phase_is("Suspended"))
    wait_until(
        lambda: deployment(api, ns, "bert") == "Suspended",
        timeout=TIMEOUT,
        what="KubeRay's Suspended",
    )
    wait_until(lambda: not kuberay.ray_pods(api.kube, ns, first), timeout=TIMEOUT, what="the Ray pods gone")
    assert kuberay.raycluster(api.kube, ns, "bert") is None
    # KubeRay clears the RayJob's cluster name after deleting the cluster; the job's status follows.
    api.wait_status(ns, "bert", "no Ray cluster named", lambda s: "rayClusterName" not in s)
    # Suspended, the RayJob takes the current render (an event says so), for the run after the resume.
    wait_until(
        lambda: api.rayjob(ns, "bert")["spec"]["entrypoint"] != OLDER_ENTRYPOINT,
        timeout=TIMEOUT,
        what="the current render on the suspended RayJob",
    )

    api.patch_job(ns, "bert", {"spec": {"suspend": False}})
    resumed = api.wait_status(ns, "bert", "submitting again", submitting)
    assert resumed["rayClusterName"] != first
    assert head_container(raycluster(api, ns, "bert")["spec"])["image"] == current
    story = ["Pending", "Initializing", DEFERRED_REASON, "Suspended", APPLIED_REASON, "Pending", "Initializing"]
    wait_until(lambda: [r for _, r in api.events(ns, "bert")] == story, timeout=WORLD_TIMEOUT, what=f"events {story}")


def test_job_retries_go_through_kuberay_retrying_on_a_new_ray_cluster(world: World, world_api: Api, world_ns: str):
    api, ns = world_api, world_ns
    # Every submitter pod of this job fails: KubeRay fails the submission, retries the whole job once.
    kwok.script(api.kube, ns, "exit", labels={"batch.kubernetes.io/job-name": "flaky"}, exit_code=1)
    api.create_job(ns, "flaky", timeout=TIMEOUT, resources=SMALL, faultTolerance={"jobRetries": 1})
    clusters = set()

    def seen(s: dict[str, Any]) -> bool:
        if s.get("rayClusterName"):
            clusters.add(s["rayClusterName"])
        return s.get("phase") == "Failed"

    done = api.wait_status(ns, "flaky", "Failed after one retry", seen, timeout=2 * TIMEOUT)
    assert done["restarts"] == 1 and len(clusters) == 2, (done, clusters)
    failed = api.condition(ns, "flaky", ConditionType.FAILED)
    assert failed["reason"] == "SubmissionFailed" and "BackoffLimitExceeded" in failed["message"], failed
    assert kuberay.rayjob(api.kube, ns, "flaky")["status"]["failed"] == 2  # KubeRay's own count
    # The operator posts a transition's event right after it writes the status.
    story = wait_until(
        lambda: (found := [r for _, r in api.events(ns, "flaky")]) and found[-1] == "Failed" and found,
        timeout=TIMEOUT,
        what="the Failed event",
    )
    assert story[:3] == ["Pending", "Initializing", "Retrying"] and story[-1] == "Failed", story


def test_active_deadline_fails_the_job_and_a_finished_job_is_not_rerun(world: World, world_api: Api, world_ns: str):
    api, ns = world_api, world_ns
    # 1 s: KubeRay fails the RayJob at its next look (every 3 s), wherever it is; no retry for a deadline.
    limits = {"activeDeadlineSeconds": 1, "jobRetries": 1}
    api.create_job(ns, "late", timeout=TIMEOUT, resources=SMALL, faultTolerance=limits)
    api.wait_status(ns, "late", "Failed", phase_is("Failed"))
    failed = api.condition(ns, "late", ConditionType.FAILED)
    assert failed["reason"] == "DeadlineExceeded", failed
    assert failed["message"].startswith("The RayJob has passed the activeDeadlineSeconds"), failed
    assert api.status(ns, "late")["restarts"] == 0
    # Finished: its RayJob deleted by hand is not made again.
    api.kube.delete(api.rayjob(ns, "late"))
    wait_until(lambda: api.rayjob(ns, "late") is None, timeout=TIMEOUT, what="the RayJob gone")
    time.sleep(2)  # the operator reacts to the deletion at once and retries every second
    assert api.rayjob(ns, "late") is None and api.status(ns, "late")["phase"] == "Failed"


# ---- KubeRay away, KubeRay refusing ----------------------------------------------------------------


def test_kuberay_restarted_mid_flight(world: World, world_api: Api, world_ns: str):
    """While KubeRay is down nothing moves; back, it picks up what changed without a second Ray cluster."""
    api, ns = world_api, world_ns
    api.create_job(ns, "bert", timeout=TIMEOUT, resources=SMALL)
    first = api.wait_status(ns, "bert", "submitting", submitting)["rayClusterName"]
    world.kuberay.stop()
    try:
        api.create_job(ns, "later", timeout=TIMEOUT, resources=SMALL)
        api.patch_job(ns, "bert", {"spec": {"suspend": True}})
        wait_until(
            lambda: api.rayjob(ns, "bert")["spec"].get("suspend") is True, timeout=TIMEOUT, what="the RayJob suspended"
        )
        # No KubeRay: the RayJob is not started, and the suspended job still holds its Ray cluster.
        api.wait_status(ns, "later", "Pending", phase_is("Pending"))
        assert api.condition(ns, "later", ConditionType.READY)["reason"] == Reason.RAYJOB_CREATED
        assert kuberay.raycluster(api.kube, ns, "bert")["metadata"]["name"] == first
    finally:
        world.kuberay.start()
        world.kuberay.wait_ready(TIMEOUT)
    api.wait_status(ns, "bert", "Suspended", phase_is("Suspended"))
    api.wait_status(ns, "later", "submitting", submitting)
    clusters = api.kube.request("GET", f"/apis/ray.io/v1/namespaces/{ns}/rayclusters")["items"]
    assert [c["metadata"]["name"] for c in clusters] == [api.status(ns, "later")["rayClusterName"]]


def test_kuberay_validation_failed_is_the_jobs_failure(world: World, world_api: Api, world_ns: str):
    """The operator's validation refuses every KubeRay v1.5.1 rule it knows of, so KubeRay's own
    `ValidationFailed` comes from a RayJob changed behind the operator's back (here by hand, as a
    policy engine or an admin would) or from a KubeRay with other rules."""
    api, ns = world_api, world_ns
    api.create_job(ns, "bert", timeout=TIMEOUT, resources=SMALL)
    api.wait_status(ns, "bert", "submitting", submitting)
    api.kube.request(
        "PATCH",
        f"/apis/ray.io/v1/namespaces/{ns}/rayjobs/bert",
        body=[
            {
                "op": "add",
                "path": "/spec/rayClusterSpec/headGroupSpec/template/spec/containers/0/env/-",
                "value": {"name": "RAY_REDIS_ADDRESS", "value": "redis:6379"},
            }
        ],
        content_type="application/json-patch+json",
    )
    api.wait_status(ns, "bert", "Failed", phase_is("Failed"))
    failed = api.condition(ns, "bert", ConditionType.FAILED)
    assert failed["reason"] == Reason.VALIDATION_FAILED, failed
    assert "RAY_REDIS_ADDRESS is set which implicitly enables GCS fault tolerance" in failed["message"], failed


# ---- the operator restarted ----------------------------------------------------------------------------


def test_operator_restart_converges_on_what_kuberay_did_meanwhile(
    world: World, world_api: Api, world_ns: str, world_operator: Operator
):
    api, ns = world_api, world_ns
    kwok.script(api.kube, ns, "exit", labels={"batch.kubernetes.io/job-name": "b"}, exit_code=1)
    uids = {name: api.create_job(ns, name, timeout=TIMEOUT, resources=SMALL)["metadata"]["uid"] for name in "abc"}
    world_operator.stop()
    try:
        # Meanwhile KubeRay starts a and c, and fails b's submission.
        for name in ("a", "c"):
            wait_until(
                lambda n=name: deployment(api, ns, n) == "Running",
                timeout=TIMEOUT,
                what=f"{name} Running",
            )
        wait_until(
            lambda: deployment(api, ns, "b") == "Failed",
            timeout=TIMEOUT,
            what="b's submission failed",
        )
        api.patch_job(ns, "c", {"spec": {"suspend": True}})
        api.kube.create(job_manifest("d", ns, resources=SMALL))
    finally:
        world_operator.start()
    api.wait_status(ns, "a", "submitting", submitting)
    api.wait_status(ns, "b", "Failed", phase_is("Failed"))
    assert api.condition(ns, "b", ConditionType.FAILED)["reason"] == "SubmissionFailed"
    api.wait_status(ns, "c", "Suspended", phase_is("Suspended"))
    api.wait_status(ns, "d", "submitting", submitting)
    rayjobs = api.kube.request("GET", f"/apis/ray.io/v1/namespaces/{ns}/rayjobs")["items"]
    assert sorted(r["metadata"]["name"] for r in rayjobs) == ["a", "b", "c", "d"]
    assert {r["metadata"]["name"]: r["metadata"]["uid"] for r in rayjobs if r["metadata"]["name"] in uids} == uids
