"""The per-rank training function that Ray Train runs under DDP: a step loop over a built `Worker`.

`rank_setup.build_worker` sets everything up (model, batch plan, tokenised records, optimiser,
checkpoint restore); `TrainLoop` then trains with gradient accumulation and (on GPUs) autocast.

No step waits for the device or for the other ranks beyond DDP's own gradient all-reduce: the
loss is summed on the device, batches are padded and pinned ahead on a thread (`prefetch`), and
the ranks agree on the step of the next report at the previous report, which is a sync point
anyway (one small all-reduce there, none per step). Every rank runs the same steps, so all reach
each `ray.train.report` together: reports fall on the agreed steps, evaluations and checkpoints
on fixed ones. At a report the device is synchronised first, so the interval's time includes all
the GPU work of its steps. Each report is a `RankReport`; checkpoints upload asynchronously.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

import ray.train
import torch
from ray.train import CheckpointUploadMode

from rocmtrain.plan.setup import EVAL_BATCH_FACTOR
from rocmtrain_train.checkpoint import staging, train_state
from rocmtrain_train.checkpoint.model_export import merged_location
from rocmtrain_train.collectives import MIN, SUM, over_ranks
from rocmtrain_train.data.prefetch import Prefetcher
from rocmtrain_train.loop.rank_setup import Worker, build_worker
from rocmtrain_train.loop.rank_shard import file_truncations, local_fits
from rocmtrain_train.loop.resource_sampling import ResourceSampler, utilization_sampler
from rocmtrain_train.reporting.rank_report import Evaluation, RankReport
from rocmtrain_train.tasks import MicroBatch


def synchronize(device: torch.device) -> None:
    """Wait until the device has finished the work queued so far."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steps_until_report(steps: int, seconds: float, interval_s: float) -> int:
    """Steps that take about `interval_s` at the pace of the last interval (`steps` in `seconds`), at least one."""
    return max(1, int(interval_s * steps / seconds)) if seconds > 0 else 1


class Interval:
    """Training counters since the last report; the loss stays on the device until the report reads it."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self.reset()

    def reset(self) -> None:
        self.loss_sum = torch.zeros((), device=self._device)
        self.loss_items = 0  # what the loss is averaged over: records, or tokens that carry loss
        self.steps = 0
        self.samples = 0
        self.tokens = 0
        self.data_wait = 0.0
        self.started = time.perf_counter()
        self.train_seconds = 0.0

    def close(self) -> float:
        """End the interval's training time (after synchronising the device); return it."""
        self.train_seconds = time.perf_counter() - self.started
        return self.train_seconds

    def mean_loss(self) -> float | None:
        return float(self.loss_sum.item()) / self.loss_items if self.loss_items else None


class TrainLoop:
    """Runs a rank's optimiser steps, evaluations, checkpoints and reports."""

    def __init__(self, worker: Worker) -> None:
        self.w = worker
        self.spec = worker.settings.job.spec
        self.sampler = ResourceSampler(worker.device, utilization_sampler(worker.device))
        self.interval = Interval(worker.device)
        self.next_report = worker.state.step + 1  # the first report comes after one step
        self.samples: list[dict[str, str]] = []  # the last evaluation's generated samples (language models)
        fits = local_fits(worker.train, worker.eval_data)  # the same on every rank: a collective or none
        self.truncation = (
            [] if fits is None else file_truncations(self.spec, over_ranks(fits, SUM, worker.device).tolist())
        )

    def run(self) -> None:
        """Train every remaining epoch from where the worker's state stands, then finish."""
        try:
            self._train()
            self._finish()
        finally:
            self.sampler.close()

    def _micro_batches(self, epoch: int) -> list[tuple[int, list[MicroBatch], int]]:
        """The rest of an epoch: each step's index, this rank's micro-batches (of rows of its records) and how many
        of them count. Where the ranks go in lockstep, the last is repeated, not counted, until this rank runs as
        many forward passes in the step as every other."""
        w, training = self.w, self.spec.training
        plan, position = w.train.plan, w.train.position
        out = []
        for step in plan.epoch_order(training.seed, epoch)[w.state.epoch_step :]:
            rows = [position[record] for record in plan.portion(step, w.rank)]
            group = w.task.micro_batches(rows, w.train.encoded, training.batch_size_per_worker)
            passes = len(group) if w.step_passes is None else int(w.step_passes[step])
            out.append((step, group + [group[-1]] * (passes - len(group)), len(group)))
        return out

    def _train(self) -> None:
        w, training, every = self.w, self.spec.training, self.spec.checkpoint.every_steps
        state, plan = w.state, w.train.plan
        for epoch in range(state.epoch, training.epochs):
            steps = self._micro_batches(epoch)
            batches = Prefetcher(self._collate, (micro for _, group, _ in steps for micro in group))
            try:
                feed = iter(batches)
                for step, group, counted in steps:
                    self._step(group, feed, int(w.step_items[step]), counted)
                    state.step += 1
                    state.epoch_step += 1
                    state.epoch_samples += len(plan.steps[step])
                    epoch_end = state.epoch_step == len(plan.steps)
                    if epoch_end:
                        state.epoch, state.epoch_step, state.epoch_samples = epoch + 1, 0, 0
                        w.log.info("epoch %d finished at step %d", epoch + 1, state.step)
                    evaluate = self._evaluation_due(epoch_end)
                    save = epoch_end or bool(every and state.step % every == 0)
                    if save or evaluate or state.step >= self.next_report:
                        self._report(evaluate=evaluate, save=save, epoch_end=epoch_end)
            finally:
                batches.close()

    def _evaluation_due(self, epoch_end: bool) -> bool:
        """Whether to evaluate now; the same on every rank (a rank without eval records joins the all-reduce)."""
        every = self.spec.training.eval_every_steps
        if self.spec.data.eval is None:
            return False
        return bool(every and self.w.state.step % every == 0) if every else epoch_end

    def _collate(self, micro: MicroBatch) -> dict[str, torch.Tensor]:
        w = self.w
        pad = w.tokenizer.pad_token_id
        return w.task.collate(w.train.encoded, micro, pad, multiple_of=w.pad_multiple, pin=w.pin_memory)

    def _step(
        self, group: list[MicroBatch], feed: Iterator[dict[str, torch.Tensor]], step_items: int, counted: int
    ) -> None:
        """One optimiser step over this rank's micro-batches, of which the first `counted` count; gradients sync
        on the last one only.

        Each micro-batch's mean loss is weighted by its share of what the whole step's loss is averaged
        over (`step_items`: the records, or the tokens that carry loss, of every rank), times the world
        size that DDP's gradient average divides by: the gradient is that of the mean over the whole
        global batch, however the records are split among ranks and micro-batches.
        """
        w, state, interval = self.w, self.w.state, self.interval
        lengths, weights = w.train.encoded.lengths, w.train.items
        for i, micro in enumerate(group):
            rows = _records(micro) if i < counted else []
            waited = time.perf_counter()
            batch = {k: v.to(w.device, non_blocking=True) for k, v in next(feed).items()}
            waited = time.perf_counter() - waited
            interval.data_wait += waited
            state.data_wait_seconds += waited
            last = i == len(group) - 1
            items = int(weights[rows].sum())
            with w.strategy.gradient_sync(w.module, last):
                with w.autocast():
                    loss = w.module(**batch).loss
                w.scaler.scale(loss * loss_weight(items, step_items, w.world_size)).backward()
            interval.loss_sum += loss.detach().float() * items
            interval.loss_items += items
            tokens = int(lengths[rows].sum())
            interval.samples += len(rows)
            interval.tokens += tokens
            state.samples += len(rows)
            state.tokens += tokens
            state.padded_tokens += batch["input_ids"].numel()
        max_norm = self.spec.training.max_grad_norm
        if max_norm > 0:
            w.scaler.unscale_(w.optimizer)
            torch.nn.utils.clip_grad_norm_(w.model.parameters(), max_norm)
        w.scaler.step(w.optimizer)
        w.scaler.update()
        w.scheduler.step()
        w.optimizer.zero_grad(set_to_none=True)
        interval.steps += 1

    def _evaluate(self) -> Evaluation:
        """Evaluate on the eval shards (all ranks together); record the result (and samples) in the state."""
        w = self.w
        started = time.perf_counter()
        result, samples = w.task.evaluate(
            w.model,
            w.tokenizer,
            w.eval_data,
            batch_size=EVAL_BATCH_FACTOR * self.spec.training.batch_size_per_worker,
            multiple_of=w.pad_multiple,
            device=w.device,
            autocast=w.autocast,
            lockstep=w.strategy.lockstep,
        )
        w.state.eval_seconds += time.perf_counter() - started
        w.state.last_eval, w.state.last_eval_step = result, w.state.step
        if samples:
            self.samples = samples
        w.log.info("evaluation at step %d: %s", w.state.step, _format(result))
        for sample in samples:
            w.log.info("generated for %r: %r (reference %r)", sample["prompt"], sample["output"], sample["reference"])
        return result

    def _rank_report(self, evaluated: Evaluation, **flags: Any) -> RankReport:
        w, state, interval = self.w, self.w.state, self.interval
        seconds = max(interval.train_seconds, 1e-9)
        return RankReport(
            rank=w.rank,
            world_size=w.world_size,
            step=state.step,
            total_steps=w.total_steps,
            epoch=state.epoch + state.epoch_step / len(w.train.plan.steps),
            learning_rate=float(w.scheduler.get_last_lr()[0]),
            samples=state.samples,
            tokens=state.tokens,
            padded_tokens=state.padded_tokens,
            train_seconds=state.train_seconds,
            eval_seconds=state.eval_seconds,
            data_wait_seconds=state.data_wait_seconds,
            interval_samples=interval.samples,
            interval_loss_items=interval.loss_items,
            train_loss=interval.mean_loss(),
            samples_per_second=interval.samples / seconds,
            tokens_per_second=interval.tokens / seconds,
            data_wait_fraction=min(1.0, interval.data_wait / seconds),
            **dataclasses.asdict(self.sampler.sample()),
            evaluation=evaluated,
            generation_samples=self.samples if evaluated else [],
            trainable_parameters=w.parameters[0],
            total_parameters=w.parameters[1],
            resumed_from_step=w.resumed_from,
            network=w.network.dump() if w.network else None,
            truncation=self.truncation,
            **flags,
        )

    def _checkpoint(self) -> ray.train.Checkpoint:
        """This rank's part of a checkpoint, in a folder Ray Train deletes once it has uploaded it (`staging`
        removes one whose upload never completed)."""
        w = self.w
        totals: dict[str, Any] = dict(
            zip(
                w.state.TOTALS,
                over_ranks([getattr(w.state, n) for n in w.state.TOTALS], SUM, w.device).tolist(),
                strict=True,
            )
        )
        directory = staging.new_folder(w.settings.run_id)
        train_state.save(
            directory,
            rank=w.rank,
            device=w.device,
            totals=dataclasses.replace(w.state, **totals),
            scaler=w.scaler,
            run_id=w.settings.run_id,
            world_size=w.world_size,
            plan=w.train.plan.digest,
        )
        w.strategy.save(directory, rank=w.rank, model=w.model, optimizer=w.optimizer)
        return ray.train.Checkpoint.from_directory(directory)

    def _report(
        self,
        *,
        evaluate: bool = False,
        save: bool = False,
        carried: Evaluation | None = None,
        final: bool = False,
        **flags: Any,
    ) -> None:
        """End the interval, evaluate if due, agree on the next report, and report (all ranks together).

        Without a new evaluation the report carries `carried` (the final report: the last evaluation). The
        final report comes once the model is exported.
        """
        w, state, interval = self.w, self.w.state, self.interval
        synchronize(w.device)
        state.train_seconds += interval.close()
        evaluated = self._evaluate() if evaluate else {}
        if final:
            flags.update(self._export())
        proposal = steps_until_report(interval.steps, interval.train_seconds, w.settings.report_interval_s)
        self.next_report = int(over_ranks([state.step + proposal], MIN, w.device)[0])  # the report's one collective
        report = self._rank_report(evaluated or carried or {}, final=final, **flags)
        w.log.info("step %d/%d epoch %.2f: %s", report.step, w.total_steps, report.epoch, _format(report.to_metrics()))
        found = self._checkpoint() if save else None
        ray.train.report(report.to_metrics(), checkpoint=found, checkpoint_upload_mode=CheckpointUploadMode.ASYNC)
        interval.reset()

    def _export(self) -> dict[str, Any]:
        """Rank 0 exports the trained model (every rank tells where it went, and its weights' checksum, taken
        before an adapter is merged into them)."""
        w = self.w
        output = w.settings.model_output
        checksum = w.strategy.checksum(w.model)
        merge = bool(self.spec.adapter and self.spec.adapter.merge)
        merged = merged_location(output) if merge else None
        w.strategy.export(w.model, w.tokenizer, output, rank=w.rank, merge=merge)
        if w.rank == 0:
            w.log.info("model saved to %s%s", output, f" (merged: {merged})" if merged else "")
        return {"model_path": output, "merged_model_path": merged, "weights_checksum": checksum}

    def _finish(self) -> None:
        """Evaluate the final model if that has not happened yet, export it, and send the final report."""
        w = self.w
        evaluate = self.spec.data.eval is not None and w.state.last_eval_step != w.state.step
        self._report(evaluate=evaluate, carried=w.state.last_eval, final=True)


def loss_weight(items: int, step_items: int, world_size: int) -> float:
    """The weight of a micro-batch's mean loss (over its `items`) in the step's gradient: its share of the
    `step_items` of every rank, times the world size that DDP's gradient average divides by."""
    return items * world_size / max(step_items, 1)


def _records(micro: MicroBatch) -> list[int]:
    """The records of a micro-batch (of its packed rows, one after the other)."""
    found: list[int] = []
    for item in micro:
        found.extend(item if isinstance(item, Sequence) else [item])
    return found


def _format(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def train_rank(config: dict[str, Any]) -> None:
    """Build this rank and run its step loop (on the rank, under Ray Train); `config["settings"]` is the run's
    RunSettings."""
    staging.remove_orphans()  # the checkpoint folders of ranks that ended before their uploads did
    worker = build_worker(config["settings"])
    try:
        TrainLoop(worker).run()
    except Exception:
        worker.log.exception("training failed on rank %d", worker.rank)
        raise
