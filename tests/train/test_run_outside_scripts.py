"""Scripts that nobody here wrote (tests/own_code/outside), run through `rocmtrain run` as a new user would: Ray's
transformers example (the one behind AMD's blog on Ray Train and ROCm), TRL's SFT script and Ray's linear example,
unchanged but for hub access.

Real parts: `rocmtrain run` as a command, each script as its child process with its own Ray where it starts one,
transformers' KubeflowCallback, TRL's SFTTrainer. Stand-ins: the hub's models and data sets (tiny models built
from a config, generated data: tests/own_code/outside/stand_ins.py). The runs cannot share one Ray: the
environment contract (the progress channel among it) reaches Ray's workers as they inherit it from the command's
Ray, which the command starts. Ray's transformers example also runs on the world (tests/e2e/test_training.py).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from own_code.outside import stand_ins

pytestmark = pytest.mark.ray

ROCMTRAIN = Path(sys.executable).parent / "rocmtrain"
# Two CPU workers, as the scripts' own ScalingConfig asks.
RESOURCES = {"workers": 2, "gpusPerWorker": 0, "cpusPerWorker": "1", "memoryPerWorker": "2Gi"}


def rocmtrain_run(folder: Path, name: str, code: dict[str, Any]) -> tuple[subprocess.CompletedProcess, dict]:
    """`rocmtrain run` of a job running `code` in `folder` (its HOME too, so that Ray Train's default storage
    lies there); the finished process and its summary."""
    job = {
        "apiVersion": "rocmtrain.dev/v1alpha1",
        "kind": "RocmTrainingJob",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"code": code, "resources": RESOURCES},
    }
    (folder / "job.yaml").write_text(yaml.safe_dump(job))
    argv = [str(ROCMTRAIN), "run", str(folder / "job.yaml"), "--storage", str(folder / "runs")]
    summary = folder / "summary.json"
    env = {**os.environ, "HOME": str(folder)}
    done = subprocess.run([*argv, "--summary", str(summary)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done, json.loads(summary.read_text())


def assert_loss_and_progress(summary: dict, steps: int) -> None:
    """The run's last report: every step done, and the loss field filled."""
    assert summary["final"] and summary["progress"]["percent"] == 100, summary
    assert summary["progress"]["step"] == steps == summary["progress"]["totalSteps"], summary["progress"]
    assert math.isfinite(summary["metrics"]["trainLoss"]) and summary["metrics"]["trainLoss"] > 0, summary["metrics"]


def test_rays_transformers_example_trains_with_its_loss_and_tells_where_ray_kept_it(tmp_path: Path) -> None:
    script = stand_ins.ray_example(tmp_path)
    code = {"command": ["python", script.name], "workingDir": str(tmp_path)}
    done, summary = rocmtrain_run(tmp_path, "ray-example", code)
    # 1,000 reviews, 3 epochs of 8 a step: on CPUs each worker trains them all (transformers' parallel_mode is
    # not DISTRIBUTED there), and reports as rank 0 of its own.
    assert_loss_and_progress(summary, 375)
    assert summary["metrics"]["evalAccuracy"] >= 0
    custom = {m["name"] for m in summary["metrics"].get("custom", [])}
    assert "train_loss" not in custom, "the run's mean train_loss is the loss field's"
    assert f"done: {summary['reports']} progress reports" in done.stdout
    assert "note: Ray Train kept this run in its default storage" in done.stderr


def test_trls_sft_script_trains_with_its_loss(tmp_path: Path) -> None:
    model, chats = stand_ins.sft_model_and_data(tmp_path)
    script = stand_ins.HERE / "sft.py"
    # The script's own arguments: local folders for the hub's, CPUs, a few steps (fewer than its logging_steps
    # of 10: the loss arrives as the run's mean train_loss at the end).
    args = ["--model_name_or_path", str(model), "--dataset_name", str(chats), "--output_dir", str(tmp_path / "out")]
    args += ["--use_cpu", "--max_steps", "6", "--per_device_train_batch_size", "8"]
    done, summary = rocmtrain_run(tmp_path, "trl-sft", {"command": ["python", str(script), *args]})
    assert_loss_and_progress(summary, 6)
    assert "Training completed." in done.stdout and (tmp_path / "out" / "config.json").is_file()


def test_rays_linear_example_trains_with_its_loss(tmp_path: Path) -> None:
    script = stand_ins.HERE / "torch_linear_example.py"
    done, summary = rocmtrain_run(tmp_path, "linear", {"command": ["python", str(script), "--epochs", "1"]})
    assert any(line.startswith("{'loss': ") for line in done.stdout.splitlines()), "the script's own end"
    # Ray Train's reports (ray.train.report) are the script's only ones: they fill the loss field too.
    assert math.isfinite(summary.get("metrics", {}).get("trainLoss", math.nan)), summary
