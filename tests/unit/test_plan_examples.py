"""The examples' memory plans against hand arithmetic from each model's config.json, phase by phase and term by term.

Llama 3.1 8B and 70B (examples/models): the parameters from the config (embeddings, each block's q/k/v/o
projections, MLP and norms, the final norm and the head), then the bytes each phase of the example's job
holds per GPU: the load, the training step, evaluation at twice the training micro-batch and generation's
KV cache, AdamW's state, and the margin.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import yaml

from rocmtrain.api.models import RocmTrainingJobSpec
from rocmtrain.plan.fit import plan_job
from rocmtrain.plan.gpu_memory import GIB, table_gpu_memory
from rocmtrain.plan.memory import MemoryPlan, Phase, PhasePlan
from unit.samples import EXAMPLES

LORA_8B = EXAMPLES / "cluster-llama-lora-mi300x.yaml"
LORA_70B = EXAMPLES / "cluster-llama-70b-lora-fsdp-mi300x.yaml"


def config(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / "models" / name / "config.json").read_text())


def spec(path: Any, **training: Any) -> RocmTrainingJobSpec:
    raw = yaml.safe_load(path.read_text())["spec"]
    raw["training"].update(training)
    return RocmTrainingJobSpec.model_validate(raw)


def margin(rest: int) -> int:
    """A tenth for the allocator's fragmentation, and 2 GiB for the runtime."""
    return math.ceil(rest * 0.1) + 2 * GIB


def by_phase(plan: MemoryPlan) -> dict[Phase, PhasePlan]:
    return {p.phase: p for p in plan.phases}


def llama_parameters(c: dict[str, Any]) -> tuple[int, int]:
    """(every parameter, those of one block) of a Llama config, by hand."""
    h, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    head_dim = h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    block = h * q + 2 * h * kv + q * h + 3 * h * inter + 2 * h  # q, k, v, o; gate, up, down; two RMSNorms
    return vocab * h + c["num_hidden_layers"] * block + h + vocab * h, block  # embeddings, blocks, norm, head


def test_the_configs_parameters_by_hand():
    assert llama_parameters(config("llama-3.1-8b"))[0] == 8_030_261_248
    assert llama_parameters(config("llama-3.1-70b"))[0] == 70_553_706_496


def test_the_8b_lora_example_on_mi300x_peaks_in_the_step():
    """DDP over 8 GPUs, a rank-16 adapter on every linear layer of a bf16 base, micro-batches of 4 x 4096 tokens,
    evaluation at 8 x 4096, generation of 64 records' answers (8 per rank) of up to 256 new tokens."""
    c = config("llama-3.1-8b")
    h, inter, vocab, layers, heads, kv = 4096, 14336, 128_256, 32, 32, 8
    head_dim = h // heads
    whole, _ = llama_parameters(c)
    adapter = layers * 16 * ((h + h) + 2 * (h + kv * head_dim) + (h + h) + 2 * (h + inter) + (inter + h))
    assert adapter == 41_943_040
    planned = plan_job(spec(LORA_8B), c, table_gpu_memory("MI300X"))
    plan, phases = planned.plan, by_phase(planned.plan)
    assert [p.phase for p in plan.phases] == [Phase.LOAD, Phase.STEP, Phase.EVALUATION, Phase.GENERATION]
    assert (plan.total_parameters, plan.trainable_parameters) == (whole + adapter, adapter)

    parameters = 2 * whole + 4 * adapter  # the bf16 base, the fp32 adapter: whole on every GPU
    gradients = 4 * adapter  # DDP's buckets, from the first step to the end
    optimizer = 8 * adapter + 4 * layers * 7 * 2  # two fp32 moments, and a step per adapter matrix
    working = 2 * adapter  # autocast's cached bf16 casts of the adapter's fp32 matrices
    load = plan.load
    assert (load.parameters, load.buffer) == (parameters, 0)
    assert load.total == parameters + margin(parameters)
    assert plan.host_load == 8 * parameters  # a whole model per rank, on the pod's host at once

    step = phases[Phase.STEP]
    assert (step.parameters, step.gradients, step.optimizer, step.working) == (
        parameters,
        gradients,
        optimizer,
        working,
    )
    # the chunked loss: the hidden states' gradient (bf16), and one chunk's logits (bf16, and their fp32 upcast) of
    # 512 tokens: 4 x 4096 tokens cut into ceil(vocab / h) = 32 chunks
    assert step.logits == 4 * 4096 * h * 2 + 512 * vocab * (2 + 4)

    tokens = 8 * 4096  # evaluation's micro-batch: twice the training's, never packed
    held = tokens * (16 + 4096 + 2 * head_dim * 2)  # ids and labels, the boolean mask, rotary's cos and sin (bf16)
    evaluation = phases[Phase.EVALUATION]
    assert evaluation.logits == tokens // 32 * vocab * (2 + 4) == 788_004_864  # one chunk: bf16 head, fp32 upcast
    # a block's MLP at a time: the embeddings' output, the block's input, the sum after attention, the norm's output
    # (bf16 each), and the MLP's gate, SiLU and up projection; more than the final hidden states and the loss's chunk
    mlp = 4 * 2 * h + 3 * 2 * inter
    assert evaluation.activations == held + tokens * mlp > held + tokens * 2 * h + evaluation.logits
    assert (evaluation.parameters, evaluation.gradients, evaluation.optimizer) == (parameters, gradients, optimizer)
    rest = parameters + gradients + optimizer + working + evaluation.activations
    assert (evaluation.working, evaluation.margin, evaluation.total) == (working, margin(rest), rest + margin(rest))

    generation = phases[Phase.GENERATION]
    prompts = min(8, math.ceil(64 / 8))
    assert generation.kv_cache == 2 * layers * kv * head_dim * (4096 + 256) * prompts * 2 == 4_563_402_752
    assert generation.logits == prompts * vocab * (2 + 4)  # the last position's, and its fp32 copy
    assert generation.activations == held + tokens * mlp
    rest = parameters + gradients + optimizer + working + generation.kv_cache + generation.activations
    assert generation.total == rest + margin(rest)

    assert plan.peak is step and plan.total == step.total
    assert f"{plan.total / GIB:.1f}" == "29.9" and planned.fits is True
    assert step.total > generation.total > evaluation.total > load.total


def test_the_70b_lora_example_is_sharded_from_the_load_and_fits_mi250x_and_mi300x():
    """FSDP over the 8 GPUs of a pod, a rank-16 adapter on q/k/v/o of a bf16 base, one packed row of 8192 tokens,
    evaluation at 2 x 8192; no generation. Every tensor's first dimension splits evenly into 8 shards."""
    c = config("llama-3.1-70b")
    h, vocab, layers, heads, kv = 8192, 128_256, 80, 64, 8
    head_dim = h // heads
    whole, block = llama_parameters(c)
    per_block_adapter = 16 * ((h + h) + 2 * (h + kv * head_dim) + (h + h))
    adapter = layers * per_block_adapter
    assert adapter == 65_536_000
    plans = {gpu: plan_job(spec(LORA_70B), c, table_gpu_memory(gpu)) for gpu in ("MI250X", "MI300X")}
    plan = plans["MI250X"].plan
    phases = by_phase(plan)
    assert [p.phase for p in plan.phases] == [Phase.LOAD, Phase.STEP, Phase.EVALUATION]

    parameters = (2 * whole + 4 * adapter) // 8  # 1/8 of the bf16 base and of the fp32 adapter
    largest = vocab // 8 * h * 2  # the embeddings' (and the head's) shard, in bf16
    load = plan.load
    assert (load.parameters, load.buffer, load.gradients, load.activations) == (parameters, largest, 0, 0)
    assert load.total == parameters + largest + margin(parameters + largest)
    assert plan.host_load == 8 * largest  # a read buffer per rank: nowhere the whole model
    assert load.total < 21 * GIB < 2 * whole // 8 + 8 * GIB  # ~1/8 of the 131 GiB bf16 model, not all of it

    optimizer = 8 * adapter // 8 + 4 * layers * 4 * 2
    step = phases[Phase.STEP]
    assert (step.parameters, step.gradients, step.optimizer) == (parameters, 4 * adapter // 8, optimizer)
    # the chunked loss: the hidden states' gradient (bf16), and one chunk's logits (bf16, and their fp32 upcast) of
    # 512 tokens: 8192 tokens cut into ceil(vocab / h) = 16 chunks
    assert step.logits == 8192 * h * 2 + 512 * vocab * (2 + 4)

    tokens = 2 * 8192
    evaluation = phases[Phase.EVALUATION]
    # FSDP2 gathers the root (embeddings, final norm, head) and two blocks at a time, in bf16 (its policy)
    gathered = 2 * (2 * vocab * h + h) + 2 * 2 * (block + per_block_adapter)
    assert (evaluation.working, evaluation.gradients) == (gathered, 0)  # no gradients: freed after each step
    assert evaluation.logits == tokens // 16 * vocab * (2 + 4) == 788_004_864
    held = tokens * (16 + 8192 + 2 * head_dim * 2)
    mlp = 4 * 2 * h + 3 * 2 * c["intermediate_size"]  # a block's MLP at a time, as the 8B's
    assert evaluation.activations == held + tokens * mlp > held + tokens * 2 * h + evaluation.logits
    rest = parameters + optimizer + gathered + evaluation.activations
    assert evaluation.total == rest + margin(rest)

    assert plan.peak is step and f"{plan.total / GIB:.1f}" == "44.2"
    assert step.total > evaluation.total > load.total
    assert plans["MI250X"].fits is True and 64 * GIB - plan.total > 11 * GIB
    assert plans["MI300X"].fits is True and plans["MI300X"].plan == plan


def test_the_70b_example_loaded_whole_would_not_fit_mi250x_and_the_plan_says_so():
    """With `sharding: none` every rank loads the whole bf16 model onto its GPU: 131 GiB, twice an MI250X's 64 GiB."""
    c = config("llama-3.1-70b")
    planned = plan_job(spec(LORA_70B, sharding="none"), c, table_gpu_memory("MI250X"))
    load = planned.plan.load
    assert load.parameters == 2 * 70_553_706_496 + 4 * 65_536_000
    assert planned.fits is False and load.total > 64 * GIB
    assert planned.plan.host_load == 8 * load.parameters
    assert planned.refusal() is not None and "fsdp over 8 GPUs" in planned.refusal()


@pytest.mark.parametrize("batch", [4, 8])
def test_evaluation_and_generation_scale_with_the_training_micro_batch(batch):
    c = config("llama-3.1-8b")
    phases = by_phase(plan_job(spec(LORA_8B, batchSizePerWorker=batch), c, None).plan)
    # one chunk of the chunked loss: a 32nd of the tokens (ceil(128_256 / 4096) chunks), in bf16 and fp32
    assert phases[Phase.EVALUATION].logits == 2 * batch * 4096 // 32 * 128_256 * (2 + 4)
    assert phases[Phase.GENERATION].kv_cache == 2 * 32 * 8 * 128 * (4096 + 256) * min(2 * batch, 8) * 2
