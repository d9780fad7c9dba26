"""FSDP2 sharding (`training.sharding: fsdp`) on real processes over gloo, without Ray: the strategy's own parts.

Each test starts 1, 2 or 4 processes with torch.distributed (gloo on CPU), shards the example's tiny Llama
with `Sharded.prepare`, and checks what a run relies on: a checkpoint written by 2 ranks loads on 1 and on 4
(DCP reshards) with every weight and optimiser moment, an adapter trains alone under FSDP, the export is
one consolidated Hugging Face folder equal to the trained weights with the generation config (the adapter's
merged one equal to peft's merge), full fine-tuning over 2 ranks and over a 2x2 hybrid mesh trains what one
rank trains, and the bf16 mixed-precision policy trains on CPU from fp32 shards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from rocmtrain.api.models import AdapterSpec
from rocmtrain.api.ranks import shard_group
from rocmtrain_train.loop.rank_setup import COMPILE_BUCKET
from rocmtrain_train.model.causal_lm import with_adapter
from rocmtrain_train.model.pretrained import compile_model
from rocmtrain_train.strategy.sharded import Sharded, _full
from train.gloo import CPU, spawn


def _model(path: Path, adapter: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.config.use_cache = False
    return (
        with_adapter(model, AdapterSpec(rank=4, dropout=0.0, targetModules=["q_proj", "v_proj"])) if adapter else model
    )


def _batch(path: Path) -> dict[str, torch.Tensor]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = tokenizer(["question : what colour is the zorb ? answer : red"] * 4, return_tensors="pt")["input_ids"]
    return {"input_ids": ids, "labels": ids}


def _train(rank: int, world: int, path: Path, out: Path) -> None:
    model = _model(path)
    Sharded(CPU, 1, world, None).prepare(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(**_batch(path)).loss.backward()
    optimizer.step()
    Sharded(CPU, 1, world, None).save(out, rank=rank, model=model, optimizer=optimizer)
    weights = {n: _full(p.detach()) for n, p in model.named_parameters()}
    moments = {n: _full(optimizer.state[p]["exp_avg"]) for n, p in model.named_parameters()}
    if rank == 0:
        torch.save({"weights": weights, "moments": moments}, out / "expected.pt")


def _restore(rank: int, world: int, path: Path, out: Path) -> None:
    model = _model(path)
    strategy = Sharded(CPU, 1, world, None)
    strategy.prepare(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    strategy.load(out, model=model, optimizer=optimizer)
    expected = torch.load(out / "expected.pt", weights_only=True)
    for name, p in model.named_parameters():
        torch.testing.assert_close(_full(p.detach()), expected["weights"][name], msg=name)
        torch.testing.assert_close(_full(optimizer.state[p]["exp_avg"]), expected["moments"][name], msg=name)


@pytest.fixture(scope="module")
def sharded_checkpoint(tiny_lm: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sharded")
    spawn(2, _train, tiny_lm, out)
    return out


@pytest.mark.parametrize("world", [1, 4])
def test_a_checkpoint_of_two_ranks_loads_on_another_number_of_ranks(sharded_checkpoint, tiny_lm, world):
    assert sorted(p.name for p in (sharded_checkpoint / "sharded").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    spawn(world, _restore, tiny_lm, sharded_checkpoint)


def _adapter_alone(rank: int, world: int, path: Path, out: Path) -> None:
    model = _model(path, adapter=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    strategy = Sharded(CPU, 1, world, None)
    strategy.prepare(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(**_batch(path)).loss.backward()
    assert all((p.grad is not None) == p.requires_grad for p in model.parameters())
    optimizer.step()
    after = {n: _full(p.detach()) for n, p in model.named_parameters()}
    for name, value in after.items():
        moved = not torch.equal(value, before[name])
        assert moved == ("lora_B" in name or "lora_A" in name), name  # the adapter moves, the base never
    strategy.export(model, AutoTokenizer.from_pretrained(path), str(out), rank=rank, merge=True)
    if rank == 0:
        torch.save(after, out / "trained.pt")


def test_an_adapter_trains_alone_under_fsdp_and_exports_for_peft_and_merged(tiny_lm, tmp_path):
    from peft import PeftModel

    spawn(2, _adapter_alone, tiny_lm, tmp_path)
    trained = torch.load(tmp_path / "trained.pt", weights_only=True)
    adapter = PeftModel.from_pretrained(_model(tiny_lm), tmp_path).eval()
    for name, value in adapter.named_parameters():
        torch.testing.assert_close(value, trained[name], msg=name)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert GenerationConfig.from_pretrained(tmp_path / "merged") == GenerationConfig.from_pretrained(tiny_lm)
    expected = adapter.merge_and_unload().state_dict()
    for name, value in merged.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=1e-6, atol=1e-6, msg=name)


def _export(rank: int, world: int, path: Path, out: Path, file_bytes: int | None = None) -> None:
    from rocmtrain_train.strategy import sharded

    if file_bytes is not None:
        sharded.EXPORT_SHARD_BYTES = file_bytes
    model = _model(path)
    strategy = Sharded(CPU, 1, world, None)
    strategy.prepare(model)
    torch.optim.SGD(model.parameters(), lr=0.1)
    model(**_batch(path)).loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    weights = {n: _full(p.detach()) for n, p in model.named_parameters()}
    checksum = strategy.checksum(model)
    strategy.export(model, AutoTokenizer.from_pretrained(path), str(out / "model"), rank=rank, merge=False)
    if rank == 0:
        torch.save({"weights": weights, "checksum": checksum}, out / "trained.pt")


def test_the_export_is_one_consolidated_folder_equal_to_the_trained_weights(tiny_lm, tmp_path):
    spawn(2, _export, tiny_lm, tmp_path)
    trained = torch.load(tmp_path / "trained.pt", weights_only=True)
    folder = tmp_path / "model"
    assert sorted(p.name for p in folder.glob("*.safetensors*")) == ["model.safetensors"]  # one file, as transformers
    assert "lm_head.weight" not in load_file(str(folder / "model.safetensors"))  # tied: saved once, as transformers
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    for name, value in loaded.named_parameters():
        torch.testing.assert_close(value, trained["weights"][name], rtol=0, atol=0, msg=name)
    assert trained["checksum"] == pytest.approx(sum(float(v.double().sum()) for v in trained["weights"].values()))
    assert GenerationConfig.from_pretrained(folder) == GenerationConfig.from_pretrained(tiny_lm)  # as DDP's export


def test_hybrid_sharding_shards_within_a_pod_and_replicates_across_pods():
    assert shard_group(16, 8, "pod") == 8  # two pods of 8 GPUs: shard in each, replicate across
    assert shard_group(16, 8, "job") == 16
    assert shard_group(8, 8, "pod") == 8  # one pod: nothing to replicate
    assert shard_group(2, 1, "pod") == 2  # CPU ranks (one per pod): sharding over pods of one would shard nothing


def test_a_large_model_is_exported_in_numbered_files_with_an_index(tiny_lm, tmp_path):
    """Files close at the shard size as the tensors arrive (here 16 KiB, as 5 GiB is for a real model)."""
    spawn(2, _export, tiny_lm, tmp_path, 16 * 1024)
    folder = tmp_path / "model"
    files = sorted(p.name for p in folder.glob("model-*.safetensors"))
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert (
        len(files) > 2 and set(index.values()) == set(files) and files[-1].endswith(f"-of-{len(files):05d}.safetensors")
    )
    trained = torch.load(tmp_path / "trained.pt", weights_only=True)
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    for name, value in loaded.named_parameters():
        torch.testing.assert_close(value, trained["weights"][name], rtol=0, atol=0, msg=name)


def _checkpointed_and_compiled(rank: int, world: int, path: Path, out: Path) -> None:
    grads = []
    for checkpointing, compiled in ((False, False), (True, False), (False, True)):
        model = _model(path)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        Sharded(CPU, 1, world, None).prepare(model)
        if compiled:  # as the loop compiles (after sharding); AOT autograd without Inductor's C++ build
            compile_model(model, max_length=64, bucket=COMPILE_BUCKET, backend="aot_eager")
        model.train()
        model(**_batch(path)).loss.backward()
        grads.append({n: _full(p.grad) for n, p in model.named_parameters()})
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "the compiled pass ran compiled graphs"
    for other in grads[1:]:
        for name, grad in grads[0].items():
            torch.testing.assert_close(other[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_gradient_checkpointing_and_compile_under_fsdp_compute_the_same_gradients(tiny_lm, tmp_path):
    spawn(2, _checkpointed_and_compiled, tiny_lm, tmp_path)


# A few optimiser steps of one global batch of 4 distinct rows of equal length: each rank's mean loss over its rows
# weighs the same, so the ranks' averaged gradients are the global batch's.
STEPS, ROWS, LENGTH = 3, 4, 12


def _rows(path: Path) -> torch.Tensor:
    vocabulary = AutoTokenizer.from_pretrained(path).vocab_size
    return torch.randint(7, vocabulary, (ROWS, LENGTH), generator=torch.Generator().manual_seed(1))


def _steps(model: torch.nn.Module, ids: torch.Tensor, steps: int = STEPS) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)  # its steps scale with the gradients (Adam's would not)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _fine_tune(rank: int, world: int, path: Path, replicate: int, out: Path) -> None:
    model = _model(path)
    Sharded(CPU, replicate, world // replicate, None).prepare(model)
    share = ROWS // world
    _steps(model, _rows(path)[rank * share : (rank + 1) * share])
    weights = {n: _full(p.detach()) for n, p in model.named_parameters()}
    if rank == 0:
        torch.save(weights, out / "weights.pt")


@pytest.mark.parametrize("replicate, shard", [(1, 2), (2, 2)], ids=["fsdp-2", "hybrid-2x2"])
def test_full_fine_tuning_under_fsdp_trains_what_one_rank_trains(tiny_lm, tmp_path, replicate, shard):
    """Every weight trains (no adapter), over a 1-D mesh of 2 ranks, and a 2-D one of 2 replicas of 2 shards
    (hybrid sharding: a reduce-scatter within the shards, an all-reduce across the replicas)."""
    spawn(replicate * shard, _fine_tune, tiny_lm, replicate, tmp_path)
    sharded = torch.load(tmp_path / "weights.pt", weights_only=True)
    alone = _model(tiny_lm)
    _steps(alone, _rows(tiny_lm))
    original = _model(tiny_lm).state_dict()
    for name, value in alone.named_parameters():
        assert not torch.equal(value, original[name]), name  # it trained
        torch.testing.assert_close(sharded[name], value.detach(), rtol=1e-5, atol=1e-7, msg=name)


def _mixed(rank: int, world: int, path: Path, out: Path) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor

    model = _model(path)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    strategy = Sharded(CPU, 1, world, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    strategy.prepare(model)
    ids = _rows(path)[rank * 2 : rank * 2 + 2]
    losses = _steps(model, ids, steps=6)
    masters = {}
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor) and p.dtype == torch.float32, name  # fp32 sharded masters
        masters[name] = _full(p.detach())
        assert not torch.equal(masters[name], before[name]), name
    with torch.no_grad():  # as an evaluation: the root keeps its gathered bf16 copies after it
        assert model(input_ids=ids).logits.dtype == torch.bfloat16  # the blocks and the head compute in bf16
    assert strategy.checksum(model) == pytest.approx(sum(float(m.double().sum()) for m in masters.values()), rel=1e-12)
    if rank == 0:
        (out / "losses.json").write_text(json.dumps(losses))


def test_the_bf16_mixed_precision_policy_trains_on_cpu(tiny_lm, tmp_path):
    """As `Sharded.for_run` sets it on GPUs with precision bf16: bf16 compute from fp32 shards, fp32 reduction."""
    spawn(2, _mixed, tiny_lm, tmp_path)
    losses = json.loads((tmp_path / "losses.json").read_text())
    assert losses[-1] < 0.75 * losses[0], losses
