"""Per-job metric values from the jobs the operator indexes (pure; `rocmtrain.metrics.prometheus` serves them).

Every gauge is labelled `namespace` and `job_name` and read from the job's
status at scrape time, so a deleted job's series go with it. Cardinality is bounded:
series are exported for at most `limit` jobs (`ROCMTRAIN_METRICS_MAX_JOBS`), jobs that
have not ended first, then the most recently ended; `dropped` counts the others. That
is at most `len(JOB_GAUGES) + 2` series per job (the gauges, the phase and the cost).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rocmtrain.api.condition_reasons import ConditionType
from rocmtrain.api.models import Phase
from rocmtrain.api.timestamps import parse_time
from rocmtrain.status.accounting import gpu_seconds_at
from rocmtrain.status.condition_merge import find
from rocmtrain.status.objects import requested_gpus
from rocmtrain.status.phase import phase_of

Job = Mapping[str, Any]  # a job view (`rocmtrain.status.objects.job_view`)


def _number(value: object, scale: float = 1.0) -> float | None:
    return float(value) * scale if isinstance(value, int | float) and not isinstance(value, bool) else None


def _condition(job: Job, kind: ConditionType) -> Mapping[str, Any]:
    return find(job["status"].get("conditions") or [], kind) or {}


def _since(moment: object) -> float | None:
    parsed = parse_time(moment)
    return parsed.timestamp() if parsed is not None else None


def waiting_since(job: Job) -> float | None:
    """When a Pending or Queued job began to wait (its Ready condition turned False), as a Unix time."""
    phase = phase_of(job["status"])
    if phase is None or not phase.is_waiting:
        return None
    return _since(_condition(job, ConditionType.READY).get("lastTransitionTime"))


def _stalled(job: Job) -> float | None:
    if phase_of(job["status"]) is not Phase.RUNNING:
        return None
    return 1.0 if _condition(job, ConditionType.STALLED).get("status") == "True" else 0.0


@dataclass(frozen=True)
class JobGauge:
    """One per-job metric: its name (without the `rocmtrain_job_` prefix), help, and how to read it."""

    name: str
    help: str
    read: Callable[[Job, dt.datetime], float | None]
    counter: bool = False


def _status(*path: str, scale: float = 1.0) -> Callable[[Job, dt.datetime], float | None]:
    def read(job: Job, _now: dt.datetime) -> float | None:
        node: Any = job["status"]
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None  # API objects are plain dicts
        return _number(node, scale)

    return read


PREFIX = "rocmtrain_job_"
JOB_GAUGES: tuple[JobGauge, ...] = (
    JobGauge(
        "progress_ratio", "Share of the training steps done (0 to 1).", _status("progress", "percent", scale=0.01)
    ),
    JobGauge("eta_seconds", "Estimated seconds until training ends.", _status("progress", "etaSeconds")),
    JobGauge("train_loss", "Latest training loss.", _status("metrics", "trainLoss")),
    JobGauge("eval_loss", "Latest evaluation loss.", _status("metrics", "evalLoss")),
    JobGauge("eval_accuracy", "Latest evaluation accuracy (0 to 1).", _status("metrics", "evalAccuracy")),
    JobGauge("samples_per_second", "Training throughput of all workers.", _status("metrics", "samplesPerSecond")),
    JobGauge(
        "gpu_utilization_percent", "Mean GPU utilisation over workers.", _status("metrics", "gpuUtilizationPercent")
    ),
    JobGauge(
        "gpu_memory_peak_bytes", "Largest GPU memory peak of any worker.", _status("metrics", "gpuMemoryPeakBytes")
    ),
    JobGauge("gpus", "AMD GPUs the job requests.", lambda job, _now: float(requested_gpus(job))),
    JobGauge("gpus_held", "AMD GPUs the job's ready Ray workers hold.", _status("gpusHeld")),
    JobGauge(
        "gpu_seconds",
        "AMD GPU-seconds the job has held.",
        lambda job, now: gpu_seconds_at(job["status"], now) if "gpuSeconds" in job["status"] else None,
        counter=True,
    ),
    JobGauge(
        "waiting_since_timestamp_seconds",
        "When a Pending or Queued job began to wait (Unix time).",
        lambda job, _now: waiting_since(job),
    ),
    JobGauge(
        "stalled", "1 while a Running job shows no progress (Stalled=True), else 0.", lambda job, _n: _stalled(job)
    ),
)


@dataclass(frozen=True)
class JobSamples:
    """The per-job samples of one scrape."""

    values: dict[str, list[tuple[tuple[str, str], float]]]  # gauge name -> ((namespace, job), value)
    phases: list[tuple[tuple[str, str, str], float]]  # ((namespace, job, phase), 1)
    costs: list[tuple[tuple[str, str, str], float]]  # ((namespace, job, currency), amount)
    kinds: list[tuple[tuple[str, str, str], float]]  # ((namespace, job, gpu kind), 1) for jobs with GPUs
    dropped: int


WHOLE_GPU_KIND = "gpu"


def gpu_kind(resources: Mapping[str, Any]) -> str | None:
    """What one GPU of a job's `spec.resources` is: `gpu` (a whole one), or its partition (`cpx_nps4`); None
    without GPUs."""
    if resources.get("gpusPerWorker", 1) == 0:
        return None
    gpu = resources.get("gpu") or {}
    partition = gpu.get("partition") or str(gpu.get("resourceName") or "").removeprefix("amd.com/")
    return str(partition) if partition and partition != WHOLE_GPU_KIND else WHOLE_GPU_KIND


def _rank(job: Job) -> tuple[int, float, str, str]:
    """Jobs that have not ended first (by name), then the most recently ended."""
    meta, status = job["metadata"], job["status"]
    phase = phase_of(status)
    ended = phase is not None and phase.is_terminal
    when = _since(status.get("completionTime")) or 0.0
    return (1 if ended else 0, -when if ended else 0.0, meta.get("namespace", ""), meta.get("name", ""))


def job_samples(jobs: Iterable[Job], now: dt.datetime, limit: int) -> JobSamples:
    """The per-job samples of at most `limit` jobs."""
    ranked: Sequence[Job] = sorted(jobs, key=_rank)
    kept = ranked[: max(limit, 0)]
    values: dict[str, list[tuple[tuple[str, str], float]]] = {gauge.name: [] for gauge in JOB_GAUGES}
    phases, costs, kinds = [], [], []
    for job in kept:
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        for gauge in JOB_GAUGES:
            if (value := gauge.read(job, now)) is not None:
                values[gauge.name].append((key, value))
        if phase := job["status"].get("phase"):
            phases.append(((*key, str(phase)), 1.0))
        cost = job["status"].get("cost")
        if isinstance(cost, Mapping) and (amount := _number(cost.get("amount"))) is not None:
            costs.append(((*key, str(cost.get("currency", ""))), amount))
        if kind := gpu_kind(job["spec"].get("resources") or {}):
            kinds.append(((*key, kind), 1.0))
    return JobSamples(values=values, phases=phases, costs=costs, kinds=kinds, dropped=len(ranked) - len(kept))


def queue_wait(old: Mapping[str, Any], new: Mapping[str, Any], now: dt.datetime) -> float | None:
    """Seconds a job waited (Pending or Queued) before it started, when `old` → `new` is that start."""
    before, after = phase_of(old), phase_of(new)
    if before is None or not before.is_waiting or after is None or not after.holds_gpus:
        return None
    ready = find(old.get("conditions") or [], ConditionType.READY) or {}
    since = parse_time(ready.get("lastTransitionTime"))
    return max(0.0, (now - since).total_seconds()) if since is not None else None
