"""The causal-LM loss that never holds the whole vocabulary's logits (`model.linear_loss`): the same loss and
gradients as transformers' `ForCausalLMLoss`, chunk by chunk; in a whole model, with and without an adapter; the
kernel each job gets (the bench of its memory runs in tests/bench/test_lm_loss_memory.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.loss.loss_utils import ForCausalLMLoss

from rocmtrain.api.errors import ConfigError
from rocmtrain.plan.activations import loss_chunk
from rocmtrain_train.model.causal_lm import load_causal_lm
from rocmtrain_train.model.linear_loss import (
    IGNORE,
    LossKernel,
    kernel_of,
    linear_cross_entropy,
    loss_kernel,
    plain_head,
    use_loss_kernel,
)
from train.jobs import job


def inputs(rows: int, length: int, hidden: int, vocabulary: int, bias: bool) -> tuple[torch.Tensor, ...]:
    """Hidden states, a head's weight (and bias) that require gradients, and labels with some ignored: a row's first
    tokens (a prompt) and another's last (padding)."""
    generator = torch.Generator().manual_seed(rows * length + vocabulary)
    states = torch.randn(rows, length, hidden, generator=generator, requires_grad=True)
    weight = torch.randn(vocabulary, hidden, generator=generator, requires_grad=True)
    offset = torch.randn(vocabulary, generator=generator, requires_grad=True) if bias else None
    labels = torch.randint(0, vocabulary, (rows, length), generator=generator)
    labels[0, : length // 3] = IGNORE
    labels[-1, -length // 4 :] = IGNORE
    return states, weight, offset, labels


def transformers_loss(states, weight, offset, labels, items) -> torch.Tensor:
    """What a transformers causal LM computes: the head over every token, then `ForCausalLMLoss`."""
    return ForCausalLMLoss(F.linear(states, weight, offset), labels, weight.shape[0], num_items_in_batch=items)


def gradients(loss: torch.Tensor, *tensors: torch.Tensor | None) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, [t for t in tensors if t is not None]))


@pytest.mark.parametrize(
    ("rows", "length", "hidden", "vocabulary", "bias"),
    [(3, 37, 16, 100, True), (2, 64, 8, 300, False), (1, 5, 32, 40, True)],
    ids=["7-chunks-bias", "38-chunks", "one-chunk"],
)
@pytest.mark.parametrize("given", [True, False], ids=["num-items", "mean"])
def test_the_loss_and_its_gradients_are_transformers(rows, length, hidden, vocabulary, bias, given):
    states, weight, offset, labels = inputs(rows, length, hidden, vocabulary, bias)
    tokens = rows * length
    assert loss_chunk(tokens, vocabulary, hidden) < tokens or tokens < hidden  # several chunks, a last one short
    items = (labels[:, 1:] != IGNORE).sum() + 5 if given else None  # a global count, not this batch's
    expected = transformers_loss(states, weight, offset, labels, items)
    found = linear_cross_entropy(states, weight, offset, labels, items)
    torch.testing.assert_close(found, expected, rtol=1e-6, atol=1e-6)
    found_grads, expected_grads = gradients(found, states, weight, offset), gradients(expected, states, weight, offset)
    for grad, want in zip(found_grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-6)


def test_under_autocast_the_head_computes_in_its_dtype_and_the_loss_in_float32():
    """The head's matmul in bfloat16 as transformers' would be (a float32 one differs at bfloat16's rounding), the
    logits in float32: the hidden states' gradient is transformers' to the bit, the weight's its sum in float32 of
    each chunk's bfloat16 product (transformers': one product, rounded once)."""
    states, weight, offset, labels = inputs(2, 64, 16, 200, False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = transformers_loss(states, weight, offset, labels, None)
        found = linear_cross_entropy(states, weight, offset, labels, None)
    assert found.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(found, expected, rtol=1e-6, atol=1e-6)
    float32 = linear_cross_entropy(states, weight, offset, labels, None)
    assert not torch.isclose(float32, expected, rtol=1e-4)  # a float32 head's loss is not bfloat16's
    hidden, weights = gradients(found, states, weight)
    want_hidden, want_weights = gradients(expected, states, weight)
    torch.testing.assert_close(hidden, want_hidden, rtol=0, atol=0)
    torch.testing.assert_close(weights, want_weights, rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("items", [None, torch.tensor(1)], ids=["mean", "num-items"])
def test_labels_that_are_all_ignored_give_loss_0_and_zero_gradients(items):
    states, weight, offset, labels = inputs(2, 9, 8, 50, True)
    loss = linear_cross_entropy(states, weight, offset, torch.full_like(labels, IGNORE), items)
    assert float(loss.detach()) == 0.0
    assert all(torch.equal(g, torch.zeros_like(g)) for g in gradients(loss, states, weight, offset))


def test_without_gradients_the_loss_is_the_same():
    states, weight, offset, labels = inputs(3, 37, 16, 100, True)
    expected = transformers_loss(states, weight, offset, labels, None)
    with torch.no_grad():
        found = linear_cross_entropy(states, weight, offset, labels, None)
    assert not found.requires_grad
    torch.testing.assert_close(found, expected.detach(), rtol=1e-6, atol=1e-6)


def loss_and_gradients(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    return out, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def lm_batch(vocabulary: int) -> dict[str, torch.Tensor]:
    """Two padded rows, the first with a prompt that carries no loss."""
    ids = torch.randint(1, vocabulary, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0
    labels = ids.masked_fill(mask == 0, IGNORE)
    labels[0, :5] = IGNORE
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "num_items_in_batch": torch.tensor(13)}


def assert_same(found: tuple[Any, dict[str, torch.Tensor]], expected: tuple[Any, dict[str, torch.Tensor]]) -> None:
    (out, grads), (want, want_grads) = found, expected
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-6, atol=1e-6)
    assert out.logits is None and want.logits is not None
    assert grads.keys() == want_grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_whole_llama_trains_the_same_with_the_chunked_loss(tiny_lm):
    """Every parameter's gradient (the head's and the embeddings' among them), and generation's forward unchanged."""
    torch.manual_seed(0)
    plain = AutoModelForCausalLM.from_pretrained(tiny_lm, attn_implementation="sdpa")
    chunked = AutoModelForCausalLM.from_pretrained(tiny_lm, attn_implementation="sdpa")
    assert plain_head(chunked)
    use_loss_kernel(chunked, LossKernel.CHUNKED)
    batch = lm_batch(plain.config.vocab_size)
    assert_same(loss_and_gradients(chunked, batch), loss_and_gradients(plain, batch))
    with torch.no_grad():  # without labels, the model's own forward: logits, as generation takes them
        ids = batch["input_ids"]
        torch.testing.assert_close(chunked(input_ids=ids).logits, plain(input_ids=ids).logits)


def lm_spec(tiny_lm, loss: str, adapter: dict[str, Any] | None = None) -> Any:
    spec: dict[str, Any] = {
        "model": {"task": "causal-lm", "numLabels": None, "maxSeqLength": 32},
        "data": {"promptField": "prompt", "responseField": "response"},
        "training": {"precision": "fp32", "lossImplementation": loss},
    }
    return job("loss", spec, {"adapter": adapter} if adapter else {}, model=tiny_lm).spec


def test_with_a_lora_adapter_the_chunked_loss_trains_the_adapter_the_same(tiny_lm):
    """Through `load_causal_lm`, which gives the peft-wrapped model the job's kernel (the default: chunked on CPUs)."""
    adapter = {"rank": 4, "dropout": 0.0, "targetModules": ["q_proj", "v_proj"]}
    chunked, _ = load_causal_lm(tiny_lm, lm_spec(tiny_lm, None, adapter), gpu=False)
    plain, _ = load_causal_lm(tiny_lm, lm_spec(tiny_lm, "model", adapter), gpu=False)
    assert (kernel_of(chunked), kernel_of(plain)) == (LossKernel.CHUNKED, LossKernel.MODEL)
    batch = lm_batch(plain.config.vocab_size)
    found, expected = loss_and_gradients(chunked, batch), loss_and_gradients(plain, batch)
    assert all("lora_" in name for name in found[1])
    assert_same(found, expected)


@pytest.mark.parametrize(
    ("requested", "gpu", "liger", "plain", "kernel"),
    [
        (None, True, True, True, LossKernel.FUSED),
        (None, True, False, True, LossKernel.CHUNKED),
        (None, False, True, True, LossKernel.CHUNKED),
        (None, True, True, False, LossKernel.MODEL),
        ("chunked", True, True, True, LossKernel.CHUNKED),
        ("fused", True, True, True, LossKernel.FUSED),
        ("model", True, True, True, LossKernel.MODEL),
        ("model", False, False, False, LossKernel.MODEL),
    ],
)
def test_the_kernel_a_job_gets(requested, gpu, liger, plain, kernel):
    assert loss_kernel(requested, gpu=gpu, liger_installed=liger, plain_head=plain) is kernel


@pytest.mark.parametrize(
    ("requested", "gpu", "liger", "plain", "says"),
    [
        ("fused", False, True, True, "needs a GPU"),
        ("fused", True, False, True, "pip install liger-kernel"),
        ("chunked", False, False, False, "one plain linear layer"),
        ("fused", True, True, False, "one plain linear layer"),
    ],
)
def test_a_kernel_that_cannot_run_is_refused(requested, gpu, liger, plain, says):
    with pytest.raises(ConfigError, match=r"spec\.training\.lossImplementation") as raised:
        loss_kernel(requested, gpu=gpu, liger_installed=liger, plain_head=plain)
    assert says in str(raised.value)


def test_soft_capped_or_scaled_logits_are_not_a_plain_head(tiny_lm):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm)
    assert plain_head(model)
    model.config.final_logit_softcapping = 30.0
    assert not plain_head(model)
