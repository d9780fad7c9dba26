"""Pre-flight: can any node ever run this job's workers? (pure)

The operator keeps a small index of Nodes (allocatable `amd.com/gpu` and other extended
resources: the partitions of the device plugin's mixed naming such as `amd.com/cpx_nps4`,
RDMA NICs; and labels) and asks, before it creates a RayJob, whether the workers could be placed at
all: enough GPUs on one node for one worker, nodes carrying the requested GPU
model and node selector, and enough such nodes for every worker. It checks
capacity (allocatable), not what is free right now: a job that does not fit an
empty cluster waits with `Unschedulable=True` until the nodes change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rocmtrain.api.condition_reasons import Reason
from rocmtrain.api.contract import GPU_NODE_LABELS, GPU_RESOURCE
from rocmtrain.api.models import RocmTrainingJobSpec
from rocmtrain.api.quantity import device_count
from rocmtrain.plan.gpu_memory import GpuMemory, vram_label_bytes
from rocmtrain.status.hold import Hold, HoldKind


@dataclass(frozen=True)
class NodeInfo:
    """What pre-flight needs to know about one schedulable node."""

    name: str
    gpus: int
    labels: Mapping[str, str] = field(default_factory=dict)
    # Other allocatable extended resources, by name: partitions under the device plugin's mixed naming
    # (`amd.com/cpx_nps4`: 64), RDMA NICs (`rdma/rdma_shared_device_a`: 1000).
    extended: Mapping[str, int] = field(default_factory=dict)

    def devices(self, resource: str) -> int:
        """Allocatable devices of the extended resource `resource` (`amd.com/gpu`, a partition's, RDMA NICs)."""
        return self.gpus if resource == GPU_RESOURCE else self.extended.get(resource, 0)


def node_info(node: Mapping[str, Any]) -> NodeInfo | None:
    """The pre-flight view of a Node object; None for a node that takes no new pods."""
    metadata = node.get("metadata") or {}
    if (node.get("spec") or {}).get("unschedulable"):
        return None
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return NodeInfo(
        name=metadata.get("name", ""),
        gpus=device_count(allocatable.get(GPU_RESOURCE)),
        labels=dict(metadata.get("labels") or {}),
        extended={
            name: count
            for name, value in allocatable.items()
            if "/" in name and name != GPU_RESOURCE and (count := device_count(value))
        },
    )


def _required_labels(spec: RocmTrainingJobSpec) -> dict[str, str]:
    gpu = spec.resources.gpu
    return {**spec.scheduling.node_selector, **(gpu.node_labels() if gpu is not None else {})}


def _matching(spec: RocmTrainingJobSpec, nodes: Iterable[NodeInfo]) -> list[NodeInfo]:
    """The nodes with the job's kind of GPU that carry its node selector and GPU model labels."""
    required, resource = _required_labels(spec), spec.resources.gpu_resource
    return [n for n in nodes if n.devices(resource) and all(n.labels.get(k) == v for k, v in required.items())]


def gpu_memory(spec: RocmTrainingJobSpec, nodes: Iterable[NodeInfo]) -> GpuMemory | None:
    """The memory of one GPU where the job's workers can run: the smallest `amd.com/gpu.vram` of the matching nodes
    with GPUs; None where none of them carries the label (the memory plan then uses the job's GPU model)."""
    label = GPU_NODE_LABELS["vram"]
    found = [
        (size, node)
        for node in _matching(spec, nodes)
        if (size := vram_label_bytes(node.labels.get(label, ""))) is not None
    ]
    if not found:
        return None
    size, node = min(found, key=lambda pair: (pair[0], pair[1].name))
    return GpuMemory(size, f"{label} {node.labels[label]} on node {node.name}")


def _describe(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(labels.items()))


def _unschedulable(reason: str, message: str) -> Hold:
    return Hold(HoldKind.UNSCHEDULABLE, reason, message)


def check(spec: RocmTrainingJobSpec, nodes: Iterable[NodeInfo]) -> Hold | None:
    """Why the job's workers can never be placed on `nodes`; None when they fit.

    Jobs without GPUs always pass: CPU and memory are left to the scheduler.
    """
    per_worker, resource = spec.resources.gpus_per_worker, spec.resources.gpu_resource
    if per_worker == 0:
        return None
    nodes = list(nodes)
    required = _required_labels(spec)
    matching = _matching(spec, nodes)
    if required and not matching:
        product = GPU_NODE_LABELS["product_name"]
        models = sorted({n.labels[product] for n in nodes if product in n.labels})
        available = f" (GPU models on the nodes: {', '.join(models)})" if models else ""
        return _unschedulable(
            Reason.GPU_MODEL_UNAVAILABLE, f"no node with {resource} has {_describe(required)}{available}"
        )
    largest = max((n.devices(resource) for n in matching), default=0)
    if largest < per_worker:
        where = "node" if not required else "matching node"
        return _unschedulable(
            Reason.INSUFFICIENT_GPUS, f"needs {per_worker} {resource} per worker; the largest {where} has {largest}"
        )
    network = spec.resources.network
    rdma = (network.rdma_resource, network.rdma_per_worker) if network and network.rdma_resource else None
    if rdma is not None:
        largest_rdma = max((n.devices(rdma[0]) for n in matching), default=0)
        if largest_rdma < rdma[1]:
            return _unschedulable(
                Reason.INSUFFICIENT_GPUS,
                f"needs {rdma[1]} {rdma[0]} per worker; the largest node with its GPUs has {largest_rdma}",
            )
    need = dict([(resource, per_worker), *([rdma] if rdma else [])])  # per worker, by resource
    slots = sum(min(n.devices(name) // count for name, count in need.items()) for n in matching)
    workers = spec.worker_pods
    if slots < workers:
        trials = (
            f" ({spec.resources.workers} for each of {spec.concurrent_runs} concurrent trials)"
            if spec.tuning is not None
            else ""
        )
        return _unschedulable(
            Reason.INSUFFICIENT_GPUS,
            f"needs {workers} workers{trials} with {per_worker} {resource} each; "
            f"the nodes can hold only {slots} such workers",
        )
    return None
