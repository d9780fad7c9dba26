"""Building one training worker: everything `loop` needs, set up once when Ray Train starts the worker.

`build_worker` loads the model and this rank's data shards, sets up AdamW, the linear
warmup schedule, autocast and (with more than one worker) DDP, and restores the latest
checkpoint if there is one. The result, a `Worker`, holds no behaviour beyond that:
the step loop (`loop.TrainLoop`) runs it.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedModel, get_linear_schedule_with_warmup

from rocmtrain.api.models import DataSource, TrainingSpec
from rocmtrain_train import checkpoint
from rocmtrain_train.checkpoint import TrainState
from rocmtrain_train.config import ConfigError, RunSettings
from rocmtrain_train.data import Encoded, encode, read_records, sample_order, shard
from rocmtrain_train.logs import rank_logger
from rocmtrain_train.model import load_model, resolve_model

LR_SCALING: dict[str, Callable[[int], float]] = {"none": lambda w: 1.0, "linear": float, "sqrt": math.sqrt}
FUSED_ADAMW_DEVICES = ("cuda", "cpu")

Autocast = Callable[[], AbstractContextManager[Any]]


def scaled_learning_rate(training: TrainingSpec, world_size: int) -> float:
    return training.learning_rate * LR_SCALING[training.lr_scaling](world_size)


def optimizer_for(model: torch.nn.Module, training: TrainingSpec, world_size: int) -> torch.optim.AdamW:
    """AdamW without weight decay on biases and norms; fused where the device has a fused kernel."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": training.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    fused = params[0].device.type in FUSED_ADAMW_DEVICES
    return torch.optim.AdamW(groups, lr=scaled_learning_rate(training, world_size), fused=fused)


def autocast_for(training: TrainingSpec, device: torch.device) -> Autocast:
    """bf16/fp16 autocast on GPUs; fp32 on CPUs."""
    if device.type != "cuda" or training.precision == "fp32":
        return nullcontext
    dtype = torch.bfloat16 if training.precision == "bf16" else torch.float16
    return lambda: torch.autocast("cuda", dtype=dtype)


def load_shard(settings: RunSettings, source: DataSource, tokenizer: Any, *, pad: bool) -> Encoded:
    """This worker's share of a data source, tokenised."""
    spec = settings.job.spec
    ctx = ray.train.get_context()
    records = read_records(source, spec.data, spec.model, settings.base_dir)
    order = sample_order(len(records), spec.data.shuffle_seed, source.max_samples)
    indices = shard(order, ctx.get_world_rank(), ctx.get_world_size(), pad=pad)
    return encode(tokenizer, records.take(indices), spec.model.max_seq_length)


@dataclass
class Worker:
    """One training worker's parts: model, data shards, optimiser, schedule, and where training stands."""

    settings: RunSettings
    rank: int
    world_size: int
    log: logging.Logger
    device: torch.device
    model: PreTrainedModel
    ddp: DistributedDataParallel | None  # the model wrapped for DDP; None with one worker
    tokenizer: Any
    train_data: Encoded
    eval_data: Encoded | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    autocast: Autocast
    pad_multiple: int  # batches are padded to a multiple of this (8 on GPUs)
    micro_batches: int  # per epoch
    total_steps: int
    state: TrainState
    resumed_from: int | None  # the checkpoint step this attempt started from


def _device(settings: RunSettings) -> torch.device:
    device = ray.train.torch.get_device() if settings.use_gpu else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _restore(worker: Worker) -> None:
    """Continue from the latest checkpoint, if there is one and `checkpoint.resume` allows it."""
    found = ray.train.get_checkpoint()
    if found is None:
        return
    with found.as_directory() as directory:
        saved = checkpoint.load(Path(directory))
    resume = worker.settings.job.spec.checkpoint.resume
    if not checkpoint.resumable(saved, resume=resume, run_id=worker.settings.run_id, world_size=worker.world_size):
        worker.log.info("not resuming from %s: checkpoint.resume is never", found.path)
        return
    worker.state = checkpoint.restore(
        saved, model=worker.model, optimizer=worker.optimizer, scheduler=worker.scheduler, scaler=worker.scaler
    )
    worker.resumed_from = worker.state.step
    worker.log.info("resumed from %s: epoch %d, step %d", found.path, worker.state.epoch, worker.state.step)


def build_worker(settings: RunSettings) -> Worker:
    """Set up this rank's worker (inside Ray Train's `train_loop_per_worker`)."""
    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    spec = settings.job.spec
    training = spec.training
    log = rank_logger(settings.log_dir, rank)
    log.info("rank %d of %d started: pid %d on %s", rank, world_size, os.getpid(), socket.gethostname())
    torch.set_num_threads(settings.torch_threads)
    device = _device(settings)

    torch.manual_seed(training.seed)  # the new head starts the same on every rank
    model_dir = resolve_model(spec.model.source, settings.base_dir)
    if model_dir is None:
        raise ConfigError(f"model {spec.model.source}: not available on rank {rank}")
    model, tokenizer = load_model(model_dir, spec.model)
    model.to(device)  # type: ignore[arg-type]  # transformers wraps `to` in a way mypy reads as unbound
    torch.manual_seed(training.seed + rank)  # dropout differs between ranks
    train_data = load_shard(settings, spec.data.train, tokenizer, pad=True)
    eval_data = load_shard(settings, spec.data.eval, tokenizer, pad=False) if spec.data.eval is not None else None

    micro_batches = math.ceil(len(train_data.labels) / training.batch_size_per_worker)
    steps_per_epoch = math.ceil(micro_batches / training.gradient_accumulation_steps)
    total_steps = steps_per_epoch * training.epochs
    optimizer = optimizer_for(model, training, world_size)
    on_gpu = device.type == "cuda"
    worker = Worker(
        settings=settings,
        rank=rank,
        world_size=world_size,
        log=log,
        device=device,
        model=model,
        ddp=None,
        tokenizer=tokenizer,
        train_data=train_data,
        eval_data=eval_data,
        optimizer=optimizer,
        scheduler=get_linear_schedule_with_warmup(
            optimizer, math.ceil(total_steps * training.warmup_ratio), total_steps
        ),
        scaler=torch.amp.GradScaler("cuda", enabled=on_gpu and training.precision == "fp16"),
        autocast=autocast_for(training, device),
        pad_multiple=8 if on_gpu else 1,
        micro_batches=micro_batches,
        total_steps=total_steps,
        state=TrainState(),
        resumed_from=None,
    )
    _restore(worker)
    if world_size > 1:
        worker.ddp = DistributedDataParallel(
            model, device_ids=[device.index] if on_gpu else None, gradient_as_bucket_view=True
        )
    log.info(
        "%d training records on this rank, %d micro-batches and %d optimiser steps per epoch, %d steps in all",
        len(train_data.labels),
        micro_batches,
        steps_per_epoch,
        total_steps,
    )
    return worker
