"""Driver-side reporting: the ranks' `RankReport`s become one ProgressReport, which goes to every sink.

Each `ray.train.report` call gives the driver one RankReport per rank (see `relay`).
Sums over ranks: throughput and CPU use. Maxima: the seconds spent (ranks run in lockstep).
Evaluation metrics are identical on every rank (all-reduced) and taken from rank 0, as is the network
RCCL chose (`rccl_log`), which the Reporter logs once.
The driver's own number, the memory plan's bytes per GPU, joins every report on its way to the
sinks (`with_planned_memory`). A loss that is not a number (NaN, infinite) cannot go into the status:
it is left out there (its previous value would mislead), written in the main log, and kept in the summary.
What `maxSeqLength` did to each data file's records goes to the main log once, the summary per file, and
the status in all.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from rocmtrain.api.models import EVAL_METRICS, Metrics, NetworkTransport, Progress, ProgressReport
from rocmtrain.plan.fit import JobPlan
from rocmtrain_train.reporting.rank_report import Evaluation, RankReport
from rocmtrain_train.reporting.rccl_log import TransportLog


class Sink(Protocol):
    """A consumer of the driver's aggregated progress reports."""

    def emit(self, report: ProgressReport) -> None: ...

    def close(self) -> None: ...


class PlannedMemory:
    """A sink that passes every report on with the memory plan's bytes per GPU (`gpuMemoryPlannedBytes`), beside
    the peak the ranks measure."""

    def __init__(self, sink: Sink, planned: Metrics) -> None:
        self._sink = sink
        self._planned = planned.dump()

    def emit(self, report: ProgressReport) -> None:
        metrics = Metrics.model_validate({**report.metrics.dump(), **self._planned})
        self._sink.emit(report.model_copy(update={"metrics": metrics}))

    def close(self) -> None:
        self._sink.close()


def with_planned_memory(sinks: list[Sink], plan: JobPlan | None) -> list[Sink]:
    """`sinks`, each passing the plan's bytes per GPU on with every report; unchanged without a plan (or with one
    beyond what the status takes)."""
    if plan is None:
        return sinks
    try:
        planned = Metrics(gpu_memory_planned_bytes=plan.plan.total)
    except ValueError:
        return sinks
    return [PlannedMemory(sink, planned) for sink in sinks]


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _values(values: Iterable[float | None]) -> list[float]:
    """The finite ones of `values`."""
    return [v for value in values if (v := _finite(value)) is not None]


def evaluation(ranks: list[RankReport]) -> Evaluation:
    """The evaluation metrics in a report, if it carries any (in `EVAL_METRICS` order), finite or not."""
    found = ranks[0].evaluation
    return {k: float(v) for k in EVAL_METRICS if (v := found.get(k)) is not None}


def truncation(ranks: list[RankReport]) -> dict[str, Any]:
    """The records of all data files that maxSeqLength cut and dropped (language models; none else)."""
    files = ranks[0].truncation
    if not files:
        return {}
    return {"records_cut": sum(f.cut for f in files), "records_dropped": sum(f.dropped for f in files)}


def network(ranks: list[RankReport]) -> NetworkTransport | None:
    """The network RCCL chose, as rank 0 read it from its log; None where it could not tell."""
    found = ranks[0].network
    return NetworkTransport.model_validate(found) if found is not None else None


def padding_efficiency(ranks: list[RankReport]) -> float | None:
    """Real tokens over the tokens the model computed on (padding included), over the whole run."""
    padded = sum(r.padded_tokens for r in ranks)
    return sum(r.tokens for r in ranks) / padded if padded else None


def ranks_in_step(ranks: list[RankReport]) -> bool:
    """Whether every rank ends with the same weights (what DDP guarantees while it works)."""
    return len({r.weights_checksum for r in ranks}) == 1


def whole_run(ranks: list[RankReport]) -> dict[str, float]:
    """Throughput of the whole run so far, from the running totals of every rank."""
    seconds = _values(r.train_seconds for r in ranks)
    train_seconds, rank_seconds = max(seconds, default=0.0), sum(seconds)
    return {
        "samples_per_second": sum(r.samples for r in ranks) / train_seconds if train_seconds else 0.0,
        "tokens_per_second": sum(r.tokens for r in ranks) / train_seconds if train_seconds else 0.0,
        "data_wait_fraction": sum(_values(r.data_wait_seconds for r in ranks)) / rank_seconds if rank_seconds else 0.0,
    }


class Aggregator:
    """Turns per-rank metrics into ProgressReports.

    A report carries the latest value of every metric: values a report lacks (no evaluation, no
    training since the last report) keep their previous value. The final report's throughput is
    that of the whole run. It also counts the worker failures the run recovered from.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._latest: dict[str, Any] = {}
        self._pace: tuple[float, int] | None = None  # (time, step) of the first report since (re)start
        self.worker_failures = 0
        self.not_finite: dict[str, float] = {}  # the last report's metrics that are not numbers: left out

    def restart(self) -> None:
        """A worker failed: the workers restart from a checkpoint (forget the pace)."""
        self._pace = None
        self.worker_failures += 1

    def _eta(self, step: int, total: int) -> float | None:
        now = self._clock()
        if self._pace is None or step < self._pace[1]:
            self._pace = (now, step)
        started, start_step = self._pace
        return (total - step) * (now - started) / (step - start_step) if step > start_step else None

    @staticmethod
    def _interval(ranks: list[RankReport]) -> dict[str, Any]:
        """The job's metrics from the ranks' last interval, keyed by `Metrics` field (None: not known)."""
        samples = sum(r.interval_samples for r in ranks)
        losses = [(r.train_loss, r.interval_loss_items) for r in ranks if r.train_loss is not None]
        weight = sum(n for _, n in losses)
        memory = _values(r.gpu_memory_peak_bytes for r in ranks)
        reserved = _values(r.gpu_memory_reserved_bytes for r in ranks)
        utilization = _values(r.gpu_utilization_percent for r in ranks)
        waits = _values(r.data_wait_fraction for r in ranks)
        cpu = _values(r.cpu_utilization_percent for r in ranks)
        trained = {
            "train_loss": sum(loss * n for loss, n in losses) / weight if weight else None,
            "samples_per_second": sum(_values(r.samples_per_second for r in ranks)),
            "tokens_per_second": sum(_values(r.tokens_per_second for r in ranks)),
            "data_wait_fraction": sum(waits) / len(waits) if waits else None,
        }
        return {
            **(trained if samples else {}),
            "learning_rate": _finite(ranks[0].learning_rate),
            "trainable_parameters": ranks[0].trainable_parameters,
            "total_parameters": ranks[0].total_parameters,
            "train_seconds": max(_values(r.train_seconds for r in ranks), default=None),
            "eval_seconds": max(_values(r.eval_seconds for r in ranks), default=None),
            "cpu_utilization_percent": sum(cpu) if cpu else None,
            "gpu_memory_peak_bytes": int(max(memory)) if memory else None,
            "gpu_memory_peak_bytes_min": int(min(memory)) if memory else None,
            "gpu_memory_reserved_bytes": int(max(reserved)) if reserved else None,
            "gpu_utilization_percent": sum(utilization) / len(utilization) if utilization else None,
            "gpu_utilization_percent_min": min(utilization, default=None),
            "gpu_utilization_percent_max": max(utilization, default=None),
            **evaluation(ranks),
            **truncation(ranks),
        }

    def add(self, ranks: list[RankReport]) -> ProgressReport:
        """The ProgressReport of one report of every rank."""
        first = ranks[0]
        step, total, final = first.step, first.total_steps, first.final
        found = self._interval(ranks)
        self.not_finite = {k: v for k, v in found.items() if isinstance(v, float) and not math.isfinite(v)}
        for name in self.not_finite:
            self._latest.pop(name, None)
        self._latest.update({k: v for k, v in found.items() if v is not None and k not in self.not_finite})
        if final:
            self._latest.update(whole_run(ranks))
        progress = Progress(
            epoch=_finite(first.epoch),
            step=step,
            total_steps=total,
            percent=100.0 * step / total if total else None,
            eta_seconds=0.0 if final else self._eta(step, total),
        )
        return ProgressReport(
            progress=progress,
            metrics=Metrics(**self._latest),
            final=final,
            worker_failures=self.worker_failures or None,  # left out of the report until a failure
            resumed_from_step=first.resumed_from_step,
            network=network(ranks),
        )


def summary(ranks: list[RankReport], wall_seconds: float) -> dict[str, Any]:
    """The final metrics of a run (`rocmtrain run --summary`): whole-run throughput over all workers, and per data
    file what maxSeqLength did to its records. A loss that is not a number stays one (JSON's NaN)."""
    first = ranks[0]
    files = {f.data: {k: v for k, v in dataclasses.asdict(f).items() if k != "data"} for f in first.truncation}
    return {
        **evaluation(ranks),
        "train_seconds": max(_values(r.train_seconds for r in ranks), default=0.0),
        "eval_seconds": max(_values(r.eval_seconds for r in ranks), default=0.0),
        **whole_run(ranks),
        "padding_efficiency": padding_efficiency(ranks),
        "world_size": first.world_size,
        "steps": first.step,
        "epochs": _finite(first.epoch),
        "resumed_from_step": first.resumed_from_step,
        "wall_seconds": wall_seconds,
        "model_path": first.model_path,
        "trainable_parameters": first.trainable_parameters,
        "total_parameters": first.total_parameters,
        **({"merged_model_path": first.merged_model_path} if first.merged_model_path else {}),
        **({"generation_samples": first.generation_samples} if first.generation_samples else {}),
        **({"truncation": files} if files else {}),
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
        self._truncation_logged = False
        self._network = TransportLog(log)
        self.final_ranks: list[RankReport] | None = None

    def _log_truncation(self, first: RankReport) -> None:
        """Once a run: a line per data file of which maxSeqLength cut or dropped records."""
        if self._truncation_logged or not first.truncation:
            return
        self._truncation_logged = True
        for file in first.truncation:
            if (line := file.line()) is not None:
                self._log.log(logging.WARNING if file.dropped else logging.INFO, line)

    def on_report(self, ranks: list[RankReport], checkpoint_path: str | None) -> None:
        """Log what the report tells, aggregate it and hand it to every sink."""
        first = ranks[0]
        step = first.step
        if first.final:
            self.final_ranks = ranks
        if not self._attempt_started:
            self._attempt_started = True
            if first.resumed_from_step is not None:
                self._log.info("resumed from the checkpoint at step %s", first.resumed_from_step)
        self._log_truncation(first)
        if first.epoch_end:
            self._log.info("epoch %.0f finished at step %s", first.epoch, step)
        if (found := evaluation(ranks)) and not first.final:
            self._log.info("evaluation at step %s: %s", step, _fmt(found))
        if checkpoint_path:
            self._log.info("checkpoint at step %s: %s", step, checkpoint_path)
        try:
            report = self._aggregator.add(ranks)
        except ValueError as exc:  # a value outside the API's bounds: log it, keep training
            self._log.warning("progress report at step %s not sent: %s", step, exc)
            return
        if self._aggregator.not_finite:
            self._log.warning(
                "step %s: %s: not a number, left out of the status", step, _fmt(self._aggregator.not_finite)
            )
        self._network.seen(report.network)
        for sink in self._sinks:
            try:
                sink.emit(report)
            except Exception as exc:  # a failing sink must not stop training
                self._log.warning("progress sink %s failed: %s", type(sink).__name__, exc)
        if report.final:
            self._log.info("completed at step %s: %s; model at %s", step, _fmt(found), first.model_path)
            if not ranks_in_step(ranks):
                self._log.error(
                    "the ranks ended with different weights (checksums %s): gradients were not synchronised",
                    sorted({r.weights_checksum for r in ranks}, key=str),
                )

    @property
    def failures(self) -> int:
        """Worker failures so far (each restarted the workers from the last checkpoint)."""
        return self._aggregator.worker_failures

    def on_failure(self, errors: dict[int, str]) -> None:
        for rank, error in sorted(errors.items()):
            self._log.error("worker failure on rank %d: %s", rank, error)
        self._aggregator.restart()
        self._attempt_started = False

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()
