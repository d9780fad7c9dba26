"""Building one training rank: everything `step_loop` needs, set up once when Ray Train starts the worker.

`build_worker` loads the job's task and its model (attention kernels, gradient checkpointing, an
adapter, torch.compile as the job says), plans the batches and tokenises this rank's records
(`batch_plan`, the task's encoding), counts what each step's loss is averaged over on all ranks
together, spreads the model over the ranks by the job's strategy (DDP, or FSDP's shards, each rank
reading only its own from the model's files: `model.sharded_load`), sets up
AdamW, the linear warmup schedule and autocast, and restores the latest checkpoint if there is one.
The result, a `Worker`, holds no behaviour beyond that: the step loop (`loop.TrainLoop`) runs it.
Each rank has one GPU (`ray.train.torch.get_device`).
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

import numpy as np
import ray.train
import ray.train.torch
import torch
from transformers import PreTrainedModel, get_linear_schedule_with_warmup

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import NetworkTransport, TrainingSpec
from rocmtrain.plan.setup import Setup
from rocmtrain_train.checkpoint import train_state
from rocmtrain_train.checkpoint.train_state import TrainState
from rocmtrain_train.collectives import MAX, SUM, over_ranks
from rocmtrain_train.config import RunSettings
from rocmtrain_train.data.batch_plan import BatchPlan
from rocmtrain_train.data.tokens import Encoded
from rocmtrain_train.loop.rank_shard import Tokenizing, TrainData, load_eval_data, load_train_data, takes_token_types
from rocmtrain_train.model.linear_loss import kernel_of
from rocmtrain_train.model.pretrained import compile_model, parameter_counts, resolve_model
from rocmtrain_train.model.sharded_load import is_empty, shard_and_fill
from rocmtrain_train.reporting import rccl_log
from rocmtrain_train.reporting.log_files import rank_logger
from rocmtrain_train.strategy import Strategy, strategy_for
from rocmtrain_train.tasks import Task, task_for

LR_SCALING: dict[str, Callable[[int], float]] = {"none": lambda w: 1.0, "linear": float, "sqrt": math.sqrt}
FUSED_ADAMW_DEVICES = ("cuda", "cpu")
# With torch.compile, batches are padded to a multiple of this many tokens (few shapes to compile).
COMPILE_BUCKET = 64
# Without it, GPU batches are padded to a multiple of 8 (tensor-core friendly shapes).
GPU_PAD_MULTIPLE = 8

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


def schedule(
    optimizer: torch.optim.Optimizer, training: TrainingSpec, world_size: int, total_steps: int, step: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup and decay of this run's learning rate, standing at `step` (after a restore)."""
    for group in optimizer.param_groups:
        group["initial_lr"] = scaled_learning_rate(training, world_size)
    warmup = math.ceil(total_steps * training.warmup_ratio)
    return get_linear_schedule_with_warmup(optimizer, warmup, total_steps, last_epoch=step - 1)


def autocast_for(training: TrainingSpec, device: torch.device, strategy: Strategy) -> Autocast:
    """bf16/fp16 autocast on GPUs, unless the strategy casts to the compute precision itself; fp32 on CPUs."""
    if device.type != "cuda" or training.precision == "fp32" or strategy.casts:
        return nullcontext
    dtype = torch.bfloat16 if training.precision == "bf16" else torch.float16
    return lambda: torch.autocast("cuda", dtype=dtype)


def pad_multiple(training: TrainingSpec, device: torch.device) -> int:
    if training.compile:
        return COMPILE_BUCKET
    return GPU_PAD_MULTIPLE if device.type == "cuda" else 1


@dataclass
class Worker:
    """One rank's parts: model, data, optimiser, schedule, and where training stands."""

    settings: RunSettings
    task: Task
    strategy: Strategy
    rank: int
    world_size: int
    log: logging.Logger
    device: torch.device
    model: PreTrainedModel
    module: torch.nn.Module  # what a step calls: the model, or its DDP wrapper
    tokenizer: Any
    train: TrainData
    eval_data: Encoded | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    autocast: Autocast
    pad_multiple: int  # batches are padded to a multiple of this
    total_steps: int
    step_items: np.ndarray  # per step of the plan, what its loss is averaged over, on all ranks together
    step_passes: np.ndarray | None  # per step, the most forward passes of any rank (ranks in lockstep), else None
    state: TrainState
    resumed_from: int | None  # the checkpoint step this attempt started from
    parameters: tuple[int, int]  # (trainable, total)
    network: NetworkTransport | None  # rank 0 on GPUs: the network RCCL chose, where its log tells

    @property
    def pin_memory(self) -> bool:
        return self.device.type == "cuda"


def _device(settings: RunSettings) -> torch.device:
    device = ray.train.torch.get_device() if settings.use_gpu else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def rccl_log_file(settings: RunSettings, rank: int) -> str | None:
    """Rank 0 on GPUs (the RCCL backend): RCCL's INIT and NET lines to a file, set before the first
    collective creates a communicator (where RCCL reads NCCL_DEBUG*); the file that will tell its network."""
    if not settings.use_gpu or rank != 0:
        return None
    return rccl_log.raise_debug_level(settings.log_dir)


def _threads(settings: RunSettings) -> None:
    """Thread pools sized to this rank's CPUs: torch's, and the tokenizer's (which the image turns off)."""
    threads = settings.torch_threads
    torch.set_num_threads(threads)
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"


def _latest_checkpoint(settings: RunSettings, rank: int, parts: Parts, log: logging.Logger) -> dict[str, Any] | None:
    """The latest checkpoint of the run (this rank's view of it), if `checkpoint.resume` allows resuming it; its
    weights and optimiser state are loaded into `parts`."""
    found = ray.train.get_checkpoint()
    if found is None:
        return None
    with found.as_directory() as directory:
        saved = train_state.load(Path(directory), rank)
        if not train_state.resumable(saved, resume=settings.job.spec.checkpoint.resume, run_id=settings.run_id):
            log.info("not resuming from %s: checkpoint.resume is never", found.path)
            return None
        log.info("resuming from %s", found.path)
        parts.strategy.load(Path(directory), model=parts.model, optimizer=parts.optimizer)
    return saved


@dataclass(frozen=True)
class Parts:
    """What a checkpoint restores into."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    device: torch.device
    strategy: Strategy


def _restore(
    settings: RunSettings,
    rank: int,
    world_size: int,
    plan: BatchPlan,
    parts: Parts,
    log: logging.Logger,
) -> tuple[TrainState, int | None]:
    """The state to start from, and the step of the checkpoint it came from (None for a fresh start).

    Random numbers: restored where this rank saved them with the same steps and world size, else
    seeded from the seed, the rank and the step.
    """
    seed = settings.job.spec.training.seed
    saved = _latest_checkpoint(settings, rank, parts, log)
    if saved is None:
        torch.manual_seed(train_state.rng_seed(seed, rank, 0))
        return TrainState(), None
    state = train_state.restore(saved, scaler=parts.scaler)
    resumed_from = state.step
    same_steps = saved["plan"] == plan.digest
    if not same_steps:
        state.epoch_step = plan.resume_at(seed, state.epoch, state.epoch_samples)
        state.step = state.epoch * len(plan.steps) + state.epoch_step
        log.info(
            "the checkpoint at step %d was written by %d ranks with other steps; continuing after "
            "%d samples of epoch %d, at step %d",
            resumed_from,
            saved["world_size"],
            state.epoch_samples,
            state.epoch + 1,
            state.step,
        )
    if same_steps and saved["world_size"] == world_size and saved["rng"] is not None:
        train_state.set_rng_state(saved["rng"], parts.device)
    else:
        torch.manual_seed(train_state.rng_seed(seed, rank, state.step))
    log.info("resumed at epoch %d, step %d", state.epoch, state.step)
    return state.share(rank, world_size), resumed_from


def _portions(train: TrainData, rank: int) -> list[list[int]]:
    """This rank's records of each step of the plan, as indices into its encoded records."""
    plan = train.plan
    return [[train.position[r] for r in plan.portion(step, rank)] for step in range(len(plan.steps))]


def step_items(train: TrainData, rank: int, device: torch.device) -> np.ndarray:
    """Per step of the plan, the records (classifiers) or tokens that carry loss (language models) of every rank
    together: one all-reduce for the whole run, none per step."""
    local = [int(train.items[rows].sum()) for rows in _portions(train, rank)]
    return over_ranks(local, SUM, device)


def step_passes(train: TrainData, task: Task, rank: int, batch_size: int, device: torch.device) -> np.ndarray:
    """Per step of the plan, the most micro-batches any rank runs (one all-reduce for the whole run): ranks in
    lockstep all run that many."""
    local = [len(task.micro_batches(rows, train.encoded, batch_size)) for rows in _portions(train, rank)]
    return over_ranks(local, MAX, device)


def _place(
    model: torch.nn.Module, path: Path, device: torch.device, strategy: Strategy, log: logging.Logger, *, sharded: bool
) -> None:
    """Spread the model over the ranks: a model built on the meta device is sharded, then this rank's shards are
    read from its files; a loaded one moves to the device whole first."""
    if is_empty(model):
        shard_and_fill(model, path, device, strategy.prepare)
        log.info("loaded this rank's shards of the model's weights from its safetensors files")
        return
    if sharded:
        log.warning(
            "loaded the whole model on this rank before sharding it: a sharded load reads a causal language "
            "model's rows from safetensors files, and this one is a classifier, saved as .bin files, or has weights "
            "transformers converts on loading"
        )
    model.to(device)
    strategy.prepare(model)


def build_worker(settings: RunSettings) -> Worker:
    """Set up this rank's worker (inside Ray Train's `train_loop_per_worker`)."""
    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    spec = settings.job.spec
    training = spec.training
    log = rank_logger(settings.log_dir, rank)
    log.info(
        "rank %d of %d started: pid %d on %s (local rank %d)",
        rank,
        world_size,
        os.getpid(),
        socket.gethostname(),
        ctx.get_local_rank(),
    )
    _threads(settings)
    rccl_file = rccl_log_file(settings, rank)
    device = _device(settings)

    torch.manual_seed(training.seed)  # the new head starts the same on every rank
    model_dir = resolve_model(spec.model.source, settings.base_dir)
    if model_dir is None:
        raise ConfigError(f"model {spec.model.source}: not available on rank {rank}")
    task = task_for(spec)
    model, tokenizer = task.load(model_dir, gpu=device.type == "cuda")
    if (kernel := kernel_of(model)) is not None:
        log.info("the loss: %s (training.lossImplementation)", kernel.value)
    how = Tokenizing(task, tokenizer, model_dir, takes_token_types(model), log)
    train = load_train_data(settings, rank, world_size, how, device)
    eval_data = load_eval_data(settings, rank, world_size, how)

    total_steps = len(train.plan.steps) * training.epochs
    counted = parameter_counts(model)  # before sharding: the whole model's (on the meta device alike)
    strategy = strategy_for(settings, device)
    _place(model, model_dir, device, strategy, log, sharded=training.sharding == "fsdp")
    optimizer = optimizer_for(model, training, world_size)
    on_gpu = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=on_gpu and training.precision == "fp16")
    parts = Parts(model, optimizer, scaler, device, strategy)
    state, resumed_from = _restore(settings, rank, world_size, train.plan, parts, log)
    if training.compile:
        compile_model(model, Setup.of(spec).sequence, COMPILE_BUCKET)  # a flat row: its records' tokens
    items = step_items(train, rank, device)  # the first collective: RCCL has chosen its network
    worker = Worker(
        settings=settings,
        task=task,
        strategy=strategy,
        rank=rank,
        world_size=world_size,
        log=log,
        device=device,
        model=model,
        module=strategy.wrap(model),
        tokenizer=tokenizer,
        train=train,
        eval_data=eval_data,
        optimizer=optimizer,
        scheduler=schedule(optimizer, training, world_size, total_steps, state.step),
        scaler=scaler,
        autocast=autocast_for(training, device, strategy),
        pad_multiple=pad_multiple(training, device),
        total_steps=total_steps,
        step_items=items,
        step_passes=step_passes(train, task, rank, training.batch_size_per_worker, device)
        if strategy.lockstep
        else None,
        state=state,
        resumed_from=resumed_from,
        parameters=counted,
        network=rccl_log.read_transport(rccl_file, socket.gethostname(), os.getpid(), log),
    )
    log.info(
        "%d training records on this rank, %d optimiser steps per epoch of %d records, %d steps in all; "
        "%d of %d parameters train",
        len(train.encoded),
        len(train.plan.steps),
        train.plan.step_size,
        total_steps,
        *worker.parameters,
    )
    return worker
