"""The per-worker training function that Ray Train runs under DDP.

Every worker loads the model and its own data shard, restores the latest checkpoint if there is one,
and trains with AdamW, a linear warmup schedule, gradient accumulation and (on GPUs) autocast.
All workers run the same number of micro-batches and reach every `ray.train.report` together:
evaluations and checkpoints happen at fixed steps, and the time-based metric reports are agreed on
with a one-element all-reduce.
"""

from __future__ import annotations

import math
import os
import socket
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import get_linear_schedule_with_warmup

from rocmtrain.api.models import DataSource, TrainingSpec
from rocmtrain_train import checkpoint
from rocmtrain_train.checkpoint import TrainState
from rocmtrain_train.config import RunSettings
from rocmtrain_train.data import (
    Encoded,
    collate,
    encode,
    length_grouped_batches,
    read_records,
    sample_order,
    shard,
    sorted_batches,
)
from rocmtrain_train.evaluate import evaluate
from rocmtrain_train.logs import rank_logger
from rocmtrain_train.metrics import ResourceSampler
from rocmtrain_train.model import load_model, resolve_model

LR_SCALING: dict[str, Callable[[int], float]] = {"none": lambda w: 1.0, "linear": float, "sqrt": math.sqrt}
FUSED_ADAMW_DEVICES = ("cuda", "cpu")


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


def autocast_for(training: TrainingSpec, device: torch.device) -> Callable[[], AbstractContextManager]:
    """bf16/fp16 autocast on GPUs; fp32 on CPUs."""
    if device.type != "cuda" or training.precision == "fp32":
        return nullcontext
    dtype = torch.bfloat16 if training.precision == "bf16" else torch.float16
    return lambda: torch.autocast("cuda", dtype=dtype)


class Interval:
    """Training counters since the last report."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self.reset()

    def reset(self) -> None:
        self.loss_sum = torch.zeros((), device=self._device)
        self.samples = 0
        self.tokens = 0
        self.train_seconds = 0.0
        self.data_wait = 0.0
        self.started = time.perf_counter()

    def metrics(self) -> dict[str, float | int | None]:
        seconds = max(self.train_seconds, 1e-9)
        return {
            "loss": float(self.loss_sum.item()) / self.samples if self.samples else None,
            "interval_samples": self.samples,
            "samples_per_second": self.samples / seconds,
            "tokens_per_second": self.tokens / seconds,
            "data_wait_fraction": min(1.0, self.data_wait / seconds),
        }


def report_due(started: float, interval_s: float, device: torch.device) -> bool:
    """Whether the report interval has passed on any worker (all workers get the same answer)."""
    due = time.perf_counter() - started >= interval_s
    if not dist.is_initialized():
        return due
    flag = torch.tensor([1.0 if due else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def load_shard(settings: RunSettings, source: DataSource, tokenizer: Any, *, pad: bool) -> Encoded:
    """This worker's share of a data source, tokenised."""
    spec = settings.job.spec
    ctx = ray.train.get_context()
    records = read_records(source, spec.data, spec.model, settings.base_dir)
    order = sample_order(len(records), spec.data.shuffle_seed, source.max_samples)
    indices = shard(order, ctx.get_world_rank(), ctx.get_world_size(), pad=pad)
    return encode(tokenizer, records.take(indices), spec.model.max_seq_length)


class Worker:
    """One training worker: model, data shard, optimiser and the training state."""

    def __init__(self, settings: RunSettings) -> None:
        ctx = ray.train.get_context()
        self.settings = settings
        self.spec = settings.job.spec
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        self.log = rank_logger(settings.log_dir, self.rank)
        self.log.info(
            "rank %d of %d started: pid %d on %s", self.rank, self.world_size, os.getpid(), socket.gethostname()
        )
        torch.set_num_threads(settings.torch_threads)
        self.device = ray.train.torch.get_device() if settings.use_gpu else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        training = self.spec.training

        torch.manual_seed(training.seed)  # the new head starts the same on every rank
        model_dir = resolve_model(self.spec.model.source, settings.base_dir)
        assert model_dir is not None
        self.model, self.tokenizer = load_model(model_dir, self.spec.model)
        self.model.to(self.device)
        torch.manual_seed(training.seed + self.rank)  # dropout differs between ranks
        self.train_data = load_shard(settings, self.spec.data.train, self.tokenizer, pad=True)
        self.train_lengths = self.train_data.lengths
        self.eval_data = None
        if self.spec.data.eval is not None:
            self.eval_data = load_shard(settings, self.spec.data.eval, self.tokenizer, pad=False)

        self.micro_batches = math.ceil(len(self.train_data.labels) / training.batch_size_per_worker)
        self.steps_per_epoch = math.ceil(self.micro_batches / training.gradient_accumulation_steps)
        self.total_steps = self.steps_per_epoch * training.epochs
        self.optimizer = optimizer_for(self.model, training, self.world_size)
        self.scheduler = get_linear_schedule_with_warmup(
            self.optimizer, math.ceil(self.total_steps * training.warmup_ratio), self.total_steps
        )
        on_gpu = self.device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda", enabled=on_gpu and training.precision == "fp16")
        self.autocast = autocast_for(training, self.device)
        self.pad_multiple = 8 if on_gpu else 1
        self.state, self.resumed_from = self._restore()
        self.ddp = (
            DistributedDataParallel(
                self.model, device_ids=[self.device.index] if on_gpu else None, gradient_as_bucket_view=True
            )
            if self.world_size > 1
            else self.model
        )
        self.sampler = ResourceSampler(self.device)
        self.interval = Interval(self.device)
        self.log.info(
            "%d training records on this rank, %d micro-batches and %d optimiser steps per epoch, %d steps in all",
            len(self.train_data.labels),
            self.micro_batches,
            self.steps_per_epoch,
            self.total_steps,
        )

    def _restore(self) -> tuple[TrainState, int | None]:
        found = ray.train.get_checkpoint()
        if found is None:
            return TrainState(), None
        with found.as_directory() as directory:
            saved = checkpoint.load(Path(directory))
        resume = self.spec.checkpoint.resume
        if not checkpoint.resumable(saved, resume=resume, run_id=self.settings.run_id, world_size=self.world_size):
            self.log.info("not resuming from %s: checkpoint.resume is never", found.path)
            return TrainState(), None
        state = checkpoint.restore(
            saved, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, scaler=self.scaler
        )
        self.log.info("resumed from %s: epoch %d, step %d", found.path, state.epoch, state.step)
        return state, state.step

    def _batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        batch = collate(
            self.train_data,
            indices,
            self.tokenizer.pad_token_id,
            regression=self.spec.model.task == "regression",
            multiple_of=self.pad_multiple,
        )
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _step(self, group: list[list[int]]) -> None:
        """One optimiser step over a group of micro-batches; gradients sync on the last one only."""
        for i, indices in enumerate(group):
            waited = time.perf_counter()
            batch = self._batch(indices)
            waited = time.perf_counter() - waited
            tokens = sum(self.train_lengths[j] for j in indices)
            self.interval.data_wait += waited
            self.state.data_wait_seconds += waited
            last = i == len(group) - 1
            with nullcontext() if last or self.ddp is self.model else self.ddp.no_sync():
                with self.autocast():
                    loss = self.ddp(**batch).loss
                self.scaler.scale(loss / len(group)).backward()
            self.interval.loss_sum += loss.detach().float() * len(indices)
            self.interval.samples += len(indices)
            self.interval.tokens += tokens
            self.state.samples += len(indices)
            self.state.tokens += tokens
        max_norm = self.spec.training.max_grad_norm
        if max_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _evaluate(self) -> dict[str, float]:
        assert self.eval_data is not None
        started = time.perf_counter()
        batch_size = 2 * self.spec.training.batch_size_per_worker
        pad_id, regression = self.tokenizer.pad_token_id, self.spec.model.task == "regression"
        batches = (
            collate(self.eval_data, b, pad_id, regression=regression, multiple_of=self.pad_multiple)
            for b in sorted_batches(self.eval_data.lengths, batch_size)
        )
        result = evaluate(self.model, batches, self.spec.model, self.device, self.autocast)
        self.state.eval_seconds += time.perf_counter() - started
        self.state.last_eval, self.state.last_eval_step = result, self.state.step
        self.log.info("evaluation at step %d: %s", self.state.step, _format(result))
        return result

    def _report(self, *, evaluated: dict[str, float] | None, save: bool, **flags: Any) -> None:
        """Report this rank's metrics (all ranks call this together); rank 0 attaches the checkpoint."""
        state = self.state
        epoch = state.epoch + state.batches_done / self.micro_batches
        metrics: dict[str, Any] = {
            "rank": self.rank,
            "world_size": self.world_size,
            "step": state.step,
            "total_steps": self.total_steps,
            "epoch": epoch,
            "learning_rate": self.scheduler.get_last_lr()[0],
            "samples": state.samples,
            "tokens": state.tokens,
            "train_seconds": state.train_seconds,
            "data_wait_seconds": state.data_wait_seconds,
            "eval_seconds": state.eval_seconds,
            "resumed_from_step": self.resumed_from,
            **self.interval.metrics(),
            **self.sampler.sample(),
            **(evaluated or {}),
            **flags,
        }
        self.log.info("step %d/%d epoch %.2f: %s", state.step, self.total_steps, epoch, _format(metrics))
        with tempfile.TemporaryDirectory() as directory:
            found = None
            if save and self.rank == 0:
                checkpoint.save(
                    Path(directory),
                    state=state,
                    model=self.model,
                    optimizer=self.optimizer,
                    scheduler=self.scheduler,
                    scaler=self.scaler,
                    run_id=self.settings.run_id,
                    world_size=self.world_size,
                )
                found = ray.train.Checkpoint.from_directory(directory)
            ray.train.report(metrics, checkpoint=found)
        self.interval.reset()

    def train(self) -> None:
        training, every = self.spec.training, self.spec.checkpoint.every_steps
        state = self.state
        for epoch in range(state.epoch, training.epochs):
            batches = length_grouped_batches(
                self.train_lengths, training.batch_size_per_worker, seed=f"{training.seed}:{epoch}"
            )
            accumulate = training.gradient_accumulation_steps
            for start in range(state.batches_done, len(batches), accumulate):
                began = time.perf_counter()
                group = batches[start : start + accumulate]
                self._step(group)
                spent = time.perf_counter() - began
                state.train_seconds += spent
                self.interval.train_seconds += spent
                state.step += 1
                state.batches_done = start + len(group)
                epoch_end = state.batches_done == len(batches)
                evaluated = None
                if self.eval_data is not None and (
                    (training.eval_every_steps and state.step % training.eval_every_steps == 0)
                    or (not training.eval_every_steps and epoch_end)
                ):
                    evaluated = self._evaluate()
                if epoch_end:
                    state.epoch, state.batches_done = epoch + 1, 0
                    self.log.info("epoch %d finished at step %d", epoch + 1, state.step)
                save = epoch_end or bool(every and state.step % every == 0)
                if save or evaluated or report_due(self.interval.started, self.settings.report_interval_s, self.device):
                    self._report(evaluated=evaluated, save=save, epoch_end=epoch_end)
        self._finish()

    def _finish(self) -> None:
        """Evaluate the final model if that has not happened yet, export it, and send the final report."""
        evaluated = None
        if self.eval_data is not None and self.state.last_eval_step != self.state.step:
            evaluated = self._evaluate()
        if self.rank == 0:
            checkpoint.export_model(self.model, self.tokenizer, self.settings.model_output)
            self.log.info("model saved to %s", self.settings.model_output)
        self._report(
            evaluated=evaluated or self.state.last_eval, save=False, final=True, model_path=self.settings.model_output
        )


def _format(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def train_worker(config: dict[str, Any]) -> None:
    """Ray Train's `train_loop_per_worker`: `config["settings"]` is the run's RunSettings."""
    worker = Worker(config["settings"])
    try:
        worker.train()
    except Exception:
        worker.log.exception("training failed on rank %d", worker.rank)
        raise
