"""Checkpoints: everything needed to continue a run where it stopped.

Rank 0 writes the position (`TrainState`, with the run's totals over all ranks) and the gradient
scaler; every rank writes its own random-number state (dropout), into the same directory (Ray Train
merges the ranks' files into one checkpoint). The weights and optimiser state are the strategy's to
write there (`rocmtrain_train.strategy`): rank 0's whole model, or every rank's shards. A checkpoint of the same batch
plan resumes exactly at its step; one written at another world size resumes by samples seen (see
`data.batch_plan`), with each rank's random numbers seeded from the seed, its rank and the step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "train_state.pt"
RNG_DIR = "rng"


@dataclass
class TrainState:
    """Where training stands, and the running totals that outlive a restart.

    The totals are this rank's while it trains; a checkpoint holds them summed over all ranks.
    """

    epoch: int = 0
    epoch_step: int = 0  # optimiser steps of `epoch` already done
    epoch_samples: int = 0  # samples of `epoch` already trained on, over all ranks
    step: int = 0  # optimiser steps done in the whole run
    samples: int = 0
    tokens: int = 0
    padded_tokens: int = 0  # tokens including padding: what the model computed on
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    last_eval: dict[str, float] = field(default_factory=dict)
    last_eval_step: int | None = None

    TOTALS = ("samples", "tokens", "padded_tokens")

    def share(self, rank: int, world_size: int) -> TrainState:
        """This state with the run's totals split over `world_size` ranks (so that they add up again)."""
        parts = {}
        for name in self.TOTALS:
            value = getattr(self, name)
            parts[name] = value // world_size + (1 if rank < value % world_size else 0)
        return dataclasses.replace(self, **parts)


def rng_state(device: torch.device) -> dict[str, Any]:
    """The random-number state of this process: torch's CPU generator and, on GPUs, the device's."""
    return {
        "cpu": torch.get_rng_state(),
        "device": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(saved: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(saved["cpu"])
    if saved["device"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(saved["device"], device)


def rng_seed(seed: int, rank: int, step: int) -> int:
    """The dropout seed of a rank: distinct per rank, and per step where a run resumes at another world size."""
    return (seed * 1_000_003 + rank * 7919 + step) % 2**63


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights a checkpoint holds: every one, or only those that train where the rest is frozen (an adapter)."""
    params = dict(model.named_parameters())
    if all(p.requires_grad for p in params.values()):
        return model.state_dict()
    return {name: p.detach() for name, p in params.items() if p.requires_grad}


def load_model_state(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """Load what `model_state` saved; every weight that trains must be in it."""
    if set(saved) == set(model.state_dict()):
        model.load_state_dict(saved)
        return
    result = model.load_state_dict(saved, strict=False)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    if result.unexpected_keys or trainable - set(saved):
        raise ValueError(
            "the checkpoint does not hold this model's trainable weights (another model or adapter?): "
            f"missing {sorted(trainable - set(saved))[:5]}, unexpected {sorted(result.unexpected_keys)[:5]}"
        )


def save(
    directory: Path,
    *,
    rank: int,
    device: torch.device,
    totals: TrainState | None,
    scaler: torch.amp.GradScaler,
    run_id: str,
    world_size: int,
    plan: str,
) -> None:
    """Write this rank's part of a checkpoint's position into `directory`; rank 0 passes the state with the run's
    totals."""
    (directory / RNG_DIR).mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(device), directory / RNG_DIR / f"rank-{rank}.pt")
    if rank != 0:
        return
    if totals is None:
        raise ValueError("rank 0 writes the training state")
    torch.save(
        {
            "state": dataclasses.asdict(totals),
            "scaler": scaler.state_dict(),
            "run_id": run_id,
            "world_size": world_size,
            "plan": plan,
        },
        directory / STATE_FILE,
    )


def load(directory: Path, rank: int) -> dict[str, Any]:
    """Read a checkpoint written by `save` (tensors on the CPU), with this rank's random-number state if saved."""
    saved: dict[str, Any] = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)
    rng = directory / RNG_DIR / f"rank-{rank}.pt"
    saved["rng"] = torch.load(rng, map_location="cpu", weights_only=True) if rng.is_file() else None
    return saved


def resumable(saved: dict[str, Any], *, resume: str, run_id: str) -> bool:
    """Whether to continue from a checkpoint: always within this run (a worker restart), and from an
    earlier run's (a whole-job retry, or a new job on the same storage) unless `checkpoint.resume` is never."""
    return resume != "never" or saved["run_id"] == run_id


def restore(saved: dict[str, Any], *, scaler: torch.amp.GradScaler) -> TrainState:
    """Load a checkpoint's scaler and return its state (totals over all ranks)."""
    scaler.load_state_dict(saved["scaler"])
    return TrainState(**saved["state"])
