"""Strategies: how a model is spread over the ranks, behind one seam the loop asks.

A strategy prepares the model for the ranks (before the optimiser sees its parameters), says which
module a step calls and how gradient synchronisation is skipped within an accumulation step, writes
and restores the weights and optimiser state of a checkpoint, exports the trained model, and sums its
weights. The loop (`loop.step_loop`) knows none of this:

- `data_parallel`: `training.sharding: none`: DDP, every rank holds the whole model;
- `sharded`: `training.sharding: fsdp`: PyTorch FSDP2, each block's parameters, gradients and
  optimiser state sharded within a pod (or over the job), gathered one block at a time.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from rocmtrain_train.config import RunSettings


class Strategy(Protocol):
    """How the ranks share a model."""

    @property
    def lockstep(self) -> bool:
        """Whether every rank must run the same forward passes (a sharded model gathers its weights in each)."""

    @property
    def casts(self) -> bool:
        """Whether it computes in the job's GPU precision itself (in place of autocast)."""

    def prepare(self, model: torch.nn.Module) -> None:
        """Spread the model over the ranks, in place, before an optimiser takes its parameters."""

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module a training step calls (after a checkpoint is restored)."""

    def gradient_sync(self, module: torch.nn.Module, sync: bool) -> AbstractContextManager[Any]:
        """A context in which backward passes synchronise gradients across ranks only if `sync`."""

    def save(self, directory: Path, *, rank: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Write this rank's part of the weights and optimiser state of a checkpoint into `directory`."""

    def load(self, directory: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Restore what `save` wrote (at any world size where the strategy allows)."""

    def export(self, model: torch.nn.Module, tokenizer: Any, destination: str, *, rank: int, merge: bool) -> None:
        """Export the trained model where `from_pretrained` loads it (a collective where the model is sharded)."""

    def checksum(self, model: torch.nn.Module) -> float:
        """The sum of every weight, in float64, the same on every rank exactly when the ranks are in step."""


def strategy_for(settings: RunSettings, device: torch.device) -> Strategy:
    """The strategy of a run."""
    if settings.job.spec.training.sharding == "fsdp":
        from rocmtrain_train.strategy.sharded import Sharded

        return Sharded.for_run(settings, device)
    from rocmtrain_train.strategy.data_parallel import DataParallel

    return DataParallel(device)
