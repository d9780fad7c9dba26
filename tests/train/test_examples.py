"""The local examples run with the commands their headers (and the README) give, on a copy of examples/ as a
checkout holds it, with only their sizes shrunk (`train.jobs.run_example`).

The quickstart's run is test_training's (`two_workers`). examples/own-code/job.yaml is not run here: its recipe
starts a Ray of its own and loads MiniLM in two Ray Train workers, some 30 s more than the suite can spend; its
recipe runs on the world (tests/e2e/test_training.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocmtrain_train.search.tune_trials import SUMMARY_FILE, SearchOutcome
from rocmtrain_train.trainer.torch_trainer import RunOutcome
from train.jobs import run_example

pytestmark = pytest.mark.ray


def test_the_language_model_example_runs_after_its_model_is_made(ray_local, tmp_path: Path) -> None:
    """`python examples/sft/make_model.py examples/sft/model`, then `rocmtrain run examples/sft-local.yaml`:
    32 records, one step of 2 ranks x 16, answers generated for 4 held-out questions."""
    sizes = {
        "data": {"train": {"maxSamples": 32}, "eval": {"maxSamples": 8}},
        "training": {"epochs": 1, "evalEverySteps": 1},
        "evaluation": {"generate": {"records": 4}},
    }
    _, outcome = run_example("sft-local.yaml", tmp_path, sizes)
    assert isinstance(outcome, RunOutcome)
    assert (tmp_path / "examples" / "sft" / "model" / "config.json").is_file(), "the copy had none before"
    assert outcome.summary["steps"] == 1 and 0 <= outcome.summary["eval_exact_match"] <= 1


def test_the_search_example_runs_and_exports_its_best_trial(ray_local, tmp_path: Path) -> None:
    """`rocmtrain run examples/tune.yaml`: 2 trials of 2 or 4 steps, 2 at a time; the best trial's model and the
    summary where the example's header says."""
    sizes = {
        "model": {"maxSeqLength": 16},
        "data": {"train": {"maxSamples": 32}, "eval": {"maxSamples": 16}},
        "training": {"evalEverySteps": 1},
        "tuning": {"numTrials": 2},
    }
    _, outcome = run_example("tune.yaml", tmp_path, sizes)
    assert isinstance(outcome, SearchOutcome)
    runs = tmp_path / "runs" / "tune-reviews"
    assert (runs / "model" / "model.safetensors").is_file()
    trials = json.loads((runs / SUMMARY_FILE).read_text())["trials"]
    assert len(trials) == 2 and outcome.summary["trials"] == trials
