"""`rocmtrain run` of a job's own code (spec.code): the cluster's environment contract and progress endpoints,
on this machine.

Real parts: `rocmtrain run` as a command, the scripts of tests/own_code as child processes, a plain Hugging Face
`Trainer` with transformers' own KubeflowCallback, `rocmtrain_train.sdk`, a tiny BERT built from a config. The
scripts run their training in the driver (`--in-driver`): Ray Train runs them on the test world
(tests/e2e/test_training.py), and these tests start no Ray. Also here: the loopback endpoint's count of steps
that went backwards, and Ray Train's default storage (its RunConfig, read in a child process) with what a
run kept there is told.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from own_code.expected import SDK_STEPS_LAST_METRICS, SDK_STEPS_LAST_PROGRESS
from rocmtrain.api.contract import KUBEFLOW_URL_ENV, PROGRESS_URL_ENV
from rocmtrain.api.models import ProgressReport, RocmTrainingJob
from rocmtrain.api.tracebacks import USER_FRAMES
from rocmtrain_train.driver import own_code
from rocmtrain_train.reporting.local_endpoint import LocalEndpoint
from train.conftest import save_tiny_bert

SCRIPTS = Path(__file__).resolve().parents[1] / "own_code"
DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
ROCMTRAIN = Path(sys.executable).parent / "rocmtrain"
PWNED = Path(tempfile.gettempdir()) / f"pwned-by-rocmtrain-run-{uuid.uuid4().hex}"
HOSTILE = ["it's", f"$(touch {PWNED})", "a\nb", "`id`", "", "; exit 3"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def run_job(folder: Path, command: list[str], model: Path, **spec: Any) -> tuple[subprocess.CompletedProcess, Path]:
    """`rocmtrain run` of a job running `command`, its runs in `folder`; the finished process and its summary."""
    job = {
        "apiVersion": "rocmtrain.dev/v1alpha1",
        "kind": "RocmTrainingJob",
        "metadata": {"name": "own", "namespace": "ml"},
        "spec": {
            "code": {"command": command},
            "model": {"source": str(model), "numLabels": 3, "maxSeqLength": 32},
            "data": {"train": {"uri": str(DATA / "train.jsonl"), "maxSamples": 48}},
            "training": {"epochs": 1, "batchSizePerWorker": 8, "learningRate": 1e-4},
            "resources": {
                "workers": 2,
                "gpusPerWorker": 0,
                "cpusPerWorker": "1",
                "memoryPerWorker": "2Gi",
                "sharedMemory": "256Mi",
            },
            **spec,
        },
    }
    (folder / "job.yaml").write_text(yaml.safe_dump(job))
    summary = folder / "summary.json"
    argv = [
        str(ROCMTRAIN),
        "run",
        str(folder / "job.yaml"),
        "--storage",
        str(folder / "runs"),
        "--summary",
        str(summary),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False), summary


def test_a_plain_hugging_face_trainer_reports_through_its_own_callback(tmp_path: Path, model: Path) -> None:
    done, summary = run_job(tmp_path, ["python", str(SCRIPTS / "hf_trainer.py"), "--in-driver"], model)
    assert done.returncode == 0, done.stderr
    reported = json.loads(summary.read_text())
    assert reported["reports"] >= 2 and reported["final"], "the callback's first and last report at least"
    assert (
        reported["progress"]["percent"] == 100
        and reported["progress"]["step"] == 6 == reported["progress"]["totalSteps"]
    )
    assert reported["metrics"]["trainLoss"] > 0 and reported["metrics"]["samplesPerSecond"] > 0
    custom = {m["name"] for m in reported["metrics"]["custom"]}
    assert "grad_norm" in custom and "train_loss" not in custom, "the run's mean train_loss is the loss field's"
    lines = (tmp_path / "runs" / "own" / "logs" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == reported["reports"]
    assert "train loss" in done.stderr and f"done: {reported['reports']} progress reports" in done.stdout


def test_the_sdk_reports_every_step_and_hostile_arguments_arrive_as_written(tmp_path: Path, model: Path) -> None:
    command = ["python", str(SCRIPTS / "sdk_steps.py"), "--in-driver", *HOSTILE]
    done, summary = run_job(tmp_path, command, model, env=[{"name": "STEP_SECONDS", "value": "0.05"}])
    assert done.returncode == 0, done.stderr
    run = tmp_path / "runs" / "own"
    assert json.loads((run / "argv.json").read_text()) == ["--in-driver", *HOSTILE]
    assert not PWNED.exists()
    reported = json.loads(summary.read_text())
    assert reported["reports"] == 8 and reported["final"]
    assert reported["progress"] == SDK_STEPS_LAST_PROGRESS and reported["metrics"] == SDK_STEPS_LAST_METRICS


def test_a_failing_script_fails_the_run_with_its_error_line_and_frame_first(tmp_path: Path, model: Path) -> None:
    done, _ = run_job(tmp_path, ["python", str(SCRIPTS / "fails.py"), "--in-driver"], model)
    assert done.returncode == 1
    explained = done.stderr.split("training failed: ", 1)[1].splitlines()
    assert explained[0] == "ValueError: label 7 out of range 0..2"
    end = explained.index("(the command exited with 1)")
    assert end <= 1 + 2 * USER_FRAMES, "the error and the user's innermost frames"
    assert explained[end - 2 : end] == [
        f'  File "{SCRIPTS / "fails.py"}", line 10, in check',
        '    raise ValueError(f"label {label} out of range 0..2")',
    ]


def test_a_script_that_reports_nothing_runs_with_the_contract(tmp_path: Path, model: Path) -> None:
    done, summary = run_job(tmp_path, ["python", str(SCRIPTS / "silent.py"), "--in-driver"], model)
    assert done.returncode == 0, done.stderr
    assert json.loads(summary.read_text()) == {"reports": 0}
    seen = json.loads((tmp_path / "runs" / "own" / "contract.json").read_text())["driver"]
    assert seen["ROCMTRAIN_WORLD_SIZE"] == "2" and seen["ROCMTRAIN_GPUS_PER_WORKER"] == "0"
    assert seen["ROCMTRAIN_STORAGE_PATH"] == str(tmp_path / "runs" / "own")
    assert (seen["ROCMTRAIN_JOB_NAME"], seen["ROCMTRAIN_JOB_NAMESPACE"]) == ("own", "ml")
    assert json.loads(seen["ROCMTRAIN_MODEL"])["source"] == str(model)
    assert seen[PROGRESS_URL_ENV].startswith("http://127.0.0.1:") and seen[PROGRESS_URL_ENV].endswith("/progress")
    assert seen[KUBEFLOW_URL_ENV].endswith("/v1/namespaces/ml/rocmtrainingjobs/own/trainerstatus")
    assert Path(seen["ROCMTRAIN_PROGRESS_TOKEN"]).parent.name.startswith("rocmtrain-progress-")
    assert not Path(seen["ROCMTRAIN_PROGRESS_TOKEN"]).exists(), "the token goes with the run"


class Kept:
    """A sink that keeps what it is given."""

    def __init__(self) -> None:
        self.reports: list[ProgressReport] = []

    def emit(self, report: ProgressReport) -> None:
        self.reports.append(report)

    def close(self) -> None:
        """Nothing to close."""


def test_reports_whose_step_goes_backwards_are_explained_as_not_data_parallel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two copies of one Trainer, each rank 0 of its own, as `rocmtrain run`'s endpoint gets their KEP-2779
    reports: each starts (no step), then their steps interleave."""
    kept = Kept()
    endpoint = LocalEndpoint("ml", "own", [kept], tmp_path)
    token = endpoint.token_file.read_text()
    try:
        for step in (None, None, 2, 1, 4, 3, 5):
            metrics = [{"name": "total_steps", "value": "6"}] + (
                [{"name": "current_step", "value": str(step)}] if step is not None else []
            )
            body = json.dumps({"trainerStatus": {"progressPercentage": 0, "metrics": metrics}}).encode()
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            url = endpoint.trainer_status_url  # the loopback endpoint's http URL
            post = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310
            with urllib.request.urlopen(post, timeout=30) as answer:  # noqa: S310
                assert answer.status == 204
    finally:
        endpoint.close()
    assert endpoint.backward_steps == 2 and len(kept.reports) == 7
    warned = capsys.readouterr().err
    assert warned.count("warning: the reported step went backwards 2 times") == 1 and "full copy" in warned
    summary = own_code.CodeOutcome(kept.reports[-1], 7, endpoint.backward_steps).summary
    assert summary["backwardSteps"] == 2


# ---- Ray Train's default storage ----------------------------------------------------------------------------


def test_ray_trains_default_storage_is_homes_ray_results_whatever_ray_storage_says(tmp_path: Path) -> None:
    """What the operator's HOME on the head (`rocmtrain.render.env.code_home`) and the local note rely on: Ray
    2.60's RunConfig takes its default from HOME (RAY_STORAGE is Ray Train v1's), and marks each run's folder."""
    probe = (
        "from ray.train import RunConfig; from ray.train.v2._internal.constants import "
        "VALIDATE_STORAGE_MARKER_FILENAME as m; print(RunConfig().storage_path, m)"
    )
    env = {**os.environ, "HOME": str(tmp_path), "RAY_STORAGE": str(tmp_path / "elsewhere")}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == [str(tmp_path / own_code.RAY_RESULTS), own_code.STORAGE_MARKER]


def test_a_run_in_ray_trains_default_storage_is_told_what_that_does_on_a_cluster(tmp_path: Path) -> None:
    runs = tmp_path / own_code.RAY_RESULTS
    for name, age in (("TorchTrainer_old", 3600), ("TorchTrainer_new", 0)):
        (runs / name).mkdir(parents=True)
        marker = runs / name / own_code.STORAGE_MARKER
        marker.touch()
        os.utime(marker, (time.time() - age, time.time() - age))
    found = own_code.default_storage_runs(tmp_path, time.time() - 60)
    assert found == [runs / "TorchTrainer_new"], "runs of earlier commands are not this one's"
    job = RocmTrainingJob.model_validate(
        {"metadata": {"name": "own"}, "spec": {"code": {"command": ["python", "t.py"]}, "checkpoint": {}}}
    )
    on_volume = own_code.default_storage_note(job, "/runs/own", found)
    assert on_volume is not None and on_volume.startswith("note:") and "shared by every pod" in on_volume
    in_bucket = RocmTrainingJob.model_validate(
        {"metadata": {"name": "own"}, "spec": {**job.spec.dump(), "checkpoint": {"storagePath": "s3://bucket/runs"}}}
    )
    warned = own_code.default_storage_note(in_bucket, "s3://bucket/runs/default/own", found)
    assert warned is not None and warned.startswith("warning:") and "storage_path='s3://bucket/runs'" in warned
    assert own_code.default_storage_note(job, "/runs/own", []) is None
