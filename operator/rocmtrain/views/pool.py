"""The AMD GPU pool (`rocmtrain pool`), per GPU model: nodes, GPUs allocatable, requested and free,
who holds them, Kueue's ClusterQueues (quota, usage, borrowing, pending workloads) where Kueue runs,
and the queued jobs with when each is expected to start (their `status.queue`).

Requests are counted as the scheduler counts them: pods bound to a node (`spec.nodeName`) that
have not ended, each with its effective request (the larger of its containers' sum and its
largest init container). A pod belongs to a job by the `rocmtrain.dev/job-name` label the
operator puts on every Ray pod; other pods are shown by their controller (or their own name).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rocmtrain.api.contract import GPU_NODE_LABELS, JOB_NAME_LABEL
from rocmtrain.api.kubernetes import PodPhase
from rocmtrain.api.quantity import amd_devices, container_devices
from rocmtrain.api.workload_conditions import WorkloadCondition
from rocmtrain.views.table import table

UNLABELLED = "(no product-name label)"

WHOLE_GPU = "spx_nps1"  # an unpartitioned GPU, as the node labeller calls it


@dataclass(frozen=True)
class Holder:
    """A job (or another workload) holding GPUs of one model."""

    namespace: str
    name: str
    kind: str  # RocmTrainingJob, or the holding pod's controller kind (Pod when it has none)
    gpus: int
    phase: str | None = None


@dataclass(frozen=True)
class ModelPool:
    """The GPUs of one model."""

    model: str
    nodes: int
    unavailable_nodes: int  # not Ready or cordoned: their free GPUs are not counted
    allocatable: int
    requested: int
    free: int
    holders: list[Holder] = field(default_factory=list)


@dataclass(frozen=True)
class QuotaRow:
    """One flavor's quota of one resource in a ClusterQueue, and its use."""

    flavor: str
    resource: str
    nominal: str
    borrowing_limit: str | None
    lending_limit: str | None
    usage: str
    borrowed: str


@dataclass(frozen=True)
class QueueView:
    """A Kueue ClusterQueue."""

    name: str
    cohort: str | None
    quotas: list[QuotaRow]
    pending_workloads: int
    admitted_workloads: int
    local_queues: list[str]  # namespace/name
    pending: list[str]  # namespace/name of the workloads waiting in it


@dataclass(frozen=True)
class QueuedJob:
    """A job Kueue holds, with its place in line and expected start (`status.queue`)."""

    namespace: str
    name: str
    gpus: int | None
    position: int | None
    expected_start: str | None
    basis: str


@dataclass(frozen=True)
class PoolView:
    """The whole pool."""

    models: list[ModelPool]
    unbound: list[Holder]  # GPU requests of pods no node holds yet
    kueue: list[QueueView] | None  # None: Kueue is not installed
    queued: list[QueuedJob] = field(default_factory=list)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _has_ended(pod: Mapping[str, Any]) -> bool:
    """Whether a pod has ended (`PodPhase.has_ended`): it holds its GPUs no more."""
    try:
        return PodPhase((pod.get("status") or {}).get("phase") or "").has_ended
    except ValueError:  # no phase yet, or one Kubernetes does not write
        return False


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """The pod's effective AMD GPU request, as the scheduler computes it."""
    spec = pod.get("spec") or {}
    containers = sum(container_devices(c) for c in spec.get("containers") or [])
    return max([containers, *(container_devices(c) for c in spec.get("initContainers") or [])])


def _model(node: Mapping[str, Any]) -> str:
    """The node's GPU model, and its partition where the GPUs are partitioned (`... cpx_nps4`)."""
    labels = _meta(node).get("labels") or {}
    partition = labels.get(GPU_NODE_LABELS["partition"])
    model = str(labels.get(GPU_NODE_LABELS["product_name"], UNLABELLED))
    return f"{model} {partition}" if partition and partition != WHOLE_GPU else model


def _available(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    return ready.get("status") == "True" and not (node.get("spec") or {}).get("unschedulable")


def _holder_key(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = _meta(pod)
    job = (meta.get("labels") or {}).get(JOB_NAME_LABEL)
    if job:
        return meta.get("namespace", ""), job, "RocmTrainingJob"
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    if owner is not None:
        return meta.get("namespace", ""), owner.get("name", ""), owner.get("kind", "")
    return meta.get("namespace", ""), meta.get("name", ""), "Pod"


def _holders(pods: Iterable[Mapping[str, Any]], phases: Mapping[tuple[str, str], str | None]) -> list[Holder]:
    gpus: dict[tuple[str, str, str], int] = defaultdict(int)
    for pod in pods:
        gpus[_holder_key(pod)] += pod_gpus(pod)
    return [
        Holder(ns, name, kind, count, phases.get((ns, name)) if kind == "RocmTrainingJob" else None)
        for (ns, name, kind), count in sorted(gpus.items())
        if count
    ]


def _quantity(value: object) -> str:
    return "-" if value is None else str(value)


def _limit(value: object) -> str | None:
    """A quantity limit as text (the API keeps what was written: 8 or "8"); None when there is none."""
    return None if value is None else str(value)


def _queue(
    cq: Mapping[str, Any], local_queues: Sequence[Mapping[str, Any]], workloads: Sequence[Mapping[str, Any]]
) -> QueueView:
    name = _meta(cq).get("name", "")
    spec, status = cq.get("spec") or {}, cq.get("status") or {}
    usage = {
        (f.get("name"), r.get("name")): r for f in status.get("flavorsUsage") or [] for r in f.get("resources") or []
    }
    quotas = []
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                used = usage.get((flavor.get("name"), resource.get("name")), {})
                quotas.append(
                    QuotaRow(
                        flavor=flavor.get("name", ""),
                        resource=resource.get("name", ""),
                        nominal=_quantity(resource.get("nominalQuota")),
                        borrowing_limit=_limit(resource.get("borrowingLimit")),
                        lending_limit=_limit(resource.get("lendingLimit")),
                        usage=_quantity(used.get("total", 0)),
                        borrowed=_quantity(used.get("borrowed", 0)),
                    )
                )
    queues = {
        (_meta(lq).get("namespace", ""), _meta(lq).get("name", ""))
        for lq in local_queues
        if (lq.get("spec") or {}).get("clusterQueue") == name
    }
    pending = sorted(
        "{}/{}".format(_meta(w).get("namespace", ""), _meta(w).get("name", ""))
        for w in workloads
        if (_meta(w).get("namespace", ""), (w.get("spec") or {}).get("queueName")) in queues
        and not _workload_done_or_admitted(w)
    )
    return QueueView(
        name=name,
        cohort=spec.get("cohortName") or spec.get("cohort"),
        quotas=quotas,
        pending_workloads=int(status.get("pendingWorkloads") or 0),
        admitted_workloads=int(status.get("admittedWorkloads") or 0),
        local_queues=sorted(f"{ns}/{lq}" for ns, lq in queues),
        pending=pending,
    )


def _workload_done_or_admitted(workload: Mapping[str, Any]) -> bool:
    conditions = (workload.get("status") or {}).get("conditions") or []
    holding = (WorkloadCondition.ADMITTED, WorkloadCondition.FINISHED)
    return any(c.get("type") in holding and c.get("status") == "True" for c in conditions)


def pool_view(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    jobs: Iterable[Mapping[str, Any]],
    kueue: tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]] | None = None,
) -> PoolView:
    """The pool from Nodes, Pods and RocmTrainingJobs, and (ClusterQueues, LocalQueues, Workloads) if Kueue runs."""
    jobs = list(jobs)
    phases = {
        (_meta(j).get("namespace", ""), _meta(j).get("name", "")): (j.get("status") or {}).get("phase") for j in jobs
    }
    gpu_nodes = {
        _meta(n).get("name"): n for n in nodes if amd_devices((n.get("status") or {}).get("allocatable") or {})
    }
    live = [p for p in pods if not _has_ended(p) and pod_gpus(p)]
    by_node: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    unbound = []
    for pod in live:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            by_node[node].append(pod)
        else:
            unbound.append(pod)
    models: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for node in gpu_nodes.values():
        models[_model(node)].append(node)
    rows = []
    for model, members in sorted(models.items()):
        allocatable = requested = free = 0
        for node in members:
            count = amd_devices(node["status"]["allocatable"])
            used = sum(pod_gpus(p) for p in by_node.get(_meta(node).get("name", ""), []))
            allocatable, requested = allocatable + count, requested + used
            free += max(count - used, 0) if _available(node) else 0
        bound = [p for node in members for p in by_node.get(_meta(node).get("name", ""), [])]
        rows.append(
            ModelPool(
                model=model,
                nodes=len(members),
                unavailable_nodes=sum(not _available(n) for n in members),
                allocatable=allocatable,
                requested=requested,
                free=free,
                holders=_holders(bound, phases),
            )
        )
    queues = None
    if kueue is not None:
        cluster_queues, local_queues, workloads = kueue
        queues = [
            _queue(cq, local_queues, workloads) for cq in sorted(cluster_queues, key=lambda q: _meta(q).get("name", ""))
        ]
    queued = [
        QueuedJob(
            namespace=_meta(j).get("namespace", ""),
            name=_meta(j).get("name", ""),
            gpus=(j.get("status") or {}).get("gpus"),
            position=queue.get("position"),
            expected_start=queue.get("expectedStartTime"),
            basis=queue.get("basis", ""),
        )
        for j in jobs
        if (queue := (j.get("status") or {}).get("queue"))
    ]
    queued.sort(key=lambda q: (q.expected_start is None, q.expected_start or "", q.namespace, q.name))
    return PoolView(models=rows, unbound=_holders(unbound, phases), kueue=queues, queued=queued)


def pool_text(view: PoolView) -> str:
    """The pool as tables."""
    parts = [
        table(
            ["GPU MODEL", "NODES", "ALLOCATABLE", "REQUESTED", "FREE"],
            [
                [
                    m.model,
                    f"{m.nodes}" + (f" ({m.unavailable_nodes} unavailable)" if m.unavailable_nodes else ""),
                    m.allocatable,
                    m.requested,
                    m.free,
                ]
                for m in view.models
            ],
        )
    ]
    holders = [[m.model, h.namespace, h.name, h.kind, h.gpus, h.phase] for m in view.models for h in m.holders]
    holders += [["(not bound to a node)", h.namespace, h.name, h.kind, h.gpus, h.phase] for h in view.unbound]
    if holders:
        parts.append(table(["GPU MODEL", "NAMESPACE", "HOLDER", "KIND", "GPUS", "PHASE"], holders))
    if view.kueue is None:
        parts.append("Kueue is not installed.")
    elif view.kueue:
        parts.append(
            table(
                [
                    "CLUSTERQUEUE",
                    "COHORT",
                    "FLAVOR",
                    "RESOURCE",
                    "QUOTA",
                    "BORROWING LIMIT",
                    "USAGE",
                    "BORROWED",
                    "PENDING",
                    "ADMITTED",
                ],
                [
                    [
                        q.name,
                        q.cohort,
                        r.flavor,
                        r.resource,
                        r.nominal,
                        r.borrowing_limit,
                        r.usage,
                        r.borrowed,
                        q.pending_workloads,
                        q.admitted_workloads,
                    ]
                    for q in view.kueue
                    for r in q.quotas
                ],
            )
        )
        waiting = [[q.name, w] for q in view.kueue for w in q.pending]
        if waiting:
            parts.append(table(["CLUSTERQUEUE", "PENDING WORKLOAD"], waiting))
    else:
        parts.append("Kueue is installed; no ClusterQueue exists.")
    if view.queued:
        parts.append(
            table(
                ["NAMESPACE", "QUEUED JOB", "GPUS", "POSITION", "EXPECTED START", "BASIS"],
                [[q.namespace, q.name, q.gpus, q.position, q.expected_start, q.basis] for q in view.queued],
            )
        )
    return "\n\n".join(parts) + "\n"
