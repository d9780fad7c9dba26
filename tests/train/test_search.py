"""Hyper-parameter search on a real local Ray: Ray Tune trials of the real MiniLM, on CPUs (of a tiny BERT
where only the mechanics count, not what the trials learn).

Nothing is faked: ASHA decides from real evaluations, the killed worker is a real process killed
with SIGKILL, and the interrupted driver is a real `rocmtrain run` process stopped with SIGINT.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from ray import tune
from transformers import AutoConfig, AutoModelForSequenceClassification

from rocmtrain.api.models import ProgressReport, RocmTrainingJob
from rocmtrain_train.config import RunSettings
from rocmtrain_train.driver.train_job import run_local
from rocmtrain_train.model.pretrained import packaged_model
from rocmtrain_train.search.tune_trials import SEARCH_DIR, SUMMARY_FILE, TRIALS_DIR, SearchOutcome
from train.jobs import EXAMPLES, job, settings

pytestmark = pytest.mark.ray

# 160 reviews, 10 steps of 16, an evaluation every 2 steps: 5 evaluations per full trial.
SMALL = {
    "model": {"maxSeqLength": 32},
    "data": {"train": {"maxSamples": 160}, "eval": {"maxSamples": 64}},
    "training": {"epochs": 1, "batchSizePerWorker": 16, "evalEverySteps": 2},
    "resources": {"workers": 1},
}
FULL_EVALUATIONS = 5


def tuning(**fields) -> dict:
    return {"tuning": {"searchSpace": {"learningRate": {"min": 1e-6, "max": 2e-3}}, **fields}}


def trial_ids(run: RunSettings) -> list[str]:
    return sorted(p.name for p in Path(run.run_path, TRIALS_DIR).iterdir())


def test_a_killed_trial_worker_is_recovered(ray_local, tiny_bert, tmp_path):
    """A rank of a trial is killed once Ray Train has recorded the trial's first checkpoint. Ray Train takes one
    report of each rank per look at the workers, 2 s apart, and the ranks live until it has taken them all: the
    kill lands in the trial, whose worker group starts again from that checkpoint."""
    extra = {
        "data": {"train": {"maxSamples": 320}},  # 10 steps of 2 x 16, a checkpoint every 2
        "resources": {"workers": 2},
        "checkpoint": {"everySteps": 2},
        "faultTolerance": {"maxWorkerFailures": 1},
    }
    run = settings(job("search-kill", SMALL, extra, tuning(numTrials=1), model=tiny_bert), tmp_path)
    with ThreadPoolExecutor(1) as pool:
        search = pool.submit(run_local, run, console=False)
        deadline = time.monotonic() + 300
        while not list(Path(run.run_path, TRIALS_DIR).glob("*/checkpoint_manager_snapshot.json")):
            assert not search.done(), f"the search ended before a checkpoint: {search.exception()}"
            assert time.monotonic() < deadline, "no checkpoint within 5 minutes"
            time.sleep(0.2)
        (trial,) = trial_ids(run)
        rank_log = Path(run.log_dir, TRIALS_DIR, trial, "rank-1.log")
        pid = int(rank_log.read_text().split("started: pid ")[-1].split()[0])
        os.kill(pid, signal.SIGKILL)
        outcome = search.result(timeout=600)
    (row,) = outcome.summary["trials"]
    assert row["state"] == "Succeeded" and row["steps"] == 320 // 32
    assert rank_log.read_text().count("started: pid") == 2, "the killed rank was started again"
    assert "resumed at epoch" in rank_log.read_text()


@pytest.fixture(scope="module")
def another_ray():
    """Another Ray on this machine, as Ray's discovery of local instances sees one: a process named raylet
    with a `--gcs-address` (a stand-in: a second real Ray costs seconds and a CPU, and Ray finds local
    instances by nothing else). In `make test` the world's Ray pods beside these tests are such processes.
    The address is a documentation one (RFC 5737), never dialled: Ray only counts it."""
    sleeper = "import time; time.sleep(900)"
    args = ["raylet", "-c", sleeper, "--gcs-address=192.0.2.9:6379"]
    process = subprocess.Popen(args, executable=sys.executable)
    yield
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def minilm_without_dropout(tmp_path_factory) -> Path:
    """MiniLM with its dropout off: in 10 steps of 16 reviews its trials then part by learning rate clearly
    enough for ASHA's rungs (with dropout they all stay near chance); what this module tests is ASHA's mechanics."""
    folder = tmp_path_factory.mktemp("minilm-without-dropout")
    source = packaged_model("sentence-transformers/all-MiniLM-L6-v2")
    assert source is not None
    shutil.copytree(source, folder, dirs_exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps(config | {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    )
    return folder


@pytest.fixture(scope="module")
def asha_search(ray_local, another_ray, minilm_without_dropout, tmp_path_factory) -> tuple[RunSettings, SearchOutcome]:
    """A search with ASHA, on an embedded Ray with the options `rocmtrain run` gives a search, beside
    another Ray on the same machine."""
    spec = tuning(numTrials=4, maxConcurrentTrials=1, seed=3, scheduler={"gracePeriod": 1, "reductionFactor": 2})
    search = job("search-asha", SMALL, spec, model=minilm_without_dropout)
    run = settings(search, tmp_path_factory.mktemp("search-asha"))
    outcome = run_local(run, console=False)
    assert isinstance(outcome, SearchOutcome)
    return run, outcome


def test_asha_stops_poor_trials_early(asha_search):
    _, outcome = asha_search
    trials = outcome.summary["trials"]
    assert len(trials) == 4
    states = {t["state"] for t in trials}
    assert states <= {"Succeeded", "Stopped"} and "Succeeded" in states
    stopped = [t for t in trials if t["state"] == "Stopped"]
    assert stopped, f"ASHA stopped no trial: {trials}"
    for t in trials:
        expected = FULL_EVALUATIONS if t["state"] == "Succeeded" else range(1, FULL_EVALUATIONS)
        assert t["evaluations"] in (expected if isinstance(expected, range) else [expected]), t
    best_stopped = max(t["metric"] for t in stopped)
    assert best_stopped < outcome.summary["best_metric"]


def test_the_best_trial_is_chosen_by_the_metric_and_exported(asha_search):
    run, outcome = asha_search
    summary = outcome.summary
    scored = [t for t in summary["trials"] if t["metric"] is not None]
    best = max(scored, key=lambda t: t["metric"])
    assert summary["best_trial"] == best["id"] and summary["best_metric"] == best["metric"]
    assert summary["eval_accuracy"] == best["metric"] and summary["metric"] == "evalAccuracy"
    assert summary["model_path"] == run.model_output
    model = AutoModelForSequenceClassification.from_pretrained(run.model_output)
    assert model.config.num_labels == 3
    exported = Path(run.model_output, "model.safetensors").read_bytes()
    assert exported == Path(best["model_path"], "model.safetensors").read_bytes()
    assert json.loads(Path(run.run_path, SUMMARY_FILE).read_text())["trials"] == summary["trials"]


def test_the_status_matches_the_trials(asha_search):
    run, outcome = asha_search
    lines = Path(run.log_dir, "metrics.jsonl").read_text().splitlines()
    reports = [ProgressReport.model_validate_json(line) for line in lines]
    final = reports[-1]
    assert final.final and final.tuning is not None
    status = final.tuning
    assert (status.trials_total, status.trials_done, status.trials_running, status.trials_pending) == (4, 4, 0, 0)
    assert status.best_trial_id == outcome.summary["best_trial"] and status.best_checkpoint == run.model_output
    assert status.best_config.learning_rate == outcome.summary["best_config"]["learning_rate"]
    rows = {r.id: (r.state, r.metric, r.iterations, r.config.learning_rate) for r in status.trials}
    assert rows == {
        t["id"]: (t["state"], t["metric"], t["evaluations"], t["config"]["learning_rate"])
        for t in outcome.summary["trials"]
    }
    assert final.metrics.eval_accuracy == outcome.summary["eval_accuracy"]
    # While it ran, the status counted the trials as they went (one at a time).
    assert any(r.tuning.trials_running == 1 and r.tuning.trials_done < 4 for r in reports if r.tuning)


def test_trials_stopped_early_free_their_resources(asha_search):
    """Ray Train's PlacementGroupCleaner removes a stopped trial's placement group once it sees (through
    the state API that `embedded_ray_options` turns on and names) that the trial's controller died with
    it, though another Ray runs on the machine."""
    import ray

    _, outcome = asha_search
    assert any(t["state"] == "Stopped" for t in outcome.summary["trials"])
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU") != ray.cluster_resources().get("CPU"):
        assert time.monotonic() < deadline, (ray.available_resources(), ray.cluster_resources())
        time.sleep(1)


def second_trial_started(storage: Path) -> bool:
    """Whether one trial has exported its model and another trial's rank 0 has started training."""
    exported = {p.parent.parent.name for p in (storage / TRIALS_DIR).glob("*/model/model.safetensors")}
    started = {
        log.parent.name
        for log in (storage / "logs" / TRIALS_DIR).glob("*/rank-0.log")
        if "started: pid" in log.read_text()
    }
    return len(exported) == 1 and bool(started - exported)


def test_a_restarted_driver_continues_the_search_without_rerunning_finished_trials(ray_local, tiny_bert, tmp_path):
    spec = tuning(numTrials=2, maxConcurrentTrials=1, seed=5, scheduler={"type": "None"})
    spec["tuning"]["searchSpace"]["epochs"] = [1, 3]  # seed 5 draws 1 epoch, then 3: the second outlasts the SIGINT
    raw = job("search-resume", SMALL, spec, model=tiny_bert).dump()
    for source in (raw["spec"]["data"]["train"], raw["spec"]["data"]["eval"]):
        source["uri"] = str((EXAMPLES / source["uri"]).resolve())
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(raw))
    storage = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [str(Path(sys.executable).parent / "rocmtrain"), "run", str(job_file), "--storage", str(storage)]
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    trials = storage / "search-resume" / TRIALS_DIR
    deadline = time.monotonic() + 400
    while not second_trial_started(storage / "search-resume"):
        assert first.poll() is None, first.stdout.read()
        assert time.monotonic() < deadline, f"no second trial started within 400 s: {sorted(storage.rglob('*.log'))}"
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)  # the second trial is training: Tune lists it in the grid, not ended
    output, _ = first.communicate(timeout=300)
    assert first.returncode == 1 and "interrupted" in output, output
    # The trial that ended as the saved experiment state says (the other may still export its model while
    # Tune stops it, yet stays unfinished there and runs again).
    saved = tune.ExperimentAnalysis(str(storage / "search-resume" / SEARCH_DIR)).trials
    (done,) = [trials / t.trial_id for t in saved if t.status == "TERMINATED"]
    exported_at = (done / "model" / "model.safetensors").stat().st_mtime

    run = settings(RocmTrainingJob.model_validate(raw), storage)
    outcome = run_local(run, console=False)
    assert isinstance(outcome, SearchOutcome)
    rows = {t["id"]: t for t in outcome.summary["trials"]}
    assert len(rows) == 2 and {t["state"] for t in rows.values()} == {"Succeeded"}
    assert done.name in rows
    assert (done / "model" / "model.safetensors").stat().st_mtime == exported_at, "a finished trial ran again"
    assert Path(run.log_dir, TRIALS_DIR, done.name, "rank-0.log").read_text().count("started: pid") == 1
    assert "continuing the search" in Path(run.log_dir, "main.log").read_text()
    AutoConfig.from_pretrained(run.model_output)
