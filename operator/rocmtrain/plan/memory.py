"""The memory plan: the bytes each GPU of a job needs in each phase of the job, from the model's config alone
(pure, no torch).

`plan_memory(shape, setup)` adds up what one rank holds at the peak of each phase the job runs, as the
training image allocates it (transformers 5, peft, PyTorch's AdamW, DDP or FSDP2). The job's peak is the
largest phase's, and that is what must fit a GPU:

- **load**: with `sharding: fsdp` each rank builds the model on the meta device, shards it, and fills its
  own shards from the safetensors files, reading only its slices: its share of the **parameters**, and a
  **read buffer** of one tensor's shard (the largest). With `sharding: none` each rank loads the whole model
  on its host and moves it to its GPU: all the **parameters**, before DDP's buckets exist. A worker pod's
  host holds a read buffer per rank, or a whole model per rank, at once (`MemoryPlan.host_load`).
- **step**, one micro-batch's forward and backward pass and AdamW's update. A micro-batch is
  batchSizePerWorker sequences of maxSeqLength tokens (padded records, or packed rows), or with
  `tokensPerWorker` as many as its tokens hold; a flat row (`varlen`) is one sequence of those records'
  tokens (batchSizePerWorker x maxSeqLength, or `tokensPerWorker`):
  - **parameters**: every weight, in the dtype the training image loads it in (`training_dtype`): float32
    master weights where they train, a LoRA adapter's frozen base in bfloat16 on GPUs with precision bf16;
    the adapter's matrices in float32 (peft upcasts them);
  - **gradients** of the weights that train, in their dtype (DDP's buckets are the gradients);
  - **optimizer state**: AdamW's two moments per trained weight, in its dtype, and a 4-byte step per tensor;
  - with `sharding: fsdp`, those three are each rank's shard: FSDP2 cuts every tensor along its first
    dimension into `shard group` pieces, padded to equal rows (`ceil(rows / group)` each);
  - **working copies**: FSDP2's gathered weights in the compute dtype (the root's embeddings, final norm
    and head for the whole step, and two blocks: one computing, one prefetched) and the unsharded gradients
    of the root and one block; or autocast's bfloat16 copies of float32 linear weights (kept from the
    forward to the backward pass);
  - **activations**: what autograd keeps for the backward pass (`activations.step_activations`), counted
    tensor by tensor from transformers' code for the Llama family (within 3% on CPU, see
    tests/train/test_memory_plan_measured.py), and in the same way, less exactly, for GPT-NeoX and GPT-2.
    SDPA keeps no sequence x sequence attention matrix (flash or memory-efficient kernels keep the output
    and a log-sum-exp per row); eager attention (`attentionImplementation: eager`) keeps its softmax's
    weights, heads x sequence² per row. SDPA's additive mask is sequence² per row, for a flat row of
    records (`attentionImplementation: varlen`) too, but on GPUs, where flash-attention's variable-length
    kernel needs none. Keys and values count at the full head count: with padding or
    packing transformers repeats them before SDPA (copies, but views of a single key/value head). Autocast
    casts as on GPUs: ops on CUDA's float32 list run in float32 (GPT-2's gelu_new from its pow on). Under
    an adapter the first block's input needs no gradient (the embeddings are frozen), so its first norm
    keeps nothing; the rest of that block is counted as kept, which errs a little high where the adapter
    targets no attention projection. With gradient checkpointing each block keeps only its input, and one
    block is recomputed at a time. The peak is the loss's backward (the final norm's and the head's inputs
    kept) or a block's (its output's gradient and its MLP's), whichever is larger;
  - **logits**, of the activations, by the loss kernel a causal LM gets (`training.lossImplementation`,
    `setup.planned_loss`: unset counts as chunked, the training image's pick without Liger):
    - model (the model's own head and loss): the loss upcasts the logits to float32 and keeps its
      log-softmax; in the backward pass its gradient and the log-softmax's make 12 bytes per token and
      vocabulary entry; the head keeps its input (autocast's cast of it) for its backward pass;
    - chunked: the head and the cross-entropy a chunk of tokens at a time (`activations.loss_chunk`, Liger's
      rule: about the hidden states' size of logits), gradients made in the forward pass: one chunk's float32
      logits (their softmax and gradient in their place) beside their compute-dtype copy, the hidden states'
      gradient, under autocast the head's cast (the loss's own, not autocast's: not among the working copies)
      and each chunk's compute-dtype share of a trained head's gradient; nothing kept for the backward
      pass but the final hidden states' gradient, so the peak may be the final RMSNorm's backward instead
      (`NORM_BACKWARD` float32 temporaries). The head's own gradient, made in the loss's forward pass here,
      is among the gradients;
    - fused (Liger's kernel, on GPUs with liger-kernel): the same, its chunk's logits in the compute dtype;
- **evaluation** (with `data.eval`): forward passes without autograd at twice the training micro-batch
  (`EVAL_BATCH_FACTOR`), never packed. The parameters and AdamW's state stay (and DDP's gradient buckets;
  FSDP2's sharded gradients are freed after each step); the **working copies** are a forward pass's (FSDP2's
  gathered root and two blocks, no gradients; autocast's cached casts of the float32 weights that train, and
  one frozen weight's cast at a time); the **activations** are one block's tensors at a time, or the final
  hidden states and the **logits**: with the model's loss the head's output, the loss's float32 upcast and
  its log-softmax, 10 bytes per token and vocabulary entry in bf16 (8 in fp32); with a loss kernel one
  chunk's, and the head's cast under autocast (`activations.forward_activations`);
- **generation** (with `evaluation.generate`): greedy `generate` calls with up to the evaluation's
  micro-batch of prompts (a rank's share of the records where that is fewer), holding what evaluation holds
  but for the logits, and a **KV cache** of 2 (keys and values) x layers x key/value heads x head_dim x
  (maxSeqLength + maxNewTokens) tokens x prompts, in the residual stream's dtype where rotary embeddings
  rotate the keys (float32 masters promote them, and the cache's values follow its keys), in the compute
  dtype otherwise; beside it the prefill's forward pass of the prompts (its logits at the last position only);
- **margin**, in each phase: the allocator's fragmentation (`FRAGMENTATION` of the rest) and what lives
  outside it, the HIP context, RCCL's buffers and the BLAS workspaces (`RUNTIME_BYTES`).

A phase's parts are summed as if all were held at once: in the step, gradients grow while activations are
freed, so its real peak is lower by up to the gradients; in generation, the cache counts at its full length
beside the prefill. The plan is per rank of the largest trial of a search.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum

from rocmtrain.plan.activations import forward_activations, step_activations
from rocmtrain.plan.gpu_memory import GIB
from rocmtrain.plan.model_shapes import ModelShape
from rocmtrain.plan.setup import Generation, Precision, Setup, Weight, held, mixed_precision, weights

# AdamW's `step`, one float32 tensor per parameter tensor (fused and capturable AdamW keep it on the device).
STEP_BYTES = 4
# Outside the plan's tensors: the caching allocator's fragmentation, and the runtime's own memory.
FRAGMENTATION = 0.10
RUNTIME_BYTES = 2 * GIB


class Phase(Enum):
    """What a job does, each with a peak of its own, in the order it does them."""

    LOAD = "load"
    STEP = "step"
    EVALUATION = "evaluation"
    GENERATION = "generation"


@dataclass(frozen=True)
class PhasePlan:
    """Bytes per GPU one phase holds at its peak, by what holds them (0 for what it does not hold)."""

    phase: Phase
    parameters: int
    buffer: int = 0  # the load's read buffer: one tensor's shard as it is read
    gradients: int = 0
    optimizer: int = 0
    working: int = 0
    activations: int = 0  # the logits included
    kv_cache: int = 0
    margin: int = 0
    logits: int = 0  # of the activations

    def terms(self) -> dict[str, int]:
        """The terms that add up to the total, by name (`rocmtrain plan -o json`'s keys)."""
        return {
            "parameters": self.parameters,
            "readBuffer": self.buffer,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "working": self.working,
            "activations": self.activations,
            "kvCache": self.kv_cache,
            "margin": self.margin,
        }

    @property
    def total(self) -> int:
        return sum(self.terms().values())

    def with_margin(self, on_gpu: bool) -> PhasePlan:
        """The plan with its margin: a tenth of the rest, and the runtime's (on GPUs only)."""
        rest = self.total - self.margin
        return replace(self, margin=math.ceil(rest * FRAGMENTATION) + RUNTIME_BYTES if on_gpu else 0)


@dataclass(frozen=True)
class MemoryPlan:
    """A job's bytes per GPU in each phase it runs, and the counts behind them."""

    phases: tuple[PhasePlan, ...]  # load and step, then evaluation and generation where the job runs them
    host_load: int  # bytes a worker pod's host holds while its ranks load the model
    total_parameters: int
    trainable_parameters: int
    setup: Setup

    @property
    def load(self) -> PhasePlan:
        """The load's plan: per GPU, or per rank's host on CPUs (see `host_load` for a pod's host)."""
        return next(p for p in self.phases if p.phase is Phase.LOAD)

    @property
    def step(self) -> PhasePlan:
        """The training step's plan."""
        return next(p for p in self.phases if p.phase is Phase.STEP)

    @property
    def peak(self) -> PhasePlan:
        """The phase that needs the most (the first of equals)."""
        return max(self.phases, key=lambda p: p.total)

    @property
    def total(self) -> int:
        """The job's peak per GPU: what must fit."""
        return self.peak.total


def _autocast_copies(setup: Setup, found: list[Weight], forward_only: bool) -> int:
    """Autocast's half-precision casts of float32 linear weights. In the step the linear layers keep them for the
    backward pass: a trained weight's once (autocast caches it), a frozen one's at each use (with gradient
    checkpointing, those of the root and the block being recomputed). In a `forward_only` pass autocast still caches
    the trained weights' casts (they require a gradient); a frozen one's lives for its use. A loss kernel casts the
    head's weights itself, for the loss's time only (`activations`)."""
    if not Precision.of(setup).autocast:
        return 0
    cast = [w for w in found if w.linear and w.size == 4 and not (setup.loss_kernel and w.block is None)]
    if forward_only:
        frozen = max((w.numel for w in cast if not w.trainable), default=0)
        return 2 * (sum(w.numel for w in cast if w.trainable) + frozen)
    kept = [w for w in cast if w.trainable or not setup.checkpointing or w.block in (None, 0)]
    return 2 * sum(w.numel for w in kept)


def _working(shape: ModelShape, setup: Setup, found: list[Weight], forward_only: bool = False) -> int:
    """Weights held beyond each rank's own, and in the step their gradients: FSDP2's gathered ones (the root's, and
    two blocks'), and autocast's copies."""
    copies = _autocast_copies(setup, found, forward_only)
    if not setup.sharded:
        return copies
    compute = 2 if mixed_precision(setup) else None

    def gathered(ws: Iterable[Weight], trainable_only: bool = False) -> int:
        return sum(w.numel * (compute or w.size) for w in ws if w.trainable or not trainable_only)

    root = [w for w in found if w.block is None]
    blocks = sorted((sum(gathered([w]) for w in found if w.block == b), b) for b in range(shape.layers))[-2:]
    largest = [w for w in found if w.block == blocks[-1][1]]
    weights_held = gathered(root) + sum(size for size, _ in blocks)
    gradients = 0 if forward_only else gathered(root, True) + gathered(largest, True)
    return weights_held + gradients + copies


def kv_cache_bytes(shape: ModelShape, setup: Setup) -> int:
    """Bytes per element of generation's KV cache: rotary leaves the keys in the residual stream's dtype (float32
    masters promote them), and the cache's values follow its keys; without rotary, the compute dtype."""
    p = Precision.of(setup)
    return p.stream if shape.rotary else p.compute


def _load(setup: Setup, found: list[Weight]) -> PhasePlan:
    """The load: the rank's parameters, and with FSDP a read buffer of the largest tensor's shard."""
    parameters = sum(held(w, setup) * w.size for w in found)
    buffer = max(held(w, setup) * w.size for w in found) if setup.sharded else 0
    return PhasePlan(Phase.LOAD, parameters=parameters, buffer=buffer)


def _between_steps(shape: ModelShape, setup: Setup, found: list[Weight], step: PhasePlan, phase: Phase) -> PhasePlan:
    """What a forward-only phase holds beside its pass: the step's parameters and AdamW's state, DDP's gradient
    buckets (FSDP2's sharded gradients are freed after each step), and a forward pass's working copies."""
    return PhasePlan(
        phase,
        parameters=step.parameters,
        gradients=step.gradients if not setup.sharded and setup.world_size > 1 else 0,
        optimizer=step.optimizer,
        working=_working(shape, setup, found, forward_only=True),
    )


def _evaluation(shape: ModelShape, setup: Setup, found: list[Weight], step: PhasePlan) -> PhasePlan:
    """Evaluation: forward passes of `eval_batch` sequences, with the loss over all their logits."""
    activations, logits = forward_activations(shape, setup.forward_pass, setup.eval_batch, prefill=False)
    return replace(_between_steps(shape, setup, found, step, Phase.EVALUATION), activations=activations, logits=logits)


def _generation(
    shape: ModelShape, setup: Setup, found: list[Weight], step: PhasePlan, generation: Generation
) -> PhasePlan:
    """Generation: the KV cache of `generation_batch` prompts of up to `sequence` tokens and their new tokens,
    beside the prompts' prefill."""
    rows, tokens = setup.generation_batch, setup.forward_pass.sequence + generation.new_tokens
    kv_cache = 2 * shape.layers * shape.kv_heads * shape.head_dim * tokens * rows * kv_cache_bytes(shape, setup)
    activations, logits = forward_activations(shape, setup.forward_pass, rows, prefill=True)
    resident = _between_steps(shape, setup, found, step, Phase.GENERATION)
    return replace(resident, kv_cache=kv_cache, activations=activations, logits=logits)


def plan_memory(shape: ModelShape, setup: Setup) -> MemoryPlan:
    """What one rank of the job needs at the peak of each phase, by part (see the module's docstring)."""
    found = weights(shape, setup)
    trained = [w for w in found if w.trainable]
    load = _load(setup, found)
    activations, logits = step_activations(shape, setup)
    step = PhasePlan(
        Phase.STEP,
        parameters=load.parameters,
        gradients=sum(held(w, setup) * w.size for w in trained),
        optimizer=sum(2 * held(w, setup) * w.size + STEP_BYTES for w in trained),
        working=_working(shape, setup, found),
        activations=activations,
        logits=logits,
    )
    phases = [load, step]
    if setup.evaluation:
        phases.append(_evaluation(shape, setup, found, step))
        if setup.generation is not None:
            phases.append(_generation(shape, setup, found, step, setup.generation))
    host_share = (load.buffer if setup.sharded else load.parameters) if setup.on_gpu else load.total
    return MemoryPlan(
        phases=tuple(p.with_margin(setup.on_gpu) for p in phases),
        host_load=setup.ranks_per_pod * host_share,
        total_parameters=sum(w.numel for w in found),
        trainable_parameters=sum(w.numel for w in trained),
        setup=setup,
    )
