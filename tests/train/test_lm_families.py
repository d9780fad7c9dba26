"""The model families a causal-lm job names: Llama, Qwen2, Qwen3, Mistral, GPT-NeoX and GPT-2, each a tiny model of
its real transformers architecture (from a config, with the language-model example's tokenizer).

Each passes the pre-flight and loads through `AutoModelForCausalLM` with SDPA, gradient checkpointing and its
family's default LoRA targets (peft's table), trains a packed batch through the adapter only, and keeps packed
records apart: a family whose attention ignored the restarting positions would fail here, not in a user's run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rocmtrain_train.data.causal_lm.tokens import LmFormat, collate_lm, collate_packed, encode_lm, pack
from rocmtrain_train.tasks import task_for
from train.jobs import job
from train.test_lm_data import pair_table

LAYERS = {"num_hidden_layers": 2, "num_attention_heads": 4}
FAMILIES = {
    "llama": ({**LAYERS, "hidden_size": 32, "intermediate_size": 64, "num_key_value_heads": 2}, ["q_proj", "v_proj"]),
    "qwen2": ({**LAYERS, "hidden_size": 32, "intermediate_size": 64, "num_key_value_heads": 2}, ["q_proj", "v_proj"]),
    "qwen3": (
        {**LAYERS, "hidden_size": 32, "intermediate_size": 64, "num_key_value_heads": 2, "head_dim": 8},
        ["q_proj", "v_proj"],
    ),
    "mistral": ({**LAYERS, "hidden_size": 32, "intermediate_size": 64, "num_key_value_heads": 2}, ["q_proj", "v_proj"]),
    "gpt_neox": ({**LAYERS, "hidden_size": 32, "intermediate_size": 64}, ["query_key_value"]),
    "gpt2": ({"n_layer": 2, "n_head": 4, "n_embd": 32}, ["c_attn"]),
}


def family_model(folder: Path, family: str, tiny_lm: Path) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    size, _ = FAMILIES[family]
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = AutoConfig.for_model(family, vocab_size=len(tokenizer), **special, **size)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_trains_an_adapter_on_packed_records_with_sdpa_and_gradient_checkpointing(
    family, tiny_lm, tmp_path
):
    path = family_model(tmp_path / family, family, tiny_lm)
    spec = {
        "model": {"source": str(path), "task": "causal-lm", "numLabels": None, "maxSeqLength": 64},
        "data": {"promptField": "prompt", "responseField": "response"},
        "training": {"gradientCheckpointing": True, "packing": True, "attentionImplementation": "sdpa"},
        "adapter": {"dropout": 0.0},
    }
    task = task_for(job("family", spec).spec)
    task.check_model(path)
    model, tokenizer = task.load(path, gpu=False)
    assert model.config._attn_implementation == "sdpa" and model.is_gradient_checkpointing
    adapted = {name.split(".lora_A")[0].rsplit(".", 1)[-1] for name, _ in model.named_parameters() if ".lora_A" in name}
    assert sorted(adapted) == FAMILIES[family][1]  # peft's default targets for the family

    encoded = encode_lm(tokenizer, pair_table(), [0, 1, 2, 3], LmFormat("pairs", "response", 64))
    rows = pack([0, 1, 2, 3], encoded.lengths, 64)
    packed = collate_packed(encoded, rows, tokenizer.pad_token_id)
    model.train()
    model(**packed).loss.backward()
    trained = {name for name, p in model.named_parameters() if p.grad is not None}
    assert trained and all("lora_" in name for name in trained)

    model.eval()
    with torch.no_grad():
        together = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits[0]
        at = 0
        for record in rows[0]:
            alone = collate_lm(encoded, [record], tokenizer.pad_token_id)
            n = int(encoded.lengths[record])
            logits = model(input_ids=alone["input_ids"], attention_mask=alone["attention_mask"]).logits[0, :n]
            torch.testing.assert_close(together[at : at + n], logits, rtol=1e-4, atol=1e-5, msg=family)
            at += n


def test_weights_load_in_fp32_to_train_and_a_frozen_base_in_bf16_on_gpus(tiny_lm, tmp_path):
    """transformers loads a model in the dtype it was saved in (bf16 for most language models): the weights that
    train are fp32 masters whatever that dtype, and only a LoRA adapter's frozen base stays bf16, on GPUs."""
    saved = tmp_path / "saved-in-bf16"
    AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.bfloat16).save_pretrained(saved)
    AutoTokenizer.from_pretrained(tiny_lm).save_pretrained(saved)
    lm = {"source": str(saved), "task": "causal-lm", "numLabels": None, "maxSeqLength": 64}
    data = {"promptField": "prompt", "responseField": "response"}
    full = task_for(job("full", {"model": lm, "data": data}).spec)
    model, _ = full.load(saved, gpu=True)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    lora = task_for(job("lora", {"model": lm, "data": data, "adapter": {}, "training": {"precision": "bf16"}}).spec)
    on_gpu, _ = lora.load(saved, gpu=True)
    assert {p.dtype for p in on_gpu.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in on_gpu.parameters() if p.requires_grad} == {torch.float32}
    on_cpu, _ = lora.load(saved, gpu=False)
    assert {p.dtype for p in on_cpu.parameters()} == {torch.float32}
