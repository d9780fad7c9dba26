"""The language-model benchmarks' own measures (bench/lm_throughput.py, bench/gpu_lm.py), on a CPU and without Ray.

Real tokens are counted alike whatever the batch layout: TRL's collators' (padding-free, padded) and our
loop's (padded, packed). The GPU case's minimal loop trains on a CPU too (its `--smoke` size), and its FLOPs
per token count exactly the matrix products of a real Llama with grouped-query attention.
"""

from __future__ import annotations

import dataclasses
import re

import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import gpu_lm
import lm_compile
from lm_throughput import real_tokens
from rocmtrain_train.data.causal_lm.tokens import LmFormat, collate_lm, collate_packed, encode_lm, pack

RECORDS = [
    ("question : what colour is the zorb ? answer :", "red"),
    ("the food of the quill is fish . question : where does the quill live ? answer :", "cave"),
    ("question : the mimbo eats what ? answer :", "fish"),
]


def test_real_tokens_are_what_our_loop_counts_in_every_layout_of_either_loop(tiny_lm):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    pad = tokenizer.pad_token_id
    assert pad != tokenizer.eos_token_id  # else an EOS would count as padding
    table = pa.table({"prompt": [p for p, _ in RECORDS], "response": [r for _, r in RECORDS]})
    rows = list(range(len(RECORDS)))
    encoded = encode_lm(tokenizer, table, rows, LmFormat("pairs", "response", 64))
    ours = int(encoded.lengths.sum())  # what our loop counts: the records' tokens
    records = [{"input_ids": encoded.ids[encoded.offsets[i] : encoded.offsets[i + 1]].tolist()} for i in rows]
    batches = {
        "trl padding-free": DataCollatorForLanguageModeling(pad_token_id=pad, padding_free=True)(records),
        "trl padded": DataCollatorForLanguageModeling(pad_token_id=pad)(records),
        "ours padded": collate_lm(encoded, rows, pad, multiple_of=8),
        "ours packed": collate_packed(encoded, pack(rows, encoded.lengths, 32), pad, multiple_of=8),
    }
    for layout, batch in batches.items():
        assert int(real_tokens(batch["input_ids"], pad)) == ours, layout
        if layout != "trl padding-free":
            assert batch["input_ids"].numel() > ours, layout  # these do compute on padding


def test_the_gpu_cases_minimal_loop_trains_on_a_cpu_and_counts_a_llamas_flops(tmp_path):
    plan = gpu_lm.SMOKE
    model = gpu_lm.build_model(tmp_path / "model", "smoke", plan.lengths[1], torch.device("cpu"))
    vocab = gpu_lm.SIZES["smoke"]["vocab_size"]
    data = gpu_lm.make_data(tmp_path / "data", vocab, 6, plan.lengths)
    work = gpu_lm.LmGpuWorkload(data=str(data), batch_size=2, steps=3, max_length=64, use_gpu=False, cpus=1)
    runs = {mode: gpu_lm.reference(str(model), mode, work) for mode in gpu_lm.MODES}
    for run in runs.values():
        assert run.steps == 3 and 0 < run.tokens < run.all_tokens <= run.padded_tokens
        assert plan.lengths[0] <= run.mean_length <= plan.lengths[1]
        figures = run.figures(1e6, peak_flops=1e12)
        assert figures["mfu"] == figures["tokens_per_second"] * 1e6 / 1e12
        assert run.figures(1e6, peak_flops=None)["mfu"] is None

    assert runs["lora"].planned_allocated_bytes < runs["full"].planned_allocated_bytes <= runs["full"].planned_bytes

    llama = AutoModelForCausalLM.from_pretrained(model)
    layers = sum(m.weight.numel() for m in llama.model.layers.modules() if isinstance(m, torch.nn.Linear))
    products = layers + llama.lm_head.weight.numel()  # tied to the input embedding, but a matrix product all the same
    config = llama.config
    attention = 12 * config.num_hidden_layers * config.hidden_size * 100
    assert gpu_lm.flops_per_token(str(model), 100, lora=False) == 6 * products + attention
    assert gpu_lm.flops_per_token(str(model), 100, lora=True) == 4 * products + attention


def test_the_gpu_cases_reference_and_trl_train_flat_rows_and_token_budgets_on_a_cpu(tmp_path):
    """The reference's varlen rows and token budget, and TRL's padding-free arm, on a CPU (SDPA's masked path)."""
    model = gpu_lm.build_model(tmp_path / "model", "smoke", 64, torch.device("cpu"))
    data = gpu_lm.make_data(tmp_path / "data", gpu_lm.SIZES["smoke"]["vocab_size"], 6, (16, 64))
    work = gpu_lm.LmGpuWorkload(data=str(data), batch_size=2, steps=3, max_length=64, use_gpu=False, cpus=1)
    padded = gpu_lm.reference(str(model), "lora", work)
    flat = gpu_lm.reference(str(model), "lora", dataclasses.replace(work, variant="varlen"))
    budget = gpu_lm.reference(str(model), "lora", dataclasses.replace(work, variant="varlen+tokens128"))
    trl = gpu_lm.trl(str(model), "lora", dataclasses.replace(work, variant="varlen"), tmp_path / "trl")
    assert padded.all_tokens == flat.all_tokens == budget.all_tokens == trl.all_tokens  # every record, once
    assert padded.padded_tokens > padded.all_tokens and flat.padded_tokens == flat.all_tokens == trl.padded_tokens
    assert flat.steps == trl.steps == 3 and budget.steps == -(-budget.all_tokens // 128)  # rows of up to 128
    assert flat.kernels == trl.kernels | {"loss": "model"} == {"attention": "sdpa", "loss": "model", "liger": "false"}
    assert trl.kernels["loss"] == "chunked" and 0 < trl.tokens < trl.all_tokens


def test_the_gpu_cases_variants_name_their_arms_and_each_loop_refuses_what_it_cannot_train():
    variant = gpu_lm.Variant.parse("varlen+tokens16k+fused+gc")
    assert variant == gpu_lm.Variant(gc=True, varlen=True, tokens=16384, loss="fused")
    assert variant.parts() == ["varlen", "tokens16k", "fused", "gc"]
    assert gpu_lm.Variant.parse("fsdp+gc").parts() == ["fsdp", "gc"] and gpu_lm.Variant.parse("none").parts() == []
    assert gpu_lm.Variant.parse("tokens256").tokens == 256
    with pytest.raises(ValueError, match="unknown part 'flash'"):
        gpu_lm.Variant.parse("varlen+flash")
    assert gpu_lm.arms(gpu_lm.GPU) == [
        ("reference", "none"),
        ("reference-varlen-fused", "varlen+fused"),
        ("trl-varlen", "varlen"),
        ("trl-varlen-liger", "varlen+liger"),
        ("ours-model", "model"),
        ("ours-varlen-chunked", "varlen+chunked"),
        ("ours-varlen-fused", "varlen+fused"),
        ("ours-varlen-tokens16k-fused", "varlen+tokens16k+fused"),
        ("ours-varlen-tokens16k-fused-gc", "varlen+tokens16k+fused+gc"),
    ]
    refused = {"references": ("chunked", "fsdp", "liger"), "trl": ("varlen+fused", "tokens16k"), "variants": ("liger",)}
    for field, texts in refused.items():
        for text in texts:
            with pytest.raises(ValueError, match=re.escape(f"variant '{text}'")):
                alone = {"references": (), "trl": (), "variants": ()} | {field: (text,)}
                gpu_lm.arms(dataclasses.replace(gpu_lm.GPU, **alone))
    # Liger's kernels are Triton's: never on a CPU, so those arms are skipped there
    assert gpu_lm.unavailable(gpu_lm.Variant.parse("varlen+fused"), use_gpu=False)
    assert gpu_lm.unavailable(gpu_lm.Variant.parse("varlen+liger"), use_gpu=False)
    assert gpu_lm.unavailable(gpu_lm.Variant.parse("varlen+chunked"), use_gpu=False) is None


def test_the_gpu_case_compares_arms_of_the_same_layout_and_says_whether_the_goals_are_met():
    variants = dict(gpu_lm.arms(gpu_lm.GPU))
    measured = {
        "3b full reference": 100.0,
        "3b full trl-varlen": 200.0,
        "3b full trl-varlen-liger": 250.0,
        "3b full ours-model": 110.0,
        "3b full ours-varlen-chunked": 220.0,
        "3b full ours-varlen-tokens16k-fused": 400.0,
    }
    results = {key: {"tokens_per_second": rate, "mfu": rate / 1000} for key, rate in measured.items()}
    assert gpu_lm.ratios(results, variants) == {
        "3b full ours-model / reference": 1.1,  # padded, records: the loss differs, the layout does not
        "3b full ours-varlen-chunked / trl-varlen": 1.1,
        "3b full ours-varlen-chunked / trl-varlen-liger": 220 / 250,
    }
    assert gpu_lm.goals(results, variants) == [
        "goal: 3B full fine-tune >= 40% MFU: met (40.0%, 3b full ours-varlen-tokens16k-fused)",
        "goal: 3B full ours >= 1.0x TRL with the same kernels: met (3b full ours-varlen-chunked / trl-varlen 1.10x)",
    ]
    results["3b full ours-varlen-chunked"]["tokens_per_second"] = 150.0
    del results["3b full ours-varlen-tokens16k-fused"]
    assert [goal.split(": ")[2][:7] for goal in gpu_lm.goals(results, variants)] == ["not met", "not met"]
    assert gpu_lm.goals({}, variants)[0].endswith("not measured")


def test_our_loop_runs_in_each_sharding_and_checkpointing_variant_against_its_memory_plan(tmp_path):
    model = gpu_lm.build_model(tmp_path / "model", "smoke", 64, torch.device("cpu"))
    work = gpu_lm.LmGpuWorkload(data="data", batch_size=2, steps=3, max_length=64, use_gpu=False, cpus=1)
    plans = {}
    for variant in gpu_lm.VARIANTS:
        varied = dataclasses.replace(work, variant=variant)
        training = gpu_lm.lm_gpu_job(str(model), "full", varied, "v").spec.training
        assert (training.sharding, training.gradient_checkpointing) == (variant[:4], variant.endswith("+gc"))
        plans[variant] = gpu_lm.planned(str(model), "full", varied)
    flat = dataclasses.replace(work, variant="varlen+tokens256+chunked")
    training = gpu_lm.lm_gpu_job(str(model), "full", flat, "v").spec.training
    assert (training.attention_implementation, training.tokens_per_worker) == ("varlen", 256)
    assert training.loss_implementation == "chunked"
    # FSDP2 over one rank shards nothing yet holds its gathered copies (the root and two blocks), which the plan
    # counts; checkpointing keeps less of the blocks' activations
    assert plans["fsdp"]["planned_bytes"] > plans["none"]["planned_bytes"]
    assert plans["none+gc"]["planned_bytes"] < plans["none"]["planned_bytes"]


def test_the_compile_bench_trains_our_token_budget_steps_alike_in_every_arm(tmp_path):
    """bench/lm_compile.py's smoke: the token plan's first steps, collated by our task in flat rows, trained eager,
    compiled as our loop compiles (one graph per padded shape) and with dynamic shapes, with dynamo's tracing backend:
    every arm trains the same tokens to the same losses."""
    found = lm_compile.smoke(tmp_path, print_=lambda _: None)
    runs = found["runs"]
    assert set(runs) == set(lm_compile.ARMS)
    assert {(r["steps"], r["tokens"], r["shapes"]) for r in runs.values()} == {
        (3, runs["eager"]["tokens"], runs["eager"]["shapes"])
    }
    assert runs["eager"]["tokens"] > 0 and runs["eager"]["shapes"] >= 1
    for arm in ("compiled", "dynamic"):
        assert runs[arm]["losses"] == pytest.approx(runs["eager"]["losses"], rel=1e-5)
    assert set(found["break_even_steps"]) == {"compiled", "dynamic"}
