"""Checkpoint contents (no Ray): random-number state per rank, the run's totals, and (DDP's) the model and
optimiser rank 0 writes beside them; the local folders they are staged in, and their removal."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from rocmtrain_train.checkpoint import staging
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


STAGE = """
import sys
from rocmtrain_train.checkpoint import staging
folder = staging.new_folder(sys.argv[1])
(folder / "weights.pt").write_bytes(b"a checkpoint's part")
print(folder, flush=True)
sys.stdin.read()
"""


def _staging_process(run_id: str, tmp: Path) -> tuple[subprocess.Popen, Path]:
    """A process that stages a checkpoint's part in `tmp` (its TMPDIR), and runs until its stdin closes."""
    env = os.environ | {"TMPDIR": str(tmp)}
    process = subprocess.Popen(
        [sys.executable, "-c", STAGE, run_id], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    return process, Path(process.stdout.readline().strip())


def test_the_checkpoint_folders_of_a_killed_rank_are_removed_and_a_live_ones_kept(tmp_path):
    """A rank killed before Ray Train uploaded its checkpoint leaves its folder; the next rank to start removes
    it, and keeps those of processes that still run, or that run in another PID namespace (a pid it cannot
    judge)."""
    killed, staged = _staging_process("run-a", tmp_path)
    alive, kept = _staging_process("run-a", tmp_path)
    try:
        assert staged.parent.parent == tmp_path
        namespace = os.stat("/proc/self/ns/pid").st_ino
        assert staged.parent.name.startswith(f"{staging.PREFIX}run-a-{namespace}.{killed.pid}-")
        killed.kill()
        killed.wait()
        (tmp_path / f"{staging.PREFIX}not-ours").mkdir()  # named alike, without a process: left alone
        elsewhere = tmp_path / f"{staging.PREFIX}run-a-{namespace + 1}.{killed.pid}-x"  # another PID namespace's
        elsewhere.mkdir()
        link = tmp_path / f"{staging.PREFIX}run-b-{namespace}.{killed.pid}-link"  # a link is never followed
        link.symlink_to(kept.parent)
        assert staging.remove_orphans(tmp_path) == [staged.parent]
        assert not staged.parent.exists() and (kept / "weights.pt").is_file() and link.is_symlink()
        assert (tmp_path / f"{staging.PREFIX}not-ours").is_dir() and elsewhere.is_dir()
    finally:
        alive.communicate("")
    # Its process gone, the live one's root goes too, at the next start.
    assert staging.remove_orphans(tmp_path) == [kept.parent]


def test_a_run_removes_its_roots_when_it_ends(tmp_path, monkeypatch):
    """`rocmtrain run` removes every root of its run when its ranks have ended, whether they still run or not,
    and never another run's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ours = staging.new_folder("run-a")
    assert staging.new_folder("run-a").parent == ours.parent  # one root per run and process
    other, theirs = _staging_process("run-b", tmp_path)
    try:
        assert staging.remove_run("run-a") == [ours.parent]
        assert not ours.parent.exists() and (theirs / "weights.pt").is_file()
        assert staging.new_folder("run-a").parent != ours.parent  # a new root once it is gone
    finally:
        other.communicate("")
