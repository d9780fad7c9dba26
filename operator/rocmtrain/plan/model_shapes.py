"""The shapes of a Transformer's weights, read from its `config.json` (plain data in, plain data out).

The memory plan (`memory_plan`) needs every weight tensor's shape and which ones are linear layers (an
adapter's targets), not the weights. They follow from a few fields of the model's config, the way
transformers builds each family (`modeling_<family>.py` of transformers 5):

- `llama`, `mistral`, `qwen2`, `qwen3`: token embeddings, `num_hidden_layers` blocks of RMSNorm,
  attention with `num_key_value_heads` key/value heads of `head_dim` (q/k/v/o projections; biases on
  q/k/v for Qwen2, on all four with `attention_bias`; Qwen3's RMSNorm of each query and key head) and a
  SwiGLU MLP of `intermediate_size` (gate, up, down), a final RMSNorm, and the output head unless
  `tie_word_embeddings`;
- `gpt_neox`: LayerNorms, a fused query/key/value projection, GELU MLP, an untied head by default;
- `gpt2`: LayerNorms, learned position embeddings, fused attention (Conv1D, weights stored transposed), a
  `4 x n_embd` GELU MLP unless `n_inner`, the head tied to the embeddings by default.

A field the config leaves out takes the family's default (configs written by hand or by older
versions of transformers omit defaults). Any other `model_type` is refused: the plan says which
families it knows rather than guess.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rocmtrain.api.errors import InputError

# The weights' dtypes: as saved, the config's `dtype` (or `torch_dtype` in configs written before transformers
# 4.56), float32 where it names neither; as trained, `training_dtype`'s.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_DTYPE = "float32"
# Bounds on what a config may say, so that a corrupt file cannot make the plan's arithmetic absurd.
MAX_DIMENSION = 1 << 20
MAX_LAYERS = 4096
MAX_VOCABULARY = 1 << 24
MAX_LABELS = 10_000

Norm = Literal["rms", "layer"]
Shapes = tuple[tuple[int, ...], ...]


class ModelConfigError(InputError):
    """A config.json the plan cannot read: an unknown model type, or a field out of its bounds."""


@dataclass(frozen=True)
class Linear:
    """A linear layer of a transformer block: its path inside the block, and its sizes."""

    path: str
    inputs: int
    outputs: int
    bias: bool
    transposed: bool = False  # GPT-2's Conv1D stores its weight as (inputs, outputs)

    @property
    def tensors(self) -> tuple[tuple[int, ...], ...]:
        weight = (self.inputs, self.outputs) if self.transposed else (self.outputs, self.inputs)
        return (weight, (self.outputs,)) if self.bias else (weight,)


@dataclass(frozen=True)
class ModelShape:
    """What the memory plan needs to know of a model: every weight's shape, and how a block computes."""

    model_type: str
    dtype: str  # the weights' dtype as saved (the training image trains them in `training_dtype`'s)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocabulary: int
    linears: tuple[Linear, ...]  # of one block
    block_vectors: Shapes  # one block's norm weights and biases
    root: Shapes  # embeddings and the final norm
    head: Shapes  # the output head (none where tied to the embeddings)
    block_path: str  # a block's module path, `{}` for its index (LoRA targets match module paths)
    norm: Norm
    norm_readers: tuple[int, int]  # linear layers reading the attention's and the MLP's norm
    attention_saved: int  # tensors of heads x head_dim per token that attention keeps for the backward pass
    qk_norm: bool  # an RMSNorm on each query and key head (Qwen3)
    mlp_saved: int  # tensors of intermediate_size per token the MLP keeps, the down projection's input aside
    mlp_float32: int  # of those, the ones CUDA's autocast computes in float32 (ops on its float32 list, and after)
    dropout: float  # dropout after attention and after the MLP (GPT-2's resid_pdrop)
    rotary: int  # the width of rotary's cos and sin per position (0: no rotary embedding)
    parallel: bool  # attention and the MLP both read the block's input (GPT-NeoX's parallel residual)

    @property
    def block_tensors(self) -> Shapes:
        return tuple(t for linear in self.linears for t in linear.tensors) + self.block_vectors

    def tensors(self) -> Iterator[tuple[int, ...]]:
        """Every weight tensor's shape: the root's, each block's, the head's."""
        yield from self.root
        for _ in range(self.layers):
            yield from self.block_tensors
        yield from self.head

    @property
    def parameters(self) -> int:
        return sum(math.prod(shape) for shape in self.tensors())

    def linear_paths(self) -> Iterator[tuple[str, Linear]]:
        """(module path, layer) of every linear layer of every block, as the model names them."""
        for index in range(self.layers):
            prefix = self.block_path.format(index)
            for linear in self.linears:
                yield f"{prefix}.{linear.path}", linear


def _int(config: Mapping[str, Any], key: str, default: int | None, bound: int) -> int:
    value = config.get(key)
    if value is None:
        value = default
    if value is None or isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
        raise ModelConfigError(f"config.json: {key} must be a whole number from 1 to {bound}, not {value!r}")
    return value


def _flag(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelConfigError(f"config.json: {key} must be true or false, not {value!r}")
    return value


def _probability(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ModelConfigError(f"config.json: {key} must be a number from 0 to below 1, not {value!r}")
    return float(value)


def _rotary_fraction(config: Mapping[str, Any]) -> float:
    """The share of each head GPT-NeoX rotates: `partial_rotary_factor` of `rope_parameters` (transformers 5), or
    `rotary_pct` in older configs (0.25 by default)."""
    rope = config.get("rope_parameters")
    value = rope.get("partial_rotary_factor") if isinstance(rope, Mapping) else None
    value = config.get("rotary_pct", 0.25) if value is None else value
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ModelConfigError(f"config.json: partial_rotary_factor must be above 0 and at most 1, not {value!r}")
    return float(value)


def training_dtype(*, adapter: bool, on_gpu: bool, precision: str) -> str:
    """The dtype the training image loads a model's weights in, whatever the config's: float32 master weights where
    they train (autocast or FSDP compute in bfloat16 from them); a LoRA adapter's frozen base in bfloat16, on GPUs
    with precision bf16 (half the memory; the adapter itself is float32)."""
    return "bfloat16" if adapter and on_gpu and precision == "bf16" else "float32"


def weights_dtype(config: Mapping[str, Any]) -> str:
    """The dtype the weights were saved in, as the config says (`dtype="auto"` would load them in it)."""
    value = config.get("dtype") or config.get("torch_dtype") or DEFAULT_DTYPE
    if value not in DTYPE_BYTES:
        raise ModelConfigError(f"config.json: dtype must be one of {', '.join(DTYPE_BYTES)}, not {value!r}")
    return str(value)


@dataclass(frozen=True)
class _Sizes:
    """The sizes every family has."""

    layers: int
    hidden: int
    heads: int
    vocabulary: int


def _head(config: Mapping[str, Any], sizes: _Sizes, task: str, labels: int, tied_default: bool) -> Shapes:
    """The output head: a language model's (none where tied to the embeddings), or a classifier's `score`."""
    if task != "causal-lm":
        return ((labels, sizes.hidden),)
    return () if _flag(config, "tie_word_embeddings", tied_default) else ((sizes.vocabulary, sizes.hidden),)


@dataclass(frozen=True)
class _LlamaFamily:
    """What a member of the Llama family's defaults and biases are (transformers' `Configuration<Family>`)."""

    vocabulary: int
    intermediate: int
    kv_heads: int | None  # None: as many as attention heads
    head_dim: int | None  # None: hidden_size / num_attention_heads
    qkv_bias: bool | None  # None: `attention_bias` decides, for all four projections
    qk_norm: bool
    mlp_bias: bool


LLAMA_FAMILY = {
    "llama": _LlamaFamily(32_000, 11_008, None, None, None, False, True),
    "mistral": _LlamaFamily(32_000, 14_336, 8, None, False, False, False),
    "qwen2": _LlamaFamily(151_936, 22_016, 32, None, True, False, False),
    "qwen3": _LlamaFamily(151_936, 22_016, 32, 128, None, True, False),
}


def _llama(config: Mapping[str, Any], model_type: str, task: str, labels: int) -> ModelShape:
    family = LLAMA_FAMILY[model_type]
    keys = ("num_hidden_layers", "hidden_size", "num_attention_heads")
    sizes = _sizes(config, keys, (32, 4096, 32), family.vocabulary)
    h = sizes.hidden
    kv = _int(config, "num_key_value_heads", family.kv_heads or sizes.heads, MAX_DIMENSION)
    head_dim = _int(config, "head_dim", family.head_dim or h // sizes.heads, MAX_DIMENSION)
    inter = _int(config, "intermediate_size", family.intermediate, MAX_DIMENSION)
    attention_bias = _flag(config, "attention_bias", False)
    qkv_bias = attention_bias if family.qkv_bias is None else family.qkv_bias
    o_bias = attention_bias if family.qkv_bias is None else False
    mlp_bias = family.mlp_bias and _flag(config, "mlp_bias", False)
    q, k = sizes.heads * head_dim, kv * head_dim
    linears = (
        Linear("self_attn.q_proj", h, q, qkv_bias),
        Linear("self_attn.k_proj", h, k, qkv_bias),
        Linear("self_attn.v_proj", h, k, qkv_bias),
        Linear("self_attn.o_proj", q, h, o_bias),
        Linear("mlp.gate_proj", h, inter, mlp_bias),
        Linear("mlp.up_proj", h, inter, mlp_bias),
        Linear("mlp.down_proj", inter, h, mlp_bias),
    )
    return ModelShape(
        model_type=model_type,
        dtype=weights_dtype(config),
        layers=sizes.layers,
        hidden=h,
        heads=sizes.heads,
        kv_heads=kv,
        head_dim=head_dim,
        intermediate=inter,
        vocabulary=sizes.vocabulary,
        linears=linears,
        block_vectors=((h,), (h,), *(((head_dim,), (head_dim,)) if family.qk_norm else ())),
        root=((sizes.vocabulary, h), (h,)),
        head=_head(config, sizes, task, labels, tied_default=False),
        block_path="model.layers.{}",
        norm="rms",
        norm_readers=(3, 2),  # q, k, v; gate, up
        attention_saved=4,  # rotated queries and keys, values (keys and values repeated to every head), output
        qk_norm=family.qk_norm,
        mlp_saved=3,  # the gate's and up projection's outputs and the SiLU's
        mlp_float32=0,
        dropout=0.0,
        rotary=head_dim,
        parallel=False,
    )


def _sizes(config: Mapping[str, Any], keys: tuple[str, str, str], defaults: tuple[int, int, int], vocab: int) -> _Sizes:
    """Layers, hidden size and heads (under the family's names for them), and the vocabulary."""
    found = _Sizes(
        layers=_int(config, keys[0], defaults[0], MAX_LAYERS),
        hidden=_int(config, keys[1], defaults[1], MAX_DIMENSION),
        heads=_int(config, keys[2], defaults[2], MAX_DIMENSION),
        vocabulary=_int(config, "vocab_size", vocab, MAX_VOCABULARY),
    )
    if found.hidden % found.heads:
        raise ModelConfigError(f"config.json: {keys[1]} {found.hidden} is not a multiple of {keys[2]} {found.heads}")
    return found


def _gpt_neox(config: Mapping[str, Any], model_type: str, task: str, labels: int) -> ModelShape:
    sizes = _sizes(config, ("num_hidden_layers", "hidden_size", "num_attention_heads"), (44, 6144, 64), 50_432)
    h = sizes.hidden
    inter = _int(config, "intermediate_size", 24_576, MAX_DIMENSION)
    bias = _flag(config, "attention_bias", True)
    linears = (
        Linear("attention.query_key_value", h, 3 * h, bias),
        Linear("attention.dense", h, h, bias),
        Linear("mlp.dense_h_to_4h", h, inter, True),
        Linear("mlp.dense_4h_to_h", inter, h, True),
    )
    return ModelShape(
        **_gpt_common(config, model_type, sizes, inter, linears),
        root=((sizes.vocabulary, h), (h,), (h,)),
        head=_head(config, sizes, task, labels, tied_default=False),
        block_path="gpt_neox.layers.{}",
        attention_saved=6,  # the fused projection's output (values are a view of it), rotated queries, keys, output
        mlp_saved=1,  # the GELU's input
        mlp_float32=0,
        dropout=_probability(config, "hidden_dropout", 0.0),
        rotary=int(h // sizes.heads * _rotary_fraction(config)),
        parallel=_flag(config, "use_parallel_residual", True),
    )


def _gpt2(config: Mapping[str, Any], model_type: str, task: str, labels: int) -> ModelShape:
    sizes = _sizes(config, ("n_layer", "n_embd", "n_head"), (12, 768, 12), 50_257)
    h = sizes.hidden
    inter = _int(config, "n_inner", 4 * h, MAX_DIMENSION)
    positions = _int(config, "n_positions", 1024, MAX_DIMENSION)
    linears = (
        Linear("attn.c_attn", h, 3 * h, True, transposed=True),
        Linear("attn.c_proj", h, h, True, transposed=True),
        Linear("mlp.c_fc", h, inter, True, transposed=True),
        Linear("mlp.c_proj", inter, h, True, transposed=True),
    )
    return ModelShape(
        **_gpt_common(config, model_type, sizes, inter, linears),
        root=((sizes.vocabulary, h), (positions, h), (h,), (h,)),
        head=_head(config, sizes, task, labels, tied_default=True),
        block_path="transformer.h.{}",
        attention_saved=4,  # the fused projection's output (queries, keys and values are views of it), output
        mlp_saved=4,  # gelu_new, written as tensor operations: its input, 0.5 x, tanh(...), 1 + tanh(...)
        mlp_float32=3,  # pow casts its input to float32 under autocast, and tanh(...) and 1 + tanh(...) follow
        dropout=_probability(config, "resid_pdrop", 0.1),
        rotary=0,  # learned position embeddings
        parallel=False,
    )


def _gpt_common(
    config: Mapping[str, Any], model_type: str, sizes: _Sizes, inter: int, linears: tuple[Linear, ...]
) -> dict[str, Any]:
    """What GPT-style models share: LayerNorms (weight and bias), multi-head attention."""
    h = sizes.hidden
    return {
        "model_type": model_type,
        "dtype": weights_dtype(config),
        "layers": sizes.layers,
        "hidden": h,
        "heads": sizes.heads,
        "kv_heads": sizes.heads,
        "head_dim": h // sizes.heads,
        "intermediate": inter,
        "vocabulary": sizes.vocabulary,
        "linears": linears,
        "block_vectors": ((h,),) * 4,
        "norm": "layer",
        "norm_readers": (1, 1),
        "qk_norm": False,
    }


FAMILIES: dict[str, Callable[[Mapping[str, Any], str, str, int], ModelShape]] = {
    **dict.fromkeys(LLAMA_FAMILY, _llama),
    "gpt_neox": _gpt_neox,
    "gpt2": _gpt2,
}


def model_shape(config: Mapping[str, Any], *, task: str = "causal-lm", labels: int = 1) -> ModelShape:
    """The shape of the model `config` (a config.json's object) describes, with the head of `task`."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise ModelConfigError(
            f"config.json: model_type {model_type!r} is not one the memory plan knows ({', '.join(FAMILIES)})"
        )
    if not 1 <= labels <= MAX_LABELS:
        raise ModelConfigError(f"labels must be from 1 to {MAX_LABELS}")
    return FAMILIES[str(model_type)](config, str(model_type), task, labels)
