"""The per-worker training function that Ray Train runs under DDP: a small step loop over a built `Worker`.

`worker.build_worker` sets everything up (model, data shard, optimiser, checkpoint
restore); `TrainLoop` then trains with gradient accumulation and (on GPUs) autocast.
All workers run the same number of micro-batches and reach every `ray.train.report`
together: evaluations and checkpoints happen at fixed steps, and the time-based metric
reports are agreed on with a one-element all-reduce. Each report is a `RankReport`.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import ray.train
import torch
import torch.distributed as dist

from rocmtrain_train import checkpoint
from rocmtrain_train.data import collate, length_grouped_batches, sorted_batches
from rocmtrain_train.evaluate import evaluate
from rocmtrain_train.metrics import ResourceSampler
from rocmtrain_train.rank_report import Evaluation, RankReport
from rocmtrain_train.worker import Worker, build_worker


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

    def mean_loss(self) -> float | None:
        return float(self.loss_sum.item()) / self.samples if self.samples else None


def report_due(started: float, interval_s: float, device: torch.device) -> bool:
    """Whether the report interval has passed on any worker (all workers get the same answer)."""
    due = time.perf_counter() - started >= interval_s
    if not dist.is_initialized():
        return due
    flag = torch.tensor([1.0 if due else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


class TrainLoop:
    """Runs a worker's optimiser steps, evaluations, checkpoints and reports."""

    def __init__(self, worker: Worker) -> None:
        self.w = worker
        self.spec = worker.settings.job.spec
        self.train_lengths = worker.train_data.lengths  # tokens per record, computed once
        self.sampler = ResourceSampler(worker.device)
        self.interval = Interval(worker.device)

    def run(self) -> None:
        """Train every remaining epoch from where the worker's state stands, then finish."""
        w, training, every = self.w, self.spec.training, self.spec.checkpoint.every_steps
        state = w.state
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
                evaluated = self._evaluate() if self._evaluation_due(epoch_end) else None
                if epoch_end:
                    state.epoch, state.batches_done = epoch + 1, 0
                    w.log.info("epoch %d finished at step %d", epoch + 1, state.step)
                save = epoch_end or bool(every and state.step % every == 0)
                if save or evaluated or report_due(self.interval.started, w.settings.report_interval_s, w.device):
                    self._report(evaluated or {}, save=save, epoch_end=epoch_end)
        self._finish()

    def _evaluation_due(self, epoch_end: bool) -> bool:
        every = self.spec.training.eval_every_steps
        if self.w.eval_data is None:
            return False
        return bool(every and self.w.state.step % every == 0) if every else epoch_end

    def _batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        w = self.w
        batch = collate(
            w.train_data,
            indices,
            w.tokenizer.pad_token_id,
            regression=self.spec.model.task == "regression",
            multiple_of=w.pad_multiple,
        )
        return {k: v.to(w.device, non_blocking=True) for k, v in batch.items()}

    def _step(self, group: list[list[int]]) -> None:
        """One optimiser step over a group of micro-batches; gradients sync on the last one only."""
        w, state, interval = self.w, self.w.state, self.interval
        for i, indices in enumerate(group):
            waited = time.perf_counter()
            batch = self._batch(indices)
            waited = time.perf_counter() - waited
            tokens = sum(self.train_lengths[j] for j in indices)
            interval.data_wait += waited
            state.data_wait_seconds += waited
            last = i == len(group) - 1
            with nullcontext() if last or w.ddp is None else w.ddp.no_sync():
                with w.autocast():
                    loss = (w.ddp or w.model)(**batch).loss
                w.scaler.scale(loss / len(group)).backward()
            interval.loss_sum += loss.detach().float() * len(indices)
            interval.samples += len(indices)
            interval.tokens += tokens
            state.samples += len(indices)
            state.tokens += tokens
        max_norm = self.spec.training.max_grad_norm
        if max_norm > 0:
            w.scaler.unscale_(w.optimizer)
            torch.nn.utils.clip_grad_norm_(w.model.parameters(), max_norm)
        w.scaler.step(w.optimizer)
        w.scaler.update()
        w.scheduler.step()
        w.optimizer.zero_grad(set_to_none=True)

    def _evaluate(self) -> Evaluation:
        """Evaluate on the eval shards (all ranks together); record the result in the state."""
        w, data = self.w, self.w.eval_data
        if data is None:
            return {}
        started = time.perf_counter()
        batch_size = 2 * self.spec.training.batch_size_per_worker
        regression = self.spec.model.task == "regression"
        batches = (
            collate(data, b, w.tokenizer.pad_token_id, regression=regression, multiple_of=w.pad_multiple)
            for b in sorted_batches(data.lengths, batch_size)
        )
        result = evaluate(w.model, batches, self.spec.model, w.device, w.autocast)
        w.state.eval_seconds += time.perf_counter() - started
        w.state.last_eval, w.state.last_eval_step = result, w.state.step
        w.log.info("evaluation at step %d: %s", w.state.step, _format(result))
        return result

    def _rank_report(self, evaluated: Evaluation, **flags: Any) -> RankReport:
        w, state, interval = self.w, self.w.state, self.interval
        seconds = max(interval.train_seconds, 1e-9)
        return RankReport(
            rank=w.rank,
            world_size=w.world_size,
            step=state.step,
            total_steps=w.total_steps,
            epoch=state.epoch + state.batches_done / w.micro_batches,
            learning_rate=float(w.scheduler.get_last_lr()[0]),
            samples=state.samples,
            tokens=state.tokens,
            train_seconds=state.train_seconds,
            eval_seconds=state.eval_seconds,
            data_wait_seconds=state.data_wait_seconds,
            interval_samples=interval.samples,
            train_loss=interval.mean_loss(),
            samples_per_second=interval.samples / seconds,
            tokens_per_second=interval.tokens / seconds,
            data_wait_fraction=min(1.0, interval.data_wait / seconds),
            **dataclasses.asdict(self.sampler.sample()),
            evaluation=evaluated,
            resumed_from_step=w.resumed_from,
            **flags,
        )

    def _report(self, evaluated: Evaluation, *, save: bool, **flags: Any) -> None:
        """Report this rank's `RankReport` (all ranks call this together); rank 0 attaches the checkpoint."""
        w = self.w
        report = self._rank_report(evaluated, **flags)
        w.log.info("step %d/%d epoch %.2f: %s", report.step, w.total_steps, report.epoch, _format(report.to_metrics()))
        with tempfile.TemporaryDirectory() as directory:
            found = None
            if save and w.rank == 0:
                checkpoint.save(
                    Path(directory),
                    state=w.state,
                    model=w.model,
                    optimizer=w.optimizer,
                    scheduler=w.scheduler,
                    scaler=w.scaler,
                    run_id=w.settings.run_id,
                    world_size=w.world_size,
                )
                found = ray.train.Checkpoint.from_directory(directory)
            ray.train.report(report.to_metrics(), checkpoint=found)
        self.interval.reset()

    def _finish(self) -> None:
        """Evaluate the final model if that has not happened yet, export it, and send the final report."""
        w = self.w
        evaluated: Evaluation = {}
        if w.eval_data is not None and w.state.last_eval_step != w.state.step:
            evaluated = self._evaluate()
        output = w.settings.model_output
        if w.rank == 0:
            checkpoint.export_model(w.model, w.tokenizer, output)
            w.log.info("model saved to %s", output)
        self._report(evaluated or w.state.last_eval, save=False, final=True, model_path=output)


def _format(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def train_worker(config: dict[str, Any]) -> None:
    """Ray Train's `train_loop_per_worker`: `config["settings"]` is the run's RunSettings."""
    worker = build_worker(config["settings"])
    try:
        TrainLoop(worker).run()
    except Exception:
        worker.log.exception("training failed on rank %d", worker.rank)
        raise
