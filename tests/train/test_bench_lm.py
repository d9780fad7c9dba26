"""The language-model benchmarks' own measures (bench/lm_throughput.py, bench/gpu_lm.py), on a CPU and without Ray.

Real tokens are counted alike whatever the batch layout: TRL's collators' (padding-free, padded) and our
loop's (padded, packed). The GPU case's minimal loop trains on a CPU too (its `--smoke` size), and its FLOPs
per token count exactly the matrix products of a real Llama with grouped-query attention.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import gpu_lm
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


def test_our_loop_runs_in_each_sharding_and_checkpointing_variant_against_its_memory_plan(tmp_path):
    assert gpu_lm.arms(gpu_lm.GPU) == [
        ("reference", "none"),
        ("ours", "none"),
        ("ours-fsdp", "fsdp"),
        ("ours-gc", "none+gc"),
        ("ours-fsdp-gc", "fsdp+gc"),
    ]
    model = gpu_lm.build_model(tmp_path / "model", "smoke", 64, torch.device("cpu"))
    work = gpu_lm.LmGpuWorkload(data="data", batch_size=2, steps=3, max_length=64, use_gpu=False, cpus=1)
    plans = {}
    for variant in gpu_lm.VARIANTS:
        varied = dataclasses.replace(work, variant=variant)
        training = gpu_lm.lm_gpu_job(str(model), "full", varied, "v").spec.training
        assert (training.sharding, training.gradient_checkpointing) == (variant[:4], variant.endswith("+gc"))
        plans[variant] = gpu_lm.planned(str(model), "full", varied)
    # FSDP2 over one rank shards nothing yet holds its gathered copies (the root and two blocks), which the plan
    # counts; checkpointing keeps less of the blocks' activations
    assert plans["fsdp"]["planned_bytes"] > plans["none"]["planned_bytes"]
    assert plans["none+gc"]["planned_bytes"] < plans["none"]["planned_bytes"]
