"""A causal language model's next-token loss that never holds the whole vocabulary's logits.

transformers' causal LMs compute the output head over every token, upcast all the logits to float32 and take
the cross-entropy (`ForCausalLMLoss`): 12 bytes per token and vocabulary entry at its peak, most of a step's
memory at a 128k vocabulary. Here the head and the cross-entropy run a chunk of tokens at a time:

- chunked (`linear_cross_entropy`): PyTorch, on any device. The same value as `ForCausalLMLoss` (labels shifted
  left by one, -100 ignored, float32 logits, the sum over `num_items_in_batch` where given, else the mean over
  the tokens that carry loss) and the same gradients, to within float32 rounding; the head's matmul in the dtype
  transformers' head would use (autocast's, else the hidden states'), as its backward;
- fused: Liger's fused linear cross-entropy kernel (GPUs, with the liger-kernel package);
- model: the model's own head and loss, for heads that are not one plain linear layer (soft-capped or scaled
  logits, a LoRA-wrapped head) or MoE models that add their router's loss.

`use_loss_kernel` puts the chosen one into the model's own forward, so that it runs inside the model's call
(FSDP2's hooks on the root, which gather its embeddings, norm and head, fire as before).
"""

from __future__ import annotations

import functools
import importlib.util
import types
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
import torch.nn.functional as F

from rocmtrain.api.errors import ConfigError
from rocmtrain.plan.activations import loss_chunk

IGNORE = -100  # transformers' ignore_index (data.causal_lm.tokens.IGNORE)
LIGER_INSTALL = "pip install liger-kernel"
# Config fields of models whose logits are more than the head's output (soft-capped, scaled) or whose loss has more
# than the cross-entropy (MoE routers' auxiliary loss): those keep their own head and loss.
NOT_PLAIN = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier", "lm_head_multiplier")
ROUTER_LOSS = "output_router_logits"
# The attribute of the (unwrapped) model that records the kernel `use_loss_kernel` gave it.
KERNEL_ATTRIBUTE = "rocmtrain_loss_kernel"


class LossKernel(Enum):
    """How the loss meets the vocabulary (`training.lossImplementation`)."""

    CHUNKED = "chunked"
    FUSED = "fused"
    MODEL = "model"


def loss_kernel(requested: str | None, *, gpu: bool, liger_installed: bool, plain_head: bool) -> LossKernel:
    """The kernel a job gets: the one it asks for, else fused where Liger runs (a GPU with liger-kernel), else
    chunked; the model's own loss for a head that is not plain. Asking for what cannot run is a ConfigError."""
    if requested == LossKernel.MODEL.value or (requested is None and not plain_head):
        return LossKernel.MODEL
    if not plain_head:
        raise ConfigError(
            f"spec.training.lossImplementation: {requested} needs the model's output head to be one plain linear "
            "layer, without soft-capped or scaled logits or a router's loss; use model"
        )
    fused = gpu and liger_installed
    if requested == LossKernel.FUSED.value and not fused:
        missing = "a GPU" if not gpu else f"the liger-kernel package ({LIGER_INSTALL})"
        raise ConfigError(f"spec.training.lossImplementation: fused runs Liger's kernel, which needs {missing}")
    if requested is None:
        return LossKernel.FUSED if fused else LossKernel.CHUNKED
    return LossKernel(requested)


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


@dataclass
class _Gradients:
    """The gradients the forward pass accumulates, each in its tensor's dtype (a float32 master weight's in float32;
    under FSDP2's bfloat16 policy in bfloat16, rounded once a chunk, as Liger's kernel does); None for an input that
    needs none."""

    hidden: torch.Tensor | None
    weight: torch.Tensor | None
    bias: torch.Tensor | None


def _summed_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    dtype: torch.dtype,
    divisor: torch.Tensor,
    grads: _Gradients | None,
) -> torch.Tensor:
    """The cross-entropy of `hidden` (tokens x hidden) under the head, summed over the targets that carry loss and
    divided by `divisor`, a chunk of tokens at a time; into `grads`, where given, its gradients. The head's matmuls
    run in `dtype`, the logits and their softmax in float32."""
    w = weight.to(dtype)
    b = bias.to(dtype) if bias is not None else None
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    step = loss_chunk(len(hidden), weight.shape[0], weight.shape[1])
    for start in range(0, len(hidden), step):
        h, t = hidden[start : start + step].to(dtype), targets[start : start + step]
        kept = t != IGNORE
        safe = torch.where(kept, t, 0)
        # the float32 logits, then in their place their softmax: one chunk's logits are all the loss holds
        probs = F.linear(h, w, b).float()
        picked = probs.gather(1, safe[:, None]).squeeze(1)
        top = probs.amax(dim=1, keepdim=True)
        sums = probs.sub_(top).exp_().sum(dim=1)
        total += torch.where(kept, top.squeeze(1) + sums.log() - picked, 0.0).sum()
        if grads is None:
            continue
        probs.div_(sums[:, None])
        probs[torch.arange(len(t), device=t.device), safe] -= 1
        grad = probs.mul_((kept / divisor)[:, None]).to(dtype)
        del probs  # the float32 chunk, where `grad` is a cast of it
        if grads.hidden is not None:
            grads.hidden[start : start + step] = grad @ w
        if grads.weight is not None:
            if dtype == grads.weight.dtype:
                grads.weight.addmm_(grad.T, h)
            else:  # each chunk's product in `dtype`, as autocast's head computes it, summed in the master's float32
                grads.weight.add_(grad.T @ h)
        if grads.bias is not None:
            grads.bias.add_(grad.sum(0))
    return total / divisor


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """The chunked loss, its gradients computed in the forward pass (as Liger's kernel does) rather than the logits
    recomputed in the backward pass: that saves a fourth matmul of the head's size (beside its forward and its two
    gradients), some 7% of a step's work for a 1B Llama with a 128k vocabulary. What it costs is holding
    the hidden states' gradient (the size of the hidden states) and the weight's (which the step holds anyway) from
    the loss's forward to its backward; a pass without gradients (evaluation) computes none."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        dtype: torch.dtype,
        divisor: torch.Tensor,
    ) -> torch.Tensor:
        need = ctx.needs_input_grad
        grads = _Gradients(
            torch.empty_like(hidden) if need[0] else None,
            torch.zeros_like(weight) if need[1] else None,
            torch.zeros_like(bias) if need[2] and bias is not None else None,
        )
        with torch.autocast(hidden.device.type, enabled=False):  # the dtypes are set here, as autocast would
            loss = _summed_loss(hidden, weight, bias, targets, dtype, divisor, grads)
        ctx.grads = (grads.hidden, grads.weight, grads.bias)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        found = tuple(g.mul_(grad_loss) if g is not None else None for g in ctx.grads)
        ctx.grads = None
        return (*found, None, None, None)


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype transformers' head computes in: autocast's where it is on, else the hidden states'."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype


def _targets_and_divisor(
    labels: torch.Tensor, num_items_in_batch: torch.Tensor | int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's target (the next label, -100 after a row's last) flattened, and what the summed loss is divided
    by: `num_items_in_batch`, else the targets that carry loss (at least 1: no target gives loss 0, not 0/0)."""
    targets = F.pad(labels, (0, 1), value=IGNORE)[..., 1:].reshape(-1)
    if num_items_in_batch is None:
        return targets, (targets != IGNORE).sum().clamp(min=1).float()
    return targets, torch.as_tensor(num_items_in_batch, dtype=torch.float32, device=labels.device)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """`ForCausalLMLoss` of the head's logits (`hidden` batch x sequence x hidden, `weight` vocabulary x hidden,
    `labels` batch x sequence), computed a chunk of tokens at a time (see `_ChunkedLinearCrossEntropy`)."""
    targets, divisor = _targets_and_divisor(labels, num_items_in_batch)
    flat, dtype = hidden.reshape(-1, hidden.shape[-1]), _compute_dtype(hidden)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias)):
        return _ChunkedLinearCrossEntropy.apply(flat, weight, bias, targets, dtype, divisor)
    with torch.autocast(hidden.device.type, enabled=False):
        return _summed_loss(flat, weight, bias, targets, dtype, divisor, None)


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """The same loss by Liger's fused linear cross-entropy kernel (its sum, divided as `linear_cross_entropy`)."""
    from liger_kernel.transformers.functional import (  # type: ignore[import-not-found, unused-ignore]
        liger_fused_linear_cross_entropy,
    )

    targets, divisor = _targets_and_divisor(labels, num_items_in_batch)
    flat = hidden.reshape(-1, hidden.shape[-1])
    summed = liger_fused_linear_cross_entropy(flat, weight, targets, bias, ignore_index=IGNORE, reduction="sum")
    return summed / divisor


LOSSES = {LossKernel.CHUNKED: linear_cross_entropy, LossKernel.FUSED: fused_linear_cross_entropy}


def causal_lm_of(model: torch.nn.Module) -> Any:
    """The transformers model inside peft's wrapper, or the model itself."""
    base = getattr(model, "get_base_model", None)
    return base() if base is not None else model


def plain_head(model: torch.nn.Module) -> bool:
    """Whether the model's logits are its output head's, one plain linear layer, and its loss their cross-entropy."""
    lm = causal_lm_of(model)
    config = lm.config
    scaled = any(getattr(config, name, None) not in (None, 1, 1.0) for name in NOT_PLAIN)
    router = getattr(config, ROUTER_LOSS, False)
    return type(lm.get_output_embeddings()) is torch.nn.Linear and not scaled and not router


def use_loss_kernel(model: torch.nn.Module, kernel: LossKernel) -> None:
    """Gives the causal LM (inside peft's wrapper, where there is one) a forward that, given labels, runs its decoder
    and then the kernel on its head's weights, returning the loss without logits; without labels (generation) its
    own forward runs. MODEL leaves the model as it is."""
    lm = causal_lm_of(model)
    setattr(lm, KERNEL_ATTRIBUTE, kernel)
    if kernel is LossKernel.MODEL:
        return
    own = type(lm).forward
    loss = LOSSES[kernel]

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        from transformers.modeling_outputs import CausalLMOutputWithPast

        labels = kwargs.pop("labels", None)
        if labels is None:
            return own(self, *args, **kwargs)
        num_items = kwargs.pop("num_items_in_batch", None)
        kwargs.pop("logits_to_keep", None)
        outputs = getattr(self, self.base_model_prefix)(*args, **kwargs)
        head = self.get_output_embeddings()
        return CausalLMOutputWithPast(
            loss=loss(outputs[0], head.weight, head.bias, labels, num_items),
            logits=None,
            past_key_values=getattr(outputs, "past_key_values", None),
            hidden_states=getattr(outputs, "hidden_states", None),
            attentions=getattr(outputs, "attentions", None),
        )

    lm.forward = types.MethodType(functools.wraps(own)(forward), lm)  # its signature, for transformers' inspections


def kernel_of(model: torch.nn.Module) -> LossKernel | None:
    """The kernel `use_loss_kernel` gave the model; None where it gave none (models other than causal LMs)."""
    return getattr(causal_lm_of(model), KERNEL_ATTRIBUTE, None)
