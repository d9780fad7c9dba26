"""Ray pods whose volumes or environment name a ConfigMap or Secret that is missing (`rocmtrain.status.pods`):
the kubelet's events on the pod (FailedMount, FailedAttachVolume) and its CreateContainerConfigError reach
the job's RayPodsUnavailable condition, as the other reasons a pod cannot run do."""

from __future__ import annotations

from typing import Any

import pytest

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.status.messages import EVENT_MESSAGE_LIMIT
from rocmtrain.status.pods import assess, volume_event_view, with_volume_events
from unit.test_status import RUN, UNSCHEDULED, cluster, ray_pod, rayjob, run

MOUNT = 'MountVolume.SetUp failed for volume "code" : configmap "recipe" not found'
ATTACH = 'AttachVolume.Attach failed for volume "pvc-1" : rpc error: code = NotFound desc = volume not found'
CREATING = [{"name": "ray-worker", "waiting": {"reason": "ContainerCreating"}}]


def event(pod: str, reason: str, message: str, *, uid: str | None = None, at: str = "2026-01-02T03:04:05Z",
          name: str = "e1") -> dict[str, Any]:  # fmt: skip
    """A core/v1 Event as the kubelet posts it on a pod."""
    return {
        "metadata": {"namespace": "ns", "name": f"{pod}.{name}"},
        "involvedObject": {"kind": "Pod", "namespace": "ns", "name": pod, "uid": uid or f"uid-{pod}"},
        "reason": reason,
        "message": message,
        "type": "Warning",
        "lastTimestamp": at,
    }


def pod(name: str, *events: dict[str, Any], **status: Any) -> dict[str, Any]:
    """A worker's pod view with the volume events the operator's event watch holds for its name."""
    view = ray_pod(name, ready=False, **status)
    view["metadata"]["uid"] = f"uid-{name}"
    return with_volume_events(view, [v for e in events if (v := volume_event_view(e)) is not None])


def problem(*pods: dict[str, Any]) -> tuple[str, str] | None:
    found = assess(pods, "job-x7k2p")
    assert found is not None
    return (found.problem.reason, found.problem.message) if found.problem else None


CONFIG = {"reason": "CreateContainerConfigError", "message": 'secret "s3-credentials" not found'}


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        (
            [pod("w-1", event("w-1", "FailedMount", MOUNT), containers=CREATING)],
            (Reason.FAILED_MOUNT, f"pod w-1: {MOUNT}"),
        ),
        ([pod("w-1", event("w-1", "FailedAttachVolume", ATTACH))], (Reason.FAILED_ATTACH_VOLUME, f"pod w-1: {ATTACH}")),
        (
            [pod("w-1", containers=[{"name": "ray-worker", "waiting": CONFIG}])],
            (
                Reason.CREATE_CONTAINER_CONFIG_ERROR,
                f"pod w-1: container ray-worker {CONFIG['reason']}: {CONFIG['message']}",
            ),
        ),
        # The same pod name, an earlier pod: its events are not this pod's.
        ([pod("w-1", event("w-1", "FailedMount", MOUNT, uid="uid-old"), containers=CREATING)], None),
        # Mounted since (the ConfigMap was made): the event stays an hour, the pod runs.
        ([pod("w-1", event("w-1", "FailedMount", MOUNT), containers=[{"name": "ray-worker"}])], None),
        # Another Warning on the pod is not about its volumes.
        ([pod("w-1", event("w-1", "FailedScheduling", "0/4 nodes"), containers=CREATING)], None),
        # A pod meets the scheduler before its volumes, its volumes before its image.
        (
            [pod("w-1", event("w-1", "FailedMount", MOUNT), containers=CREATING), pod("w-2", scheduled=UNSCHEDULED)],
            (Reason.UNSCHEDULABLE, f"pod w-2: {UNSCHEDULED['message']}"),
        ),
        (
            [
                pod("w-1", containers=[{"name": "ray-worker", "waiting": {"reason": "ImagePullBackOff"}}]),
                pod("w-2", event("w-2", "FailedMount", MOUNT), containers=CREATING),
                pod("w-3", event("w-3", "FailedMount", MOUNT), containers=CREATING),
            ],
            (Reason.FAILED_MOUNT, f"pods w-2, w-3: {MOUNT}"),
        ),
    ],
)
def test_a_pods_volume_events_and_config_errors_say_why_it_cannot_run(pods, expected):
    assert problem(*pods) == expected


def test_the_latest_event_of_a_pod_counts_and_an_event_is_kept_small():
    timed_out = 'MountVolume.SetUp failed for volume "code" : timed out'
    later = event("w-1", "FailedMount", timed_out, at="2026-01-02T03:09:00Z", name="e2")
    assert problem(pod("w-1", event("w-1", "FailedMount", MOUNT), later, containers=CREATING)) == (
        Reason.FAILED_MOUNT,
        f"pod w-1: {later['message']}",
    )
    huge = volume_event_view(event("w-1", "FailedMount", "x" * 100_000))
    assert huge is not None and len(huge["message"]) == EVENT_MESSAGE_LIMIT
    assert volume_event_view({**event("w-1", "FailedMount", MOUNT), "involvedObject": {"kind": "Node"}}) is None
    series = {**event("w-1", "FailedMount", MOUNT), "lastTimestamp": None, "series": {"lastObservedTime": "t2"}}
    assert (volume_event_view(series) or {}).get("time") == "t2"


def test_a_missing_configmap_reaches_the_jobs_condition_until_the_pod_runs():
    starting = rayjob("Initializing", **RUN, rayClusterStatus=cluster(0))
    statuses = run(
        [starting, starting],
        pods=[
            [pod("w-1", event("w-1", "FailedMount", MOUNT), containers=CREATING)],
            [pod("w-1", event("w-1", "FailedMount", MOUNT), containers=[{"name": "ray-worker"}])],
        ],
    )
    found = [next(c for c in s["conditions"] if c["type"] == ConditionType.RAY_PODS_UNAVAILABLE) for s in statuses]
    assert [(c["status"], c["reason"]) for c in found] == [
        ("True", Reason.FAILED_MOUNT),
        ("False", Reason.RAY_PODS_AVAILABLE),
    ]
    assert found[0]["message"] == f"pod w-1: {MOUNT}"
