"""What one rank of a job holds, as far as memory goes (pure, no torch): how the job trains (`Setup`), its
weight tensors (`weights`), and the precision each pass computes in (`Precision`).

The memory plan (`memory`) adds up the bytes from these; they follow the training image's choices
(transformers 5, peft, PyTorch's AdamW, DDP or FSDP2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rocmtrain.api.models import AdapterSpec, RocmTrainingJobSpec
from rocmtrain.api.ranks import shard_group
from rocmtrain.plan.model_shapes import DTYPE_BYTES, Linear, ModelConfigError, ModelShape, training_dtype

# peft keeps LoRA's matrices in float32 even on a bfloat16 model (`autocast_adapter_dtype`).
ADAPTER_BYTES = 4
# Evaluation (and generation) runs at twice the training micro-batch; the training image reads it here.
EVAL_BATCH_FACTOR = 2
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
class Generation:
    """What evaluation generates (`evaluation.generate`): greedy responses to the first `records` evaluation records
    (shared out over the ranks), each of up to `new_tokens` tokens."""

    records: int
    new_tokens: int


def planned_loss(spec: RocmTrainingJobSpec) -> str:
    """The loss kernel the training image picks for a causal LM (`training.lossImplementation`), as the plan counts
    it: the one asked for, else chunked. Unset, the image runs Liger's fused kernel on GPUs where liger-kernel is
    installed; the plan cannot see the image's packages and assumes it is not (chunked holds a little more than
    fused). A head that is not one plain linear layer gets the model's own loss: no family the plan counts has one."""
    return spec.training.loss_implementation or "chunked"


@dataclass(frozen=True)
class Setup:
    """How a job trains, as far as memory goes: one rank's view."""

    on_gpu: bool
    precision: str  # autocast precision on GPUs: fp32, bf16, fp16
    world_size: int
    shard_group: int  # ranks sharing one copy of the model: 1 without sharding
    adapter: AdapterSpec | None
    batch: int  # sequences per training micro-batch per rank (1 for a flat row)
    sequence: int  # tokens per training sequence (maxSeqLength: the longest a batch pads to; a flat row's tokens)
    checkpointing: bool
    task: str
    eager: bool = False  # attention in the model's own code, not SDPA: it keeps its sequence x sequence weights
    packed: bool = False  # rows packed with several records (`training.packing`), each with positions of its own
    ranks_per_pod: int = 1  # the ranks of one worker pod, which share its host's memory
    evaluation: bool = False  # the job evaluates (`data.eval`): forward passes at `eval_batch`
    generation: Generation | None = None  # and generates, with a KV cache
    fsdp: bool = False  # `sharding: fsdp`, over a shard group of any size (of 1 too: loaded sharded, FSDP2's copies)
    varlen: bool = False  # one flat row of records a pass (`attentionImplementation: varlen`)
    records: int = 0  # batchSizePerWorker, where it differs from `batch` (a flat row, a token budget)
    max_length: int = 0  # maxSeqLength, where it differs from `sequence` (a flat row)
    budget: bool = False  # micro-batches of a token budget (`tokensPerWorker`), not of records
    loss: str = "chunked"  # a causal LM's loss kernel (`planned_loss`): chunked, fused or model

    @property
    def flash(self) -> bool:
        """Attention in flash-attention's variable-length kernel, which needs no mask: a flat row on GPUs (the
        training image installs flash-attn)."""
        return self.varlen and self.on_gpu

    @property
    def loss_kernel(self) -> bool:
        """A causal LM's loss in a kernel of its own on the head's weights (chunked or fused), not the model's head
        and loss: it never holds every token's logits."""
        return self.task == "causal-lm" and self.loss != "model"

    @property
    def eval_batch(self) -> int:
        """Sequences per evaluation micro-batch (of up to maxSeqLength tokens each, padded, never packed)."""
        return EVAL_BATCH_FACTOR * (self.records or self.batch)

    @property
    def forward_pass(self) -> Setup:
        """The setup of evaluation's and generation's forward passes: padded records of up to maxSeqLength tokens."""
        return replace(self, sequence=self.max_length or self.sequence, packed=False, varlen=False)

    @property
    def generation_batch(self) -> int:
        """Prompts per `generate` call: the evaluation's micro-batch, or fewer where a rank has fewer to answer."""
        records = self.generation.records if self.generation is not None else 0
        return min(self.eval_batch, math.ceil(records / self.world_size))

    @property
    def sharded(self) -> bool:
        return self.fsdp or self.shard_group > 1

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
        evaluation = spec.data.eval
        generate = spec.evaluation.generate if evaluation is not None and spec.model.task == "causal-lm" else None
        generation = None
        if generate is not None and evaluation is not None:
            records = min(generate.records, evaluation.max_samples or generate.records)
            generation = Generation(records, generate.max_new_tokens)
        length, budget = spec.model.max_seq_length, training.tokens_per_worker
        records = max([training.batch_size_per_worker, *batches])
        if training.varlen:  # one flat row: the budget's tokens, or the records' at their longest
            batch, sequence = 1, budget or records * length
        else:  # padded records or packed rows, at their longest: the budget's worth, or the records'
            batch, sequence = (max(1, budget // length) if budget else records), length
        return cls(
            on_gpu=resources.gpus_per_worker > 0,
            precision=training.precision,
            world_size=world,
            shard_group=shard_group(world, ranks_per_pod, training.sharding_scope)
            if training.sharding == "fsdp"
            else 1,
            adapter=adapter,
            batch=batch,
            sequence=sequence,
            checkpointing=training.gradient_checkpointing,
            task=spec.model.task,
            eager=training.attention_implementation == "eager",
            packed=training.packing or training.varlen,
            ranks_per_pod=ranks_per_pod,
            evaluation=evaluation is not None,
            generation=generation,
            fsdp=training.sharding == "fsdp",
            varlen=training.varlen,
            records=records if records != batch else 0,
            max_length=length if length != sequence else 0,
            budget=budget is not None,
            loss=planned_loss(spec),
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


def held(weight: Weight, setup: Setup) -> int:
    """Elements of `weight` this rank keeps between steps: its shard, or all of it."""
    return weight.shard(setup.shard_group) if setup.sharded else weight.numel


def mixed_precision(setup: Setup) -> bool:
    """FSDP2 computes in bfloat16 itself (a MixedPrecisionPolicy) in place of autocast: bf16 on GPUs."""
    return setup.sharded and setup.on_gpu and setup.precision == "bf16"


@dataclass(frozen=True)
class Precision:
    """The bytes per element a pass computes in, where (the training image's precision, see `memory`'s docstring)."""

    autocast: bool  # autocast casts to half precision: GPUs with bf16 or fp16, but under FSDP2's bf16 policy
    compute: int  # the linear layers' outputs, attention and the MLP
    stream: int  # the residual stream: the embeddings, the blocks' sums, RMSNorm's output, rotary's cos and sin

    @classmethod
    def of(cls, setup: Setup) -> Precision:
        if mixed_precision(setup):  # FSDP2 gathers the weights in bfloat16 and casts the inputs: all bfloat16
            return cls(False, 2, 2)
        autocast = setup.on_gpu and setup.precision != "fp32"
        return cls(autocast, 2 if autocast else setup.weights_bytes, setup.weights_bytes)
