"""Loading a causal LM for FSDP (`training.sharding: fsdp`) as the sharded frameworks do, on gloo processes without
Ray: built on the meta device, sharded, each rank's shards filled from the safetensors files.

The sharded load gives what `from_pretrained` gives (weights, buffers, tied weights, dtypes, the adapter's initial
matrices, logits, the generation config), each rank's memory peak is its share of the weights and not the whole
model (measured), and what it cannot load is loaded whole or refused by name. The causal LM as loaded also refuses
a packed batch with the KV cache on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, GPTNeoXConfig, MixtralConfig

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import ModelSpec, TrainingSpec
from rocmtrain_train.model.causal_lm import check_causal_lm_files, load_causal_lm
from rocmtrain_train.model.pretrained import load_model, parameter_counts
from rocmtrain_train.model.sharded_load import is_empty, shard_and_fill
from rocmtrain_train.strategy.sharded import Sharded, _full
from train.gloo import CPU, spawn
from train.jobs import EXAMPLES, example_script, job

SFT = EXAMPLES / "sft" / "data"
LM = {
    "model": {"task": "causal-lm", "numLabels": None, "maxSeqLength": 48},
    "data": {"train": {"uri": str(SFT / "train.jsonl")}, "promptField": "prompt", "responseField": "response"},
    "training": {"precision": "bf16"},
}
ADAPTER = {"adapter": {"rank": 4, "alpha": 8, "dropout": 0.0, "targetModules": ["q_proj", "v_proj"]}}


def _spec(path: Path, sharding: str, adapter: bool):
    return job("load", LM, {"training": {"sharding": sharding}}, ADAPTER if adapter else {}, model=path).spec


TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _saved(model: torch.nn.Module, folder: Path, tokenizer_from: Path, **options) -> Path:
    """`folder`, holding the model (save_pretrained's `options`) and the tokenizer of `tokenizer_from`."""
    model.save_pretrained(folder, **options)
    for name in TOKENIZER:
        (folder / name).write_bytes((tokenizer_from / name).read_bytes())
    return folder


@pytest.fixture(scope="module")
def llama_in_bf16(tiny_lm: Path, tmp_path_factory) -> Path:
    """The tiny Llama saved in bf16 (as released models are) in several files with an index, with a generation
    config of its own."""
    model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.bfloat16)
    model.generation_config.temperature, model.generation_config.do_sample = 0.6, True
    return _saved(model, tmp_path_factory.mktemp("llama"), tiny_lm, max_shard_size="20KB")


def _tiny(config_class, tiny_lm: Path, folder: Path, **sizes) -> Path:
    """A tiny model of another family, from a config, with the tiny Llama's tokenizer."""
    vocabulary = AutoConfig.from_pretrained(tiny_lm).vocab_size
    config = config_class(vocab_size=vocabulary, hidden_size=32, intermediate_size=64, num_hidden_layers=2, **sizes)
    torch.manual_seed(0)
    return _saved(AutoModelForCausalLM.from_config(config), folder, tiny_lm)


@pytest.fixture(scope="module")
def neox(tiny_lm: Path, tmp_path_factory) -> Path:
    """GPT-NeoX: its files name the output head `embed_out` (transformers renames it `lm_head` on loading), its
    embeddings are not tied, and its rotary embedding covers a quarter of each head."""
    return _tiny(GPTNeoXConfig, tiny_lm, tmp_path_factory.mktemp("neox"), num_attention_heads=4, rotary_pct=0.25)


def _load_both(rank: int, world: int, path: Path, adapter: bool, gpu: bool) -> None:
    torch.manual_seed(rank)  # the adapter's matrices come from the job's seed, whatever the rank's state
    model, tokenizer = load_causal_lm(path, _spec(path, "fsdp", adapter), gpu=gpu)
    assert is_empty(model)
    counts = parameter_counts(model)  # before sharding, as the loop counts
    shard_and_fill(model, path, CPU, Sharded(CPU, 1, world, None).prepare)
    whole, _ = load_causal_lm(path, _spec(path, "none", adapter), gpu=gpu)
    assert not is_empty(whole) and parameter_counts(whole) == counts
    gathered = {n: _full(p.detach()) for n, p in model.named_parameters()}
    assert gathered.keys() == dict(whole.named_parameters()).keys()
    for name, value in whole.named_parameters():
        assert gathered[name].dtype == value.dtype, name
        torch.testing.assert_close(gathered[name], value.detach(), rtol=0, atol=0, msg=name)
        assert dict(model.named_parameters())[name].requires_grad == value.requires_grad, name
    buffers = dict(model.named_buffers())
    for name, value in whole.named_buffers():  # rotary frequencies, computed again
        torch.testing.assert_close(buffers[name], value, rtol=0, atol=0, msg=name)
    base, whole_base = (model.get_base_model(), whole.get_base_model()) if adapter else (model, whole)
    tied = base.get_output_embeddings().weight is base.get_input_embeddings().weight  # one tensor, if tied
    assert tied == whole_base.config.tie_word_embeddings
    assert base.generation_config == whole_base.generation_config
    ids = tokenizer(["question : what colour is the zorb ? answer : red"] * 2, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, whole(input_ids=ids).logits)


@pytest.mark.parametrize(
    "folder, adapter, gpu",
    [("llama_in_bf16", False, False), ("llama_in_bf16", True, True), ("neox", False, False)],
    ids=["full-fp32", "lora-on-bf16", "gpt-neox"],
)
def test_the_sharded_load_gives_what_from_pretrained_gives(request, folder, adapter, gpu):
    """On 2 ranks: full fine-tuning's fp32 weights from bf16 files in several parts, a LoRA adapter over a bf16
    base (the GPU's load dtype, forced here) with its fp32 matrices, and a model of another family."""
    spawn(2, _load_both, request.getfixturevalue(folder), adapter, gpu)


def test_the_generation_config_is_the_folders(llama_in_bf16):
    model, _ = load_causal_lm(llama_in_bf16, _spec(llama_in_bf16, "fsdp", False), gpu=False)
    assert is_empty(model) and model.generation_config.temperature == 0.6


def _bin_files(tiny_lm: Path, folder: Path) -> Path:
    for name in ("config.json", *TOKENIZER):
        (folder / name).write_bytes((tiny_lm / name).read_bytes())
    torch.save(AutoModelForCausalLM.from_pretrained(tiny_lm).state_dict(), folder / "pytorch_model.bin")
    return folder


def _fused_experts(tiny_lm: Path, folder: Path) -> Path:
    return _tiny(MixtralConfig, tiny_lm, folder, num_attention_heads=4, num_key_value_heads=2, num_local_experts=2)


@pytest.mark.parametrize("make", [_bin_files, _fused_experts], ids=["bin-files", "fused-experts"])
def test_a_model_no_rank_can_read_by_rows_loads_whole(tiny_lm, tmp_path, make):
    """PyTorch .bin files, and experts that transformers fuses into one tensor from the files' separate ones."""
    folder = make(tiny_lm, tmp_path)
    model, _ = load_causal_lm(folder, _spec(folder, "fsdp", False), gpu=False)
    assert not is_empty(model)


def test_files_that_lack_a_weight_are_refused_by_its_name_before_the_run(tiny_llama):
    """A folder saved from the bare decoder (no `model.` prefix, which the load strips) without the output head."""
    with pytest.raises(ConfigError, match=r"no weight named lm_head\.weight \(1 missing\); use sharding: none"):
        check_causal_lm_files(tiny_llama, _spec(tiny_llama, "fsdp", False))
    check_causal_lm_files(tiny_llama, _spec(tiny_llama, "none", False))


def test_a_packed_batch_with_the_cache_on_is_refused(tiny_lm):
    """Packed records are isolated only without the KV cache (transformers reads their boundaries from
    position_ids then); the loop turns it off, and a caller that turns it on is stopped."""
    model, _ = load_causal_lm(tiny_lm, _spec(tiny_lm, "none", False), gpu=False)
    ids = torch.tensor([[1, 8, 9, 2, 1, 10, 2]])
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])
    model(input_ids=ids, position_ids=positions)
    model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)  # not packed
    with pytest.raises(ValueError, match=r"packed batch .* needs the KV cache off"):
        model(input_ids=ids, position_ids=positions, use_cache=True)


# A Llama of about 270 MB in fp32: few layers, wide, a small vocabulary (its largest tensor 16 MB).
WIDE = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 4, "num_attention_heads": 8}


def _status(field: str) -> int:
    """A field of /proc/self/status, in bytes."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(f"{field}:"))
    return int(line.split()[1]) * 1024


def _peak(rank: int, world: int, path: Path, sharding: str, out: Path) -> None:
    """This rank's peak RSS over loading the model and sharding it, above its RSS before (once the modules a load
    imports are imported and the tokenizer read: a meta-device build does both, in no memory)."""
    spec = _spec(path, sharding, False)
    load_causal_lm(path, _spec(path, "fsdp", False), gpu=False)
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the RSS now
    before = _status("VmRSS")
    model, _ = load_causal_lm(path, spec, gpu=False)
    strategy = Sharded(CPU, 1, world, None)
    if is_empty(model):
        shard_and_fill(model, path, CPU, strategy.prepare)
    else:  # the whole model, then its shards: what every FSDP rank did before
        strategy.prepare(model)
    (out / f"{sharding}-{rank}.json").write_text(json.dumps(_status("VmHWM") - before))


def test_each_rank_of_a_sharded_load_peaks_at_its_share_never_the_whole_model(tmp_path):
    """2 CPU ranks load a model of ~270 MB: sharded, each rank's peak is about half of it and one tensor's half (what
    the memory plan counts), where loading it whole peaks at the whole model at least."""
    folder = example_script("make_model").build(tmp_path / "wide", [f"w{i}" for i in range(1000)], **WIDE)
    with safe_open(folder / "model.safetensors", framework="pt") as f:  # fp32, a tied weight once
        sizes = [math.prod(f.get_slice(name).get_shape()) * 4 for name in f.keys()]  # noqa: SIM118  # a safe_open, not a dict
    model_bytes = sum(sizes)
    planned = model_bytes // 2 + max(sizes) // 2
    for sharding in ("fsdp", "none"):
        spawn(2, _peak, folder, sharding, tmp_path)
    sharded = [json.loads((tmp_path / f"fsdp-{r}.json").read_text()) for r in range(2)]
    whole = [json.loads((tmp_path / f"none-{r}.json").read_text()) for r in range(2)]
    mib = 2**20
    print(
        f"\nmodel {model_bytes / mib:.0f} MiB fp32; peak RSS above the start, per rank: sharded load "
        f"{[round(x / mib) for x in sharded]} MiB (planned {planned / mib:.0f} MiB), whole load "
        f"{[round(x / mib) for x in whole]} MiB"
    )
    assert all(x < 0.7 * model_bytes for x in sharded)
    assert all(x >= 0.9 * model_bytes for x in whole)


def test_the_model_to_train_is_in_training_mode_so_gradient_checkpointing_runs(tiny_lm, tiny_bert):
    """`from_pretrained` (and the meta-device build, after it) leaves a model in evaluation mode, where transformers
    skips gradient checkpointing and dropout: every loaded model trains in training mode, its blocks checkpointed
    (what each block computes runs again in the backward pass)."""
    fsdp = job("load", LM, {"training": {"sharding": "fsdp"}}, ADAPTER, model=tiny_lm).spec
    sharded, _ = load_causal_lm(tiny_lm, fsdp, gpu=False)
    classifier, _ = load_model(tiny_bert, ModelSpec(source=str(tiny_bert), numLabels=3), TrainingSpec())
    checkpointing = job("load", LM, {"training": {"gradientCheckpointing": True}}, model=tiny_lm).spec
    model, tokenizer = load_causal_lm(tiny_lm, checkpointing, gpu=False)
    for loaded in (sharded, classifier, model):
        assert all(m.training for m in loaded.modules()), type(loaded).__name__
    forwards = []
    model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: forwards.append(1))
    ids = torch.tensor([tokenizer("a short question")["input_ids"]])
    model(input_ids=ids, labels=ids).loss.backward()
    assert len(forwards) == 2, "the block's MLP began in the forward pass and again in the backward pass"
