"""Prometheus metrics of the operator, served over HTTP from its event loop.

- `rocmtrain_jobs{phase}`: jobs by phase (every phase listed, zeros included);
- `rocmtrain_gpus_requested{phase}`: AMD GPUs asked for by jobs that have not ended;
- `rocmtrain_reconcile_errors_total{handler}`: handler runs that raised;
- `rocmtrain_reconcile_duration_seconds{handler}`: handler run time;
- `rocmtrain_reconciles_in_flight`: reconciles holding one of the reconciler's slots;
- `rocmtrain_jobs_remembered`: jobs the reconciler keeps state for (deleted ones are forgotten);
- `rocmtrain_progress_token_reviews_total`: TokenReviews the progress endpoint sent.

Job gauges are computed at scrape time from a source of (phase, gpus) pairs
(the operator passes a view of its job index), so they cannot drift.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import get_args

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rocmtrain.api.models import Phase
from rocmtrain.status import TERMINAL_PHASES

PHASES: tuple[str, ...] = get_args(Phase)
UNKNOWN_PHASE = "Unknown"

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

RECONCILES_IN_FLIGHT = Gauge(
    "rocmtrain_reconciles_in_flight", "Reconciles holding one of the reconciler's slots.", registry=REGISTRY
)
TOKEN_REVIEWS = Counter(
    "rocmtrain_progress_token_reviews_total", "TokenReviews the progress endpoint sent.", registry=REGISTRY
)
JOBS_REMEMBERED = Gauge(
    "rocmtrain_jobs_remembered", "Jobs the reconciler keeps state for (deleted ones are forgotten).", registry=REGISTRY
)

JobSource = Callable[[], Iterable[tuple[str | None, int]]]


class JobsCollector(Collector):
    """Jobs by phase and GPUs requested, read from `source` at every scrape."""

    def __init__(self) -> None:
        self.source: JobSource = tuple

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Yield the two job gauges."""
        jobs: Tally[str] = Tally()
        gpus: Tally[str] = Tally()
        for phase, requested in self.source():
            label = phase if phase in PHASES else UNKNOWN_PHASE
            jobs[label] += 1
            if label not in TERMINAL_PHASES:
                gpus[label] += requested
        by_phase = GaugeMetricFamily("rocmtrain_jobs", "RocmTrainingJobs by phase.", labels=["phase"])
        requested_gpus = GaugeMetricFamily(
            "rocmtrain_gpus_requested", "AMD GPUs requested by jobs that have not ended.", labels=["phase"]
        )
        for phase in (*PHASES, UNKNOWN_PHASE):
            by_phase.add_metric([phase], jobs[phase])
            if phase not in TERMINAL_PHASES:
                requested_gpus.add_metric([phase], gpus[phase])
        yield by_phase
        yield requested_gpus


JOBS = JobsCollector()
REGISTRY.register(JOBS)


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


async def _scrape(_request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def serve(port: int, host: str) -> web.AppRunner:
    """Serve `/metrics` on `host`:`port` (plain HTTP); clean up with `await runner.cleanup()`."""
    app = web.Application()
    app.router.add_get("/metrics", _scrape)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
