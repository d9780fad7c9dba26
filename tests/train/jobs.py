"""Small variants of the quickstart job for the training tests, and their local-run settings; the local examples
run with the commands their headers give."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from rocmtrain import cli
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain_train.cli import run as run_command
from rocmtrain_train.config import RunSettings, local_settings
from unit.samples import documented_commands

if TYPE_CHECKING:
    from rocmtrain_train.search.tune_trials import SearchOutcome
    from rocmtrain_train.trainer.torch_trainer import RunOutcome

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUICKSTART = EXAMPLES / "quickstart.yaml"
# Small and quick, yet enough for the real MiniLM to learn much of the quickstart task.
FAST: dict[str, Any] = {
    "model": {"maxSeqLength": 64},
    "data": {"train": {"maxSamples": 960}, "eval": {"maxSamples": 200}},
    "training": {"epochs": 1, "batchSizePerWorker": 16, "learningRate": 2.0e-4},
}


def example_script(name: str, folder: str = "sft") -> ModuleType:
    """A script of examples/sft (the language-model example's data generator or model maker), or of another
    folder of examples/ (data: the reviews' generator), as a module."""
    path = EXAMPLES / folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{folder}_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged in, recursively (a copy)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def job(name: str, *specs: dict[str, Any], model: Path | None = None) -> RocmTrainingJob:
    """The quickstart job under another name, with the FAST settings and then `specs` merged into its spec;
    trained from the model folder `model` instead of MiniLM, if given."""
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["metadata"]["name"] = name
    for extra in (FAST, *specs, {"model": {"source": str(model)}} if model else {}):
        raw["spec"] = merge(raw["spec"], extra)
    return RocmTrainingJob.model_validate(raw)


def settings(training_job: RocmTrainingJob, storage: Path | None, *, job_dir: Path = EXAMPLES) -> RunSettings:
    """Local-run settings, reporting every second; storage in `storage`, else the job's storagePath."""
    return local_settings(
        training_job,
        job_dir=str(job_dir),
        run_id=uuid.uuid4().hex,
        storage=None if storage is None else str(storage),
        cpu_count=os.cpu_count() or 1,
        report_interval_s=1.0,
    )


# The fields of an example that a test may shrink to run it in seconds: how much it trains, never what or how.
SIZE_FIELDS = frozenset(
    {
        "model.maxSeqLength",
        "data.train.maxSamples",
        "data.eval.maxSamples",
        "training.epochs",
        "training.evalEverySteps",
        "evaluation.generate.records",
        "tuning.numTrials",
    }
)


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The values of a nested dict by their dotted paths."""
    found: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        found |= leaves(value, f"{path}.") if isinstance(value, dict) else {path: value}
    return found


def run_example(name: str, folder: Path, sizes: dict[str, Any]) -> tuple[RunSettings, RunOutcome | SearchOutcome]:
    """Runs the commands the header of examples/`name` gives (the README gives them too: tests/unit/test_cli.py),
    as written, in `folder`; the run's settings and outcome.

    `folder` gets a copy of examples/ as a checkout holds it (no model made yet), whose `name` has `sizes` merged
    into its spec and differs from the example in SIZE_FIELDS only. `python ...` runs as a process of its own;
    `rocmtrain run ...` runs in this one, through the `rocmtrain` command's own entry point, on the tests' embedded
    Ray, reporting every second as `settings` does.
    """
    shutil.copytree(EXAMPLES, folder / "examples", ignore=shutil.ignore_patterns("model", "runs", "__pycache__"))
    raw = yaml.safe_load((EXAMPLES / name).read_text())
    shrunk = {**raw, "spec": merge(raw["spec"], sizes)}
    before, after = leaves(raw["spec"]), leaves(shrunk["spec"])
    changed = {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}
    assert changed <= SIZE_FIELDS, f"not a size field: {sorted(changed - SIZE_FIELDS)}"
    (folder / "examples" / name).write_text(yaml.safe_dump(shrunk, sort_keys=False))
    ran: list[tuple[RunSettings, Any]] = []
    train = run_command._train

    def recorded(job: RocmTrainingJob, settings: RunSettings) -> Any:
        outcome = train(job, settings)
        ran.append((settings, outcome))
        return outcome

    with contextlib.chdir(folder), pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_command, "LOCAL_REPORT_INTERVAL_SECONDS", 1.0)
        patch.setattr(run_command, "_train", recorded)
        for command in documented_commands(name):
            program, *args = shlex.split(command)
            if program == "python":
                subprocess.run([sys.executable, *args], check=True, timeout=300)
            else:
                assert program == "rocmtrain" and cli.main(args) == 0, command
    (result,) = ran
    return result
