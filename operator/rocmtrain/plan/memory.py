"""The memory plan: the bytes each GPU of a job needs, from the model's config alone (pure, no torch).

`plan_memory(shape, setup)` adds up what one rank holds at its peak in a step,
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
  transformers' code for the Llama family (within 3% on CPU, see tests/train/test_memory_plan_measured.py),
  and in the same way, less exactly, for GPT-NeoX and GPT-2. SDPA keeps no sequence x sequence
  attention matrix (flash or memory-efficient kernels keep the output and a log-sum-exp per row); eager
  attention (`attentionImplementation: eager`) keeps its softmax's weights, heads x sequence² per row.
  Keys and values count at the full head count: with padding or packing transformers repeats them
  before SDPA (copies, but views of a single key/value head). Autocast casts as on GPUs: ops on CUDA's
  float32 list run in float32 (GPT-2's gelu_new from its pow on). Under an adapter the first block's
  input needs no gradient (the embeddings are frozen), so its first norm keeps nothing; the rest of that
  block is counted as kept, which errs a little high where the adapter targets no attention projection.
  With gradient checkpointing each block keeps only its input, and one block is recomputed at a time.
  The peak is the loss's backward (the final norm's and the head's inputs kept) or a block's (its
  output's gradient and its MLP's), whichever is larger;
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

from rocmtrain.api.models import AdapterSpec, RocmTrainingJobSpec
from rocmtrain.api.ranks import shard_group
from rocmtrain.plan.gpu_memory import GIB
from rocmtrain.plan.model_shapes import DTYPE_BYTES, Linear, ModelConfigError, ModelShape, training_dtype

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
    packed: bool = False  # rows packed with several records (`training.packing`), each with positions of its own

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
            packed=training.packing,
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


def mixed_precision(setup: Setup) -> bool:
    """FSDP2 computes in bfloat16 itself (a MixedPrecisionPolicy) in place of autocast: bf16 on GPUs."""
    return setup.sharded and setup.on_gpu and setup.precision == "bf16"


@dataclass(frozen=True)
class Precision:
    """The bytes per element a pass computes in, where (the training image's precision, see the module's docstring)."""

    autocast: bool  # autocast casts to half precision: GPUs with bf16 or fp16, but under FSDP2's bf16 policy
    compute: int  # the linear layers' outputs, attention and the MLP
    stream: int  # the residual stream: the embeddings, the blocks' sums, RMSNorm's output, rotary's cos and sin

    @classmethod
    def of(cls, setup: Setup) -> Precision:
        if mixed_precision(setup):  # FSDP2 gathers the weights in bfloat16 and casts the inputs: all bfloat16
            return cls(False, 2, 2)
        autocast = setup.on_gpu and setup.precision != "fp32"
        return cls(autocast, 2 if autocast else setup.weights_bytes, setup.weights_bytes)


def _autocast_copies(setup: Setup, found: list[Weight]) -> int:
    """Autocast's half-precision casts of float32 linear weights, which the linear layers keep for the backward pass:
    a trained weight's once (autocast caches it), a frozen one's at each use (with gradient checkpointing, those of
    the root and the block being recomputed)."""
    if not Precision.of(setup).autocast:
        return 0
    cast = [w for w in found if w.linear and w.size == 4]
    kept = [w for w in cast if w.trainable or not setup.checkpointing or w.block in (None, 0)]
    return 2 * sum(w.numel for w in kept)


def _working(shape: ModelShape, setup: Setup, found: list[Weight]) -> int:
    """Weights and gradients held beyond each rank's own: FSDP2's gathered ones, and autocast's copies."""
    if not setup.sharded:
        return _autocast_copies(setup, found)
    compute = 2 if mixed_precision(setup) else None

    def gathered(ws: Iterable[Weight], trainable_only: bool = False) -> int:
        return sum(w.numel * (compute or w.size) for w in ws if w.trainable or not trainable_only)

    root = [w for w in found if w.block is None]
    blocks = sorted((sum(gathered([w]) for w in found if w.block == b), b) for b in range(shape.layers))[-2:]
    largest = [w for w in found if w.block == blocks[-1][1]]
    held = gathered(root) + sum(size for size, _ in blocks) + gathered(root, True) + gathered(largest, True)
    return held + _autocast_copies(setup, found)


@dataclass(frozen=True)
class _Activations:
    """What the pass keeps: per block, for the largest block being recomputed from its checkpointed input, of the
    rest of the model for the whole pass, of the final norm and the head, and of the loss."""

    block: list[int]
    recomputed: int
    model: int
    head: int
    logits: int


def _norm(
    shape: ModelShape, p: Precision, dim: int, weight_trains: bool, input_grad: bool = True, input_held: bool = False
) -> tuple[int, int]:
    """What a norm keeps per token, and the bytes per element of its output. RMSNorm: its input in float32 (a copy
    of a half-precision one), 1/rms, and for its weight's gradient the normalised input in the stream's dtype; its
    output in the stream's dtype. LayerNorm: its input, mean and 1/std; autocast runs it in float32 (a copy of a
    half-precision input) and its output is float32. An input `input_held` elsewhere, uncast, costs nothing; a norm
    whose input needs no gradient (`input_grad`) and whose weight is frozen keeps nothing."""
    size = 4 if shape.norm == "rms" or p.autocast else p.stream
    output = p.stream if shape.norm == "rms" else size
    if not input_grad and not weight_trains:
        return 0, output
    kept = 0 if input_held and size == p.stream else size * dim
    if shape.norm == "rms":
        return kept + 4 + (p.stream * dim if weight_trains else 0), output
    return kept + 8, output


def _readers(p: Precision, size: int, trained: int, adapters: int, kept: bool, dropout: bool) -> int:
    """Bytes per element of one input that the linear layers reading it keep: `trained` layers whose weights train,
    and `adapters` LoRA adapters. Layers that take the input as it is share it (nothing more where `kept` already);
    autocast casts a float32 input for each trained layer, and for each adapter in any case (peft casts the input
    to the adapter's float32, autocast back to half precision); adapter dropout keeps a mask and its own output."""
    own, shared = 0, trained > 0
    if p.autocast:
        own = adapters * (p.compute + dropout)
        if size != p.compute:
            own, shared = own + trained * p.compute, False
    elif dropout:
        own = adapters * (size + 1)
    else:
        shared = shared or adapters > 0
    return own + (size if shared and not kept else 0)


def _block_activations(
    shape: ModelShape, setup: Setup, adapters: list[Linear], input_grad: bool, input_held: bool = False
) -> int:
    """Bytes one block keeps for the backward pass, per token. `input_grad`: its input needs a gradient (all but the
    first block's, under an adapter: the frozen embeddings' output needs none); `input_held`: its input is held
    already (gradient checkpointing's)."""
    p, full = Precision.of(setup), setup.adapter is None
    e, h, q, k = p.compute, shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    dropout = setup.adapter is not None and setup.adapter.dropout > 0
    first, second = shape.norm_readers
    # the linear layers by the input they read: the attention's norm, attention's output, the MLP's norm, the MLP's
    linears = shape.linears
    groups = (linears[:first], linears[first : first + 1], linears[first + 1 : -1], linears[-1:])
    assert len(groups[2]) == second

    def read(group: tuple[Linear, ...], size: int, kept: bool) -> int:
        trained, adapted = (len(group) if full else 0), sum(linear in adapters for linear in group)
        return group[0].inputs * _readers(p, size, trained, adapted, kept, dropout)

    norm, out = _norm(shape, p, h, full, input_grad, input_held)
    per_token = norm + read(groups[0], out, kept=False)
    # keys repeated to every query head are copies, but views of a single key/value head; so are the values, and the
    # keys where rotary leaves them in the compute dtype (autocast casts float32 ones, copying each repeat)
    views = (1 + (p.stream == e)) * e * (q - k) if shape.kv_heads == 1 < shape.heads else 0
    per_token += shape.attention_saved * e * q - views
    if setup.eager:  # the softmax's float32 weights (and their half-precision cast), not SDPA's log-sum-exp and mask
        per_token += shape.heads * setup.sequence * (4 + e % 4)
    else:  # a log-sum-exp per head, and the additive mask SDPA makes of the boolean one (per row, in every block)
        per_token += 4 * shape.heads + setup.sequence * e
    if shape.qk_norm:
        per_token += 4 * q + 4 * shape.heads + 4 * k + 4 * shape.kv_heads + (e * (q + k) if full else 0)
    per_token += read(groups[1], e, kept=True)
    # a parallel block's MLP norm reads the block's input, held by the attention's norm; a sequential one's, the sum
    norm, out = _norm(shape, p, h, full, input_grad or not shape.parallel, input_held=shape.parallel)
    per_token += norm + read(groups[2], out, kept=False)
    float32 = shape.mlp_float32 if p.autocast else 0
    per_token += ((shape.mlp_saved - float32) * e + 4 * float32) * shape.intermediate
    per_token += read(groups[3], 4 if float32 else e, kept=False)
    if shape.dropout:
        per_token += 2 * h  # the masks of the dropouts after attention and after the MLP
    return per_token + len(adapters) * e * (setup.adapter.rank if setup.adapter is not None else 0)


def _activations(shape: ModelShape, setup: Setup) -> _Activations:
    tokens, p, full = setup.batch * setup.sequence, Precision.of(setup), setup.adapter is None
    by_block: list[list[Linear]] = [[] for _ in range(shape.layers)]
    for block, linear in adapted(shape, setup.adapter) if setup.adapter is not None else []:
        by_block[block].append(linear)
    blocks = [tokens * _block_activations(shape, setup, a, full or b > 0) for b, a in enumerate(by_block)]
    recomputed = max(
        tokens * _block_activations(shape, setup, a, full or b > 0, input_held=True) for b, a in enumerate(by_block)
    )
    outputs = shape.vocabulary if setup.task == "causal-lm" else shape.head[0][0]
    norm, out = _norm(shape, p, shape.hidden, full)
    rows = setup.batch if setup.packed else 1  # packed rows have positions of their own; others share one row's
    model = (
        tokens * 16  # token ids and labels
        + rows * setup.sequence * 2 * shape.rotary * p.stream  # rotary's cos and sin
        + (tokens * shape.hidden if shape.dropout else 0)  # the embeddings' dropout mask
        + (setup.batch * setup.sequence**2 if setup.checkpointing else 0)  # the boolean mask every checkpoint holds
    )
    head = tokens * (norm + shape.hidden * _readers(p, out, int(full), 0, kept=False, dropout=False))
    return _Activations(blocks, recomputed, model, head, LOGIT_BYTES * tokens * outputs)


def plan_memory(shape: ModelShape, setup: Setup) -> MemoryPlan:
    """What one rank of the job needs at its peak, by part (see the module's docstring)."""
    found = weights(shape, setup)
    trained = [w for w in found if w.trainable]
    parameters = sum(_held(w, setup) * w.size for w in found)
    gradients = sum(_held(w, setup) * w.size for w in trained)
    optimizer = sum(2 * _held(w, setup) * w.size + STEP_BYTES for w in trained)
    working = _working(shape, setup, found)
    kept, p = _activations(shape, setup), Precision.of(setup)
    tokens = setup.batch * setup.sequence
    # in a block's backward: the gradient of its output, and its MLP's gradients (in float32 where the MLP computes so)
    mlp = 4 if p.autocast and shape.mlp_float32 else p.compute
    backward = tokens * (shape.hidden * p.stream + BACKWARD_GRADIENTS * shape.intermediate * mlp)
    # the peak: the loss's backward (the final norm's and the head's kept), or a block's (both freed)
    if setup.checkpointing:  # each block's input, held by its checkpoint; one block recomputed at a time
        inputs = shape.layers * tokens * shape.hidden * p.stream
        activations = inputs + kept.model + max(kept.head + kept.logits, kept.recomputed + backward)
    else:
        activations = sum(kept.block) + kept.model + max(kept.head + kept.logits, backward)
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
