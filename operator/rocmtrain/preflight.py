"""Pre-flight: can any node ever run this job's workers? (pure)

The operator keeps a small index of Nodes (allocatable `amd.com/gpu` and labels)
and asks, before it creates a RayJob, whether the workers could be placed at
all: enough GPUs on one node for one worker, nodes carrying the requested GPU
model and node selector, and enough such nodes for every worker. It checks
capacity (allocatable), not what is free right now: a job that does not fit an
empty cluster waits with `Unschedulable=True` until the nodes change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rocmtrain.api.models import RocmTrainingJobSpec
from rocmtrain.status import GPU_RESOURCE, Hold

# AMD GPU node-labeller labels behind ResourcesSpec.gpu.
GPU_LABELS = {
    "product_name": "amd.com/gpu.product-name",
    "family": "amd.com/gpu.family",
    "vram": "amd.com/gpu.vram",
}


@dataclass(frozen=True)
class NodeInfo:
    """What pre-flight needs to know about one schedulable node."""

    name: str
    gpus: int
    labels: Mapping[str, str] = field(default_factory=dict)


def _quantity_int(value: object) -> int:
    """An integer extended-resource quantity (`8`); 0 when absent or not a plain integer."""
    text = str(value) if value is not None else ""
    return int(text) if text.isdigit() else 0


def node_info(node: Mapping[str, Any]) -> NodeInfo | None:
    """The pre-flight view of a Node object; None for a node that takes no new pods."""
    metadata = node.get("metadata") or {}
    if (node.get("spec") or {}).get("unschedulable"):
        return None
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return NodeInfo(
        name=metadata.get("name", ""),
        gpus=_quantity_int(allocatable.get(GPU_RESOURCE)),
        labels=dict(metadata.get("labels") or {}),
    )


def _required_labels(spec: RocmTrainingJobSpec) -> dict[str, str]:
    required = dict(spec.scheduling.node_selector)
    gpu = spec.resources.gpu
    if gpu is not None:
        for attribute, label in GPU_LABELS.items():
            value = getattr(gpu, attribute)
            if value is not None:
                required[label] = value
    return required


def _describe(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(labels.items()))


def check(spec: RocmTrainingJobSpec, nodes: Iterable[NodeInfo]) -> Hold | None:
    """Why the job's workers can never be placed on `nodes`; None when they fit.

    Jobs without GPUs always pass: CPU and memory are left to the scheduler.
    """
    per_worker = spec.resources.gpus_per_worker
    if per_worker == 0:
        return None
    nodes = list(nodes)
    required = _required_labels(spec)
    matching = [n for n in nodes if all(n.labels.get(k) == v for k, v in required.items())]
    if required and not any(n.gpus for n in matching):
        models = sorted({n.labels[GPU_LABELS["product_name"]] for n in nodes if GPU_LABELS["product_name"] in n.labels})
        available = f" (GPU models on the nodes: {', '.join(models)})" if models else ""
        return Hold("GPUModelUnavailable", f"no node with {GPU_RESOURCE} has {_describe(required)}{available}")
    largest = max((n.gpus for n in matching), default=0)
    if largest < per_worker:
        where = "node" if not required else "matching node"
        return Hold(
            "InsufficientGPUs",
            f"needs {per_worker} {GPU_RESOURCE} per worker; the largest {where} has {largest}",
        )
    slots = sum(n.gpus // per_worker for n in matching)
    workers = spec.resources.workers
    if slots < workers:
        return Hold(
            "InsufficientGPUs",
            f"needs {workers} workers with {per_worker} {GPU_RESOURCE} each; "
            f"the nodes can hold only {slots} such workers",
        )
    return None
