"""Driver-side reporting: per-rank metrics become one ProgressReport, which goes to every sink.

Each `ray.train.report` call gives the driver a list of metric dicts, one per rank (see `relay`).
Sums over ranks: throughput and CPU use. Maxima: the seconds spent (ranks run in lockstep).
Evaluation metrics are identical on every rank (all-reduced) and taken from rank 0.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from rocmtrain.api.models import Metrics, Progress, ProgressReport
from rocmtrain_train.sinks import Sink

EVAL_KEYS = ("eval_loss", "eval_accuracy", "eval_f1", "eval_mse", "eval_mae")

RankMetrics = dict[str, Any]


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _values(ranks: list[RankMetrics], key: str) -> list[float]:
    return [v for r in ranks if (v := _finite(r.get(key))) is not None]


def evaluation(ranks: list[RankMetrics]) -> dict[str, float]:
    """The evaluation metrics in a report, if it carries any."""
    return {k: v for k in EVAL_KEYS if (v := _finite(ranks[0].get(k))) is not None}


def whole_run(ranks: list[RankMetrics]) -> dict[str, float]:
    """Throughput of the whole run so far, from the running totals of every rank."""
    train_seconds = max(_values(ranks, "train_seconds"), default=0.0)
    rank_seconds = sum(_values(ranks, "train_seconds"))
    return {
        "samples_per_second": sum(_values(ranks, "samples")) / train_seconds if train_seconds else 0.0,
        "tokens_per_second": sum(_values(ranks, "tokens")) / train_seconds if train_seconds else 0.0,
        "data_wait_fraction": sum(_values(ranks, "data_wait_seconds")) / rank_seconds if rank_seconds else 0.0,
    }


class Aggregator:
    """Turns per-rank metrics into ProgressReports.

    A report carries the latest value of every metric: values a report lacks (no evaluation, no
    training since the last report) keep their previous value. The final report's throughput is
    that of the whole run.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._latest: dict[str, Any] = {}
        self._pace: tuple[float, int] | None = None  # (time, step) of the first report since (re)start

    def restart(self) -> None:
        """Forget the pace: the workers restart from a checkpoint."""
        self._pace = None

    def _eta(self, step: int, total: int) -> float | None:
        now = self._clock()
        if self._pace is None or step < self._pace[1]:
            self._pace = (now, step)
        started, start_step = self._pace
        return (total - step) * (now - started) / (step - start_step) if step > start_step else None

    @staticmethod
    def _interval(ranks: list[RankMetrics]) -> dict[str, Any]:
        samples = sum(int(r.get("interval_samples") or 0) for r in ranks)
        losses = [(loss, int(r["interval_samples"])) for r in ranks if (loss := _finite(r.get("loss"))) is not None]
        weight = sum(n for _, n in losses)
        memory = _values(ranks, "gpu_memory_peak_bytes")
        utilization = _values(ranks, "gpu_utilization_percent")
        waits = _values(ranks, "data_wait_fraction")
        cpu = _values(ranks, "cpu_percent")
        trained = {
            "train_loss": sum(loss * n for loss, n in losses) / weight if weight else None,
            "samples_per_second": sum(_values(ranks, "samples_per_second")),
            "tokens_per_second": sum(_values(ranks, "tokens_per_second")),
            "data_wait_fraction": sum(waits) / len(waits) if waits else None,
        }
        return {
            **(trained if samples else {}),
            "learning_rate": _finite(ranks[0].get("learning_rate")),
            "train_seconds": max(_values(ranks, "train_seconds"), default=None),
            "eval_seconds": max(_values(ranks, "eval_seconds"), default=None),
            "cpu_utilization_percent": sum(cpu) if cpu else None,
            "gpu_memory_peak_bytes": int(max(memory)) if memory else None,
            "gpu_memory_peak_bytes_min": int(min(memory)) if memory else None,
            "gpu_utilization_percent": sum(utilization) / len(utilization) if utilization else None,
            "gpu_utilization_percent_min": min(utilization, default=None),
            "gpu_utilization_percent_max": max(utilization, default=None),
            **evaluation(ranks),
        }

    def add(self, ranks: list[RankMetrics]) -> ProgressReport:
        first = ranks[0]
        step, total, final = int(first["step"]), int(first["total_steps"]), bool(first.get("final"))
        self._latest.update({k: v for k, v in self._interval(ranks).items() if v is not None})
        if final:
            self._latest.update(whole_run(ranks))
        progress = Progress(
            epoch=_finite(first.get("epoch")),
            step=step,
            total_steps=total,
            percent=100.0 * step / total if total else None,
            eta_seconds=0.0 if final else self._eta(step, total),
        )
        return ProgressReport(progress=progress, metrics=Metrics(**self._latest), final=final)


def summary(ranks: list[RankMetrics], wall_seconds: float) -> dict[str, Any]:
    """The final metrics of a run (`rocmtrain run --summary`): whole-run throughput over all workers."""
    first = ranks[0]
    return {
        **evaluation(ranks),
        "train_seconds": max(_values(ranks, "train_seconds"), default=0.0),
        "eval_seconds": max(_values(ranks, "eval_seconds"), default=0.0),
        **whole_run(ranks),
        "world_size": int(first["world_size"]),
        "steps": int(first["step"]),
        "epochs": _finite(first.get("epoch")),
        "resumed_from_step": first.get("resumed_from_step"),
        "wall_seconds": wall_seconds,
        "model_path": first.get("model_path"),
    }


def _fmt(values: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4f}" for k, v in values.items())


class Reporter:
    """Receives what the workers report, logs the key events to main.log and feeds the sinks."""

    def __init__(self, sinks: list[Sink], log: logging.Logger) -> None:
        self._sinks = sinks
        self._log = log
        self._aggregator = Aggregator()
        self._attempt_started = False
        self.final_ranks: list[RankMetrics] | None = None
        self.failures = 0

    def on_report(self, ranks: list[RankMetrics], checkpoint_path: str | None) -> None:
        first = ranks[0]
        step = first["step"]
        if first.get("final"):
            self.final_ranks = ranks
        if not self._attempt_started:
            self._attempt_started = True
            if first.get("resumed_from_step") is not None:
                self._log.info("resumed from the checkpoint at step %s", first["resumed_from_step"])
        if first.get("epoch_end"):
            self._log.info("epoch %.0f finished at step %s", first["epoch"], step)
        if (found := evaluation(ranks)) and not first.get("final"):
            self._log.info("evaluation at step %s: %s", step, _fmt(found))
        if checkpoint_path:
            self._log.info("checkpoint at step %s: %s", step, checkpoint_path)
        try:
            report = self._aggregator.add(ranks)
        except ValueError as exc:  # a value outside the API's bounds: log it, keep training
            self._log.warning("progress report at step %s not sent: %s", step, exc)
            return
        for sink in self._sinks:
            try:
                sink.emit(report)
            except Exception as exc:  # a failing sink must not stop training
                self._log.warning("progress sink %s failed: %s", type(sink).__name__, exc)
        if report.final:
            self._log.info("completed at step %s: %s; model at %s", step, _fmt(found), first.get("model_path"))

    def on_failure(self, errors: dict[int, str]) -> None:
        self.failures += 1
        for rank, error in sorted(errors.items()):
            self._log.error("worker failure on rank %d: %s", rank, error)
        self._aggregator.restart()
        self._attempt_started = False

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()
