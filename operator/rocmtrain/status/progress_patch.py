"""Turn a progress report into a JSON merge patch of the job's status (pure).

- `status.progress` is replaced as a whole: it describes the current state, so a
  field the report leaves out (say, the ETA on the final report) is cleared.
- `status.metrics` is merged: evaluation metrics arrive only every so often and
  stay visible between evaluations.
- `status.history` keeps the last `HISTORY_LENGTH` points of the loss curve; a
  report at the same step as the last point completes that point, and a report
  at an earlier step (a restart from a checkpoint) drops the points after it.
  Evaluation values enter the curve only when they are new (see `history_point`).
- `status.tuning` (a hyper-parameter search) is replaced as a whole, like progress: the driver
  sends the search's whole state every time (the trial table is bounded).
- `status.lastProgressTime` is the time the report was accepted; the operator's
  stall detection reads it.
- `status.backwardSteps` counts the reports whose step went below the one before, with no restart
  between (`rocmtrain.api.report_checks`): the status mapping's `NotDataParallel` condition reads it.
- `status.reportingPods` remembers the pods that sent the run's reports, the latest first (a few; the
  endpoint names the pod of each report), and `status.reportingTurns` counts the reports that came back to
  one of them after another's, with no restart between: `NotDataParallel` reads them too. In the status, so
  that an operator restart, or another replica of it, forgets nothing, and written with the report itself.
- `status.workerFailures` is the run's count of worker failures Ray Train
  recovered from; `recovery_events` announces each new one, `tuning_events` each new best
  trial of a search.
- `status.network` is the network RCCL chose, replaced as a whole when a report names another;
  `network_events` warns when it is TCP sockets although the job asks for RDMA.
- `status.preflightError` is the driver's pre-flight refusal, from its last report: the operator
  then fails the job at once (`rocmtrain.status.phase.refusal`), and takes no report after it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from rocmtrain.api.condition_reasons import Reason
from rocmtrain.api.models import (
    EVAL_METRICS,
    HISTORY_LENGTH,
    PREFLIGHT_ERROR_LIMIT,
    HistoryPoint,
    Metrics,
    NetworkTransport,
    Progress,
    ProgressReport,
    TuningStatus,
)
from rocmtrain.api.report_checks import reporting_pods, took_turn, went_backwards
from rocmtrain.api.timestamps import rfc3339
from rocmtrain.status.events import Event
from rocmtrain.status.messages import bounded
from rocmtrain.status.phase import has_ended
from rocmtrain.status.rdma import unused_rdma

_PROGRESS_FIELDS = tuple(field.alias or name for name, field in Progress.model_fields.items())
_TUNING_FIELDS = tuple(field.alias or name for name, field in TuningStatus.model_fields.items())
_NETWORK_FIELDS = tuple(field.alias or name for name, field in NetworkTransport.model_fields.items())
# Metrics that change only when the driver has evaluated again: the results, and the time
# spent evaluating (which grows with every evaluation, even one with the same results).
_EVALUATION_FIELDS = tuple(
    field.alias or name for name, field in Metrics.model_fields.items() if name in (*EVAL_METRICS, "eval_seconds")
)


def _fresh_evaluation(metrics: dict[str, Any], previous: Mapping[str, Any]) -> bool:
    """Whether the report's evaluation results are new rather than carried over from an earlier report."""
    return any(metrics[key] != previous.get(key) for key in _EVALUATION_FIELDS if key in metrics)


def history_point(report: ProgressReport, previous_metrics: Mapping[str, Any]) -> HistoryPoint | None:
    """The loss-curve point a report contributes, if it has a step and a loss or a new evaluation.

    Drivers repeat the latest evaluation in every report (it stays in
    `status.metrics`); the curve gets evaluation values only where they changed.
    """
    metrics = report.metrics
    fresh = _fresh_evaluation(metrics.dump(), previous_metrics)
    eval_loss, eval_accuracy = (metrics.eval_loss, metrics.eval_accuracy) if fresh else (None, None)
    if report.progress.step is None or (metrics.train_loss is None and eval_loss is None and eval_accuracy is None):
        return None
    return HistoryPoint(
        step=report.progress.step, train_loss=metrics.train_loss, eval_loss=eval_loss, eval_accuracy=eval_accuracy
    )


def extend_history(
    history: Sequence[Mapping[str, Any]], point: HistoryPoint, limit: int | None = HISTORY_LENGTH
) -> list[dict[str, Any]]:
    """The history with `point` added, bounded to the last `limit` points (None: unbounded)."""
    kept = [dict(p) for p in history if isinstance(p.get("step"), int) and p["step"] <= point.step]
    if kept and kept[-1]["step"] == point.step:
        kept[-1] = {**kept[-1], **point.dump()}
    else:
        kept.append(point.dump())
    return kept if limit is None else kept[-limit:]


def _restarted(report: ProgressReport, status: Mapping[str, Any]) -> bool:
    """Whether the report counts a new worker failure: the run restarted since the last report."""
    return (report.worker_failures or 0) > (status.get("workerFailures") or 0)


def _went_backwards(report: ProgressReport, status: Mapping[str, Any]) -> bool:
    """Whether the report's step is below the last report's, with no new worker failure (a restart) between."""
    previous = (status.get("progress") or {}).get("step")
    restarted = _restarted(report, status)
    return went_backwards(report.progress.step, previous if isinstance(previous, int) else None, restarted=restarted)


def _reporters(pod: str, report: ProgressReport, status: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a report from `pod` changes among `reportingPods` and `reportingTurns`."""
    pods = [name for name in status.get("reportingPods") or [] if isinstance(name, str)]
    restarted = _restarted(report, status)
    fields: dict[str, Any] = {}
    if (after := reporting_pods(pod, pods, restarted=restarted)) != pods:
        fields["reportingPods"] = after
    if took_turn(pod, pods, restarted=restarted):
        fields["reportingTurns"] = (status.get("reportingTurns") or 0) + 1
    return fields


def takes_reports(status: Mapping[str, Any] | None) -> bool:
    """Whether a job's status takes progress reports: not once the job has ended (or its driver refused it), so
    that what it ended with (its final metrics, the cost it was charged, the refusal) stays as it was."""
    return not has_ended(status)


def progress_patch(
    report: ProgressReport, status: Mapping[str, Any] | None, now: dt.datetime, pod: str | None = None
) -> dict[str, Any]:
    """The merge patch (`{"status": {...}}`) that records `report` on top of `status`; `pod`: the pod that sent it."""
    progress = report.progress.dump()
    patch: dict[str, Any] = {
        "progress": {key: progress.get(key) for key in _PROGRESS_FIELDS},
        "lastProgressTime": rfc3339(now),
    }
    if metrics := report.metrics.dump():
        patch["metrics"] = metrics
    if report.tuning is not None:
        tuning = report.tuning.dump()
        patch["tuning"] = {key: tuning.get(key) for key in _TUNING_FIELDS}
    status = status or {}
    if report.worker_failures or "workerFailures" in status:
        patch["workerFailures"] = report.worker_failures or 0
    if _went_backwards(report, status):
        patch["backwardSteps"] = (status.get("backwardSteps") or 0) + 1
    if pod is not None:
        patch |= _reporters(pod, report, status)
    if (point := history_point(report, status.get("metrics") or {})) is not None:
        patch["history"] = extend_history(status.get("history") or [], point)
    if report.network is not None and (network := report.network.dump()) != status.get("network"):
        patch["network"] = {key: network.get(key) for key in _NETWORK_FIELDS}
    if report.preflight_error is not None:
        patch["preflightError"] = bounded(report.preflight_error, PREFLIGHT_ERROR_LIMIT)
    return {"status": patch}


def recovery_events(report: ProgressReport, status: Mapping[str, Any] | None) -> list[Event]:
    """The event a report brings when it counts more worker failures than the status has seen."""
    seen = (status or {}).get("workerFailures") or 0
    if (report.worker_failures or 0) <= seen:
        return []
    where = f" at step {report.resumed_from_step}" if report.resumed_from_step is not None else ""
    message = (
        f"a Ray Train worker failed ({report.worker_failures} so far in this run); "
        f"training continued from the checkpoint{where}"
    )
    return [Event("Warning", Reason.WORKER_FAILURE_RECOVERED, message)]


def tuning_events(report: ProgressReport, status: Mapping[str, Any] | None) -> list[Event]:
    """The event a report brings when its search has a new best trial."""
    new = report.tuning
    old = (status or {}).get("tuning") or {}
    if (
        new is None
        or new.best_trial_id is None
        or new.best_metric is None
        or new.best_trial_id == old.get("bestTrialId")
    ):
        return []
    config = ", ".join(f"{k}={v:.4g}" for k, v in (new.best_config.dump() if new.best_config else {}).items())
    message = f"trial {new.best_trial_id} is the best so far: {new.metric}={new.best_metric:.4f}"
    return [Event("Normal", Reason.NEW_BEST_TRIAL, message + (f" ({config})" if config else ""))]


def network_events(report: ProgressReport, job: Mapping[str, Any]) -> list[Event]:
    """The warning a report brings when RCCL newly reports TCP sockets between the pods of a job whose
    `spec.resources.network` names an RDMA resource: a silent fallback, many times slower than RDMA."""
    new = report.network
    seen = (job.get("status") or {}).get("network") or {}
    rdma = unused_rdma(new.transport if new else None, job.get("spec") or {})
    if new is None or rdma is None or seen.get("transport") == new.transport:
        return []
    message = (
        f"RCCL uses TCP sockets between the worker pods ({new.summary}), not RDMA, although the job requests {rdma}: "
        "check that the pods got RDMA devices and that spec.resources.network's ibHca and gidIndex match them"
    )
    return [Event("Warning", Reason.RDMA_NOT_USED, message)]


def report_events(report: ProgressReport, job: Mapping[str, Any]) -> list[Event]:
    """The events `report` deserves on top of `job` (the job, and the status, it was patched onto)."""
    status = job.get("status")
    return recovery_events(report, status) + tuning_events(report, status) + network_events(report, job)
