"""How much memory one GPU of a job has: from the AMD node labeller's label, or from a table of AMD Instinct models.

One `amd.com/gpu` is what the device plugin hands a pod: a whole GPU, one GCD of an MI250/MI250X, or
a partition where the node's GPUs are partitioned (CPX, NPS4). Sources, best first:

1. the AMD GPU node labeller's `amd.com/gpu.vram` on the nodes the job can run on (`rocmtrain plan
   --nodes`, the operator's node index): the memory of one device as the kernel reports it, partitions
   included, written `<GiB>G` (ROCm/k8s-device-plugin, cmd/k8s-node-labeller: KFD's `size_in_bytes`
   rounded to whole GiB);
2. the job's own `resources.gpu.vram` selector: the job only runs on nodes with that label;
3. `resources.gpu.productName`, looked up in `INSTINCT_GIB`: AMD's data sheets, for unpartitioned GPUs;
   with `resources.gpu.partition`, a partition's equal share of it (CPX: an eighth).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rocmtrain.api.contract import partitions_per_gpu
from rocmtrain.api.models import RocmTrainingJobSpec

GIB = 1 << 30
# HBM per `amd.com/gpu` of each AMD Instinct model, in GiB (AMD's "GB" of HBM are GiB), from AMD's Instinct
# data sheets (amd.com/en/products/accelerators/instinct). MI250X and MI250 are two GCDs of 64 GiB each, and
# the device plugin exposes each GCD as one GPU; the MI300A's 128 GiB are shared with its CPU cores.
INSTINCT_GIB = {
    "MI355X": 288,
    "MI350X": 288,
    "MI325X": 256,
    "MI300X": 192,
    "MI300A": 128,
    "MI250X": 64,
    "MI250": 64,
    "MI210": 64,
    "MI100": 32,
}
# The model in a product name label: AMD_Instinct_MI300X_OAM -> MI300X.
_MODEL = re.compile(r"MI\d{3}[A-Z]?", re.IGNORECASE)
# The labeller's value: whole GiB and a G.
_VRAM = re.compile(r"^([0-9]{1,6})G$")


@dataclass(frozen=True)
class GpuMemory:
    """The memory of one GPU, and where that number comes from."""

    bytes: int
    source: str


def vram_label_bytes(value: str) -> int | None:
    """The bytes an `amd.com/gpu.vram` value (`192G`) stands for; None for a value not in the labeller's form."""
    found = _VRAM.match(value)
    return int(found.group(1)) * GIB if found and int(found.group(1)) else None


def product_gib(product_name: str) -> int | None:
    """The table's GiB for a product name (`AMD_Instinct_MI300X_OAM`, `MI250X`); None for a model not in it."""
    found = _MODEL.search(product_name)
    return INSTINCT_GIB.get(found.group(0).upper()) if found else None


def job_gpu_memory(spec: RocmTrainingJobSpec) -> GpuMemory | None:
    """The memory of one of the job's GPUs from its own GPU selector (vram, else the product's table entry)."""
    gpu = spec.resources.gpu
    if gpu is None or spec.resources.gpus_per_worker == 0:
        return None
    if gpu.vram is not None and (found := vram_label_bytes(gpu.vram)) is not None:
        return GpuMemory(found, f"spec.resources.gpu.vram {gpu.vram}")
    if gpu.product_name is not None and (whole := table_gpu_memory(gpu.product_name)) is not None:
        if (parts := partitions_per_gpu(gpu.partition)) > 1:  # the partitions share the GPU's memory
            return GpuMemory(whole.bytes // parts, f"{whole.source}, a {gpu.partition} partition's 1/{parts} share")
        return whole
    return None


def table_gpu_memory(product_name: str) -> GpuMemory | None:
    """The memory of one GPU of a product (`AMD_Instinct_MI300X_OAM`, `MI250X`) from the table; None if not in it."""
    gib = product_gib(product_name)
    return None if gib is None else GpuMemory(gib * GIB, f"{product_name}, AMD's data sheet")
