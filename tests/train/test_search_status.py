"""The search's status from its trials (pure): the best trial by metric and mode, counts, the bounded table."""

from __future__ import annotations

import json

import pytest

from rocmtrain.api.models import TRIAL_TABLE_LENGTH, ProgressReport, TuningStatus
from rocmtrain.progress.limits import MAX_BODY_BYTES
from rocmtrain_train.search.trial_status import TrialView, best_trial, tuning_status


def trial(id: str, state: str = "TERMINATED", finished: bool = True, **result: float) -> TrialView:
    return TrialView(
        id=id, tune_state=state, config={"learning_rate": 1e-4, "epochs": 2}, result=result, finished=finished
    )


TRIALS = [
    trial("t1", eval_accuracy=0.80, eval_loss=0.50, evaluations=4),
    trial("t2", eval_accuracy=0.90, eval_loss=0.70, evaluations=4),
    trial("t3", finished=False, eval_accuracy=0.40, eval_loss=0.30, evaluations=1),  # stopped early by ASHA
    trial("t4", "RUNNING", eval_accuracy=0.85, eval_loss=0.45, evaluations=2),
    trial("t5", "ERROR", eval_accuracy=0.99, eval_loss=0.01, evaluations=1),  # failed: never the best
    trial("t6", "PENDING"),
]


@pytest.mark.parametrize(
    ("metric", "mode", "best"),
    [
        ("evalAccuracy", "max", "t2"),
        ("evalAccuracy", "min", "t3"),
        ("evalLoss", "min", "t3"),
        ("evalLoss", "max", "t2"),
    ],
)
def test_the_best_trial_follows_the_metric_and_the_mode(metric, mode, best):
    assert best_trial(TRIALS, metric, mode).id == best
    status = tuning_status(TRIALS, metric=metric, mode=mode, total=8)
    assert status.best_trial_id == best
    assert status.best_metric == next(t for t in TRIALS if t.id == best).metric(metric)


def test_counts_states_and_table():
    status = tuning_status(TRIALS, metric="evalAccuracy", mode="max", total=8)
    assert (status.trials_done, status.trials_running, status.trials_pending) == (4, 1, 3)
    rows = {row.id: row for row in status.trials}
    assert {k: r.state for k, r in rows.items()} == {
        "t1": "Succeeded",
        "t2": "Succeeded",
        "t3": "Stopped",
        "t4": "Running",
        "t5": "Failed",
        "t6": "Pending",
    }
    assert [r.id for r in status.trials][:3] == ["t4", "t5", "t2"], "running first, then best first"
    assert rows["t3"].iterations == 1 and rows["t3"].metric == 0.40
    assert rows["t6"].metric is None
    assert status.best_config.learning_rate == 1e-4 and status.best_config.epochs == 2


def test_no_best_before_any_evaluation():
    status = tuning_status([trial("a", "RUNNING")], metric="evalAccuracy", mode="max", total=2)
    assert status.best_trial_id is None and status.best_metric is None and status.trials_pending == 1


def test_the_table_is_bounded_and_fits_a_progress_report():
    many = [trial(f"search_{i:05d}", eval_accuracy=i / 1000, evaluations=i) for i in range(1000)]
    status = tuning_status(many, metric="evalAccuracy", mode="max", total=1000)
    assert len(status.trials) == TRIAL_TABLE_LENGTH
    assert status.trials[0].id == "search_00999"
    body = ProgressReport.model_validate({"progress": {"step": 1000}, "tuning": status.dump()}).dump()
    assert len(json.dumps(body)) < MAX_BODY_BYTES
    TuningStatus.model_validate(status.dump())
