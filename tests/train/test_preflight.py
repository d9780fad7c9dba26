"""Bad jobs fail on the driver before any worker starts, with a message naming the problem.

These use the real model files and the real quickstart data; only the faulty part is changed.
"""

from __future__ import annotations

import time

import pytest
import yaml

from rocmtrain_train import cli, local
from rocmtrain_train.config import ConfigError
from rocmtrain_train.preflight import preflight
from train.jobs import EXAMPLES, job, settings


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"data": {"textField": "body"}}, r"train.jsonl: no field 'body' \(fields: text, label\)"),
        ({"model": {"numLabels": 2}}, r"label 2 out of range 0\.\.1"),
        ({"data": {"train": {"uri": "./data/missing.jsonl"}}}, "missing.jsonl: no such file or folder"),
        ({"model": {"source": "/nonexistent/model"}}, "model not found: /nonexistent/model has no config.json"),
        ({"resources": {"workers": 3}, "data": {"train": {"maxSamples": 2}}}, "2 training records for 3 workers"),
    ],
)
def test_bad_jobs_are_named(tmp_path, spec, message):
    with pytest.raises(ConfigError, match=message):
        preflight(settings(job("bad", spec), tmp_path))


def test_an_empty_data_set_is_refused(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("")
    bad = job("empty", {"data": {"train": {"uri": "./data/train.jsonl"}, "eval": None}})
    with pytest.raises(ConfigError, match=r"train\.jsonl: no records"):
        preflight(settings(bad, tmp_path / "runs", job_dir=tmp_path))


def test_an_unreadable_file_is_refused(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"text": "fine", "label": 1}\n{"text": broken\n')
    bad = job("corrupt", {"data": {"train": {"uri": str(tmp_path / "train.jsonl")}}})
    with pytest.raises(ConfigError, match=r"cannot read .*train\.jsonl as jsonl"):
        preflight(settings(bad, tmp_path / "runs"))


def test_a_hub_model_that_is_neither_installed_nor_cached_is_refused_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    bad = job("nomodel", {"model": {"source": "example-org/no-such-model"}})
    with pytest.raises(ConfigError, match=r"model 'example-org/no-such-model' not found.*HF_HUB_OFFLINE"):
        preflight(settings(bad, tmp_path))


def test_more_gpus_than_the_machine_has_is_refused(tmp_path):
    greedy = job("greedy", {"resources": {"workers": 2, "gpusPerWorker": 16}})
    with pytest.raises(
        ConfigError, match=r"asks for 32 GPUs \(2 workers x 16 GPUs per worker\) but this machine has 1"
    ):
        preflight(settings(greedy, tmp_path), available_gpus=1)


def test_the_cli_fails_fast_without_starting_training(tmp_path, monkeypatch, capsys):
    """`rocmtrain run` on a job asking for 32 GPUs: this machine's real GPU count is checked (no machine has 32)."""

    def no_training(*args, **kwargs):
        raise AssertionError("training must not start")

    monkeypatch.setattr(local, "run", no_training)
    raw = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    raw["spec"]["resources"].update(workers=2, gpusPerWorker=16)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(raw))
    started = time.perf_counter()
    assert cli.main([str(tmp_path / "job.yaml"), "--storage", str(tmp_path / "runs")]) == 2
    assert time.perf_counter() - started < 30
    err = capsys.readouterr().err
    assert "asks for 32 GPUs (2 workers x 16 GPUs per worker)" in err and "--cpu" in err
