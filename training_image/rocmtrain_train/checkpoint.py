"""Checkpoints: everything needed to continue a run exactly where it stopped, and the final model export."""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs
import torch

from rocmtrain_train.storage import filesystem

if TYPE_CHECKING:
    from transformers import PreTrainedModel

STATE_FILE = "train_state.pt"


@dataclass
class TrainState:
    """Where training stands, and the running totals that outlive a restart."""

    epoch: int = 0
    step: int = 0  # optimiser steps done in the whole run
    batches_done: int = 0  # micro-batches of `epoch` already trained on
    samples: int = 0
    tokens: int = 0
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    last_eval: dict[str, float] = field(default_factory=dict)
    last_eval_step: int | None = None


def save(
    directory: Path,
    *,
    state: TrainState,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    run_id: str,
    world_size: int,
) -> None:
    """Write a checkpoint (model, optimiser, scheduler, scaler, position, totals) into `directory`."""
    torch.save(
        {
            "state": dataclasses.asdict(state),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "run_id": run_id,
            "world_size": world_size,
        },
        directory / STATE_FILE,
    )


def load(directory: Path) -> dict[str, Any]:
    """Read a checkpoint written by `save` (tensors on the CPU)."""
    return torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)


def resumable(saved: dict[str, Any], *, resume: str, run_id: str, world_size: int) -> bool:
    """Whether to continue from a checkpoint: always within this run (a worker restart), and from an
    earlier run's (a whole-job retry) unless `checkpoint.resume` is never."""
    if resume == "never" and saved["run_id"] != run_id:
        return False
    if saved["world_size"] != world_size:
        raise RuntimeError(
            f"the checkpoint was written by {saved['world_size']} workers, this run has {world_size}; "
            "use the same number of workers, or set checkpoint.resume: never"
        )
    return True


def restore(
    saved: dict[str, Any],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
) -> TrainState:
    """Load a checkpoint's tensors into the live objects and return its position."""
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    scaler.load_state_dict(saved["scaler"])
    return TrainState(**saved["state"])


def export_model(model: PreTrainedModel, tokenizer: Any, destination: str) -> None:
    """Save the model and tokenizer where `from_pretrained` loads them: a local folder or an object store."""
    fs, path = filesystem(destination, None)
    if isinstance(fs, pafs.LocalFileSystem):
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return
    with tempfile.TemporaryDirectory() as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        fs.create_dir(path, recursive=True)
        pafs.copy_files(staging, path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
