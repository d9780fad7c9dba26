"""Whether a job fits its GPUs, and if not, the cheapest changes with which it would (pure).

`plan_job(spec, config, gpu)` plans the job (`memory`) against the memory of one of its GPUs
(`gpu_memory`): its peak, the largest of its phases' (load, training step, evaluation, generation), must
fit. A job that does not fit is offered the changes that would make it fit, cheapest first: those that
keep what it trains before an adapter, which trains something else:

1. `sharding: fsdp` within each pod (the all-gathers stay on the node's xGMI links);
2. `gradientCheckpointing` (about a third more compute);
3. `fsdp` over every rank of the job (`shardingScope: job`: all-gathers across nodes);
4. a smaller `batchSizePerWorker`, with as many more gradient accumulation steps (the same global batch);
5. a LoRA adapter (`spec.adapter`, causal-lm): only the adapter trains.

One change where one suffices, else two, else all together (and a smaller micro-batch).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from rocmtrain.api.models import AdapterSpec, RocmTrainingJobSpec
from rocmtrain.api.ranks import shard_group
from rocmtrain.plan.gpu_memory import GIB, GpuMemory
from rocmtrain.plan.memory import MemoryPlan, plan_memory
from rocmtrain.plan.model_shapes import ModelShape, model_shape
from rocmtrain.plan.setup import Setup


@dataclass(frozen=True)
class Change:
    """A change to the job, and its plan."""

    description: str
    plan: MemoryPlan


def _single_changes(setup: Setup) -> Iterator[tuple[str, Setup]]:
    """Changes to the job, the ones that keep what it trains first, cheapest first."""
    world = setup.world_size
    pod = shard_group(world, setup.ranks_per_pod, "pod")
    if not setup.sharded and world > 1:
        yield f"fsdp over {pod} GPUs", replace(setup, shard_group=pod)
    if not setup.checkpointing:
        yield "gradientCheckpointing", replace(setup, checkpointing=True)
    if setup.shard_group < world and world > 1 and pod < world:
        yield f"fsdp over all {world} GPUs (shardingScope: job)", replace(setup, shard_group=world)
    if setup.adapter is None and setup.task == "causal-lm":
        yield "a LoRA adapter", replace(setup, adapter=AdapterSpec())


def _smaller_batch(shape: ModelShape, setup: Setup, fits: int) -> Change | None:
    """The largest smaller micro-batch that fits (gradient accumulation keeps the global batch): half the records
    or rows, or of a flat row half its tokens (it still holds a record of maxSeqLength)."""
    if setup.varlen:
        least = setup.max_length or setup.sequence  # a flat row still holds one record of maxSeqLength
        halves = (setup.sequence >> i for i in range(1, setup.sequence.bit_length()))
        smaller = [replace(setup, budget=True, sequence=tokens) for tokens in halves if tokens >= least]
    else:
        smaller = [replace(setup, batch=setup.batch >> i) for i in range(1, setup.batch.bit_length())]
    for changed in smaller:
        plan = plan_memory(shape, changed)
        if plan.total <= fits:
            factor = math.ceil(setup.batch * setup.sequence / (changed.batch * changed.sequence))
            size = (
                f"tokensPerWorker {changed.batch * changed.sequence}"
                if changed.budget
                else f"batchSizePerWorker {changed.batch}"
            )
            return Change(f"{size} and {factor}x gradientAccumulationSteps", plan)
    return None


def changes_that_fit(shape: ModelShape, setup: Setup, gpu_bytes: int) -> list[Change]:
    """The changes with which the job fits `gpu_bytes` per GPU, cheapest first: one change where one suffices,
    else two, else all of them together."""
    singles = list(_single_changes(setup))
    found = [Change(d, p) for d, s in singles if (p := plan_memory(shape, s)).total <= gpu_bytes]
    if (smaller := _smaller_batch(shape, setup, gpu_bytes)) is not None:
        found.insert(min(len(found), 2), smaller)
    if found:
        return found
    for i, (first, one) in enumerate(singles):
        for second, two in singles[i + 1 :]:
            both = _merge(setup, one, two)
            if (plan := plan_memory(shape, both)).total <= gpu_bytes:
                found.append(Change(f"{first} and {second}", plan))
    if found or not singles:
        return found
    everything = setup
    for _, changed in singles:
        everything = _merge(setup, everything, changed)
    plan = plan_memory(shape, everything)
    together = " and ".join(d for d, _ in singles)
    if plan.total <= gpu_bytes:
        return [Change(together, plan)]
    smaller = _smaller_batch(shape, everything, gpu_bytes)
    return [Change(f"{together} and {smaller.description}", smaller.plan)] if smaller else []


def _merge(base: Setup, one: Setup, two: Setup) -> Setup:
    """`one` with what `two` changed from `base`."""
    changed = {
        name: getattr(two, name)
        for name in ("shard_group", "checkpointing", "adapter", "batch")
        if getattr(two, name) != getattr(base, name)
    }
    if "shard_group" in changed:
        changed["shard_group"] = max(changed["shard_group"], one.shard_group)
    return replace(one, **changed)


def gib(count: int) -> str:
    """Bytes in GiB, as the plan writes them."""
    return f"{count / GIB:.1f} GiB"


def describe_setup(setup: Setup) -> str:
    """How the plan's job trains: sharding, and an adapter."""
    sharding = f"fsdp over {setup.shard_group} GPUs" if setup.sharded else "sharding none"
    return f"{sharding}, {'a LoRA adapter' if setup.adapter is not None else 'full fine-tuning'}"


def describe_phases(plan: MemoryPlan) -> str:
    """Which phase sets the peak, and each phase's bytes per GPU."""
    each = ", ".join(f"{p.phase.value} {p.total / GIB:.1f}" for p in plan.phases)
    return f"the peak is the {plan.peak.phase.value} ({each} GiB)"


def refusal(plan: MemoryPlan, gpu: GpuMemory, changes: list[Change]) -> str:
    """Why a job does not fit its GPUs, and the cheapest changes that would make it fit."""
    said = (
        f"needs {gib(plan.total)} per GPU with {describe_setup(plan.setup)}, but a GPU has {gib(gpu.bytes)} "
        f"({gpu.source})"
    )
    if not changes:
        why = f"{said}; no change of sharding, adapter, gradient checkpointing or batch size fits: use larger GPUs"
    else:
        why = f"{said}; fits with " + " or with ".join(f"{c.description} ({gib(c.plan.total)})" for c in changes[:3])
    return f"{why}; {describe_phases(plan)}"


@dataclass(frozen=True)
class JobPlan:
    """A job's memory plan, against the memory of one of its GPUs where known."""

    plan: MemoryPlan
    shape: ModelShape
    gpu: GpuMemory | None
    changes: list[Change]  # with which it would fit, where it does not

    @property
    def fits(self) -> bool | None:
        """Whether the job fits its GPUs; None where their memory is not known (or the job has none)."""
        return None if self.gpu is None else self.plan.total <= self.gpu.bytes

    def summary(self) -> str:
        """One line: the bytes per GPU, how the job trains, and the GPU's memory where known."""
        said = f"{gib(self.plan.total)} per GPU with {describe_setup(self.plan.setup)}, {describe_phases(self.plan)}"
        return f"{said}; a GPU has {gib(self.gpu.bytes)} ({self.gpu.source})" if self.gpu else said

    def refusal(self) -> str | None:
        """Why the job does not fit, and what would; None where it fits or cannot tell."""
        return None if self.gpu is None or self.fits is not False else refusal(self.plan, self.gpu, self.changes)


def plan_job(spec: RocmTrainingJobSpec, config: Mapping[str, Any], gpu: GpuMemory | None) -> JobPlan:
    """The plan of a job from its model's config (a config.json's object); ModelConfigError where the plan
    cannot read the config. A job without GPUs is planned but has no GPU memory to fit."""
    labels = spec.model.num_labels or 1
    shape = model_shape(config, task=spec.model.task, labels=labels)
    setup = Setup.of(spec)
    plan = plan_memory(shape, setup)
    gpu = gpu if setup.on_gpu else None
    if gpu is None or plan.total <= gpu.bytes:
        return JobPlan(plan, shape, gpu, [])
    return JobPlan(plan, shape, gpu, changes_that_fit(shape, setup, gpu.bytes))
