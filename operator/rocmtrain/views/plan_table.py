"""What `rocmtrain plan` shows: a job's memory plan per GPU, next to the memory of its GPUs (pure)."""

from __future__ import annotations

from typing import Any

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.plan.fit import JobPlan, describe_setup, gib
from rocmtrain.plan.memory import FRAGMENTATION, RUNTIME_BYTES, Precision, mixed_precision
from rocmtrain.views.table import table

DTYPES = {2: "bf16", 4: "fp32"}


def _gib(count: int) -> str:
    return gib(count).removesuffix(" GiB")


def _rows(planned: JobPlan) -> list[tuple[str, str, str]]:
    plan, setup = planned.plan, planned.plan.setup
    share = f"1/{setup.shard_group} of " if setup.sharded else ""
    dtype = setup.weights_dtype
    trains = "the adapter (fp32)" if setup.adapter is not None else f"every weight ({dtype})"
    weights = f"the model ({dtype}) and the adapter (fp32)" if setup.adapter is not None else "every weight"
    if setup.sharded:
        gathered = "bf16" if mixed_precision(setup) else dtype
        working = f"FSDP's gathered weights ({gathered}): embeddings, head and two blocks; their gradients"
    else:
        working = "autocast's bf16 copies of the fp32 weights" if plan.working else "-"
    checkpointing = ", one block at a time (gradient checkpointing)" if setup.checkpointing else ""
    return [
        ("parameters", _gib(plan.parameters), f"{share}{weights}" + ("" if setup.adapter else f" ({dtype})")),
        ("gradients", _gib(plan.gradients), f"{share}{trains}"),
        ("optimizer state", _gib(plan.optimizer), f"AdamW's two moments: {share}{trains}"),
        ("working copies", _gib(plan.working), working),
        (
            "activations",
            _gib(plan.activations),
            f"{DTYPES[Precision.of(setup).compute]}{checkpointing}; the loss's logits {_gib(plan.logits)}",
        ),
        (
            "margin",
            _gib(plan.margin),
            f"{FRAGMENTATION:.0%} fragmentation, {gib(RUNTIME_BYTES)} runtime" if plan.margin else "-",
        ),
        ("total", _gib(plan.total), "per GPU"),
    ]


def _header(job: RocmTrainingJob, planned: JobPlan) -> list[str]:
    plan, shape, setup = planned.plan, planned.shape, planned.plan.setup
    adapter = f", a LoRA adapter of rank {setup.adapter.rank}" if setup.adapter is not None else ""
    resources = job.spec.resources
    ranks = f"{resources.workers} x {resources.gpus_per_worker} GPUs" if setup.on_gpu else "on CPUs"
    return [
        f"job:    {job.metadata.name}",
        f"model:  {shape.model_type}, {plan.total_parameters:,} parameters (saved as {shape.dtype}, trained from "
        f"{setup.weights_dtype}), "
        f"{plan.trainable_parameters:,} train{adapter}",
        f"ranks:  {setup.world_size} ({ranks}), {describe_setup(setup)}, {setup.precision}, "
        f"micro-batch {setup.batch} x {setup.sequence} tokens",
    ]


def _verdict(planned: JobPlan) -> list[str]:
    plan, gpu = planned.plan, planned.gpu
    if not plan.setup.on_gpu:
        return ["fits:   a CPU job has no GPU memory to fit"]
    if gpu is None:
        return ["fits:   unknown: no GPU memory known (set spec.resources.gpu, or pass --nodes or --gpu)"]
    lines = [f"GPU:    {gib(gpu.bytes)} ({gpu.source})"]
    if planned.fits:
        return [*lines, f"fits:   yes, {gib(gpu.bytes - plan.total)} to spare"]
    return [*lines, f"fits:   no: {planned.refusal()}"]


def plan_text(job: RocmTrainingJob, planned: JobPlan) -> str:
    """The plan as `rocmtrain plan` prints it: the job, the parts per GPU in GiB, the GPU and the verdict."""
    parts = table(("per GPU", "GiB", "what"), _rows(planned))
    return "\n".join([*_header(job, planned), "", parts, "", *_verdict(planned)]) + "\n"


def plan_json(job: RocmTrainingJob, planned: JobPlan) -> dict[str, Any]:
    """The plan as `rocmtrain plan -o json` writes it (bytes)."""
    plan, setup, gpu = planned.plan, planned.plan.setup, planned.gpu
    return {
        "job": job.metadata.name,
        "namespace": job.metadata.namespace,
        "model": {
            "type": planned.shape.model_type,
            "dtype": planned.shape.dtype,
            "trainingDtype": plan.setup.weights_dtype,
            "parameters": plan.total_parameters,
            "trainableParameters": plan.trainable_parameters,
        },
        "ranks": {
            "worldSize": setup.world_size,
            "shardGroup": setup.shard_group,
            "onGpu": setup.on_gpu,
            "precision": setup.precision,
            "microBatch": setup.batch,
            "sequenceLength": setup.sequence,
            "gradientCheckpointing": setup.checkpointing,
            "adapterRank": setup.adapter.rank if setup.adapter is not None else None,
        },
        "perGpuBytes": plan.parts(),
        "gpuMemory": {"bytes": gpu.bytes, "source": gpu.source} if gpu is not None else None,
        "fits": planned.fits,
        "changesThatFit": [{"change": c.description, "totalBytes": c.plan.total} for c in planned.changes],
    }
