"""What `rocmtrain plan` shows: a job's memory plan per GPU in each phase, next to the memory of its GPUs (pure)."""

from __future__ import annotations

from typing import Any

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.api.quantity import parse_quantity
from rocmtrain.plan.fit import JobPlan, describe_setup, gib
from rocmtrain.plan.memory import FRAGMENTATION, RUNTIME_BYTES, MemoryPlan, Phase, PhasePlan, kv_cache_bytes
from rocmtrain.plan.setup import Precision, Setup, mixed_precision
from rocmtrain.views.table import table

DTYPES = {2: "bf16", 4: "fp32"}


def _gib(count: int) -> str:
    return gib(count).removesuffix(" GiB")


def _layout(setup: Setup) -> str:
    """A training micro-batch, in the job's layout (docs/guides/language-models.md#layouts-the-loss-and-compiling)."""
    budget = " (a token budget)" if setup.budget else ""
    if setup.varlen:
        kernel = "flash-attention's variable-length kernel" if setup.flash else "SDPA with a block-diagonal mask"
        return f"one flat row of up to {setup.sequence} tokens{budget}, padding-free ({kernel})"
    kind = "packed rows" if setup.packed else "padded records"
    return f"micro-batches of {setup.batch} x {setup.sequence} tokens{budget}, {kind}"


def _phases(job: RocmTrainingJob, plan: MemoryPlan) -> list[tuple[str, str]]:
    """What each phase runs, and the host's memory at load."""
    setup = plan.setup
    if setup.sharded:
        load = f"each rank fills its 1/{setup.shard_group} shard ({setup.weights_dtype}) from the safetensors files"
        held = "a read buffer per rank"
    else:
        where = "moves it to its GPU" if setup.on_gpu else "keeps it there"
        load = f"each rank loads the whole model ({setup.weights_dtype}) on its host and {where}"
        held = f"{setup.ranks_per_pod} whole model{'s' if setup.ranks_per_pod > 1 else ''}"
    memory = job.spec.resources.memory_per_worker
    over = "more than" if plan.host_load > parse_quantity(memory) else "of"
    host = f"the pod's host holds {gib(plan.host_load)} ({held}), {over} its {memory} memoryPerWorker"
    records = f"{setup.forward_pass.sequence} tokens"
    unpacked = ", padded" if setup.packed else ""
    rows = [
        (Phase.LOAD, f"{load}; {host}"),
        (Phase.STEP, f"{_layout(setup)}: forward, backward, AdamW's update"),
        (
            Phase.EVALUATION,
            f"micro-batches of {setup.eval_batch} x {records} (twice batchSizePerWorker{unpacked}): forward only",
        ),
    ]
    if setup.generation is not None:
        new = setup.generation.new_tokens
        rows.append(
            (
                Phase.GENERATION,
                f"{setup.generation_batch} prompts of up to {records} a call, {new} new tokens each: greedy, with a "
                "KV cache",
            )
        )
    shown = {p.phase for p in plan.phases}
    return [(phase.value, said) for phase, said in rows if phase in shown]


def _descriptions(planned: JobPlan) -> dict[str, str]:
    """What each term holds, by the name `PhasePlan.terms` gives it."""
    shape, setup = planned.shape, planned.plan.setup
    share = f"1/{setup.shard_group} of " if setup.sharded else ""
    dtype = setup.weights_dtype
    trains = "the adapter (fp32)" if setup.adapter is not None else f"every weight ({dtype})"
    weights = f"the model ({dtype}) and the adapter (fp32)" if setup.adapter is not None else f"every weight ({dtype})"
    compute = DTYPES[Precision.of(setup).compute]
    if setup.sharded:
        gathered = "bf16" if mixed_precision(setup) else dtype
        working = f"FSDP's gathered weights ({gathered}): embeddings, head and two blocks; in the step, their gradients"
        gradients = f"{share}{trains}; freed after each step"
    else:
        working = "autocast's bf16 copies of the fp32 weights"
        buckets = "; DDP's buckets, kept" if setup.world_size > 1 else "; freed after each step"
        gradients = f"{share}{trains}{buckets}"
    checkpointing = ", gradient checkpointing" if setup.checkpointing else ""
    generation = "; the last position's in generation" if setup.generation is not None else ""
    new = setup.generation.new_tokens if setup.generation is not None else 0
    cache = (
        f"2 x {shape.layers} layers x {shape.kv_heads} heads x {shape.head_dim} x ({setup.sequence} + {new}) tokens x "
        f"{setup.generation_batch} prompts ({DTYPES[kv_cache_bytes(shape, setup)]})"
    )
    return {
        "parameters": f"{share}{weights}",
        "readBuffer": f"the largest tensor's shard ({dtype}), as it is read",
        "gradients": gradients,
        "optimizer": f"AdamW's two moments: {share}{trains}",
        "working": working,
        "activations": f"the step's kept for its backward pass ({compute}{checkpointing}); else a block's at a time",
        "logits": f"of the activations: the {setup.loss} loss's logits, a chunk of tokens' at a time, and in the step "
        f"the hidden states' gradient{generation}"
        if setup.loss_kernel
        else "of the activations: the loss's fp32 logits, 12 bytes per token and vocabulary entry in the step, 10 "
        f"in evaluation{generation}",
        "kvCache": f"keys and values: {cache}",
        "margin": f"{FRAGMENTATION:.0%} fragmentation, {gib(RUNTIME_BYTES)} runtime",
    }


LABELS = {
    "parameters": "parameters",
    "readBuffer": "read buffer",
    "gradients": "gradients",
    "optimizer": "optimizer state",
    "working": "working copies",
    "activations": "activations",
    "logits": "  logits",
    "kvCache": "KV cache",
    "margin": "margin",
}


def _cells(phases: tuple[PhasePlan, ...], name: str) -> list[str | None]:
    values = [p.logits if name == "logits" else p.terms()[name] for p in phases]
    return [_gib(v) if v else None for v in values]


def _rows(planned: JobPlan) -> list[tuple[str | None, ...]]:
    plan, said = planned.plan, _descriptions(planned)
    names = [*plan.phases[0].terms()]
    names.insert(names.index("activations") + 1, "logits")
    rows: list[tuple[str | None, ...]] = []
    for name in names:
        cells = _cells(plan.phases, name)
        if any(cells):
            rows.append((LABELS[name], *cells, said[name]))
    rows.append(("total", *(_gib(p.total) for p in plan.phases), "per GPU"))
    return rows


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
    peak = f"peak:   the {plan.peak.phase.value}, {gib(plan.total)} per GPU"
    if not plan.setup.on_gpu:
        return [peak, "fits:   a CPU job has no GPU memory to fit"]
    if gpu is None:
        return [peak, "fits:   unknown: no GPU memory known (set spec.resources.gpu, or pass --nodes or --gpu)"]
    lines = [peak, f"GPU:    {gib(gpu.bytes)} ({gpu.source})"]
    if planned.fits:
        return [*lines, f"fits:   yes, {gib(gpu.bytes - plan.total)} to spare"]
    return [*lines, f"fits:   no: {planned.refusal()}"]


def plan_text(job: RocmTrainingJob, planned: JobPlan) -> str:
    """The plan as `rocmtrain plan` prints it: the job, what each phase runs, each phase's parts per GPU in GiB, the
    peak, the GPU and the verdict."""
    phases = table(("phase", "runs"), _phases(job, planned.plan))
    parts = table(("per GPU, GiB", *(p.phase.value for p in planned.plan.phases), "what"), _rows(planned))
    return "\n".join([*_header(job, planned), "", phases, "", parts, "", *_verdict(planned)]) + "\n"


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
            "evalMicroBatch": setup.eval_batch if setup.evaluation else None,
            "generationBatch": setup.generation_batch if setup.generation is not None else None,
            "sequenceLength": setup.sequence,
            "gradientCheckpointing": setup.checkpointing,
            "adapterRank": setup.adapter.rank if setup.adapter is not None else None,
        },
        "perGpuBytes": plan.total,
        "peakPhase": plan.peak.phase.value,
        "phases": {p.phase.value: {**p.terms(), "logits": p.logits, "total": p.total} for p in plan.phases},
        "hostLoadBytesPerPod": plan.host_load,
        "gpuMemory": {"bytes": gpu.bytes, "source": gpu.source} if gpu is not None else None,
        "fits": planned.fits,
        "changesThatFit": [{"change": c.description, "totalBytes": c.plan.total} for c in planned.changes],
    }
