"""What a run's reports tell beyond their numbers (pure): the final `train_loss` as the loss, a step that goes
backwards (not data-parallel), and why no loss arrives.

Real parts: the KEP-2779 bodies transformers' `KubeflowCallback` sends (its metric names), the status mapping.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from fakes import merge_patch
from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.models import ProgressReport
from rocmtrain.api.progress_body import parse_trainer_status
from rocmtrain.api.report_checks import (
    BACKWARD_STEPS_TO_WARN,
    REPORTING_PODS_KEPT,
    TURNS_TO_WARN,
    missing_loss,
    went_backwards,
)
from rocmtrain.status.progress_patch import progress_patch
from unit.test_status import CODE, T0, conditions, observe, running_rayjob


def kep(percent: float, **metrics: float) -> ProgressReport:
    """A KEP-2779 report as transformers' KubeflowCallback sends it (values as strings)."""
    body = {"progressPercentage": percent, "metrics": [{"name": k, "value": str(v)} for k, v in metrics.items()]}
    return parse_trainer_status(json.dumps({"trainerStatus": body}).encode())


# ---- the loss field ------------------------------------------------------------------------------------------


def test_a_trainers_final_train_loss_is_the_loss_when_it_logged_none_before() -> None:
    """logging_steps=500 over 375 steps: the Trainer's only loss is the run's mean, in its last report."""
    final = kep(100, train_loss=1.51523, train_runtime=12.5, epoch=3.0)
    assert final.metrics.train_loss == 1.51523 and final.metrics.custom is None, "no custom train_loss row"


def test_the_last_logged_loss_wins_over_the_runs_mean() -> None:
    final = kep(100, loss=1.0243, train_loss=1.51523, learning_rate=1e-5)
    assert final.metrics.train_loss == 1.0243 and final.metrics.custom is None


# ---- not data-parallel ---------------------------------------------------------------------------------------


def step(n: int, **kw: Any) -> ProgressReport:
    return ProgressReport.model_validate({"progress": {"step": n, "totalSteps": 375}, **kw})


def record(*reports: ProgressReport) -> dict[str, Any]:
    status: dict[str, Any] = {}
    for report in reports:
        status = merge_patch(status, progress_patch(report, status, T0)["status"])
    return status


def test_two_copies_reporting_as_rank_0_step_back_and_forth_and_each_step_back_counts() -> None:
    status = record(kep(0, total_steps=375), kep(0, total_steps=375), step(10), step(9), step(12), step(11), step(14))
    assert status["backwardSteps"] == 2


def test_a_restart_is_no_step_back() -> None:
    """A Trainer that starts again first reports no step; a loop of ours counts the worker failure."""
    status = record(step(120), kep(0, total_steps=375), step(100), step(130), step(100, workerFailures=1), step(101))
    assert "backwardSteps" not in status
    assert went_backwards(5, 6) and not went_backwards(5, 6, restarted=True) and not went_backwards(6, None)


def test_the_status_warns_once_the_step_went_backwards_twice_naming_cause_and_fix() -> None:
    rj = running_rayjob(T0)
    once = observe({"phase": "Running", "backwardSteps": BACKWARD_STEPS_TO_WARN - 1}, rj, spec=CODE)
    assert ConditionType.NOT_DATA_PARALLEL not in conditions(once), "one may be a restart the code did not mark"
    twice = observe({"phase": "Running", "backwardSteps": 34}, rj, spec=CODE)
    assert conditions(twice)[ConditionType.NOT_DATA_PARALLEL] == ("True", Reason.STEP_WENT_BACKWARDS)
    message = next(c["message"] for c in twice["conditions"] if c["type"] == ConditionType.NOT_DATA_PARALLEL)
    assert "went backwards 34 times" in message and "full copy" in message and "prepare_trainer" in message


def sent(*reports: tuple[str, ProgressReport]) -> dict[str, Any]:
    """The status after `reports`, each with the pod that sent it."""
    status: dict[str, Any] = {}
    for pod, report in reports:
        status = merge_patch(status, progress_patch(report, status, T0, pod)["status"])
    return status


def warning(status: dict[str, Any]) -> str:
    """The message of the status's NotDataParallel condition."""
    return next(c["message"] for c in status["conditions"] if c["type"] == ConditionType.NOT_DATA_PARALLEL)


def test_two_pods_taking_turns_report_as_rank_0_and_the_status_names_them_cause_and_fix() -> None:
    """No step in the reports (a KEP-2779 first report has none): the pods alone tell."""
    first, second = "job-x7k2p-worker-a1", "job-x7k2p-worker-b2"
    status = sent(*[(pod, kep(0, total_steps=375)) for pod in (first, second, first, second, first)])
    assert (status["reportingPods"], status["reportingTurns"]) == ([first, second], 3)
    assert "backwardSteps" not in status
    said = observe({"phase": "Running", **status}, running_rayjob(T0), spec=CODE)
    assert conditions(said)[ConditionType.NOT_DATA_PARALLEL] == ("True", Reason.TWO_RANK_ZEROS)
    message = warning(said)
    assert f"pods {first} and {second} took turns reporting progress, 3 times" in message
    assert "full copy" in message and "prepare_trainer" in message and "prepare_model" in message


def test_a_moved_rank_0_a_restart_a_retry_or_a_driver_reporting_around_its_workers_is_no_warning() -> None:
    head, a, b, c = "head", "worker-a", "worker-b", "worker-c"
    moved = sent((a, step(1)), (a, step(2)), (b, step(3)), (b, step(4)))
    assert moved["reportingPods"] == [b, a] and "reportingTurns" not in moved
    restarted = sent((a, step(10)), (b, step(11)), (a, step(11, workerFailures=1)), (b, step(12)))
    assert restarted["reportingPods"] == [b, a] and "reportingTurns" not in restarted
    retried = sent((a, step(10)), (b, step(11)), (c, step(12)))  # a RayJob's retry: new pods
    assert "reportingTurns" not in retried
    around = sent((head, step(0)), (a, step(1)), (a, step(2)), (head, step(2, final=True)))
    assert around["reportingTurns"] == TURNS_TO_WARN - 1
    said = observe({"phase": "Running", **around}, running_rayjob(T0), spec=CODE)
    assert ConditionType.NOT_DATA_PARALLEL not in conditions(said)


def test_the_pods_remembered_are_bounded_and_a_turn_back_among_them_counts() -> None:
    pods = [f"worker-{i}" for i in range(REPORTING_PODS_KEPT + 4)]
    status = sent(*[(pod, step(1)) for pod in pods])
    assert status["reportingPods"] == pods[::-1][:REPORTING_PODS_KEPT] and "reportingTurns" not in status
    status = sent(*[(pod, step(1)) for pod in pods], (pods[-3], step(1)), (pods[-2], step(1)))
    assert status["reportingTurns"] == 2 and status["reportingPods"][:2] == [pods[-2], pods[-3]]
    said = observe({"phase": "Running", **status}, running_rayjob(T0), spec=CODE)
    assert f"pods {pods[-2]} and {pods[-3]} (and {REPORTING_PODS_KEPT - 2} more) took turns" in warning(said)


# ---- why no loss arrives -------------------------------------------------------------------------------------


def test_past_one_percent_of_the_steps_without_a_loss_the_status_says_why_until_one_arrives() -> None:
    rj = running_rayjob(T0)
    early = {"phase": "Running", "lastProgressTime": "2026-01-02T03:04:05Z", "progress": {"step": 3, "totalSteps": 375}}
    assert conditions(observe(early, rj, spec=CODE))[ConditionType.PROGRESS_REPORTED][1] == Reason.PROGRESS_REPORTED
    late = {**early, "progress": {"step": 120, "totalSteps": 375}}
    said = observe(late, rj, spec=CODE, now=T0 + dt.timedelta(seconds=5))
    condition = next(c for c in said["conditions"] if c["type"] == ConditionType.PROGRESS_REPORTED)
    assert (condition["status"], condition["reason"]) == ("True", Reason.NO_LOSS_REPORTED)
    assert "no loss reported by step 120 of 375" in condition["message"] and "logging_steps=3" in condition["message"]
    logged = observe({**late, "metrics": {"trainLoss": 1.2}}, rj, spec=CODE)
    assert conditions(logged)[ConditionType.PROGRESS_REPORTED][1] == Reason.PROGRESS_REPORTED
    assert missing_loss(None, 375, False) is None and missing_loss(50, None, False) is None
