"""The memory plan: the bytes each GPU of a job needs, from the model's config alone (pure, no torch).

`plan_memory(shape, setup)` adds up what one rank holds at its peak, the start of a backward pass,
as the training image allocates it (transformers 5, peft, PyTorch's AdamW, DDP or FSDP2):

- **parameters**: every weight, in the dtype the training image loads it in (`training_dtype`): float32
  master weights where they train, a LoRA adapter's frozen base in bfloat16 on GPUs with precision bf16;
  the adapter's matrices in float32 (peft upcasts them);
- **gradients** of the weights that train, in their dtype (DDP's buckets are the gradients);
- **optimizer state**: AdamW's two moments per trained weight, in its dtype, and a 4-byte step per tensor;
- with `sharding: fsdp`, those three are each rank's shard: FSDP2 cuts every tensor along its first
  dimension into `shard group` pieces, padded to equal rows (`ceil(rows / group)` each);
- **working copies**: FSDP2's gathered weights in the compute dtype (the root's embeddings, final norm and
  head for the whole step, and two blocks: one computing, one prefetched) and the unsharded gradients of
  the root and one block; or autocast's bfloat16 copies of float32 linear weights (kept from the forward
  to the backward pass);
- **activations**: what autograd keeps for the backward pass, counted tensor by tensor from
  transformers' code for the Llama family (within 3% on CPU, see tests/train/test_memory_plan.py),
  and in the same way, less exactly, for GPT-NeoX and GPT-2. SDPA keeps no sequence x sequence
  attention matrix (flash or memory-efficient kernels keep the output and a log-sum-exp per row); eager
  attention (`attentionImplementation: eager`) keeps its softmax's weights, heads x sequence² per row.
  Keys and values count at the full head count: with padding or packing transformers repeats them
  before SDPA (copies, but views of a single key/value head). Every block is counted as if its input
  needed a gradient: with a frozen base the first one's does not, and keeps less (GPT-NeoX's first MLP,
  a parallel branch, nothing), so an adapter's plan errs a little high for models of few blocks. With
  gradient checkpointing each block keeps only its input, and one block is recomputed at a time;
- **logits**: the loss upcasts the logits to float32 and keeps its log-softmax; in the backward pass its
  gradient and the log-softmax's make 12 bytes per token and vocabulary entry, before any block's;
- **margin**: the allocator's fragmentation (`FRAGMENTATION` of the rest) and what lives outside it, the
  HIP context, RCCL's buffers and the BLAS workspaces (`RUNTIME_BYTES`).

The parts are summed as if all were held at once: gradients grow while activations are freed, so the
real peak is lower by up to the gradients. The plan is per rank of the largest trial of a search.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from rocmtrain.api.gpu_memory import GIB
from rocmtrain.api.model_shapes import DTYPE_BYTES, Linear, ModelConfigError, ModelShape, training_dtype
from rocmtrain.api.models import AdapterSpec, RocmTrainingJobSpec
from rocmtrain.api.ranks import shard_group

# peft keeps LoRA's matrices in float32 even on a bfloat16 model (`autocast_adapter_dtype`).
ADAPTER_BYTES = 4
# AdamW's `step`, one float32 tensor per parameter tensor (fused and capturable AdamW keep it on the device).
STEP_BYTES = 4
# The loss: float32 logits' log-softmax (kept), the gradient of the loss and of the log-softmax (backward).
LOGIT_BYTES = 12
# Gradients of a block's MLP activations alive at once in its backward pass (of the down projection's input,
# and from it of both of its factors), in intermediate_size units per token.
BACKWARD_GRADIENTS = 3
# Outside the plan's tensors: the caching allocator's fragmentation, and the runtime's own memory.
FRAGMENTATION = 0.10
RUNTIME_BYTES = 2 * GIB
# peft's default LoRA targets by model type (its TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
DEFAULT_TARGETS = {
    "llama": ("q_proj", "v_proj"),
    "mistral": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"),
    "gpt_neox": ("query_key_value",),
    "gpt2": ("c_attn",),
}
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class Setup:
    """How a job trains, as far as memory goes: one rank's view."""

    on_gpu: bool
    precision: str  # autocast precision on GPUs: fp32, bf16, fp16
    world_size: int
    shard_group: int  # ranks sharing one copy of the model: 1 without sharding
    adapter: AdapterSpec | None
    batch: int  # sequences per micro-batch per rank
    sequence: int  # tokens per sequence (maxSeqLength: the longest a batch pads to)
    checkpointing: bool
    task: str
    eager: bool = False  # attention in the model's own code, not SDPA: it keeps its sequence x sequence weights

    @property
    def sharded(self) -> bool:
        return self.shard_group > 1

    @property
    def weights_dtype(self) -> str:
        """The dtype the model's weights load in (the training image's rule, whatever the config saved)."""
        return training_dtype(adapter=self.adapter is not None, on_gpu=self.on_gpu, precision=self.precision)

    @property
    def weights_bytes(self) -> int:
        return DTYPE_BYTES[self.weights_dtype]

    @classmethod
    def of(cls, spec: RocmTrainingJobSpec) -> Setup:
        """The setup of a job (its largest trial, for a search)."""
        resources, training = spec.resources, spec.training
        ranks_per_pod = max(resources.gpus_per_worker, 1)
        world = resources.workers * ranks_per_pod
        space = spec.tuning.search_space if spec.tuning is not None else None
        adapter = spec.adapter
        if adapter is not None and space is not None and space.adapter_rank:
            adapter = adapter.model_copy(update={"rank": max([adapter.rank, *space.adapter_rank])})
        batches = space.batch_size_per_worker if space is not None and space.batch_size_per_worker else []
        return cls(
            on_gpu=resources.gpus_per_worker > 0,
            precision=training.precision,
            world_size=world,
            shard_group=shard_group(world, ranks_per_pod, training.sharding_scope)
            if training.sharding == "fsdp"
            else 1,
            adapter=adapter,
            batch=max([training.batch_size_per_worker, *batches]),
            sequence=spec.model.max_seq_length,
            checkpointing=training.gradient_checkpointing,
            task=spec.model.task,
            eager=training.attention_implementation == "eager",
        )


@dataclass(frozen=True)
class Weight:
    """One weight tensor as a rank holds it."""

    shape: tuple[int, ...]
    size: int  # bytes per element
    trainable: bool
    block: int | None  # its transformer block; None for the embeddings, the final norm and the head
    linear: bool = False  # the weight of a linear layer (what autocast casts)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def shard(self, group: int) -> int:
        """Elements of one rank's FSDP2 shard: the first dimension cut into `group` equal, padded pieces."""
        return math.ceil(self.shape[0] / group) * math.prod(self.shape[1:])


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU by what holds them, and the counts behind them."""

    parameters: int
    gradients: int
    optimizer: int
    working: int
    activations: int  # logits included
    logits: int
    margin: int
    total_parameters: int
    trainable_parameters: int
    setup: Setup

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.working + self.activations + self.margin

    def parts(self) -> dict[str, int]:
        """The parts by name (`total` last), as `rocmtrain plan -o json` writes them."""
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "working": self.working,
            "activations": self.activations,
            "logits": self.logits,
            "margin": self.margin,
            "total": self.total,
        }


def _matches(path: str, name: str) -> bool:
    return path == name or path.endswith("." + name)


def adapted(shape: ModelShape, adapter: AdapterSpec) -> list[tuple[int, Linear]]:
    """(block, layer) of every linear layer the adapter targets, matched as peft and the training image match."""
    names = adapter.target_modules or list(DEFAULT_TARGETS.get(shape.model_type, (ALL_LINEAR,)))
    found = [
        (index // len(shape.linears), linear)
        for index, (path, linear) in enumerate(shape.linear_paths())
        if names == [ALL_LINEAR] or any(_matches(path, name) for name in names)
    ]
    if missing := [n for n in names if n != ALL_LINEAR and not any(_matches(p, n) for p, _ in shape.linear_paths())]:
        linear = sorted({linear.path.rsplit(".", 1)[-1] for linear in shape.linears})
        raise ModelConfigError(
            f"spec.adapter.targetModules: {', '.join(missing)} match no linear module of the model; its linear "
            f"modules are {', '.join(linear)} (or use all-linear)"
        )
    return found


def weights(shape: ModelShape, setup: Setup) -> list[Weight]:
    """Every weight tensor one rank trains with, before sharding: the model's, and an adapter's."""
    size, full = setup.weights_bytes, setup.adapter is None
    found = [Weight(t, size, full, None) for t in shape.root]
    for block in range(shape.layers):
        for linear in shape.linears:
            found += [Weight(t, size, full, block, linear=len(t) == 2) for t in linear.tensors]
        found += [Weight(t, size, full, block) for t in shape.block_vectors]
    found += [Weight(t, size, full, None, linear=True) for t in shape.head]
    if setup.adapter is not None:
        rank = setup.adapter.rank
        for block, linear in adapted(shape, setup.adapter):
            found += [
                Weight((rank, linear.inputs), ADAPTER_BYTES, True, block, linear=True),
                Weight((linear.outputs, rank), ADAPTER_BYTES, True, block, linear=True),
            ]
    return found


def _held(weight: Weight, setup: Setup) -> int:
    """Elements of `weight` this rank keeps between steps: its shard, or all of it."""
    return weight.shard(setup.shard_group) if setup.sharded else weight.numel


def compute_bytes(shape: ModelShape, setup: Setup) -> int:
    """Bytes per element of the activations: bfloat16/float16 where the weights or autocast are, else float32."""
    return 2 if setup.weights_bytes == 2 or (setup.on_gpu and setup.precision != "fp32") else 4


def mixed_precision(setup: Setup) -> bool:
    """FSDP2 computes in bfloat16 itself (a MixedPrecisionPolicy) in place of autocast: bf16 on GPUs."""
    return setup.sharded and setup.on_gpu and setup.precision == "bf16"


def autocast_copies(shape: ModelShape, setup: Setup) -> bool:
    """Whether autocast casts float32 weights to half precision (and keeps the casts)."""
    return setup.on_gpu and setup.precision != "fp32" and setup.weights_bytes == 4 and not mixed_precision(setup)


def _working(shape: ModelShape, setup: Setup, found: list[Weight]) -> int:
    """Weights and gradients held beyond each rank's own: FSDP2's gathered ones, or autocast's copies."""
    if setup.sharded:
        compute = 2 if mixed_precision(setup) else None

        def gathered(ws: Iterable[Weight], trainable_only: bool = False) -> int:
            return sum(w.numel * (compute or w.size) for w in ws if w.trainable or not trainable_only)

        root = [w for w in found if w.block is None]
        blocks = sorted((sum(gathered([w]) for w in found if w.block == b), b) for b in range(shape.layers))[-2:]
        largest = [w for w in found if w.block == blocks[-1][1]]
        return gathered(root) + sum(size for size, _ in blocks) + gathered(root, True) + gathered(largest, True)
    if not autocast_copies(shape, setup):
        return 0
    trained = sum(w.numel for w in found if w.linear and w.trainable)
    frozen = [w for w in found if w.linear and not w.trainable]
    kept = frozen if not setup.checkpointing else [w for w in frozen if w.block in (None, 0)]
    return 2 * (trained + sum(w.numel for w in kept))


@dataclass(frozen=True)
class _Activations:
    """The activations of one block, of the rest of the model, and the logits' share."""

    block: list[int]  # per block
    model: int
    logits: int


def _norm(shape: ModelShape, setup: Setup, dim: int, consumers: int, weight_trains: bool, saved_by: bool) -> int:
    """What a norm and its output keep, per token: RMSNorm its float32 input and 1/rms (and the normalised input
    for its weight's gradient), LayerNorm its input, mean and 1/std; a trained consumer keeps the output
    (autocast: a half-precision cast per consumer)."""
    e = compute_bytes(shape, setup)
    residual = 4 if autocast_copies(shape, setup) else e
    rms = 4 * dim + 4 + (residual * dim if weight_trains else 0)
    kept = rms if shape.norm == "rms" else residual * dim + 8
    if saved_by:
        kept += 2 * dim * consumers if autocast_copies(shape, setup) else residual * dim
    return kept


def _block_activations(shape: ModelShape, setup: Setup, adapters: list[Linear]) -> int:
    """Bytes one block keeps for the backward pass, per token (steady state: its input needs a gradient)."""
    e, full = compute_bytes(shape, setup), setup.adapter is None
    h, q, k = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    attention_readers, mlp_readers = shape.norm_readers
    per_token = _norm(shape, setup, h, attention_readers, full, full)
    per_token += _norm(shape, setup, h, mlp_readers, full, full)
    # keys and values repeated to every query head are copies, but views of a single key/value head
    single = 2 * e * (q - k) if shape.kv_heads == 1 < shape.heads else 0
    if setup.eager:  # the softmax's float32 weights (and their half-precision cast), not SDPA's output and log-sum-exp
        per_token += (shape.attention_saved - 1) * e * q - single + shape.heads * setup.sequence * (4 + e % 4)
    else:
        per_token += shape.attention_saved * e * q - single + 4 * shape.heads
    if shape.qk_norm:
        per_token += 4 * q + 4 * shape.heads + 4 * k + 4 * shape.kv_heads + (e * (q + k) if full else 0)
    per_token += (shape.mlp_saved + (1 if full else 0)) * e * shape.intermediate
    if shape.dropout:
        per_token += 2 * h  # the masks of the dropouts after attention and after the MLP
    adapter_bytes = 2 if autocast_copies(shape, setup) else ADAPTER_BYTES
    for linear in adapters:
        assert setup.adapter is not None
        mask = 1 if setup.adapter.dropout else 0
        per_token += (adapter_bytes + mask) * linear.inputs + adapter_bytes * setup.adapter.rank
    return per_token


def _activations(shape: ModelShape, setup: Setup) -> _Activations:
    tokens = setup.batch * setup.sequence
    e, full = compute_bytes(shape, setup), setup.adapter is None
    by_block: list[list[Linear]] = [[] for _ in range(shape.layers)]
    for block, linear in adapted(shape, setup.adapter) if setup.adapter is not None else []:
        by_block[block].append(linear)
    blocks = [tokens * _block_activations(shape, setup, adapters) for adapters in by_block]
    outputs = shape.vocabulary if setup.task == "causal-lm" else shape.head[0][0]
    model = (
        tokens * _norm(shape, setup, shape.hidden, 1, full, full)  # the final norm
        + setup.batch * setup.sequence**2 * e  # the attention mask SDPA takes for padded or packed rows
        + tokens * (16 + 2 * shape.head_dim * e)  # token ids, labels, positions, rotary cos and sin
        + (tokens * shape.hidden if shape.dropout else 0)  # the embeddings' dropout mask
    )
    return _Activations(blocks, model, LOGIT_BYTES * tokens * outputs)


def plan_memory(shape: ModelShape, setup: Setup) -> MemoryPlan:
    """What one rank of the job needs at its peak, by part (see the module's docstring)."""
    found = weights(shape, setup)
    trained = [w for w in found if w.trainable]
    parameters = sum(_held(w, setup) * w.size for w in found)
    gradients = sum(_held(w, setup) * w.size for w in trained)
    optimizer = sum(2 * _held(w, setup) * w.size + STEP_BYTES for w in trained)
    working = _working(shape, setup, found)
    kept = _activations(shape, setup)
    tokens, e = setup.batch * setup.sequence, compute_bytes(shape, setup)
    backward = BACKWARD_GRADIENTS * tokens * shape.intermediate * e  # a block's MLP gradients, in its backward
    if setup.checkpointing:
        residual = 4 if autocast_copies(shape, setup) else e
        inputs = shape.layers * tokens * shape.hidden * residual  # each block's input, kept by the checkpoint
        activations = inputs + kept.model + max(kept.logits, max(kept.block) + backward)
    else:
        activations = sum(kept.block) + kept.model + max(kept.logits, backward)
    rest = parameters + gradients + optimizer + working + activations
    margin = (math.ceil(rest * FRAGMENTATION) + RUNTIME_BYTES) if setup.on_gpu else 0
    return MemoryPlan(
        parameters=parameters,
        gradients=gradients,
        optimizer=optimizer,
        working=working,
        activations=activations,
        logits=kept.logits,
        margin=margin,
        total_parameters=sum(w.numel for w in found),
        trainable_parameters=sum(w.numel for w in trained),
        setup=setup,
    )
