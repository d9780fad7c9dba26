"""The memory plan, pure: model shapes from config.json, the parts per GPU, what fits, and each GPU's memory.

The plan against real tensors and autograd's activations is in tests/train/test_memory_plan_measured.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from rocmtrain.admission.node_fit import NodeInfo, gpu_memory
from rocmtrain.api.models import AdapterSpec, RocmTrainingJobSpec
from rocmtrain.api.ranks import shard_group
from rocmtrain.plan.fit import changes_that_fit, plan_job
from rocmtrain.plan.gpu_memory import GIB, GpuMemory, job_gpu_memory, product_gib, vram_label_bytes
from rocmtrain.plan.memory import RUNTIME_BYTES, plan_memory
from rocmtrain.plan.model_shapes import ModelConfigError, model_shape
from rocmtrain.plan.setup import Setup
from unit.samples import EXAMPLES

LLAMA_70B = json.loads((EXAMPLES / "models" / "llama-3.1-70b" / "config.json").read_text())
LLAMA_8B = json.loads((EXAMPLES / "models" / "llama-3.1-8b" / "config.json").read_text())


def lm_spec(resources: dict[str, Any] | None = None, extra: dict[str, Any] | None = None, **training: Any):
    """An 8B-sized causal-lm job, on 8 MI250X GCDs of one pod unless `resources` says otherwise, full fine-tuning
    unless `extra` (further spec fields) has an adapter; `training` changes its training fields."""
    return RocmTrainingJobSpec.model_validate(
        {
            "model": {"source": "/models/llama", "task": "causal-lm", "maxSeqLength": 4096},
            "data": {"train": {"uri": "s3://b/train.jsonl"}, "promptField": "p", "responseField": "r"},
            "training": {"batchSizePerWorker": 4, **training},
            "resources": resources or {"workers": 1, "gpusPerWorker": 8, "gpu": {"productName": "MI250X"}},
            **(extra or {}),
        }
    )


def test_llama_3_1_has_the_parameters_meta_publishes():
    assert model_shape(LLAMA_70B).parameters == 70_553_706_496
    assert model_shape(LLAMA_8B).parameters == 8_030_261_248
    assert model_shape(LLAMA_70B).dtype == "bfloat16"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "bert"}, "model_type 'bert' is not one the memory plan knows (llama, mistral, qwen2, qwen3"),
        ({}, "model_type None is not one the memory plan knows"),
        (
            {"model_type": "llama", "hidden_size": "big"},
            "hidden_size must be a whole number from 1 to 1048576, not 'big'",
        ),
        ({"model_type": "llama", "num_hidden_layers": 0}, "num_hidden_layers must be a whole number from 1 to 4096"),
        ({"model_type": "llama", "hidden_size": 100, "num_attention_heads": 3}, "hidden_size 100 is not a multiple"),
        ({"model_type": "llama", "torch_dtype": "float64"}, "dtype must be one of float32, bfloat16, float16"),
        ({"model_type": "gpt2", "resid_pdrop": 2}, "resid_pdrop must be a number from 0 to below 1, not 2"),
        ({"model_type": "qwen2", "tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
        ({"model_type": "gpt_neox", "rotary_pct": 0}, "partial_rotary_factor must be above 0 and at most 1, not 0"),
    ],
)
def test_a_config_the_plan_cannot_read_is_refused_by_field(config, message):
    with pytest.raises(ModelConfigError, match=f"^config.json: {message[:40]}"):
        model_shape(config)


def test_fields_a_config_leaves_out_take_the_family_s_defaults():
    assert model_shape({"model_type": "mistral"}).kv_heads == 8
    assert model_shape({"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16}).head_dim == 128
    assert model_shape({"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 16}).kv_heads == 16
    assert model_shape({"model_type": "gpt2"}).head == ()  # tied to the embeddings
    assert model_shape({"model_type": "llama", "dtype": None}).dtype == "float32"
    neox = {"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 4}  # heads of 128
    assert model_shape(neox).rotary == 32  # a quarter of each head rotates by default
    assert model_shape({**neox, "rotary_pct": 1.0}).rotary == 128  # as configs before transformers 5 say it
    assert model_shape({**neox, "rope_parameters": {"partial_rotary_factor": 0.5}}).rotary == 64


def setup(**changes: Any) -> Setup:
    base = Setup(True, "bf16", 8, 1, None, 1, 4096, True, "causal-lm", ranks_per_pod=8)
    return replace(base, **changes)


@pytest.mark.parametrize("group", [2, 4, 8, 16])
def test_an_fsdp_rank_holds_its_share_of_the_whole_within_a_row_per_tensor(group):
    shape = model_shape(LLAMA_70B)
    whole, sharded = plan_memory(shape, setup()).step, plan_memory(shape, setup(shard_group=group, world_size=16)).step
    rows = sum(math.prod(t[1:]) for t in shape.tensors()) * 4  # a padding row per tensor, of float32 masters
    for part in ("parameters", "gradients"):
        assert 0 <= getattr(sharded, part) - getattr(whole, part) / group <= rows
    assert whole.parameters == 70_553_706_496 * 4


@pytest.mark.parametrize(
    ("workers", "gpus", "scope", "group"),
    [(1, 8, "pod", 8), (2, 8, "pod", 8), (2, 8, "job", 16), (4, 1, "pod", 4), (3, 2, "pod", 2), (1, 1, "pod", 1)],
)
def test_the_shard_group_is_a_pod_s_ranks_or_the_job_s(workers, gpus, scope, group):
    resources = {"workers": workers, "gpusPerWorker": gpus}
    spec = lm_spec(sharding="fsdp", shardingScope=scope, resources=resources)
    assert Setup.of(spec).shard_group == group == shard_group(workers * gpus, gpus, scope)


def test_full_fine_tuning_holds_sixteen_bytes_per_parameter_whatever_dtype_the_config_saved():
    """fp32 master weights (4 bytes), fp32 gradients (4) and AdamW's two fp32 moments (8), and a 4-byte step per
    tensor; under autocast, a bf16 copy of every linear weight kept for the pass (not the embeddings' or the norms',
    nor the head's, which the chunked loss casts for its own time; the model's loss keeps the head's too)."""
    count, tensors = 8_030_261_248, 32 * 9 + 3  # per block 7 linear weights and 2 norms; embeddings, norm, head
    embeddings, norms, head = 128_256 * 4096, (2 * 32 + 1) * 4096, 128_256 * 4096
    for dtype in ("bfloat16", "float32"):
        plan = plan_memory(model_shape({**LLAMA_8B, "torch_dtype": dtype}), setup()).step
        assert (plan.parameters, plan.gradients, plan.optimizer) == (4 * count, 4 * count, 8 * count + 4 * tensors)
        assert plan.parameters + plan.gradients + plan.optimizer == 16 * count + 4 * tensors
        assert plan.working == 2 * (count - embeddings - norms - head)
    model_loss = plan_memory(model_shape(LLAMA_8B), setup(loss="model")).step
    assert model_loss.working == 2 * (count - embeddings - norms)
    assert plan_memory(model_shape(LLAMA_8B), setup(precision="fp32")).step.working == 0  # no autocast, no copies
    sharded = plan_memory(model_shape(LLAMA_8B), setup(shard_group=8)).step  # FSDP2's bf16 policy replaces autocast
    assert sharded.working < plan.working


def test_a_lora_adapter_trains_its_matrices_in_float32_and_nothing_else():
    adapter = AdapterSpec(rank=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    plan = plan_memory(model_shape(LLAMA_70B), setup(adapter=adapter))
    assert plan.trainable_parameters == 80 * 16 * (2 * (8192 + 8192) + 2 * (8192 + 1024)) == 65_536_000
    assert plan.step.gradients == 4 * plan.trainable_parameters
    assert plan.step.parameters == 2 * 70_553_706_496 + 4 * plan.trainable_parameters


def test_an_adapter_target_no_linear_module_has_is_refused_with_the_choices():
    with pytest.raises(ModelConfigError, match=r"spec\.adapter\.targetModules: c_attn match no linear module"):
        plan_memory(model_shape(LLAMA_8B), setup(adapter=AdapterSpec(target_modules=["c_attn"])))


def test_activations_grow_with_tokens_and_shrink_with_checkpointing_and_the_loss_holds_a_chunk_of_logits():
    """The model's loss holds 12 bytes per token and vocabulary entry; the chunked one, the hidden states' gradient
    (fp32 masters: an fp32 stream), one chunk's logits (bf16 and fp32) of 4096 tokens cut into ceil(128_256 / 4096) =
    32 chunks, and the bf16 cast of the fp32 head and each chunk's bf16 share of its gradient."""
    shape = model_shape(LLAMA_8B)
    plain, checkpointed = plan_memory(shape, setup(checkpointing=False)).step, plan_memory(shape, setup()).step
    assert checkpointed.activations < plain.activations / 4
    assert plan_memory(shape, setup(batch=2)).step.activations > checkpointed.activations
    assert plain.logits == 4096 * 4096 * 4 + 4096 // 32 * 128_256 * (2 + 4) + 2 * 128_256 * 4096 * 2
    model_loss = plan_memory(shape, setup(checkpointing=False, loss="model")).step
    assert model_loss.logits == 12 * 4096 * 128_256
    assert model_loss.activations - plain.activations > 0.9 * (model_loss.logits - plain.logits)


def test_the_margin_is_a_tenth_and_the_runtime_on_gpus_only():
    for plan in plan_memory(model_shape(LLAMA_8B), setup(evaluation=True)).phases:
        rest = plan.total - plan.margin
        assert plan.margin == math.ceil(rest * 0.1) + RUNTIME_BYTES
    assert {p.margin for p in plan_memory(model_shape(LLAMA_8B), setup(on_gpu=False)).phases} == {0}


def test_a_search_is_planned_at_its_largest_trial():
    space = {"batchSizePerWorker": [2, 16], "adapterRank": [4, 64]}
    found = Setup.of(lm_spec(extra={"adapter": {"rank": 8}, "tuning": {"searchSpace": space}}))
    assert (found.batch, found.adapter.rank if found.adapter else None) == (16, 64)


def test_a_job_too_large_for_its_gpus_is_told_the_cheapest_changes_that_fit():
    planned = plan_job(lm_spec(gradientCheckpointing=False), LLAMA_8B, job_gpu_memory(lm_spec()))
    assert planned.fits is False
    assert [c.description for c in planned.changes] == [
        "fsdp over 8 GPUs and gradientCheckpointing",
        "gradientCheckpointing and a LoRA adapter",
    ]
    sharded, adapted = (f"{c.plan.total / GIB:.1f}" for c in planned.changes)
    assert planned.refusal() == (
        f"needs {planned.plan.total / GIB:.1f} GiB per GPU with sharding none, full fine-tuning, but a GPU has 64.0 "
        f"GiB (MI250X, AMD's data sheet); fits with fsdp over 8 GPUs and gradientCheckpointing ({sharded} GiB) or "
        f"with gradientCheckpointing and a LoRA adapter ({adapted} GiB); the peak is the step (load "
        f"{planned.plan.phases[0].total / GIB:.1f}, step {planned.plan.total / GIB:.1f} GiB)"
    )
    # 16 bytes per parameter alone (fp32 masters, gradients and AdamW) are 120 GiB, beyond the GPU's 64
    assert planned.plan.total > 16 * 8_030_261_248 > 64 * GIB
    assert all(c.plan.total <= 64 * GIB for c in planned.changes)


def test_a_job_whose_evaluation_does_not_fit_is_refused_though_its_step_fits():
    """The 8B LoRA example with the model's own loss evaluates at 8 x 4096 tokens: 39 GiB of logits, beside 23.5 GiB
    in the training step."""
    lora = {
        "adapter": {"rank": 16, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        "data": {"train": {"uri": "s3://b/t"}, "eval": {"uri": "s3://b/e"}, "promptField": "p", "responseField": "r"},
    }
    spec = lm_spec(extra=lora, gradientCheckpointing=True, precision="bf16", lossImplementation="model")
    planned = plan_job(spec, LLAMA_8B, GpuMemory(56 * GIB, "a 56 GiB GPU"))
    step, evaluation = planned.plan.step, planned.plan.peak
    assert evaluation.phase.value == "evaluation" and step.total < 56 * GIB < evaluation.total == planned.plan.total
    assert planned.fits is False
    changes = [c.description for c in planned.changes]
    assert changes == ["fsdp over 8 GPUs", "batchSizePerWorker 2 and 2x gradientAccumulationSteps"]
    refusal = planned.refusal()
    assert refusal is not None and refusal.endswith(
        f"; the peak is the evaluation (load {planned.plan.phases[0].total / GIB:.1f}, step {step.total / GIB:.1f}, "
        f"evaluation {evaluation.total / GIB:.1f} GiB)"
    )
    no_eval = lm_spec(
        extra={"adapter": lora["adapter"]}, gradientCheckpointing=True, precision="bf16", lossImplementation="model"
    )
    without_eval = plan_job(no_eval, LLAMA_8B, GpuMemory(56 * GIB, "a 56 GiB GPU"))
    assert without_eval.fits is True and without_eval.plan.peak.phase.value == "step"


def test_one_change_is_offered_where_one_suffices_cheapest_first():
    shape, gpu = model_shape(LLAMA_8B), 64 * GIB
    found = [c.description for c in changes_that_fit(shape, setup(batch=1, sequence=2048), gpu)]
    assert found == ["fsdp over 8 GPUs", "a LoRA adapter"]
    smaller = [c.description for c in changes_that_fit(shape, setup(shard_group=8, batch=16), 40 * GIB)]
    assert smaller[0] == "batchSizePerWorker 4 and 4x gradientAccumulationSteps"  # 2 with the model's loss
    with_model_loss = changes_that_fit(shape, setup(shard_group=8, batch=16, loss="model"), 40 * GIB)
    assert with_model_loss[0].description == "batchSizePerWorker 2 and 8x gradientAccumulationSteps"


def test_a_job_that_fits_or_has_no_gpus_is_not_refused():
    fits = plan_job(lm_spec(sharding="fsdp"), LLAMA_8B, GpuMemory(192 * GIB, "MI300X"))
    assert (fits.fits, fits.refusal(), fits.changes) == (True, None, [])
    cpu = plan_job(lm_spec(resources={"workers": 2, "gpusPerWorker": 0}), LLAMA_8B, GpuMemory(GIB, "x"))
    assert (cpu.fits, cpu.gpu, cpu.plan.peak.margin) == (None, None, 0)
    unknown = plan_job(lm_spec(resources={"workers": 1, "gpusPerWorker": 8}), LLAMA_8B, None)
    assert (unknown.fits, unknown.refusal()) == (None, None)


# --- the memory of a GPU ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "found"), [("192G", 192 * GIB), ("64G", 64 * GIB), ("192", None), ("0G", None)])
def test_the_labeller_s_vram_value_is_whole_gib(value, found):
    assert vram_label_bytes(value) == found


@pytest.mark.parametrize(
    ("product", "gib"),
    [
        ("AMD_Instinct_MI300X_OAM", 192),
        ("AMD_Instinct_MI325X_OAM", 256),
        ("AMD_Instinct_MI355X", 288),
        ("AMD_Instinct_MI300A", 128),
        ("AMD_Instinct_MI250X", 64),
        ("AMD_Instinct_MI250", 64),
        ("AMD_Instinct_MI210", 64),
        ("Instinct_MI100", 32),
        ("mi300x", 192),
        ("AMD_Instinct_MI308X", None),
        ("Radeon_RX_7900_XTX", None),
    ],
)
def test_the_instinct_table_knows_each_model_by_its_product_name(product, gib):
    assert product_gib(product) == gib


def test_the_job_s_own_vram_selector_comes_before_its_product_s_table_entry():
    both = lm_spec(resources={"workers": 1, "gpusPerWorker": 8, "gpu": {"productName": "MI300X", "vram": "48G"}})
    assert job_gpu_memory(both) == GpuMemory(48 * GIB, "spec.resources.gpu.vram 48G")
    assert job_gpu_memory(lm_spec()) == GpuMemory(64 * GIB, "MI250X, AMD's data sheet")
    assert job_gpu_memory(lm_spec(resources={"workers": 1, "gpusPerWorker": 8})) is None


def test_a_partition_has_its_share_of_its_gpus_memory():
    cpx = lm_spec(
        resources={"workers": 1, "gpusPerWorker": 8, "gpu": {"productName": "MI300X", "partition": "cpx_nps4"}}
    )
    assert job_gpu_memory(cpx) == GpuMemory(24 * GIB, "MI300X, AMD's data sheet, a cpx_nps4 partition's 1/8 share")
    spx = lm_spec(
        resources={"workers": 1, "gpusPerWorker": 8, "gpu": {"productName": "MI300X", "partition": "spx_nps1"}}
    )
    assert job_gpu_memory(spx) == GpuMemory(192 * GIB, "MI300X, AMD's data sheet")


def test_the_nodes_labels_give_the_smallest_vram_where_the_job_can_run():
    mi300x = {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}
    nodes = [
        NodeInfo("partitioned", 8, {**mi300x, "amd.com/gpu.vram": "48G"}),
        NodeInfo("whole", 8, {**mi300x, "amd.com/gpu.vram": "192G"}),
        NodeInfo("other", 8, {"amd.com/gpu.product-name": "AMD_Instinct_MI210", "amd.com/gpu.vram": "16G"}),
        NodeInfo("cordoned-cpu", 0, {**mi300x, "amd.com/gpu.vram": "1G"}),
    ]
    spec = lm_spec(resources={"workers": 1, "gpusPerWorker": 8, "gpu": {"productName": "AMD_Instinct_MI300X_OAM"}})
    assert gpu_memory(spec, nodes) == GpuMemory(48 * GIB, "amd.com/gpu.vram 48G on node partitioned")
    assert gpu_memory(spec, [NodeInfo("unlabelled", 8, mi300x)]) is None
    anywhere = lm_spec(resources={"workers": 1, "gpusPerWorker": 8})
    assert gpu_memory(anywhere, nodes).bytes == 16 * GIB  # type: ignore[union-attr]


def test_fsdp_over_one_gpu_is_planned_as_the_image_runs_it_sharded_load_and_fsdps_copies():
    """`sharding: fsdp` on one GPU still loads sharded (a read buffer) and wraps the model in FSDP2 (its gathered
    root and blocks, its bf16 policy instead of autocast): a shard group of 1 is not `sharding: none`."""
    shape = model_shape(LLAMA_8B)
    one = {"workers": 1, "gpusPerWorker": 1, "gpu": {"productName": "MI300X"}}
    adapter = {"adapter": {"rank": 16}}
    fsdp = plan_memory(shape, Setup.of(lm_spec(one, adapter, sharding="fsdp")))
    ddp = plan_memory(shape, Setup.of(lm_spec(one, adapter)))
    assert Setup.of(lm_spec(one, adapter, sharding="fsdp")).shard_group == 1
    assert fsdp.load.buffer > 0 and ddp.load.buffer == 0
    assert fsdp.step.working > ddp.step.working  # FSDP's gathered embeddings, head and blocks, not autocast's casts
    assert fsdp.load.parameters == ddp.load.parameters  # one rank holds the whole model either way
