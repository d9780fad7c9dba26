"""Driver-side aggregation of per-rank metrics into ProgressReports, the sinks, and the main log."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import os
import tempfile
from pathlib import Path

import pytest
from ray.train import UserCallback

from fakes import Clock
from rocmtrain.api.contract import CHECKPOINTS_TO_KEEP_ENV, MAX_WORKER_FAILURES_ENV, STORAGE_PATH_ENV
from rocmtrain.api.models import ProgressReport
from rocmtrain_train import sdk
from rocmtrain_train.loop.rank_setup import rccl_log_file
from rocmtrain_train.reporting import rccl_log
from rocmtrain_train.reporting.console_sink import ConsoleSink
from rocmtrain_train.reporting.driver_report import Aggregator, Reporter, summary
from rocmtrain_train.reporting.jsonl_sink import JsonlSink
from rocmtrain_train.reporting.rank_report import FileTruncation, RankReport
from rocmtrain_train.reporting.rccl_debug import RCCL_DIR_PREFIX, RcclDebug
from train.jobs import job, settings


def rank(r: int, evaluation: dict | None = None, **extra) -> RankReport:
    """Rank `r` of two, ten steps into a 40-step run, with `extra` fields changed."""
    base = {
        "rank": r,
        "world_size": 2,
        "step": 10,
        "total_steps": 40,
        "epoch": 0.25,
        "learning_rate": 1e-4,
        "samples": 160,
        "tokens": 6400,
        "train_seconds": 10.0 + r,
        "eval_seconds": 0.0,
        "data_wait_seconds": 0.5,
        "train_loss": 0.5 + r,
        "interval_samples": 32,
        "interval_loss_items": 32,
        "samples_per_second": 16.0,
        "tokens_per_second": 640.0,
        "data_wait_fraction": 0.1 * (r + 1),
        "cpu_utilization_percent": 95.0,
        "evaluation": evaluation or {},
    }
    return RankReport(**(base | extra))


def test_rank_reports_travel_as_plain_metrics_and_back():
    report = rank(0, {"eval_loss": 0.3, "eval_accuracy": 0.9}, final=True, model_path="/runs/x/model")
    metrics = report.to_metrics()
    assert json.loads(json.dumps(metrics)) == metrics  # Ray Train keeps reported metrics as JSON
    assert RankReport.from_metrics({**metrics, "added_by_ray": 1}) == report
    with pytest.raises(ValueError, match="not evaluation metrics: eval_accuracy_top5"):
        rank(0, {"eval_accuracy_top5": 0.9})


def test_ranks_are_combined():
    clock = Clock(100.0)
    aggregator = Aggregator(clock)
    aggregator.add([rank(0, step=5), rank(1, step=5)])
    clock.now += 50.0
    report = aggregator.add([rank(0, gpu_utilization_percent=80.0), rank(1, gpu_utilization_percent=60.0)])
    m, p = report.metrics, report.progress
    assert m.samples_per_second == 32.0 and m.tokens_per_second == 1280.0 and m.cpu_utilization_percent == 190.0
    assert m.train_loss == pytest.approx(1.0) and m.train_seconds == 11.0
    assert m.data_wait_fraction == pytest.approx(0.15)
    assert (m.gpu_utilization_percent, m.gpu_utilization_percent_min, m.gpu_utilization_percent_max) == (70, 60, 80)
    assert m.gpu_memory_peak_bytes is None  # not measured on CPUs: left out, never made up
    assert (p.step, p.total_steps, p.percent) == (10, 40, 25.0)
    assert p.eta_seconds == pytest.approx(30 * 50 / 5)  # 5 steps took 50 s, 30 to go
    assert not report.final


def test_the_train_loss_is_the_mean_over_what_each_rank_averaged_over():
    """A language model's ranks average over their tokens that carry loss, which differ from rank to rank: the
    job's loss is the mean over all those tokens, not the mean of the ranks' means."""
    report = Aggregator(Clock(100.0)).add(
        [rank(0, train_loss=1.0, interval_loss_items=10), rank(1, train_loss=2.0, interval_loss_items=30)]
    )
    assert report.metrics.train_loss == pytest.approx((1.0 * 10 + 2.0 * 30) / 40)


def test_parameter_counts_reach_the_status_metrics():
    report = Aggregator(Clock(100.0)).add(
        [rank(r, trainable_parameters=1_000, total_parameters=50_000) for r in (0, 1)]
    )
    assert (report.metrics.trainable_parameters, report.metrics.total_parameters) == (1_000, 50_000)


def test_metrics_keep_their_latest_value_and_the_final_report_has_whole_run_throughput():
    aggregator = Aggregator(Clock(100.0))
    evaluated = {"eval_accuracy": 0.9, "eval_loss": 0.3}
    aggregator.add([rank(0, evaluated), rank(1, evaluated)])
    aggregator.add([rank(0, train_loss=math.nan), rank(1, train_loss=math.nan)])
    final = aggregator.add([rank(0, step=40, final=True, interval_samples=0), rank(1, step=40, interval_samples=0)])
    assert final.final and final.metrics.eval_accuracy == 0.9
    assert final.metrics.train_loss is None  # a NaN loss is left out, and the last finite one never stands for it
    assert final.metrics.samples_per_second == pytest.approx(320 / 11.0)  # all samples over the longest rank
    assert final.progress.eta_seconds == 0.0


def test_summary_of_the_final_ranks():
    evaluated = {"eval_accuracy": 0.95, "eval_loss": 0.2}
    ranks = [rank(r, evaluated, step=40, epoch=1.0, model_path="/runs/x/model") for r in (0, 1)]
    out = summary(ranks, wall_seconds=60.0)
    assert out["eval_accuracy"] == 0.95 and out["world_size"] == 2 and out["steps"] == 40
    assert out["samples_per_second"] == pytest.approx(320 / 11.0)
    assert out["data_wait_fraction"] == pytest.approx(1.0 / 21.0)
    assert {"eval_loss", "train_seconds", "eval_seconds", "wall_seconds", "model_path"} <= out.keys()


def test_a_loss_that_is_not_a_number_is_left_out_of_the_status_logged_and_kept_in_the_summary(caplog):
    """One rank's NaN makes the job's loss NaN: the status cannot hold it, so the main log says it."""
    log = logging.getLogger("test.nan")
    reporter = Reporter([], log)
    with caplog.at_level(logging.INFO, logger="test.nan"):
        reporter.on_report([rank(0, {"eval_loss": 0.3}), rank(1, {"eval_loss": 0.3})], None)
        reporter.on_report([rank(0, {"eval_loss": math.nan}, step=20, train_loss=math.nan), rank(1, step=20)], None)
    assert "step 20: train_loss=nan, eval_loss=nan: not a number, left out of the status" in caplog.text
    aggregator = Aggregator(Clock(100.0))
    aggregator.add([rank(0, {"eval_loss": 0.3}), rank(1)])
    report = aggregator.add([rank(0, {"eval_loss": math.inf}), rank(1, train_loss=math.nan)])
    assert report.metrics.train_loss is None and report.metrics.eval_loss is None
    assert aggregator.not_finite == {"train_loss": pytest.approx(math.nan, nan_ok=True), "eval_loss": math.inf}
    assert math.isnan(summary([rank(0, {"eval_loss": math.nan}, final=True), rank(1)], 1.0)["eval_loss"])


def test_what_max_seq_length_did_reaches_the_main_log_once_the_summary_and_the_status(caplog):
    files = [
        FileTruncation("train", "data/train.jsonl", 128, 3, 8, 64, "cut"),
        FileTruncation("eval", "data/eval.jsonl", 16, 0, 0, 64, "cut"),
    ]
    ranks = [rank(r, truncation=files) for r in (0, 1)]
    assert RankReport.from_metrics(json.loads(json.dumps(ranks[0].to_metrics()))) == ranks[0]
    log = logging.getLogger("test.truncation")
    with caplog.at_level(logging.INFO, logger="test.truncation"):
        reporter = Reporter([], log)
        for _ in range(2):
            reporter.on_report(ranks, None)
    line = (
        "train data data/train.jsonl: of 128 records, 8 dropped (nothing to learn within maxSeqLength 64, "
        "data.truncation: cut), 3 cut at the end to maxSeqLength 64"
    )
    assert caplog.text.count(line) == 1 and "data/eval.jsonl" not in caplog.text  # nothing lost there
    assert [r.levelname for r in caplog.records if r.message == line] == ["WARNING"]
    metrics = Aggregator(Clock(100.0)).add(ranks).dump()["metrics"]
    assert (metrics["recordsCut"], metrics["recordsDropped"]) == (3, 8)
    assert summary(ranks, 1.0)["truncation"]["train"] == {
        "uri": "data/train.jsonl",
        "records": 128,
        "cut": 3,
        "dropped": 8,
        "max_length": 64,
        "truncation": "cut",
    }
    assert "recordsCut" not in Aggregator(Clock(100.0)).add([rank(0), rank(1)]).dump()["metrics"]  # a classifier


class Failing:
    def emit(self, report: ProgressReport) -> None:
        raise ConnectionError("endpoint down")

    def close(self) -> None:
        pass


def test_reporter_logs_key_events_and_survives_a_failing_sink(tmp_path, caplog):
    log = logging.getLogger("test.reporter")
    jsonl = JsonlSink(tmp_path / "metrics.jsonl")
    console = io.StringIO()
    reporter = Reporter([Failing(), jsonl, ConsoleSink(console, progress_bar=False)], log)
    with caplog.at_level(logging.INFO, logger="test.reporter"):
        reporter.on_report([rank(0, {"eval_accuracy": 0.8}, epoch_end=True), rank(1)], "/runs/x/checkpoint_1")
        reporter.on_failure({1: "ActorDiedError: worker died"})
        reporter.on_report([rank(0, resumed_from_step=10), rank(1)], None)
        reporter.on_report([rank(0, step=40, final=True, model_path="/runs/x/model"), rank(1, step=40)], None)
    reporter.close()
    text = caplog.text
    for event in (
        "epoch 0 finished at step 10",
        "evaluation at step 10: eval_accuracy=0.8000",
        "checkpoint at step 10: /runs/x/checkpoint_1",
        "worker failure on rank 1: ActorDiedError",
        "resumed from the checkpoint at step 10",
        "completed at step 40",
        "progress sink Failing failed: endpoint down",
    ):
        assert event in text
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[-1])["final"] is True
    assert "totalSteps" in json.loads(lines[0])["progress"]  # the wire form, camelCase
    assert reporter.failures == 1 and reporter.final_ranks is not None
    reported = [json.loads(line) for line in lines]
    assert "workerFailures" not in reported[0], "no failure, no field (older endpoints refuse unknown ones)"
    assert reported[1]["workerFailures"] == 1 and reported[1]["resumedFromStep"] == 10
    assert "eval accuracy" in console.getvalue() and "step 10/40" in console.getvalue()


def test_rank_zero_network_reaches_every_report_and_the_main_log_once(caplog):
    """Rank 0's network is written by hand here (no RCCL runs in the tests; see tests/unit/test_rccl_log.py)."""
    roce = {"transport": "IB", "devices": ["mlx5_0:1"], "link": "RoCE"}
    log = logging.getLogger("test.network")
    reporter = Reporter([], log)
    aggregator = Aggregator()
    with caplog.at_level(logging.INFO, logger="test.network"):
        for step in (10, 20):
            reporter.on_report([rank(0, step=step, network=roce), rank(1, step=step)], None)
    assert caplog.text.count("RCCL transport: IB over mlx5_0:1 (RoCE)") == 1
    assert aggregator.add([rank(0, network=roce), rank(1)]).dump()["network"] == roce
    assert "network" not in aggregator.add([rank(0), rank(1)]).dump(), "CPU runs, or a log that does not tell"


@pytest.mark.parametrize(("use_gpu", "world_rank", "writes"), [(True, 0, True), (True, 1, False), (False, 0, False)])
def test_rank_zero_on_gpus_has_rccl_write_its_init_and_net_lines_to_its_log_folder(
    monkeypatch, tmp_path, use_gpu, world_rank, writes
):
    """Only the variables are checked: no RCCL runs here. Other ranks, and gloo on CPUs, keep the pod's WARN."""
    monkeypatch.setenv("NCCL_DEBUG", "WARN")  # what the operator renders on GPU pods
    for name in ("NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)  # restored (unset) after the test, whatever the code under test set
    run = dataclasses.replace(settings(job("rccl"), tmp_path), use_gpu=use_gpu)
    template = rccl_log_file(run, world_rank)
    assert template == (str(Path(run.log_dir) / rccl_log.RCCL_LOG_NAME) if writes else None)
    assert os.environ.get("NCCL_DEBUG_FILE") == template
    assert os.environ["NCCL_DEBUG"] == ("INFO" if writes else "WARN")
    assert os.environ.get("NCCL_DEBUG_SUBSYS") == ("INIT,NET" if writes else None)


class WorkerGroup:
    """Ray Train's worker group as `RcclDebug` sees it: its resources per worker, and a call on one worker
    (run here, in this process)."""

    def __init__(self, gpus: float) -> None:
        self.gpus = gpus
        self.called: list[int] = []

    def get_resources_per_worker(self) -> dict[str, float]:
        return {"CPU": 2.0, **({"GPU": self.gpus} if self.gpus else {})}

    def execute_single(self, rank: int, fn) -> None:
        self.called.append(rank)
        fn()


@pytest.mark.parametrize(("gpus", "writes"), [(1.0, True), (0.0, False)])
def test_own_codes_rank_zero_on_gpus_has_rccl_write_its_init_and_net_lines_to_a_folder_of_its_own(
    monkeypatch, tmp_path, gpus, writes
):
    """Only the variables are checked: no RCCL runs here. The user's own settings win (`debug_env`'s rules,
    tests/unit/test_rccl_log.py)."""
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    for name in ("NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    group = WorkerGroup(gpus)
    RcclDebug().after_worker_group_start(group)  # type: ignore[arg-type]
    assert group.called == ([0] if writes else [])
    written = os.environ.get("NCCL_DEBUG_FILE")
    assert os.environ["NCCL_DEBUG"] == ("INFO" if writes else "WARN")
    if writes:
        assert written is not None
        folder = Path(written).parent
        assert folder.parent == tmp_path and folder.name.startswith(RCCL_DIR_PREFIX) and folder.is_dir()
        assert Path(written).name == rccl_log.RCCL_LOG_NAME
    else:
        assert written is None


def test_the_sdks_run_config_sets_rccls_log_up_beside_the_users_callbacks(monkeypatch, tmp_path):
    monkeypatch.setenv(STORAGE_PATH_ENV, str(tmp_path / "ns" / "job"))
    monkeypatch.setenv(MAX_WORKER_FAILURES_ENV, "2")
    monkeypatch.setenv(CHECKPOINTS_TO_KEEP_ENV, "2")
    theirs = UserCallback()
    callbacks = sdk.run_config(callbacks=[theirs]).callbacks
    assert [type(c) for c in callbacks] == [RcclDebug, UserCallback] and callbacks[1] is theirs
    assert [type(c) for c in sdk.run_config().callbacks] == [RcclDebug]
