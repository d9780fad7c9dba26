"""Small variants of the quickstart job for the training tests, and their local-run settings."""

from __future__ import annotations

import copy
import importlib.util
import os
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain_train.config import RunSettings, local_settings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUICKSTART = EXAMPLES / "quickstart.yaml"
# Small and quick, yet enough for the real MiniLM to learn much of the quickstart task.
FAST: dict[str, Any] = {
    "model": {"maxSeqLength": 64},
    "data": {"train": {"maxSamples": 960}, "eval": {"maxSamples": 200}},
    "training": {"epochs": 1, "batchSizePerWorker": 16, "learningRate": 2.0e-4},
}


def example_script(name: str) -> ModuleType:
    """A script of examples/sft (the language-model example's data generator or model maker), as a module."""
    path = EXAMPLES / "sft" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"sft_{name}", path)
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
