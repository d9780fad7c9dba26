"""From a progress report to the status merge patch (pure, no cluster)."""

from __future__ import annotations

import datetime as dt

from fakes import merge_patch
from rocmtrain.api.condition_reasons import Reason
from rocmtrain.api.models import HISTORY_LENGTH, PREFLIGHT_ERROR_LIMIT, ProgressReport, RocmTrainingJobStatus
from rocmtrain.status.progress_patch import (
    network_events,
    progress_patch,
    recovery_events,
    report_events,
    takes_reports,
    tuning_events,
)

NOW = dt.datetime(2025, 3, 1, 12, 30, 5, 123456, tzinfo=dt.UTC)


def report(step: int, **metrics: float) -> ProgressReport:
    return ProgressReport.model_validate(
        {"progress": {"step": step, "totalSteps": 100, "percent": step, "etaSeconds": 100 - step}, "metrics": metrics}
    )


def test_sets_progress_metrics_history_and_time():
    patch = progress_patch(report(10, trainLoss=0.9, learningRate=1e-5), None, NOW)["status"]
    assert patch["progress"] == {"epoch": None, "step": 10, "totalSteps": 100, "percent": 10.0, "etaSeconds": 90.0}
    assert patch["metrics"] == {"trainLoss": 0.9, "learningRate": 1e-5}
    assert patch["history"] == [{"step": 10, "trainLoss": 0.9}]
    assert patch["lastProgressTime"] == "2025-03-01T12:30:05Z"


def test_progress_is_replaced_and_metrics_are_merged():
    status = merge_patch(
        {}, progress_patch(report(50, trainLoss=0.5, evalAccuracy=0.8, evalLoss=0.6), None, NOW)["status"]
    )
    final = ProgressReport.model_validate(
        {"progress": {"step": 100, "totalSteps": 100, "percent": 100}, "metrics": {"trainLoss": 0.2}, "final": True}
    )
    status = merge_patch(status, progress_patch(final, status, NOW)["status"])
    assert "etaSeconds" not in status["progress"], "a field the report leaves out is cleared"
    assert status["metrics"] == {"trainLoss": 0.2, "evalAccuracy": 0.8, "evalLoss": 0.6}
    RocmTrainingJobStatus.model_validate(status)


def test_history_completes_same_step_rewinds_and_stays_bounded():
    status: dict = {}
    for step in range(1, HISTORY_LENGTH + 11):
        status = merge_patch(status, progress_patch(report(step, trainLoss=1.0 / step), status, NOW)["status"])
    assert len(status["history"]) == HISTORY_LENGTH
    assert [p["step"] for p in status["history"]] == list(range(11, HISTORY_LENGTH + 11))

    status = merge_patch(status, progress_patch(report(HISTORY_LENGTH + 10, evalAccuracy=0.9), status, NOW)["status"])
    last = status["history"][-1]
    assert last == {"step": HISTORY_LENGTH + 10, "trainLoss": 1.0 / (HISTORY_LENGTH + 10), "evalAccuracy": 0.9}

    status = merge_patch(status, progress_patch(report(30, trainLoss=0.4), status, NOW)["status"])
    assert [p["step"] for p in status["history"]][-2:] == [29, 30], "a restart from a checkpoint rewinds the curve"
    RocmTrainingJobStatus.model_validate(status)


def test_report_without_loss_adds_no_history_point():
    patch = progress_patch(report(5, samplesPerSecond=100.0), {"history": [{"step": 1, "trainLoss": 2.0}]}, NOW)
    assert "history" not in patch["status"]


def test_evaluation_carried_over_by_the_driver_is_not_repeated_in_the_curve():
    status = merge_patch(
        {}, progress_patch(report(10, trainLoss=0.9, evalAccuracy=0.7, evalSeconds=3.0), None, NOW)["status"]
    )
    status = merge_patch(
        status, progress_patch(report(20, trainLoss=0.8, evalAccuracy=0.7, evalSeconds=3.0), status, NOW)["status"]
    )
    status = merge_patch(
        status, progress_patch(report(30, trainLoss=0.6, evalAccuracy=0.7, evalSeconds=6.1), status, NOW)["status"]
    )
    assert status["history"] == [
        {"step": 10, "trainLoss": 0.9, "evalAccuracy": 0.7},
        {"step": 20, "trainLoss": 0.8},
        {"step": 30, "trainLoss": 0.6, "evalAccuracy": 0.7},
    ], "a new evaluation with an unchanged accuracy still counts (its evalSeconds moved)"
    assert status["metrics"]["evalAccuracy"] == 0.7


def test_worker_failures_are_counted_and_each_new_one_announced():
    first = ProgressReport.model_validate({"progress": {"step": 8}})
    status = merge_patch({}, progress_patch(first, None, NOW)["status"])
    assert "workerFailures" not in status and recovery_events(first, status) == []
    recovered = ProgressReport.model_validate({"progress": {"step": 6}, "workerFailures": 1, "resumedFromStep": 6})
    (event,) = recovery_events(recovered, status)
    assert (event.type, event.reason) == ("Warning", Reason.WORKER_FAILURE_RECOVERED)
    assert "1 so far" in event.message and "checkpoint at step 6" in event.message
    status = merge_patch(status, progress_patch(recovered, status, NOW)["status"])
    assert status["workerFailures"] == 1
    assert recovery_events(recovered, status) == [], "the same failure is announced once"


def tuning_report(best: str | None, metric: float | None, running: int = 1) -> ProgressReport:
    tuning = {
        "metric": "evalAccuracy",
        "mode": "max",
        "trialsTotal": 4,
        "trialsDone": 3 - running,
        "trialsRunning": running,
        "trialsPending": 1,
        "trials": [
            {"id": "a", "state": "Running", "config": {"learningRate": 1e-4}, "metric": metric, "iterations": 2}
        ],
    }
    if best is not None:
        tuning.update(bestTrialId=best, bestMetric=metric, bestConfig={"learningRate": 1e-4}, bestCheckpoint="/c/1")
    return ProgressReport.model_validate({"progress": {"step": 3 - running, "totalSteps": 4}, "tuning": tuning})


def test_tuning_is_replaced_and_new_best_trials_are_announced():
    first = progress_patch(tuning_report("a", 0.7), None, NOW)["status"]
    status = merge_patch({}, first)
    assert status["tuning"]["bestTrialId"] == "a" and status["tuning"]["trials"][0]["iterations"] == 2
    (event,) = report_events(tuning_report("a", 0.7), {})
    assert (event.type, event.reason) == ("Normal", Reason.NEW_BEST_TRIAL)
    assert event.message == "trial a is the best so far: evalAccuracy=0.7000 (learningRate=0.0001)"
    assert tuning_events(tuning_report("a", 0.8, running=0), status) == [], "the same trial, better: no event"
    status = merge_patch(status, progress_patch(tuning_report(None, None, running=0), status, NOW)["status"])
    assert "bestTrialId" not in status["tuning"] and "bestCheckpoint" not in status["tuning"], "replaced whole"
    assert [e.reason for e in tuning_events(tuning_report("b", 0.9), {"tuning": {"bestTrialId": "a"}})] == [
        Reason.NEW_BEST_TRIAL
    ]
    assert tuning_events(report(1, trainLoss=1.0), status) == []
    RocmTrainingJobStatus.model_validate(status)


SOCKET = {"transport": "Socket", "devices": ["eth0"]}
ROCE = {"transport": "IB", "devices": ["mlx5_0:1", "mlx5_1:1"], "link": "RoCE"}


def network_report(network: dict) -> ProgressReport:
    return ProgressReport.model_validate({"progress": {"step": 1}, "network": network})


def rdma_job(status: dict, workers: int = 2, rdma: str | None = "rdma/rdma_shared_device_a") -> dict:
    network = {"rdmaResource": rdma} if rdma else {}
    return {"spec": {"resources": {"workers": workers, "network": network}}, "status": status}


def test_network_is_written_once_and_replaced_whole():
    """The reports carry a network as the driver reads it from RCCL's log (written by hand: no RCCL runs here)."""
    status = merge_patch({}, progress_patch(network_report(ROCE), None, NOW)["status"])
    assert status["network"] == ROCE
    assert "network" not in progress_patch(network_report(ROCE), status, NOW)["status"], "unchanged: not rewritten"
    assert "network" not in progress_patch(report(2, trainLoss=1.0), status, NOW)["status"]
    status = merge_patch(status, progress_patch(network_report(SOCKET), status, NOW)["status"])
    assert status["network"] == SOCKET, "no link left over from the previous network"
    RocmTrainingJobStatus.model_validate(status)


def test_sockets_where_the_job_asks_for_rdma_are_a_warning_once():
    (event,) = report_events(network_report(SOCKET), rdma_job({}))
    assert (event.type, event.reason) == ("Warning", Reason.RDMA_NOT_USED)
    assert "TCP sockets" in event.message and "Socket over eth0" in event.message
    assert "rdma/rdma_shared_device_a" in event.message
    assert network_events(network_report(SOCKET), rdma_job({"network": SOCKET})) == [], "announced once"
    assert network_events(network_report(ROCE), rdma_job({})) == [], "RDMA in use"
    assert network_events(network_report(SOCKET), rdma_job({}, rdma=None)) == [], "no RDMA asked for"
    assert network_events(network_report(SOCKET), rdma_job({}, workers=1)) == [], "one pod: no network between pods"
    assert network_events(report(1, trainLoss=1.0), rdma_job({})) == []


def test_a_preflight_refusal_is_written_bounded_and_ends_the_reports():
    """The driver's last report: `preflightError` goes to the status, control characters escaped within the bound,
    and no report is taken after it."""
    refusal = "spec.data.train.uri: s3://b/t.jsonl is not readable: AWS Error NETWORK_CONNECTION \x1b[31m"
    refused = ProgressReport.model_validate({"progress": {}, "final": True, "preflightError": refusal})
    status = merge_patch({"phase": "Running"}, progress_patch(refused, {"phase": "Running"}, NOW)["status"])
    assert status["preflightError"] == refusal.replace("\x1b", "\\x1b")
    assert not takes_reports(status) and takes_reports({"phase": "Running"})
    longest = ProgressReport.model_validate({"progress": {}, "preflightError": "\x07" * PREFLIGHT_ERROR_LIMIT})
    written = progress_patch(longest, None, NOW)["status"]["preflightError"]
    assert len(written) == PREFLIGHT_ERROR_LIMIT
    RocmTrainingJobStatus.model_validate({**status, "preflightError": written})
