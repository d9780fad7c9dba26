"""Data parallelism that can be checked number by number: a tiny BERT without dropout, in fp32, on Ray.

Each of these fails when gradients are not synchronised across ranks, when the learning-rate
scaling is not applied, or when gradient accumulation does not add up to the larger batch:
- two ranks x 16 records end with the weights of one rank x 32 (and of one rank x 16 x 2
  accumulation steps), up to float rounding;
- every rank ends with the same weights;
- the learning rate of every report is the scaled schedule's.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rocmtrain.api.models import ProgressReport
from rocmtrain_train.cli import run as cli
from rocmtrain_train.driver.train_job import run_local
from train.jobs import EXAMPLES, job, settings

pytestmark = pytest.mark.ray

SAMPLES, GLOBAL_BATCH = 256, 32
STEPS = SAMPLES // GLOBAL_BATCH
PEAK_LR = 1e-3
# The same run at every world size: fp32, no dropout (the model has none), a short warmup.
TINY = {
    "model": {"maxSeqLength": 64},
    "data": {"train": {"maxSamples": SAMPLES}, "eval": {"maxSamples": 64}},
    "training": {"epochs": 1, "warmupRatio": 0.25, "precision": "fp32"},
}


def tiny_job(name: str, model: Path, *specs: dict):
    return job(name, TINY, *specs, model=model)


def weights(model_path: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(model_path) / "model.safetensors"))


@pytest.fixture(scope="module")
def two_ranks(ray_local, tiny_bert, tmp_path_factory):
    """2 ranks x 16 records; learningRate is per rank of one, scaled linearly to the peak for 2."""
    spec = {
        "resources": {"workers": 2},
        "training": {"batchSizePerWorker": 16, "learningRate": PEAK_LR / 2, "lrScaling": "linear"},
    }
    run = settings(tiny_job("two-ranks", tiny_bert, spec), tmp_path_factory.mktemp("two"))
    return run, run_local(run, console=False)


@pytest.fixture(scope="module")
def one_rank(ray_local, tiny_bert, tmp_path_factory):
    """1 rank x 32 records, through `rocmtrain run` with a job file."""
    folder = tmp_path_factory.mktemp("one")
    spec = {"resources": {"workers": 1}, "training": {"batchSizePerWorker": GLOBAL_BATCH, "learningRate": PEAK_LR}}
    shutil.copytree(EXAMPLES / "data", folder / "data", ignore=shutil.ignore_patterns("*.py"))  # ./data/...
    (folder / "job.yaml").write_text(yaml.safe_dump(tiny_job("one-rank", tiny_bert, spec).dump()))
    code = cli.main([str(folder / "job.yaml"), "--storage", str(folder / "runs"), "--summary", str(folder / "s.json")])
    assert code == 0
    summary = json.loads((folder / "s.json").read_text())
    assert summary["model_path"] == str(folder / "runs" / "one-rank" / "model")
    return summary


def test_two_ranks_train_what_one_rank_with_their_global_batch_trains(two_ranks, one_rank):
    _, two = two_ranks
    assert (two.summary["world_size"], one_rank["world_size"]) == (2, 1)
    assert two.summary["steps"] == one_rank["steps"] == STEPS
    mine, theirs = weights(two.summary["model_path"]), weights(one_rank["model_path"])
    assert mine.keys() == theirs.keys()
    for name, value in mine.items():
        torch.testing.assert_close(value, theirs[name], rtol=1e-4, atol=2e-5, msg=name)
    assert two.summary["eval_loss"] == pytest.approx(one_rank["eval_loss"], rel=1e-4)


def test_every_rank_ends_with_the_same_weights(two_ranks):
    run, outcome = two_ranks
    checksums = [r.weights_checksum for r in outcome.final_ranks]
    assert len(checksums) == 2 and checksums[0] == checksums[1]
    assert "different weights" not in Path(run.log_dir, "main.log").read_text()


def linear_schedule(step: int, total: int, warmup: int) -> float:
    return step / warmup if step < warmup else max(0.0, (total - step) / (total - warmup))


def test_the_learning_rate_is_scaled_with_the_world_size(two_ranks):
    run, _ = two_ranks
    reports = [
        ProgressReport.model_validate_json(line) for line in Path(run.log_dir, "metrics.jsonl").read_text().splitlines()
    ]
    warmup = math.ceil(STEPS * 0.25)
    seen = [(r.progress.step, r.metrics.learning_rate) for r in reports]
    assert len(seen) >= 2
    for step, rate in seen:
        assert rate == pytest.approx(PEAK_LR * linear_schedule(step, STEPS, warmup), abs=1e-12), step


def test_gradient_accumulation_trains_what_the_larger_batch_trains(ray_local, tiny_bert, one_rank, tmp_path):
    accumulate = {
        "resources": {"workers": 1},
        "training": {"batchSizePerWorker": 16, "gradientAccumulationSteps": 2, "learningRate": PEAK_LR},
    }
    run = settings(tiny_job("accumulate", tiny_bert, accumulate), tmp_path)
    outcome = run_local(run, console=False)
    assert outcome.summary["steps"] == STEPS
    mine, theirs = weights(outcome.summary["model_path"]), weights(one_rank["model_path"])
    for name, value in mine.items():
        torch.testing.assert_close(value, theirs[name], rtol=1e-4, atol=2e-5, msg=name)
