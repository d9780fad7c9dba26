"""Scripts that nobody here wrote (tests/own_code/outside), run through `rocmtrain run` as a new user would: Ray's
transformers example (the one behind AMD's blog on Ray Train and ROCm), TRL's SFT script and Ray's linear example,
unchanged but for hub access.

Real parts: `rocmtrain run` as a command, each script as its child process with its own Ray where it starts one,
transformers' KubeflowCallback, TRL's SFTTrainer. Stand-ins: the hub's models and data sets (tiny models built
from a config, generated data: tests/own_code/outside/stand_ins.py). The runs cannot share one Ray: the
environment contract (the progress channel among it) reaches Ray's workers as they inherit it from the command's
Ray, which the command starts. So the three commands run side by side, each with its own Ray, and each test
checks its own (`runs`). Ray's transformers example also runs on the world (tests/e2e/test_training.py).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from own_code.outside import stand_ins

pytestmark = pytest.mark.ray

ROCMTRAIN = Path(sys.executable).parent / "rocmtrain"
# Two CPU workers, as the scripts' own ScalingConfig asks.
RESOURCES = {"workers": 2, "gpusPerWorker": 0, "cpusPerWorker": "1", "memoryPerWorker": "2Gi"}


@dataclass(frozen=True)
class Run:
    """A finished `rocmtrain run`: its folder, its output and the summary it wrote."""

    folder: Path
    stdout: str
    stderr: str
    summary: dict[str, Any]


def start_run(folder: Path, name: str, code: dict[str, Any]) -> subprocess.Popen[bytes]:
    """`rocmtrain run` of a job running `code` in `folder` (its HOME too, so that Ray Train's default storage
    lies there), started, its output going to the folder's `stdout` and `stderr`."""
    job = {
        "apiVersion": "rocmtrain.dev/v1alpha1",
        "kind": "RocmTrainingJob",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"code": code, "resources": RESOURCES},
    }
    (folder / "job.yaml").write_text(yaml.safe_dump(job))
    argv = [str(ROCMTRAIN), "run", str(folder / "job.yaml"), "--storage", str(folder / "runs")]
    argv += ["--summary", str(folder / "summary.json")]
    env = {**os.environ, "HOME": str(folder)}
    with (folder / "stdout").open("w") as out, (folder / "stderr").open("w") as err:  # no pipe to fill
        return subprocess.Popen(argv, env=env, stdout=out, stderr=err)


def trl_arguments(folder: Path) -> list[str]:
    """The SFT script's own arguments: local folders for the hub's, CPUs, a few steps (fewer than its
    logging_steps of 10: the loss arrives as the run's mean train_loss at the end)."""
    model, chats = stand_ins.sft_model_and_data(folder)
    args = ["--model_name_or_path", str(model), "--dataset_name", str(chats), "--output_dir", str(folder / "out")]
    return [*args, "--use_cpu", "--max_steps", "6", "--per_device_train_batch_size", "8"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """The three scripts, each through `rocmtrain run` in a folder of its own, all at once; each must succeed."""
    folders = {name: tmp_path_factory.mktemp(name) for name in ("ray-example", "trl-sft", "linear")}
    ray_example = stand_ins.ray_example(folders["ray-example"])
    codes = {
        "ray-example": {"command": ["python", ray_example.name], "workingDir": str(folders["ray-example"])},
        "trl-sft": {"command": ["python", str(stand_ins.HERE / "sft.py"), *trl_arguments(folders["trl-sft"])]},
        "linear": {"command": ["python", str(stand_ins.HERE / "torch_linear_example.py"), "--epochs", "1"]},
    }
    started = {name: start_run(folders[name], name, code) for name, code in codes.items()}
    found = {}
    for name, process in started.items():
        process.wait(timeout=600)
        folder = folders[name]
        out, err = (folder / "stdout").read_text(), (folder / "stderr").read_text()
        assert process.returncode == 0, f"{name}: {err[-4000:]}"
        found[name] = Run(folder, out, err, json.loads((folder / "summary.json").read_text()))
    return found


def assert_loss_and_progress(summary: dict, steps: int) -> None:
    """The run's last report: every step done, and the loss field filled."""
    assert summary["final"] and summary["progress"]["percent"] == 100, summary
    assert summary["progress"]["step"] == steps == summary["progress"]["totalSteps"], summary["progress"]
    assert math.isfinite(summary["metrics"]["trainLoss"]) and summary["metrics"]["trainLoss"] > 0, summary["metrics"]


def test_rays_transformers_example_trains_with_its_loss_and_tells_where_ray_kept_it(runs: dict[str, Run]) -> None:
    run = runs["ray-example"]
    summary = run.summary
    # 1,000 reviews, 3 epochs of 8 a step: on CPUs each worker trains them all (transformers' parallel_mode is
    # not DISTRIBUTED there), and reports as rank 0 of its own.
    assert_loss_and_progress(summary, 375)
    assert summary["metrics"]["evalAccuracy"] >= 0
    custom = {m["name"] for m in summary["metrics"].get("custom", [])}
    assert "train_loss" not in custom, "the run's mean train_loss is the loss field's"
    assert f"done: {summary['reports']} progress reports" in run.stdout
    assert "note: Ray Train kept this run in its default storage" in run.stderr


def test_trls_sft_script_trains_with_its_loss(runs: dict[str, Run]) -> None:
    run = runs["trl-sft"]
    assert_loss_and_progress(run.summary, 6)
    assert "Training completed." in run.stdout and (run.folder / "out" / "config.json").is_file()


def test_rays_linear_example_trains_with_its_loss(runs: dict[str, Run]) -> None:
    run = runs["linear"]
    assert any(line.startswith("{'loss': ") for line in run.stdout.splitlines()), "the script's own end"
    # Ray Train's reports (ray.train.report) are the script's only ones: they fill the loss field too.
    assert math.isfinite(run.summary.get("metrics", {}).get("trainLoss", math.nan)), run.summary
