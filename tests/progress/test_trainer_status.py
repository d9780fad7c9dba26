"""Kubeflow Trainer's progress protocol (KEP-2779) as transformers' own KubeflowCallback speaks it (no cluster).

Real parts: transformers' `KubeflowCallback` (5.23), driven through a run's callbacks as `Trainer` calls them,
its requests caught where it opens them (`urllib.request.urlopen`); the contract's parser and mapping.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.integrations.integration_utils import KubeflowCallback

from rocmtrain.api.contract import KUBEFLOW_TOKEN_ENV, KUBEFLOW_URL_ENV
from rocmtrain.api.models import MAX_CUSTOM_METRICS, ProgressReport
from rocmtrain.api.progress_body import MAX_BODY_BYTES, MAX_KEYS, BodyError, parse_report, parse_trainer_status
from rocmtrain.api.trainer_status import KUBEFLOW_FIELDS, KUBEFLOW_METRICS

URL = "https://rocmtrain-progress.ops:443/v1/namespaces/ml/rocmtrainingjobs/bert/trainerstatus"


class _Answer:
    status = 204

    def __enter__(self) -> _Answer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[urllib.request.Request]:
    """The requests KubeflowCallback makes, with the job's variables set as the operator sets them."""
    token = tmp_path / "token"
    token.write_text("projected-token\n")
    monkeypatch.setenv(KUBEFLOW_URL_ENV, URL)
    monkeypatch.setenv(KUBEFLOW_TOKEN_ENV, str(token))
    requests: list[urllib.request.Request] = []

    def urlopen(request: urllib.request.Request, **_: Any) -> _Answer:
        requests.append(request)
        return _Answer()

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return requests


def bodies(requests: list[urllib.request.Request]) -> list[bytes]:
    return [request.data for request in requests if isinstance(request.data, bytes)]


def test_the_trainer_registers_the_callback_when_the_url_is_set(sent: list[Any], tmp_path: Path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    assert "kubeflow" in args.report_to


def test_what_the_callback_sends_lands_in_the_status_fields(sent: list[urllib.request.Request], tmp_path: Path):
    callback = KubeflowCallback()
    callback._MIN_UPDATE_INTERVAL = 0.0  # its 5 s throttle: every call sends here
    args, control = TrainingArguments(output_dir=str(tmp_path), report_to="none"), TrainerControl()
    state = TrainerState(max_steps=40, is_world_process_zero=True)
    callback.on_train_begin(args, state, control)
    state.global_step, state.epoch = 12, 0.3
    callback.on_log(args, state, control, logs={"loss": 0.61, "grad_norm": 1.5, "learning_rate": 4e-5, "epoch": 0.3})
    callback.on_step_end(args, state, control)
    callback.on_log(args, state, control, logs={"eval_loss": 0.52, "eval_accuracy": 0.8, "eval_runtime": 2.5})
    state.global_step, state.epoch = 40, 1.0
    callback.on_log(args, state, control, logs={"train_runtime": 31.0, "train_samples_per_second": 41.3})
    callback.on_train_end(args, state, control)

    assert {request.full_url for request in sent} == {URL}
    assert {request.get_header("Authorization") for request in sent} == {"Bearer projected-token"}
    begin, step, end = (parse_trainer_status(body) for body in bodies(sent))
    assert begin.progress.model_dump(exclude_none=True) == {"total_steps": 40, "percent": 0}
    assert step.progress.step == 12 and step.progress.total_steps == 40 and step.progress.percent == 30
    assert step.progress.epoch == 0.3 and step.progress.eta_seconds is not None and not step.final
    assert (step.metrics.train_loss, step.metrics.learning_rate) == (0.61, 4e-5)
    assert [(m.name, m.value) for m in step.metrics.custom or []] == [("grad_norm", 1.5)]
    assert end.final and end.progress.percent == 100 and end.progress.eta_seconds == 0
    assert (end.metrics.eval_loss, end.metrics.eval_accuracy) == (0.52, 0.8)
    assert (end.metrics.train_seconds, end.metrics.samples_per_second) == (31.0, 41.3)
    assert {m.name for m in end.metrics.custom or []} == {"grad_norm", "eval_runtime"}


def test_every_mapped_name_fills_its_field() -> None:
    for name, (section, field) in KUBEFLOW_METRICS.items():
        value = "3" if section == "progress" else "0.5"
        report = parse_trainer_status(
            json.dumps({"trainerStatus": {"metrics": [{"name": name, "value": value}]}}).encode()
        )
        assert report.dump()[section] == {field: float(value)}, name


def kep(*metrics: tuple[str, str], **status: Any) -> bytes:
    return json.dumps({"trainerStatus": {"metrics": [{"name": n, "value": v} for n, v in metrics], **status}}).encode()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (kep(("loss", "nan")), "trainerStatus.metrics[0].value: non-finite"),
        (kep(("loss", "inf")), "non-finite"),
        (kep(("grad_norm", "-Infinity")), "non-finite"),
        (b'{"trainerStatus": {"progressPercentage": NaN}}', "non-finite"),
        (kep(("loss", "0.5"), ("loss", "0.4")), "duplicate name"),
        (kep(("loss", "fast")), "trainerStatus.metrics[0].value is not a number"),
        (kep(("eval_accuracy", "1.5")), "metrics.evalAccuracy (eval_accuracy)"),
        (kep(("current_step", "1.5")), "progress.step (current_step)"),
        (kep(*((f"m{i}", "1") for i in range(MAX_CUSTOM_METRICS + 1))), "at most 32"),
        (kep(*((f"m{i}", "1") for i in range(65))), "trainerStatus.metrics"),
        (kep(("bad name!", "1")), "trainerStatus.metrics.0.name"),
        (kep(("loss", "1" * 65)), "trainerStatus.metrics.0.value"),
        (kep(progressPercentage=101), "trainerStatus.progressPercentage"),
        (kep(estimatedRemainingSeconds=-1), "trainerStatus.estimatedRemainingSeconds"),
        (json.dumps({"trainerStatus": {}, "extra": 1}).encode(), "(unknown field)"),
        (json.dumps({"progress": {"step": 1}}).encode(), "trainerStatus"),
        (b"[]", "JSON object"),
        (kep(("pad", "1")) + b" " * MAX_BODY_BYTES, "larger than"),
    ],
    ids=[
        "nan", "inf", "minus-infinity", "nan-percentage", "duplicate", "not-a-number", "out-of-bounds",
        "fractional-step", "too-many-custom", "too-many-metrics", "bad-name", "long-value", "percentage",
        "negative-eta", "unknown-field", "our-own-protocol", "not-an-object", "too-large",
    ],
)  # fmt: skip
def test_what_is_refused_is_named_without_its_values(body: bytes, words: str) -> None:
    with pytest.raises(BodyError) as refused:
        parse_trainer_status(body)
    assert words in str(refused.value)
    assert "bad name!" not in str(refused.value) and "fast" not in str(refused.value)


def test_the_largest_reports_either_protocol_sends_parse() -> None:
    """A search's whole trial table with custom metrics, and a KEP-2779 report of 64 metrics: within MAX_KEYS."""
    config = {"learningRate": 1e-4, "batchSizePerWorker": 32, "warmupRatio": 0.1, "weightDecay": 0.01, "epochs": 3}
    trials = [
        {"id": f"search_{i:05d}", "state": "Running", "config": config, "metric": 0.5, "iterations": 9}
        for i in range(20)
    ]
    tuning = {
        "metric": "evalAccuracy",
        "mode": "max",
        "trialsTotal": 20,
        "trialsDone": 10,
        "trialsRunning": 10,
        "trialsPending": 0,
        "bestTrialId": "search_00001",
        "bestMetric": 0.5,
        "bestConfig": config,
        "bestCheckpoint": "s3://b/x",
        "trials": trials,
    }
    custom = [{"name": f"m{i}", "value": 1.0} for i in range(MAX_CUSTOM_METRICS)]
    ours = ProgressReport.model_validate(
        {"progress": {"step": 1}, "metrics": {"trainLoss": 0.1, "custom": custom}, "tuning": tuning}
    ).dump()
    body = json.dumps(ours).encode()
    assert len(body) < MAX_BODY_BYTES and parse_report(body).dump() == ours
    theirs = kep(*((name, "1") for name in KUBEFLOW_METRICS), *((f"m{i}", "1") for i in range(MAX_CUSTOM_METRICS)))
    assert len(parse_trainer_status(theirs).metrics.custom or []) == MAX_CUSTOM_METRICS
    assert MAX_KEYS >= 2 * 64 + 5


def test_the_guide_shows_every_mapping() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "own-code.md").read_text()
    rows = [line for line in guide.splitlines() if line.startswith("| `")]
    for name, (section, field) in KUBEFLOW_METRICS.items():
        assert any(f"`{name}`" in row and f"`{section}.{field}`" in row for row in rows), name
    for wire, field in KUBEFLOW_FIELDS.items():
        assert any(f"`{wire}`" in row and f"`progress.{field}`" in row for row in rows), wire
