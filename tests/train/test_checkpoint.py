"""Checkpoint contents (no Ray): random-number state per rank, the run's totals, and (DDP's) the model and
optimiser rank 0 writes beside them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rocmtrain_train.checkpoint import train_state as checkpoint
from rocmtrain_train.checkpoint.train_state import TrainState
from rocmtrain_train.strategy.data_parallel import DataParallel

CPU = torch.device("cpu")


def parts() -> dict:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return {"model": model, "optimizer": optimizer, "scaler": torch.amp.GradScaler("cuda", enabled=False)}


def test_each_rank_resumes_its_own_random_numbers(tmp_path):
    """Dropout after a resume draws what it would have drawn without the interruption."""
    saved = parts()
    state = TrainState(epoch=1, step=7, samples=100, tokens=900, padded_tokens=1000)
    expected = {}
    for rank in (1, 0):
        torch.manual_seed(checkpoint.rng_seed(42, rank, 0))
        torch.rand(rank + 3)  # each rank's generator has moved on differently
        checkpoint.save(
            tmp_path,
            rank=rank,
            device=CPU,
            totals=state if rank == 0 else None,
            scaler=saved["scaler"],
            run_id="r",
            world_size=2,
            plan="p",
        )
        DataParallel(CPU).save(tmp_path, rank=rank, model=saved["model"], optimizer=saved["optimizer"])
        expected[rank] = torch.rand(5)
    torch.manual_seed(0)  # a new process
    for rank in (0, 1):
        loaded = checkpoint.load(tmp_path, rank)
        checkpoint.set_rng_state(loaded["rng"], CPU)
        assert torch.equal(torch.rand(5), expected[rank])
    restored = parts()
    assert checkpoint.restore(checkpoint.load(tmp_path, 0), scaler=restored["scaler"]) == state
    DataParallel(CPU).load(tmp_path, model=restored["model"], optimizer=restored["optimizer"])
    for a, b in zip(saved["model"].parameters(), restored["model"].parameters(), strict=True):
        assert torch.equal(a, b)
    assert checkpoint.load(tmp_path, 5)["rng"] is None  # a rank the writing run did not have


def test_rank_zero_must_write_the_state(tmp_path):
    with pytest.raises(ValueError, match="rank 0 writes the training state"):
        scaler = parts()["scaler"]
        checkpoint.save(tmp_path, rank=0, device=CPU, totals=None, scaler=scaler, run_id="r", world_size=1, plan="p")


@pytest.mark.parametrize("world_size", [1, 2, 3, 7])
def test_the_run_totals_are_shared_out_so_that_they_add_up(world_size):
    totals = TrainState(samples=640, tokens=10_001, padded_tokens=12_345, step=20, train_seconds=3.0)
    shares = [totals.share(rank, world_size) for rank in range(world_size)]
    for name in TrainState.TOTALS:
        assert sum(getattr(s, name) for s in shares) == getattr(totals, name)
    unshared = {name: 0 for name in TrainState.TOTALS}
    assert all(dataclasses.replace(s, **unshared) == dataclasses.replace(totals, **unshared) for s in shares)


def test_rng_seeds_differ_per_rank_and_step():
    seeds = {checkpoint.rng_seed(42, rank, step) for rank in range(8) for step in range(100)}
    assert len(seeds) == 800
