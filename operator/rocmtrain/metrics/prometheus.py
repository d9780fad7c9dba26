"""Prometheus metrics of the operator (`rocmtrain.metrics.server` serves them).

- `rocmtrain_jobs{phase}`: jobs by phase (every phase listed, zeros included);
- `rocmtrain_gpus_requested{phase}`: AMD GPUs asked for by jobs that have not ended;
- `rocmtrain_reconcile_errors_total{handler}`: handler runs that raised;
- `rocmtrain_reconcile_duration_seconds{handler}`: handler run time;
- `rocmtrain_queue_wait_seconds`: how long jobs waited (Pending or Queued) before they started;
- `rocmtrain_progress_reports_total`, `rocmtrain_progress_refusals_total{code}`: the progress endpoint's answers;
- per job, labelled `namespace` and `job_name` (`rocmtrain.status.gauges`): `rocmtrain_job_phase{phase}`,
  progress, ETA, loss, accuracy, throughput, GPU utilisation and memory, GPUs requested and held,
  GPU-seconds, `rocmtrain_job_cost{currency}`, `rocmtrain_job_gpu_kind{kind}`, waiting time and stalls, for at most
  `JOBS.max_jobs` jobs (`ROCMTRAIN_METRICS_MAX_JOBS`); `rocmtrain_job_series_dropped` counts the rest.
- `rocmtrain_reconciles_in_flight`: reconciles holding one of the reconciler's slots;
- `rocmtrain_jobs_remembered`: jobs the reconciler keeps state for (deleted ones are forgotten);
- `rocmtrain_progress_token_reviews_total`: TokenReviews the progress endpoint sent;
- `rocmtrain_progress_tokens_unreviewed_total{why}`: tokens it answered without one: from its cache (`cache`),
  refused by their shape (`shape`) or over the review budget (`budget`);
- `rocmtrain_watch_restarts_total{watch}`: watches (RayJobs, Ray pods, Kueue Workloads) started again
  after an unexpected error;
- `rocmtrain_event_loop_lag_seconds`: how late the event loop woke a timer, sampled every 100 ms
  (`ROCMTRAIN_LOOP_LAG_PROBE_MS`; `rocmtrain.controller.runtime.probe_loop_lag`): how long other work
  held the loop.

Job gauges are computed at scrape time from the operator's job index (the
operator passes a view of it), so they cannot drift and vanish with their job.
`exposition` collects them in a thread, from a snapshot of the index taken on the
event loop: a scrape of 500 jobs' series is tens of milliseconds of CPU.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from rocmtrain.api.models import Phase
from rocmtrain.status import gauges
from rocmtrain.status.phase import phase_of

UNKNOWN_PHASE = "Unknown"  # the label of jobs without a phase (yet), or with one this operator does not know

REGISTRY = CollectorRegistry()
RECONCILE_ERRORS = Counter(
    "rocmtrain_reconcile_errors_total", "Handler runs that raised an error.", ["handler"], registry=REGISTRY
)
RECONCILE_SECONDS = Histogram(
    "rocmtrain_reconcile_duration_seconds",
    "Time one handler run took.",
    ["handler"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)

QUEUE_WAIT_SECONDS = Histogram(
    "rocmtrain_queue_wait_seconds",
    "Seconds a job waited (Pending or Queued) before its Ray cluster started.",
    buckets=(10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600),
    registry=REGISTRY,
)
PROGRESS_REPORTS = Counter(
    "rocmtrain_progress_reports_total", "Progress reports the endpoint recorded.", registry=REGISTRY
)
PROGRESS_REFUSALS = Counter(
    "rocmtrain_progress_refusals_total",
    "Progress reports the endpoint refused, by HTTP status code.",
    ["code"],
    registry=REGISTRY,
)

RECONCILES_IN_FLIGHT = Gauge(
    "rocmtrain_reconciles_in_flight", "Reconciles holding one of the reconciler's slots.", registry=REGISTRY
)
TOKEN_REVIEWS = Counter(
    "rocmtrain_progress_token_reviews_total", "TokenReviews the progress endpoint sent.", registry=REGISTRY
)
TOKENS_UNREVIEWED = Counter(
    "rocmtrain_progress_tokens_unreviewed_total",
    "Bearer tokens the progress endpoint answered without a TokenReview, by why: cache, shape or budget.",
    ["why"],
    registry=REGISTRY,
)
WATCH_RESTARTS = Counter(
    "rocmtrain_watch_restarts_total", "Watches started again after an unexpected error.", ["watch"], registry=REGISTRY
)
LOOP_LAG_SECONDS = Histogram(
    "rocmtrain_event_loop_lag_seconds",
    "How late the operator's event loop woke a timer (sampled every ROCMTRAIN_LOOP_LAG_PROBE_MS): how long other "
    "work held it.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY,
)
JOBS_REMEMBERED = Gauge(
    "rocmtrain_jobs_remembered", "Jobs the reconciler keeps state for (deleted ones are forgotten).", registry=REGISTRY
)

JobSource = Callable[[], Iterable[gauges.Job]]
# The job's name; not `job`, which Prometheus sets on every series to the scrape job's name.
JOB_LABEL = "job_name"
DEFAULT_MAX_JOBS = 500


class JobsCollector(Collector):
    """Jobs by phase, GPUs requested, and the per-job gauges, read from `source` (job views) at every scrape."""

    def __init__(self) -> None:
        self.source: JobSource = tuple
        self.max_jobs = DEFAULT_MAX_JOBS

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Yield the fleet gauges, then the per-job ones (of the snapshot `exposition` took, if any)."""
        snapshot = _JOBS_SNAPSHOT.get()
        jobs = list(self.source()) if snapshot is None else list(snapshot)
        yield from self._fleet(jobs)
        yield from self._per_job(gauges.job_samples(jobs, dt.datetime.now(dt.UTC), self.max_jobs))

    @staticmethod
    def _fleet(views: list[gauges.Job]) -> Iterator[GaugeMetricFamily]:
        jobs: Tally[Phase | None] = Tally()
        gpus: Tally[Phase | None] = Tally()
        for view in views:
            phase = phase_of(view["status"])
            jobs[phase] += 1
            gpus[phase] += view["gpus"]
        by_phase = GaugeMetricFamily("rocmtrain_jobs", "RocmTrainingJobs by phase.", labels=["phase"])
        requested_gpus = GaugeMetricFamily(
            "rocmtrain_gpus_requested", "AMD GPUs requested by jobs that have not ended.", labels=["phase"]
        )
        for phase in (*Phase, None):
            label = phase or UNKNOWN_PHASE
            by_phase.add_metric([label], jobs[phase])
            if phase is None or not phase.is_terminal:
                requested_gpus.add_metric([label], gpus[phase])
        yield by_phase
        yield requested_gpus

    @staticmethod
    def _per_job(samples: gauges.JobSamples) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["namespace", JOB_LABEL]
        for gauge in gauges.JOB_GAUGES:
            kind = CounterMetricFamily if gauge.counter else GaugeMetricFamily
            family = kind(gauges.PREFIX + gauge.name, gauge.help, labels=labels)
            for key, value in samples.values[gauge.name]:
                family.add_metric(list(key), value)
            yield family
        phase = GaugeMetricFamily("rocmtrain_job_phase", "1 for the job's phase.", labels=[*labels, "phase"])
        for with_phase, value in samples.phases:
            phase.add_metric(list(with_phase), value)
        yield phase
        cost = GaugeMetricFamily("rocmtrain_job_cost", "What the job's GPU-seconds cost.", labels=[*labels, "currency"])
        for with_currency, amount in samples.costs:
            cost.add_metric(list(with_currency), amount)
        yield cost
        gpu_kind = GaugeMetricFamily(
            "rocmtrain_job_gpu_kind",
            "1 for what the job's GPUs are: gpu, or a partition (cpx_nps4).",
            labels=[*labels, "kind"],
        )
        for with_kind, value in samples.kinds:
            gpu_kind.add_metric(list(with_kind), value)
        yield gpu_kind
        yield GaugeMetricFamily(
            "rocmtrain_job_series_dropped",
            "Jobs left out of the per-job series (over ROCMTRAIN_METRICS_MAX_JOBS).",
            value=samples.dropped,
        )


JOBS = JobsCollector()
REGISTRY.register(JOBS)
# The jobs a scrape collects from: taken on the event loop, which alone changes the index, and read in the
# collecting thread (asyncio.to_thread carries context variables over).
_JOBS_SNAPSHOT: ContextVar[tuple[gauges.Job, ...] | None] = ContextVar("jobs_snapshot", default=None)


async def exposition() -> bytes:
    """The registry in Prometheus' text format, collected in a thread from a snapshot of the jobs taken here."""
    token = _JOBS_SNAPSHOT.set(tuple(JOBS.source()))
    try:
        return await asyncio.to_thread(generate_latest, REGISTRY)
    finally:
        _JOBS_SNAPSHOT.reset(token)


@contextmanager
def observe(handler: str, expected: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Time a handler run; count it as an error when it raises anything but `expected`."""
    start = time.perf_counter()
    try:
        yield
    except expected:
        raise
    except Exception:
        RECONCILE_ERRORS.labels(handler).inc()
        raise
    finally:
        RECONCILE_SECONDS.labels(handler).observe(time.perf_counter() - start)
