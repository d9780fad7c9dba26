"""What a pass keeps (pure, no torch): the training step's activations for the backward pass, and what a forward
pass without autograd (evaluation's, generation's prefill) holds at its peak.

Counted tensor by tensor from transformers' code for the Llama family (the step's within 3% on CPU, see
tests/train/test_memory_plan_measured.py), and in the same way, less exactly, for GPT-NeoX and GPT-2;
`memory`'s docstring says what is counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rocmtrain.plan.model_shapes import Linear, ModelShape
from rocmtrain.plan.setup import Precision, Setup, adapted

# The model's own loss: float32 logits' log-softmax (kept), the gradient of the loss and of the log-softmax (backward).
LOGIT_BYTES = 12
# Gradients of a block's MLP activations alive at once in its backward pass (of the down projection's input,
# and from it of both of its factors), in intermediate_size units per token.
BACKWARD_GRADIENTS = 3
# Token ids and labels (int64), per token.
IDS_BYTES = 16
# Float32 temporaries of an RMSNorm's backward pass alive at once, in hidden_size units per token: beside a loss
# kernel (which keeps no logits) the final norm's backward can be the step's peak.
NORM_BACKWARD = 4


@dataclass(frozen=True)
class _Activations:
    """What the pass keeps: per block, for the largest block being recomputed from its checkpointed input, of the
    rest of the model for the whole pass, of the final norm and the head, and of the loss."""

    block: list[int]
    recomputed: int
    model: int
    head: int
    logits: int


def mlp_bytes(shape: ModelShape, p: Precision) -> int:
    """Bytes per token of the MLP's tensors of intermediate_size, the down projection's input aside (in float32
    where CUDA's autocast computes them so)."""
    float32 = shape.mlp_float32 if p.autocast else 0
    return ((shape.mlp_saved - float32) * p.compute + 4 * float32) * shape.intermediate


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
    else:  # a log-sum-exp per head, and (not for flash's varlen kernel) SDPA's additive mask (per row, in every block)
        per_token += 4 * shape.heads + (0 if setup.flash else setup.sequence * e)
    if shape.qk_norm:
        per_token += 4 * q + 4 * shape.heads + 4 * k + 4 * shape.kv_heads + (e * (q + k) if full else 0)
    per_token += read(groups[1], e, kept=True)
    # a parallel block's MLP norm reads the block's input, held by the attention's norm; a sequential one's, the sum
    norm, out = _norm(shape, p, h, full, input_grad or not shape.parallel, input_held=shape.parallel)
    per_token += norm + read(groups[2], out, kept=False)
    per_token += mlp_bytes(shape, p)
    per_token += read(groups[3], 4 if p.autocast and shape.mlp_float32 else e, kept=False)
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
        + (setup.batch * setup.sequence**2 if setup.checkpointing and not setup.flash else 0)  # each checkpoint's mask
    )
    if not setup.loss_kernel:
        head = tokens * (norm + shape.hidden * _readers(p, out, int(full), 0, kept=False, dropout=False))
        return _Activations(blocks, recomputed, model, head, LOGIT_BYTES * tokens * outputs)
    # the chunked or fused loss keeps nothing for its backward: it makes the hidden states' gradient (in their dtype)
    # in its forward pass, and under autocast each chunk's share of a trained head's gradient in the compute dtype
    # before adding it to the float32 one (the head's gradient itself is among the gradients)
    product = shape.vocabulary * shape.hidden * p.compute if p.autocast and full else 0
    head = tokens * (norm + shape.hidden * out)  # the final hidden states, the loss's input
    return _Activations(
        blocks, recomputed, model, head, tokens * shape.hidden * out + product + _chunk(shape, setup, tokens)
    )


def step_activations(shape: ModelShape, setup: Setup) -> tuple[int, int]:
    """What one rank's training step keeps at its peak (the logits included), and of it the loss's logits."""
    kept, p = _activations(shape, setup), Precision.of(setup)
    tokens = setup.batch * setup.sequence
    # in a block's backward: the gradient of its output, and its MLP's gradients (in float32 where the MLP computes so)
    mlp = 4 if p.autocast and shape.mlp_float32 else p.compute
    backward = tokens * (shape.hidden * p.stream + BACKWARD_GRADIENTS * shape.intermediate * mlp)
    # the peak: the loss's backward (the final norm's and the head's kept), or a block's (both freed); with a loss
    # kernel, the loss's forward pass (it makes its gradients there) or the final norm's backward
    loss = kept.head + kept.logits
    if setup.loss_kernel and shape.norm == "rms":
        loss = max(loss, kept.head + tokens * shape.hidden * 4 * NORM_BACKWARD)
    if setup.checkpointing:  # each block's input, held by its checkpoint; one block recomputed at a time
        inputs = shape.layers * tokens * shape.hidden * p.stream
        return inputs + kept.model + max(loss, kept.recomputed + backward), kept.logits
    return sum(kept.block) + kept.model + max(loss, backward), kept.logits


def loss_chunk(tokens: int, vocabulary: int, hidden: int) -> int:
    """Tokens per chunk of the chunked loss, by Liger's rule (its fused kernel's too): the tokens cut into
    ceil(vocabulary / hidden) chunks, rounded up to a power of two, so that a chunk's logits are about as large as the
    hidden states."""
    per_chunk = math.ceil(tokens / math.ceil(vocabulary / hidden))
    return 1 << max(per_chunk - 1, 0).bit_length()


def _chunk(shape: ModelShape, setup: Setup, tokens: int) -> int:
    """What the chunked or fused loss holds of the logits, of `tokens` tokens: one chunk's, chunked in float32 (their
    softmax and gradient made in their place) beside the head's output in the compute dtype, or their gradient's cast
    to it; fused in the compute dtype (Liger's kernel overwrites them with their gradient). And under autocast the
    head's cast of float32 weights to the compute dtype, for the loss's time (not autocast's, kept for the pass)."""
    p = Precision.of(setup)
    per_logit = p.compute if setup.loss == "fused" else p.compute + (4 if p.compute != 4 else 0)
    cast = shape.vocabulary * shape.hidden * p.compute if p.autocast and setup.weights_bytes == 4 else 0
    return min(tokens, loss_chunk(tokens, shape.vocabulary, shape.hidden)) * shape.vocabulary * per_logit + cast


def eval_logit_bytes(p: Precision) -> int:
    """Bytes per token and vocabulary entry of the evaluation loss's logits: the head's output, the loss's float32
    upcast of it (a copy, unless it is float32 already) and its log-softmax."""
    return p.compute + (4 if p.compute != 4 else 0) + 4


def forward_activations(shape: ModelShape, setup: Setup, rows: int, *, prefill: bool) -> tuple[int, int]:
    """What a forward pass without autograd holds at its peak for `rows` sequences of `setup.sequence` tokens (the
    logits included), and of it the logits: evaluation's at every position, with its loss; generation's `prefill`
    at the last position only (`logits_to_keep=1`), copied to float32. One block computes at a time, beside the
    embeddings' output (held for the whole pass): its input, and its attention norm's output and attention's tensors,
    or the sum after attention, the MLP norm's output and the MLP's tensors; or the final hidden states and the
    logits."""
    p, sequence = Precision.of(setup), setup.sequence
    tokens, hidden = rows * sequence, shape.hidden * p.stream
    if setup.eager:  # the scores, their float32 softmax and its cast, and the additive mask for the whole pass
        attention, mask = shape.heads * sequence * (p.compute + 4 + p.compute % 4), sequence * p.compute
    else:  # the additive mask SDPA makes of the boolean one, which is held for the whole pass
        attention, mask = sequence * p.compute, sequence
    attention += hidden + shape.attention_saved * p.compute * shape.heads * shape.head_dim
    block = 2 * hidden + max(attention, 2 * hidden + mlp_bytes(shape, p))
    held = tokens * (IDS_BYTES + mask + 2 * shape.rotary * p.stream)  # ids, labels, mask, rotary's cos and sin
    outputs = shape.vocabulary if setup.task == "causal-lm" else shape.head[0][0]
    if prefill:
        logits = rows * outputs * (p.compute + 4)
    elif not setup.loss_kernel:
        logits = tokens * outputs * eval_logit_bytes(p)
    else:
        logits = _chunk(shape, setup, tokens)
    return held + max(tokens * block, tokens * hidden + logits), logits
