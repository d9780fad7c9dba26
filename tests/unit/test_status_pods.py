"""Ray pod states mapped to why a job's pods cannot run (pure: `rocmtrain.status.pods`, no cluster).

The pods are written the way the scheduler and the kubelet write them (messages taken
from kube-scheduler v1.36 and the kubelet); the world's tests show the same against
the real scheduler and kwok (test_pods.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from rocmtrain.status.pods import PodProblem, RayPods, assess, job_key, pod_view

CLUSTER = "bert-x7k2p"
SCHEDULER = (
    "0/4 nodes are available: 2 Insufficient amd.com/gpu, 2 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/4 nodes are available: 2 No preemption victims found for incoming pod."
)
PULL = 'Back-off pulling image "ghcr.io/rocm-train-operator/training:0.1.0"'


def pod(
    name: str,
    *,
    node_type: str = "worker",
    cluster: str = CLUSTER,
    scheduled: dict[str, str] | None = None,
    ready: bool = False,
    state: dict[str, Any] | None = None,
    last_exit: int | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A Ray pod as the API server returns it (the parts that matter, plus some that do not)."""
    conditions = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": str(ready)}]
    if scheduled is not None:
        conditions = [{"type": "PodScheduled", "status": "False", **scheduled}]
    container: dict[str, Any] = {"name": f"ray-{node_type}", "image": "img", "ready": ready, "restartCount": 0}
    container["state"] = state or ({"running": {"startedAt": "t"}} if scheduled is None else {})
    if last_exit is not None:
        container["lastState"] = {"terminated": {"exitCode": last_exit, "reason": "Error"}}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ml",
        "labels": {
            "rocmtrain.dev/job-name": "bert",
            "ray.io/cluster": cluster,
            "ray.io/node-type": node_type,
            "ray.io/group": "gpu",
        },
        "uid": "u",
        "managedFields": [{"manager": "kube-scheduler"}],
        "ownerReferences": [
            {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster, "uid": "c", "controller": True}
        ],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": container["name"], "image": "img"}]},
        "status": {
            "phase": "Pending" if scheduled else "Running",
            "conditions": conditions,
            "containerStatuses": [] if scheduled else [container],
        },
    }


UNSCHEDULED = {"reason": "Unschedulable", "message": SCHEDULER}
HEAD = pod(f"{CLUSTER}-head-abc", node_type="head", ready=True)


def problem(*pods: dict[str, Any]) -> PodProblem | None:
    found = assess([pod_view(p) for p in pods], CLUSTER)
    assert found is not None
    return found.problem


@pytest.mark.parametrize(
    ("pods", "reason", "message"),
    [
        (
            [HEAD, pod("w-1", ready=True), pod("w-2", scheduled=UNSCHEDULED)],
            "Unschedulable",
            f"pod w-2: {SCHEDULER}",
        ),
        (
            [HEAD, pod("w-2", scheduled=UNSCHEDULED), pod("w-1", scheduled=UNSCHEDULED)],
            "Unschedulable",
            f"pods w-1, w-2: {SCHEDULER}",
        ),
        (
            [HEAD, pod("w-1", state={"waiting": {"reason": "ErrImagePull", "message": "rpc error: not found"}})],
            "ImagePullBackOff",
            "pod w-1: container ray-worker ErrImagePull: rpc error: not found",
        ),
        (
            [HEAD, pod("w-1", state={"waiting": {"reason": "ImagePullBackOff", "message": PULL}})],
            "ImagePullBackOff",
            f"pod w-1: container ray-worker ImagePullBackOff: {PULL}",
        ),
        (
            [pod("w-1", state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}, last_exit=1)],
            "CrashLoopBackOff",
            "pod w-1: container ray-worker CrashLoopBackOff: back-off 40s (last exit code 1)",
        ),
        (
            [pod("w-1", state={"terminated": {"exitCode": 137, "reason": "OOMKilled"}})],
            "ContainerFailed",
            "pod w-1: container ray-worker exited with code 137 (OOMKilled)",
        ),
        (
            [pod("w-1", state={"terminated": {"exitCode": 2, "reason": "Error", "message": "ray start failed"}})],
            "ContainerFailed",
            "pod w-1: container ray-worker exited with code 2 (Error: ray start failed)",
        ),
        (  # the earliest kind of problem wins, whatever the pod order; the head is named first
            [
                pod("w-1", state={"waiting": {"reason": "CrashLoopBackOff", "message": "m"}}),
                pod(f"{CLUSTER}-head-abc", node_type="head", scheduled=UNSCHEDULED),
                pod("w-0", scheduled=UNSCHEDULED),
            ],
            "Unschedulable",
            f"pods {CLUSTER}-head-abc, w-0: {SCHEDULER}",
        ),
        (
            [pod(f"w-{i}", scheduled=UNSCHEDULED) for i in range(5)],
            "Unschedulable",
            f"pods w-0, w-1, w-2 and 2 more: {SCHEDULER}",
        ),
    ],
)
def test_the_first_problem_in_the_scheduler_s_or_kubelet_s_words(pods, reason, message):
    assert problem(*pods) == PodProblem(reason, message)


@pytest.mark.parametrize(
    "state",
    [
        {"waiting": {"reason": "ContainerCreating"}},
        {"terminated": {"exitCode": 0, "reason": "Completed"}},
        {"running": {"startedAt": "t"}},
    ],
)
def test_states_that_are_no_problem(state):
    assert problem(HEAD, pod("w-1", state=state)) is None


def test_ready_workers_and_what_does_not_count():
    pods = [
        HEAD,
        pod("w-1", ready=True),
        pod("w-2", ready=True),
        pod("w-3"),
        pod("old-1", cluster="bert-before", scheduled=UNSCHEDULED),  # an earlier Ray cluster (a retry)
        pod("w-4", ready=True, scheduled=None, deleting=True, state={"terminated": {"exitCode": 143}}),
    ]
    assert assess([pod_view(p) for p in pods], CLUSTER) == RayPods(heads=1, workers=3, ready_workers=2, problem=None)
    look_alike = pod("w-5", ready=True)  # a Ray pod's labels, copied onto a pod that KubeRay did not make
    look_alike["metadata"]["ownerReferences"] = []
    other_owner = pod("w-6", ready=True)
    other_owner["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSet"
    found = assess([pod_view(p) for p in [*pods, look_alike, other_owner]], CLUSTER)
    assert found == RayPods(heads=1, workers=3, ready_workers=2, problem=None)
    assert assess([pod_view(p) for p in pods], "bert-other") is None
    assert assess([], CLUSTER) is None


def test_the_view_keeps_little_and_names_its_job():
    view = pod_view(pod("w-1", scheduled=UNSCHEDULED))
    assert job_key(view) == ("ml", "bert")
    assert set(view["metadata"]["labels"]) == {"rocmtrain.dev/job-name", "ray.io/cluster", "ray.io/node-type"}
    assert "managedFields" not in view["metadata"] and "spec" not in view
    assert job_key(pod_view({"metadata": {"name": "p", "namespace": "ml"}})) is None
