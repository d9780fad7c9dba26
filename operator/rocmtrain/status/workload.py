"""What Kueue's Workload of a queued RayJob says (pure): admitted where, or why it waits or was evicted.

Kueue (v1beta2 Workloads) makes one Workload per queued RayJob, owned by it, and
writes its verdict there: `QuotaReserved=False` with what is missing in which flavor
("couldn't assign flavors to pod set gpu: insufficient unused quota for amd.com/gpu
in flavor mi300x, 8 more needed"), `Admitted=True` with the flavors in
`status.admission`, `Evicted=True` with why it took the quota back (reason
`Preempted`, `PodsReadyTimeout`, ...; `False` again once readmitted). `workload_view`
keeps that much of a Workload, with what orders it in its queue (LocalQueue, priority,
creation) and the AMD GPUs its pod sets ask for; `admission` reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rocmtrain.api.condition_reasons import Reason
from rocmtrain.api.contract import RAYJOB_API_VERSION, RAYJOB_KIND
from rocmtrain.api.quantity import AMD_DEVICE_PREFIX, container_devices
from rocmtrain.api.workload_conditions import WorkloadCondition


@dataclass(frozen=True)
class Admission:
    """Kueue's verdict on one Workload.

    `waiting`: Kueue's message while no quota is reserved (None when admitted or not said);
    `evicted`: (reason, message) of an eviction not yet undone by a readmission;
    `flavors`: the flavors assigned to the GPUs (to every resource when no GPU is asked for).
    """

    admitted: bool
    cluster_queue: str | None = None
    flavors: tuple[str, ...] = ()
    waiting: str | None = None
    evicted: tuple[str, str] | None = None


def rayjob_owner(workload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference to the RayJob a Workload was made for, or None for other Workloads."""
    refs: list[Mapping[str, Any]] = (workload.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("kind") == RAYJOB_KIND and r.get("apiVersion") == RAYJOB_API_VERSION), None)


def workload_gpus(spec: Mapping[str, Any]) -> int:
    """The AMD GPUs a Workload's pod sets ask for in all: each set's count times its pod's containers'."""
    total = 0
    for pod_set in spec.get("podSets") or []:
        if not isinstance(pod_set, Mapping):
            continue
        containers = ((pod_set.get("template") or {}).get("spec") or {}).get("containers") or []
        count = pod_set.get("count")
        total += (count if isinstance(count, int) else 1) * sum(container_devices(c) for c in containers)
    return total


def workload_view(workload: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a Workload the operator keeps in memory: its RayJob, conditions and admission, its
    queue, priority and GPUs."""
    meta = workload.get("metadata") or {}
    spec = workload.get("spec") or {}
    status = workload.get("status") or {}
    owner = rayjob_owner(workload) or {}
    admission = status.get("admission") or {}
    return {
        "metadata": {
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "creationTimestamp": meta.get("creationTimestamp"),
            "deleting": "deletionTimestamp" in meta,
            "owner": {"name": owner.get("name"), "uid": owner.get("uid")},
        },
        "conditions": [
            {key: c.get(key) for key in ("type", "status", "reason", "message")} for c in status.get("conditions") or []
        ],
        "clusterQueue": admission.get("clusterQueue"),
        "flavors": [dict(a.get("flavors") or {}) for a in admission.get("podSetAssignments") or []],
        "queueName": spec.get("queueName"),
        "priority": spec.get("priority") if isinstance(spec.get("priority"), int) else 0,
        "gpus": workload_gpus(spec),
    }


def _condition(view: Mapping[str, Any], kind: WorkloadCondition) -> Mapping[str, Any]:
    return next((c for c in view.get("conditions") or [] if c.get("type") == kind), {})


def _flavors(view: Mapping[str, Any]) -> tuple[str, ...]:
    assignments = view.get("flavors") or []
    gpu = {flavor for a in assignments for name, flavor in a.items() if name.startswith(AMD_DEVICE_PREFIX)}
    return tuple(sorted(gpu or {flavor for a in assignments for flavor in a.values()}))


def admission(view: Mapping[str, Any]) -> Admission:
    """Kueue's verdict on the Workload `view` (a `workload_view`)."""
    evicted = _condition(view, WorkloadCondition.EVICTED)
    eviction = None
    if evicted.get("status") == "True":
        eviction = (evicted.get("reason") or Reason.EVICTED, evicted.get("message") or "")
    # Kueue marks the eviction before it withdraws the admission: an evicted Workload is not admitted.
    admitted = _condition(view, WorkloadCondition.ADMITTED).get("status") == "True" and eviction is None
    reserved = _condition(view, WorkloadCondition.QUOTA_RESERVED)
    return Admission(
        admitted=admitted,
        cluster_queue=view.get("clusterQueue") if admitted else None,
        flavors=_flavors(view) if admitted else (),
        waiting=(reserved.get("message") or None) if reserved.get("status") == "False" else None,
        evicted=eviction,
    )


def finished(view: Mapping[str, Any]) -> bool:
    """Whether the Workload ended (its quota is given back) or is being deleted."""
    ended = _condition(view, WorkloadCondition.FINISHED).get("status") == "True"
    return ended or bool(view["metadata"].get("deleting"))


def holds_quota(view: Mapping[str, Any]) -> bool:
    """Whether the Workload holds quota of its ClusterQueue: reserved (admitted or about to be) and not ended."""
    return bool(view.get("clusterQueue")) and not finished(view) and admission(view).evicted is None
