"""The search's status from its trials (pure): the best trial by metric and mode, counts, the bounded table."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest

from fakes import Sent
from rocmtrain.api.models import TRIAL_TABLE_LENGTH, ProgressReport, TuningStatus
from rocmtrain.progress.limits import MAX_BODY_BYTES
from rocmtrain_train.search.trial_status import TrialView, best_trial, search_network, tuning_status
from rocmtrain_train.search.tune_trials import SearchReporter, tune_result
from train.jobs import job, settings
from train.test_reporting import rank


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


ROCE = {"transport": "IB", "devices": ["mlx5_0:1"], "link": "RoCE"}
SOCKET = {"transport": "Socket", "devices": ["eth0"]}


def with_network(view: TrialView, network: dict) -> TrialView:
    return replace(view, result={**view.result, "network": network})


def test_a_trials_rank_zero_network_reaches_tune_with_its_evaluation():
    """Rank 0's network is written by hand here (no RCCL runs in the tests; see tests/unit/test_rccl_log.py)."""
    assert tune_result(rank(0, {"eval_accuracy": 0.8}, network=ROCE), 1)["network"] == ROCE
    assert "network" not in tune_result(rank(0, {"eval_accuracy": 0.8}), 1), "CPUs, or a log that does not tell"


def test_the_searchs_network_is_the_best_trials_else_the_first_that_reported_one():
    t1, t2, t3 = TRIALS[0], TRIALS[1], TRIALS[2]  # t2 is the best by accuracy
    assert search_network(TRIALS, best_trial(TRIALS, "evalAccuracy", "max")) is None
    trials = [t1, with_network(t2, SOCKET), with_network(t3, ROCE)]
    assert search_network(trials, trials[1]).dump() == SOCKET, "the best trial's"
    assert search_network(trials, None).dump() == SOCKET, "before any best: the first that reported one"
    trials = [t1, t2, with_network(t3, ROCE)]
    assert search_network(trials, t2).dump() == ROCE, "the best did not tell: the first that did"


def test_the_search_reports_the_network_and_logs_it_once(tmp_path, caplog):
    search = job("search", {"tuning": {"searchSpace": {"learningRate": {"min": 1e-5, "max": 1e-4}}}})
    sink = Sent()
    log = logging.getLogger("test.search.network")
    reporter = SearchReporter(settings(search, tmp_path), [sink], log)
    with caplog.at_level(logging.INFO, logger=log.name):
        reporter.trials = TRIALS
        reporter.emit(final=False)
        reporter.trials = [with_network(t, ROCE) if t.id in ("t1", "t2") else t for t in TRIALS]
        reporter.emit(final=False)
        reporter.emit(final=True)
    assert [report.dump().get("network") for report in sink.reports] == [None, ROCE, ROCE]
    assert caplog.text.count("RCCL transport: IB over mlx5_0:1 (RoCE)") == 1
