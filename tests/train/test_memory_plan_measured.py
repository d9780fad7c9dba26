"""The memory plan against the real thing: tiny models loaded by the training image's own loader, on CPU.

- The static part (parameters, gradients, AdamW's state) equals the bytes of the real tensors: the
  weights as loaded, the gradients after a backward pass, the optimiser's state after a step, for
  full fine-tuning and a LoRA adapter, bf16 and fp32 weights, and sharding none and fsdp at world sizes
  1, 2 and 4. An FSDP2 rank's share is taken from FSDP2's definition (every tensor cut along its first
  dimension into equal, padded pieces), applied to the real tensors: FSDP itself runs in the lead's tests.
- Every family's parameters, and an adapter's, are counted exactly.
- The activations are what autograd really keeps: every tensor storage alive at once during a forward
  and backward pass is counted (a dispatch mode sees each one made, and a weak reference each one freed),
  and the plan's activations are held to that peak: within 3% for the Llama family, 15% for the others.
- Evaluation's forward pass and generation's (prefill and KV cache) hold what the plan says, or up to 10%
  less: counted the same way, with no autograd.
"""

from __future__ import annotations

import json
import math
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rocmtrain.api.models import AdapterSpec
from rocmtrain.plan.memory import Phase, plan_memory
from rocmtrain.plan.model_shapes import model_shape, training_dtype
from rocmtrain.plan.setup import DEFAULT_TARGETS, Generation, Setup
from rocmtrain_train.loop.rank_setup import optimizer_for
from rocmtrain_train.model.linear_loss import LossKernel, use_loss_kernel
from rocmtrain_train.tasks import task_for
from train.jobs import job
from train.test_lm_families import FAMILIES

# Odd sizes, so that FSDP's shards need padding: 36 rows split evenly over 4 ranks, 18, 90 and the vocabulary not.
SIZE = {"hidden_size": 36, "intermediate_size": 90, "num_hidden_layers": 2, "num_attention_heads": 2}
LORA = {"rank": 4, "dropout": 0.0, "targetModules": ["q_proj", "v_proj", "down_proj"]}
# The activation cases' vocabulary: small, so that the model's own loss's logits do not outweigh the blocks.
VOCABULARY = 256


def lm_job(world: int, sharding: str, adapter: dict[str, Any] | None, precision: str = "fp32") -> Any:
    """A causal-lm job of `world` one-GPU workers (the plan's view of it; nothing trains)."""
    spec: dict[str, Any] = {
        "model": {"source": "/models/tiny", "task": "causal-lm", "numLabels": None, "maxSeqLength": 32},
        "data": {"promptField": "prompt", "responseField": "response"},
        "training": {"sharding": sharding, "batchSizePerWorker": 2, "precision": precision},
        "resources": {"workers": world, "gpusPerWorker": 1},
    }
    if adapter is not None:
        spec["adapter"] = adapter
    return job("plan", spec)


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def tiny_folder(request, tiny_lm, tmp_path_factory) -> Path:
    """A Llama of odd sizes, saved in `dtype`, with the language-model example's tokenizer."""
    folder = tmp_path_factory.mktemp(f"llama-{request.param}")
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    config = AutoConfig.for_model("llama", vocab_size=len(tokenizer), num_key_value_heads=1, **SIZE)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).to(getattr(torch, request.param)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def real_bytes(
    folder: Path, adapter: dict[str, Any] | None, precision: str
) -> dict[str, list[tuple[tuple[int, ...], int]]]:
    """(shape, bytes per element) of the weights as the training image loads them for a GPU (whatever dtype they
    were saved in), of their gradients after a backward pass, and of AdamW's state after a step."""
    spec = lm_job(1, "none", adapter, precision).spec
    model, _ = task_for(spec).load(folder, gpu=True)
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer = optimizer_for(model, spec.training, 1)
    optimizer.step()
    params = list(model.parameters())
    return {
        "parameters": [(tuple(p.shape), p.element_size()) for p in params],
        "gradients": [(tuple(p.grad.shape), p.grad.element_size()) for p in params if p.grad is not None],
        "optimizer": [(tuple(t.shape), t.element_size()) for s in optimizer.state.values() for t in s.values()],
        "counts": [(tuple(p.shape), int(p.requires_grad)) for p in params],
    }


def held(tensors: list[tuple[tuple[int, ...], int]], group: int) -> int:
    """Bytes one rank holds of `tensors`: all of each, or (group > 1) its FSDP2 shard, by FSDP2's definition."""
    if group == 1:
        return sum(math.prod(shape) * size for shape, size in tensors)
    return sum((math.ceil(shape[0] / group) * math.prod(shape[1:]) if shape else 1) * size for shape, size in tensors)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("adapter", [None, LORA], ids=["full", "lora"])
def test_the_static_part_is_the_bytes_of_the_real_tensors(tiny_folder, adapter, precision):
    """Whatever dtype the model was saved in: fp32 master weights, but a LoRA adapter's frozen base in bf16."""
    real = real_bytes(tiny_folder, adapter, precision)
    config = json.loads((tiny_folder / "config.json").read_text())
    for sharding in ("none", "fsdp"):
        for world in (1, 2, 4):
            setup = Setup.of(lm_job(world, sharding, adapter, precision).spec)
            group = world if sharding == "fsdp" else 1
            assert setup.shard_group == group
            plan = plan_memory(model_shape(config), setup)
            assert plan.step.parameters == held(real["parameters"], group), (sharding, world)
            assert plan.step.gradients == held(real["gradients"], group), (sharding, world)
            # AdamW's step is a 0-dimensional float32 tensor per parameter: whole on every rank
            assert plan.step.optimizer == held(real["optimizer"], group), (sharding, world)
            if group > 1:  # the share: the whole divided among the group, but for each tensor's padding
                whole = plan_memory(model_shape(config), Setup.of(lm_job(world, "none", adapter, precision).spec)).step
                rows = sum(math.prod(s[1:]) * size for s, size in real["parameters"])
                assert 0 <= plan.step.parameters - whole.parameters / group <= rows
    assert plan.total_parameters == sum(math.prod(s) for s, _ in real["counts"])
    assert plan.trainable_parameters == sum(math.prod(s) * t for s, t in real["counts"])


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_s_weights_and_default_adapter_are_counted_exactly(family):
    size, targets = FAMILIES[family]
    config = AutoConfig.for_model(family, vocab_size=97, **size)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shape = model_shape(json.loads(config.to_json_string()))
    assert sorted(shape.tensors()) == sorted(tuple(p.shape) for p in model.parameters())
    assert DEFAULT_TARGETS[family] == tuple(targets)  # peft's default for the family

    from peft import LoraConfig, get_peft_model

    adapted = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=list(targets)))
    setup = Setup(False, "fp32", 1, 1, AdapterSpec(rank=4), 1, 8, False, "causal-lm")
    assert plan_memory(shape, setup).trainable_parameters == sum(
        p.numel() for p in adapted.parameters() if p.requires_grad
    )


class LiveBytes(TorchDispatchMode):
    """The bytes of tensor storages made inside (the weights' aside) alive at once, and their peak."""

    def __init__(self, weights: set[int]) -> None:
        super().__init__()
        self._weights, self._alive, self.now, self.peak = weights, {}, 0, 0

    def _freed(self, key: int, size: int) -> Any:
        def callback(_: Any) -> None:
            self._alive.pop(key, None)
            self.now -= size

        return callback

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            if id(storage) in self._alive or storage.data_ptr() in self._weights:
                continue
            size = storage.nbytes()
            self._alive[id(storage)] = weakref.ref(storage, self._freed(id(storage), size))
            self.now += size
            self.peak = max(self.peak, self.now)
        return out


class CudaCasts(TorchFunctionMode):
    """Casts as CUDA's autocast does where the CPU's does not (the GPU is faked here): the ops on CUDA's float32 list
    that these models call on half-precision tensors, gelu_new's pow and LayerNorm, run in float32."""

    FLOAT32 = frozenset({torch.pow, torch.Tensor.pow, torch.Tensor.__pow__, torch.nn.functional.layer_norm})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.FLOAT32 and torch.is_autocast_enabled("cpu"):
            half = (torch.bfloat16, torch.float16)
            args, kwargs = tree_map(lambda a: a.float() if getattr(a, "dtype", None) in half else a, (args, kwargs))
        return func(*args, **(kwargs or {}))


def peak_activations(
    family: str,
    size: dict[str, int],
    adapter: AdapterSpec | None,
    checkpointing: bool,
    rows: int = 2,
    tokens: int = 128,
    attention: str = "sdpa",
    loss: LossKernel = LossKernel.MODEL,
    vocabulary: int = VOCABULARY,
) -> int:
    """The most bytes a forward and backward pass hold at once, besides the weights (one batch of `rows` rows of
    `tokens` tokens, the first of them padded, as padded batches are), as a GPU job with bf16 autocast trains: the
    weights as the training image loads them there (`training_dtype`), the pass under autocast to bf16 (the CPU's,
    made to cast what CUDA's does), with the `loss` kernel."""
    model = gpu_like_model(family, size, adapter, attention, vocabulary)
    use_loss_kernel(model, loss)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, vocabulary, (rows, tokens))
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    live = LiveBytes({p.untyped_storage().data_ptr() for p in model.parameters()})
    with live:
        with CudaCasts(), torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, attention_mask=mask).loss
        loss.backward()
    return live.peak


def gpu_like_model(
    family: str, size: dict[str, int], adapter: AdapterSpec | None, attention: str, vocabulary: int = VOCABULARY
) -> Any:
    """A tiny model with random weights, in the dtype the training image loads it in on a bf16 GPU, the KV cache off
    (as the training image sets it), with a LoRA adapter where given."""
    config = AutoConfig.for_model(family, vocab_size=vocabulary, **size)
    torch.manual_seed(0)
    dtype = getattr(torch, training_dtype(adapter=adapter is not None, on_gpu=True, precision="bf16"))
    model: Any = AutoModelForCausalLM.from_config(config, attn_implementation=attention).to(dtype)
    model.config.use_cache = False
    if adapter is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=adapter.rank, lora_dropout=adapter.dropout))
    return model


def peak_forward(
    size: dict[str, int],
    adapter: AdapterSpec | None,
    attention: str,
    rows: int,
    tokens: int,
    new: int,
    loss: LossKernel = LossKernel.MODEL,
    vocabulary: int = VOCABULARY,
) -> int:
    """The most bytes evaluation's forward pass (`new` 0: the loss over every position) or a greedy `generate` call
    (`new` tokens, with the KV cache) holds at once, besides the weights, under bf16 autocast as on a GPU: `rows`
    rows of `tokens` tokens, the first left-padded, as the training image's evaluation runs them, with the `loss`
    kernel."""
    model = gpu_like_model("llama", size, adapter, attention, vocabulary)
    use_loss_kernel(model, loss)
    model.eval()
    ids = torch.randint(1, vocabulary, (rows, tokens))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    live = LiveBytes({p.untyped_storage().data_ptr() for p in model.parameters()})
    with torch.no_grad(), live, CudaCasts(), torch.autocast("cpu", dtype=torch.bfloat16):
        if new:
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            )
        else:
            model(input_ids=ids, labels=ids, attention_mask=mask)
    return live.peak


# A small MLP, and few key/value heads (one, for Qwen3) for their query heads, so that the blocks' parts
# (attention's keys and values among them) weigh against the logits (of VOCABULARY).
WIDE = {"hidden_size": 128, "num_hidden_layers": 2}
# Per family: its sizes, the plan's tolerance, and the cases measured (the Llama family's in full; the others less
# exactly counted, and slower to run).
ACTIVATION_CASES = {
    "llama": ({**WIDE, "intermediate_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2}, 0.03),
    "qwen3": ({**WIDE, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 1}, 0.03),
    "gpt_neox": ({**WIDE, "intermediate_size": 512, "num_attention_heads": 4}, 0.15),
    "gpt2": (
        {"n_layer": 2, "n_embd": 128, "n_head": 4, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
        0.15,
    ),
}
FULL, LORA_ONLY, LORA_CHECKPOINTING = (
    (None, False),
    (AdapterSpec(rank=8, dropout=0.0), False),
    (AdapterSpec(rank=8, dropout=0.0), True),
)


@pytest.mark.parametrize(
    ("family", "adapter", "checkpointing", "attention"),
    [
        ("llama", *FULL, "sdpa"),
        ("llama", *FULL, "eager"),
        ("llama", *LORA_ONLY, "sdpa"),
        ("llama", *LORA_CHECKPOINTING, "sdpa"),
        ("qwen3", *FULL, "sdpa"),
        ("gpt_neox", *FULL, "sdpa"),
        ("gpt2", *FULL, "sdpa"),
    ],
    ids=[
        "llama-full",
        "llama-full-eager",
        "llama-lora",
        "llama-lora-checkpointing",
        "qwen3-full",
        "gpt_neox-full",
        "gpt2-full",
    ],
)
def test_the_activations_are_what_autograd_keeps(family, adapter, checkpointing, attention):
    size, tolerance = ACTIVATION_CASES[family]
    measured = peak_activations(family, size, adapter, checkpointing, attention=attention)
    config = json.loads(AutoConfig.for_model(family, vocab_size=VOCABULARY, **size).to_json_string())
    setup = Setup(
        True, "bf16", 1, 1, adapter, 2, 128, checkpointing, "causal-lm", eager=attention == "eager", loss="model"
    )
    plan = plan_memory(model_shape(config), setup).step
    planned = plan.activations + plan.working  # autocast's bf16 copies of the fp32 weights are made in the pass too
    assert abs(planned - measured) <= tolerance * measured, (planned, measured)


def test_with_full_fine_tuning_and_checkpointing_the_gradients_grow_as_activations_go():
    """Where the weights outweigh the logits (one short row), the peak comes late in the backward pass, when most
    weights have their gradients: the plan's activations and gradients together bound it."""
    size, _ = ACTIVATION_CASES["llama"]
    measured = peak_activations("llama", size, None, True, rows=1, tokens=64)
    config = json.loads(AutoConfig.for_model("llama", vocab_size=VOCABULARY, **size).to_json_string())
    setup = Setup(True, "bf16", 1, 1, None, 1, 64, True, "causal-lm", loss="model")
    plan = plan_memory(model_shape(config), setup).step
    assert plan.activations + plan.working < measured <= plan.activations + plan.working + plan.gradients


# Generation's Llama: as many key/value heads as query heads and more blocks, so that the KV cache weighs.
GENERATION_SIZE = {**WIDE, "num_hidden_layers": 4, "intermediate_size": 256, "num_attention_heads": 8}


@pytest.mark.parametrize(
    ("adapter", "attention", "new"),
    [(None, "sdpa", 0), (None, "eager", 0), (LORA_ONLY[0], "sdpa", 0), (LORA_ONLY[0], "sdpa", 2)],
    ids=["full-evaluation", "full-evaluation-eager", "lora-evaluation", "lora-generation"],
)
def test_evaluation_and_generation_hold_what_the_plan_says(adapter, attention, new):
    """Evaluation at twice the training micro-batch (4 rows), and generation's prefill of 4 prompts beside its KV cache
    (`new` tokens more): the plan's activations, working copies and cache hold the measured peak, and over it by at
    most 10%."""
    rows, tokens = 4, 64 if new else 128
    size = GENERATION_SIZE if new else ACTIVATION_CASES["llama"][0]
    measured = peak_forward(size, adapter, attention, rows, tokens, new)
    config = json.loads(AutoConfig.for_model("llama", vocab_size=VOCABULARY, **size).to_json_string())
    base = Setup(
        True, "bf16", 1, 1, adapter, rows // 2, tokens, False, "causal-lm", eager=attention == "eager", loss="model"
    )
    setup = replace(base, evaluation=True, generation=Generation(rows, new) if new else None)
    phase = plan_memory(model_shape(config), setup).phases[-1]
    assert phase.phase is (Phase.GENERATION if new else Phase.EVALUATION)
    planned = phase.activations + phase.working + phase.kv_cache
    assert 0.98 * measured <= planned <= 1.10 * measured, (planned, measured)


# The chunked loss's cases: a vocabulary 32 times the hidden size, as Llama 3's 128k is to its 4k, so that the loss
# runs in 32 chunks of 8 tokens.
CHUNKED_VOCABULARY = 4096


@pytest.mark.parametrize("adapter", [None, LORA_ONLY[0]], ids=["full", "lora"])
def test_the_chunked_loss_holds_what_the_plan_says(adapter):
    """With the chunked loss the step's peak is within 3% of the plan's activations and working copies, and of the
    head's gradient under full fine-tuning (the loss makes it in its forward pass, at the step's peak; the plan has it
    among the gradients); evaluation's is held by the plan, and over it by at most 10%."""
    size, tolerance = ACTIVATION_CASES["llama"]
    config = json.loads(AutoConfig.for_model("llama", vocab_size=CHUNKED_VOCABULARY, **size).to_json_string())
    setup = Setup(True, "bf16", 1, 1, adapter, 2, 128, False, "causal-lm", evaluation=True, loss="chunked")
    step, evaluation = plan_memory(model_shape(config), setup).phases[1:]
    measured = peak_activations("llama", size, adapter, False, loss=LossKernel.CHUNKED, vocabulary=CHUNKED_VOCABULARY)
    head = CHUNKED_VOCABULARY * size["hidden_size"] * 4 if adapter is None else 0
    planned = step.activations + step.working + head
    assert abs(planned - measured) <= tolerance * measured, (planned, measured)
    measured = peak_forward(size, adapter, "sdpa", 4, 128, 0, LossKernel.CHUNKED, CHUNKED_VOCABULARY)
    planned = evaluation.activations + evaluation.working
    assert 0.98 * measured <= planned <= 1.10 * measured, (planned, measured)
