"""What the Ray pods of a job say about it (pure): how many workers are ready, and why a pod cannot run.

The operator follows the Ray pods (head and workers) KubeRay makes from the job's
templates (`pod_view` keeps the little it reads of each). A pod that is never made
leaves nothing to follow: `creation_failure` reads why from KubeRay's `ReplicaFailure`
condition, which the RayJob's `status.rayClusterStatus` carries with the API server's
refusal (a ResourceQuota, PodSecurity, a webhook), until the pods show it made them. `assess` looks at the pods of the
job's current Ray cluster and finds the first of the ways a pod that exists can be
stuck, in the order a pod meets them, with the scheduler's, the kubelet's or the attach controller's own words:

| reason                       | the pod                                               | message                     |
|------------------------------|-------------------------------------------------------|-----------------------------|
| `PodCreationFailed`          | KubeRay cannot create it (`creation_failure`)         | KubeRay's, with the API's   |
| `Unschedulable`              | `PodScheduled=False`                                  | the scheduler's             |
| `FailedAttachVolume`         | waits to be created, after such an event on it        | the attach controller's     |
| `FailedMount`                | the same: a ConfigMap, Secret or claim is missing ... | the kubelet's               |
| `ImagePullBackOff`           | a container waits in ErrImagePull, ImagePullBackOff   | the kubelet's               |
| `CreateContainerConfigError` | a container's environment names a missing ConfigMap or Secret (key) | the kubelet's |
| `CrashLoopBackOff`           | a container waits in CrashLoopBackOff                 | the kubelet's, last exit code |
| `ContainerFailed`            | a container terminated with a non-zero exit code      | exit code, kubelet's reason |

A volume that cannot be attached or mounted shows in no pod field, only in the Warning events on the pod
(`VOLUME_EVENT_REASONS`, kept as `volume_event_view`s by the operator's event watch): `with_volume_events`
gives a pod view the latest of its own (by the pod's uid), which counts while the pod's containers wait to be
created (`ContainerCreating`, `PodInitializing`).

Each message starts with the pods it concerns (`pod NAME` or `pods A, B and 2 more`).
Pods being deleted and pods of an earlier Ray cluster of the job (a retry) do not count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rocmtrain.api.condition_reasons import Reason
from rocmtrain.api.contract import JOB_NAME_LABEL, RAY_CLUSTER_LABEL, RAY_NODE_TYPE_LABEL
from rocmtrain.status.condition_merge import find
from rocmtrain.status.messages import EVENT_MESSAGE_LIMIT, bounded

# The kubelet's waiting reasons of an image that cannot be pulled.
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
NAMED_PODS = 3  # pods named in a message; the rest are counted
# The reasons of the events on a pod whose volume cannot be attached (the attach/detach controller) or mounted
# (the kubelet: a ConfigMap, Secret or claim that does not exist, a volume that does not answer).
VOLUME_EVENT_REASONS = (Reason.FAILED_ATTACH_VOLUME, Reason.FAILED_MOUNT)
# The kubelet's waiting reasons of a container that is not created yet (volumes not ready among the causes).
_NOT_CREATED = frozenset({"ContainerCreating", "PodInitializing"})


@dataclass(frozen=True)
class PodProblem:
    """Why some Ray pods cannot run: a reason from the table above and its message."""

    reason: Reason
    message: str


@dataclass(frozen=True)
class RayPods:
    """What the pods of one Ray cluster show: heads and workers made, ready workers, the first problem (or None)."""

    heads: int
    workers: int
    ready_workers: int
    problem: PodProblem | None


RAYCLUSTER_KIND = "RayCluster"
# KubeRay's RayCluster condition while a reconcile fails, and its reasons for pods it could not create.
REPLICA_FAILURE = "ReplicaFailure"
_CREATE_FAILED = {"FailedCreateHeadPod": "head", "FailedCreateWorkerPod": "worker"}


def creation_failure(
    cluster_status: Mapping[str, Any], pods: RayPods | None, desired_workers: int
) -> PodProblem | None:
    """Why KubeRay cannot create a Ray pod (a RayCluster status' `ReplicaFailure`), or None.

    KubeRay's message is its reason and the API server's refusal (`FailedCreateWorkerPod: pods
    "..." is forbidden: exceeded quota: ...`); the pod's name in it changes with each retry.
    KubeRay copies its cluster's status into the RayJob only until the cluster is ready, and
    then only while Ray's dashboard answers, so the copy can keep a refusal after KubeRay made
    the pods: the refusal of a role whose pods all exist (`pods`, live) is over.
    """
    condition = find(cluster_status.get("conditions") or [], REPLICA_FAILURE) or {}
    role = _CREATE_FAILED.get(condition.get("reason") or "")
    if condition.get("status") != "True" or role is None:
        return None
    if pods is not None and (pods.heads > 0 if role == "head" else pods.workers >= desired_workers):
        return None
    return PodProblem(
        Reason.POD_CREATION_FAILED, f"KubeRay cannot create the {role} pod: {condition.get('message') or ''}"
    )


def _controller(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The kind and name of the object that controls a pod (its controller owner reference); empty if none."""
    refs: list[Mapping[str, Any]] = meta.get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), {})
    return {key: ref[key] for key in ("kind", "name") if key in ref}


def pod_view(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a Ray pod the operator keeps in memory (its pod watch)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    scheduled = conditions.get("PodScheduled") or {}
    return {
        "metadata": {
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "labels": {k: labels[k] for k in (JOB_NAME_LABEL, RAY_CLUSTER_LABEL, RAY_NODE_TYPE_LABEL) if k in labels},
            "deleting": "deletionTimestamp" in meta,
            "controller": _controller(meta),
        },
        "phase": status.get("phase"),
        "ready": (conditions.get("Ready") or {}).get("status") == "True",
        "scheduled": {key: scheduled.get(key) for key in ("status", "reason", "message") if scheduled.get(key)},
        "containers": [_container_view(c) for c in status.get("containerStatuses") or []],
    }


def _container_view(status: Mapping[str, Any]) -> dict[str, Any]:
    state = status.get("state") or {}
    last = (status.get("lastState") or {}).get("terminated") or {}
    view: dict[str, Any] = {"name": status.get("name", "")}
    for kind in ("waiting", "terminated"):
        if state.get(kind) is not None:
            view[kind] = {k: state[kind][k] for k in ("reason", "message", "exitCode") if k in state[kind]}
    if "exitCode" in last:
        view["lastExitCode"] = last["exitCode"]
    return view


def volume_event_view(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """The part of an event on a pod about its volumes (`VOLUME_EVENT_REASONS`) the operator keeps; None for another."""
    meta, pod = event.get("metadata") or {}, event.get("involvedObject") or {}
    if event.get("reason") not in VOLUME_EVENT_REASONS or pod.get("kind") != "Pod":
        return None
    series = event.get("series") or {}
    when = series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime")
    return {
        "metadata": {"namespace": meta.get("namespace"), "name": meta.get("name")},
        "pod": {"name": pod.get("name"), "uid": pod.get("uid")},
        "reason": event["reason"],
        "message": bounded(str(event.get("message") or ""), EVENT_MESSAGE_LIMIT),
        "time": str(when or meta.get("creationTimestamp") or ""),
    }


def event_pod_key(view: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, pod name) of a `volume_event_view`."""
    return view["metadata"]["namespace"], view["pod"]["name"]


def with_volume_events(view: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A pod view with the latest of `events` (`volume_event_view`s) of that very pod, as its `volume`."""
    own = [event for event in events if event["pod"]["uid"] == view["metadata"].get("uid")]
    if not own:
        return dict(view)
    latest = max(own, key=lambda event: event["time"])
    return {**view, "volume": {"reason": latest["reason"], "message": latest["message"]}}


def job_key(view: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, job name) of a pod view, from the job label the rendered templates carry."""
    meta = view["metadata"]
    job = meta["labels"].get(JOB_NAME_LABEL)
    return (meta["namespace"], job) if job else None


# ---- problems ------------------------------------------------------------------------------

# The problems of a pod in the order it meets them; those of its containers in the order each container does.
_CONTAINER_ORDER = (
    Reason.IMAGE_PULL_BACK_OFF,
    Reason.CREATE_CONTAINER_CONFIG_ERROR,
    Reason.CRASH_LOOP_BACK_OFF,
    Reason.CONTAINER_FAILED,
)
_ORDER = (Reason.UNSCHEDULABLE, *VOLUME_EVENT_REASONS, *_CONTAINER_ORDER)


def _pod_problem(view: Mapping[str, Any]) -> PodProblem | None:
    """The first problem of one pod (its message without the pod's name)."""
    scheduled = view.get("scheduled") or {}
    if scheduled.get("status") == "False":
        return PodProblem(Reason.UNSCHEDULABLE, scheduled.get("message") or scheduled.get("reason") or "not scheduled")
    containers = view.get("containers") or []
    volume = view.get("volume")
    if volume and all((c.get("waiting") or {}).get("reason") in _NOT_CREATED for c in containers):
        return PodProblem(Reason(volume["reason"]), volume["message"])
    for reason in _CONTAINER_ORDER:
        for container in containers:
            message = _container_problem(container, reason)
            if message is not None:
                return PodProblem(reason, message)
    return None


def _container_problem(container: Mapping[str, Any], reason: Reason) -> str | None:
    name = container.get("name", "")
    waiting = container.get("waiting") or {}
    waiting_reason = waiting.get("reason", "")
    if reason == Reason.IMAGE_PULL_BACK_OFF and waiting_reason in IMAGE_PULL_REASONS:
        return f"container {name} {waiting_reason}: {waiting.get('message') or 'cannot pull the image'}"
    if reason == Reason.CREATE_CONTAINER_CONFIG_ERROR and waiting_reason == reason:
        return f"container {name} {waiting_reason}: {waiting.get('message') or 'a ConfigMap or Secret is missing'}"
    if reason == Reason.CRASH_LOOP_BACK_OFF and waiting_reason == Reason.CRASH_LOOP_BACK_OFF:
        last = container.get("lastExitCode")
        exit_code = f" (last exit code {last})" if last is not None else ""
        return f"container {name} {waiting_reason}: {waiting.get('message') or 'back-off restarting'}{exit_code}"
    terminated = container.get("terminated") or {}
    code = terminated.get("exitCode")
    if reason == Reason.CONTAINER_FAILED and isinstance(code, int) and code != 0:
        detail = ": ".join(part for part in (terminated.get("reason"), terminated.get("message")) if part)
        return f"container {name} exited with code {code}" + (f" ({detail})" if detail else "")
    return None


def _named(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMED_PODS])
    more = f" and {len(names) - NAMED_PODS} more" if len(names) > NAMED_PODS else ""
    return f"pod {shown}" if len(names) == 1 else f"pods {shown}{more}"


def _first_problem(pods: Sequence[Mapping[str, Any]]) -> PodProblem | None:
    """The problem of the earliest kind among `pods`, naming every pod that has it (head first)."""
    found = [(view, problem) for view in pods if (problem := _pod_problem(view)) is not None]
    if not found:
        return None
    reason = min((problem.reason for _, problem in found), key=_ORDER.index)
    same = [(view, problem) for view, problem in found if problem.reason == reason]
    same.sort(key=lambda item: (item[0]["metadata"]["labels"].get(RAY_NODE_TYPE_LABEL) != "head", _name(item[0])))
    names = [_name(view) for view, _ in same]
    return PodProblem(reason, f"{_named(names)}: {same[0][1].message}")


def _name(view: Mapping[str, Any]) -> str:
    return str(view["metadata"]["name"])


def assess(pods: Iterable[Mapping[str, Any]], cluster: str) -> RayPods | None:
    """What the pods of Ray cluster `cluster` show; None when none of them is known.

    A pod counts only when that RayCluster controls it (KubeRay's owner reference): anyone who may create
    pods in the namespace can copy a Ray pod's labels, but not make KubeRay's cluster its controller.
    """
    owner = {"kind": RAYCLUSTER_KIND, "name": cluster}
    current = [
        view
        for view in pods
        if view["metadata"]["labels"].get(RAY_CLUSTER_LABEL) == cluster
        and view["metadata"].get("controller") == owner
        and not view["metadata"]["deleting"]
    ]
    if not current:
        return None
    roles = [view["metadata"]["labels"].get(RAY_NODE_TYPE_LABEL) for view in current]
    workers = [view for view, role in zip(current, roles, strict=True) if role == "worker"]
    return RayPods(
        heads=roles.count("head"),
        workers=len(workers),
        ready_workers=sum(1 for view in workers if view["ready"]),
        problem=_first_problem(current),
    )
