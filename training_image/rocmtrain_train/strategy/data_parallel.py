"""Data parallelism (`training.sharding: none`): DDP over the ranks, each holding the whole model.

Gradients are all-reduced in buckets during the backward pass (not within an accumulation step);
rank 0 writes the weights (an adapter's only, where the base is frozen) and optimiser state of a
checkpoint and exports the model.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from rocmtrain_train.checkpoint.model_export import export_model
from rocmtrain_train.checkpoint.train_state import load_model_state, model_state

WEIGHTS_FILE = "weights.pt"


class DataParallel:
    """DDP: the whole model on every rank."""

    lockstep = False
    casts = False

    def __init__(self, device: torch.device) -> None:
        self._device = device

    def prepare(self, model: torch.nn.Module) -> None:
        """Nothing to spread: every rank holds the whole model."""

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return model
        device_ids = [self._device.index] if self._device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)

    def gradient_sync(self, module: torch.nn.Module, sync: bool) -> AbstractContextManager[Any]:
        return module.no_sync() if not sync and isinstance(module, DistributedDataParallel) else nullcontext()

    def save(self, directory: Path, *, rank: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if rank == 0:
            torch.save({"model": model_state(model), "optimizer": optimizer.state_dict()}, directory / WEIGHTS_FILE)

    def load(self, directory: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        saved = torch.load(directory / WEIGHTS_FILE, map_location="cpu", weights_only=True)
        load_model_state(model, saved["model"])
        optimizer.load_state_dict(saved["optimizer"])

    def export(self, model: torch.nn.Module, tokenizer: Any, destination: str, *, rank: int, merge: bool) -> None:
        if rank == 0:
            export_model(model, tokenizer, destination, merge=merge)  # type: ignore[arg-type]

    def checksum(self, model: torch.nn.Module) -> float:
        with torch.no_grad():
            return float(sum(p.detach().double().sum() for p in model.parameters()).item())  # type: ignore[union-attr]
