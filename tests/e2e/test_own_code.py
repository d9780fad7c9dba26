"""Jobs running their own code (spec.code) on a real Ray cluster that KubeRay starts: four scripts at once.

Real: everything of tests/e2e (see conftest.py), and the scripts themselves, run from the jobs' volume as a
team's own code would be: the AMD blog's recipe (examples/own-code/recipe.py, a plain Hugging Face `Trainer`
under Ray Train, whose unmodified KubeflowCallback reports), and tests/own_code's loop reporting through
`rocmtrain_train.sdk`, script that fails, and script that reports nothing. The recipe trains a 2-layer BERT
built from a config (the test asserts mechanics, not learning), wide enough that its training outlasts the
callback's 5 s between reports.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from own_code.expected import SDK_STEPS_LAST_METRICS, SDK_STEPS_LAST_PROGRESS
from rocmtrain.api.conditions import ConditionType, Reason
from rocmtrain.api.models import RocmTrainingJobStatus
from rocmtrain_testworld.jobs import JOBS, Watch, condition, cpu_job, events, run_folder, volume
from rocmtrain_testworld.paths import REPO_ROOT
from rocmtrain_testworld.processes import Process
from rocmtrain_testworld.world import Scope, World
from train.conftest import save_tiny_bert

pytestmark = [pytest.mark.cluster, pytest.mark.ray]

SCRIPTS = REPO_ROOT / "tests" / "own_code"
RECIPE = REPO_ROOT / "examples" / "own-code" / "recipe.py"


def _ended(state: dict[str, Any]) -> bool:
    return state.get("phase") in ("Succeeded", "Failed")


class Seen:
    """Every status a watch polled, with the time it saw it: a predicate that records, and holds at the end."""

    def __init__(self) -> None:
        self.states: list[tuple[float, dict[str, Any]]] = []

    def __call__(self, state: dict[str, Any]) -> bool:
        self.states.append((time.time(), state))
        return _ended(state)


def _watch(world: World, ns: str, name: str, seen: Seen) -> tuple[dict[str, Any], Watch]:
    watch = Watch(world.cluster, ns, name)
    return watch.until(seen, f"{name} to end"), watch


def test_four_scripts_of_their_own_at_once(world: World, scope: Scope, operator: Process, shared_dir: Path) -> None:
    """The recipe with an unmodified HF Trainer reaches Succeeded with progress, loss and ETA from
    KubeflowCallback in its status and in `kubectl get`; a loop reporting through the SDK, with hostile
    arguments that no shell reads, reaches Succeeded with each step; a script raising in its own function
    fails with that error line first; a script reporting nothing succeeds, saying that it reported nothing."""
    ns = scope.namespace("own", processes=True)
    folder = volume(scope, ns, shared_dir / "volume")
    shutil.copytree(SCRIPTS, folder / "own_code")
    shutil.copy(RECIPE, folder / "recipe.py")
    save_tiny_bert(folder / "bert", hidden_size=128, intermediate_size=512)
    pwned = folder / "pwned"
    hostile = ["it's", f"$(touch {pwned})", f"`touch {pwned}`", "a\nb", "; exit 3", ""]
    one = {"workers": 1}
    jobs = {
        "recipe": cpu_job(
            "recipe",
            ns,
            folder,
            # 100 steps of 2 workers x 8: training outlasts the callback's 5 s between reports
            samples=1600,
            model={"source": str(folder / "bert"), "maxSeqLength": 128},
            code={"command": ["python", "recipe.py"], "workingDir": str(folder)},
        ),
        "sdk": cpu_job(
            "sdk",
            ns,
            folder,
            resources=one,
            code={"command": ["python", str(folder / "own_code/sdk_steps.py"), *hostile]},
        ),
        "fails": cpu_job(
            "fails",
            ns,
            folder,
            resources=one,
            faultTolerance={"maxWorkerFailures": 0},
            code={"command": ["python", str(folder / "own_code/fails.py")]},
        ),
        "silent": cpu_job(
            "silent", ns, folder, resources=one, code={"command": ["python", str(folder / "own_code/silent.py")]}
        ),
    }
    applied = time.time()
    for manifest in jobs.values():
        world.cluster.create(manifest)
    seen = {name: Seen() for name in jobs}
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        running = {name: pool.submit(_watch, world, ns, name, seen[name]) for name in jobs}
        ended = {name: future.result() for name, future in running.items()}
    finals = {name: state for name, (state, _) in ended.items()}
    took = {name: round(seen[name].states[-1][0] - applied, 1) for name in jobs}
    print(f"apply to end, seconds: {took}", flush=True)

    _the_recipe_reported_through_kubeflows_callback(
        world, ns, folder, finals["recipe"], seen["recipe"], ended["recipe"][1]
    )
    _the_sdk_reported_each_step(folder, ns, finals["sdk"], seen["sdk"], hostile, pwned)
    _the_failure_names_its_line(world, ns, finals["fails"])
    _nothing_reported_is_said(folder, ns, finals["silent"])


def _reported(state: dict[str, Any]) -> tuple[str, str]:
    found = condition(state, ConditionType.PROGRESS_REPORTED)
    return found.get("status", ""), found.get("reason", "")


def _the_recipe_reported_through_kubeflows_callback(
    world: World, ns: str, folder: Path, final: dict[str, Any], seen: Seen, watch: Watch
) -> None:
    assert final["phase"] == "Succeeded", final
    RocmTrainingJobStatus.model_validate(final)
    progress, metrics = final["progress"], final["metrics"]
    assert progress["percent"] == 100 and progress["etaSeconds"] == 0, progress
    for key in ("trainLoss", "evalLoss", "evalAccuracy", "learningRate", "trainSeconds", "samplesPerSecond"):
        assert math.isfinite(metrics[key]), key
    assert "grad_norm" in {m["name"] for m in metrics["custom"]}
    assert _reported(final) == ("True", Reason.PROGRESS_REPORTED)
    midway = [s for _, s in seen.states if 0 < (s.get("progress") or {}).get("percent", 0) < 100]
    assert midway and all(s["progress"]["etaSeconds"] > 0 and s["progress"]["step"] > 0 for s in midway), midway
    assert {s["progress"]["totalSteps"] for s in midway} == {100}, "1600 samples for 2 workers of 8 a step"
    printed = world.cluster.printed(JOBS.format(ns=ns) + "/recipe")
    assert (printed["Progress"], printed["Loss"], printed["ETA"]) == (100, metrics["trainLoss"], 0), printed
    assert max(watch.workers_running, default=0) == 2, "both workers of the data-parallel Trainer"
    checkpoints = list(run_folder(folder, ns, "recipe").glob("checkpoint_*"))
    assert checkpoints, "Ray Train kept the Trainer's checkpoint in the job's run folder"


def _the_sdk_reported_each_step(
    folder: Path, ns: str, final: dict[str, Any], seen: Seen, hostile: list[str], pwned: Path
) -> None:
    assert final["phase"] == "Succeeded", final
    run = run_folder(folder, ns, "sdk")
    assert json.loads((run / "argv.json").read_text()) == hostile and not pwned.exists()
    assert final["progress"] == SDK_STEPS_LAST_PROGRESS and final["metrics"] == SDK_STEPS_LAST_METRICS
    assert [p["step"] for p in final["history"]] == list(range(1, 9)), final["history"]
    # The lag: when each step ended in the script (on its worker) to when a poll of the status first showed it.
    ended = {r["step"]: r["time"] for r in map(json.loads, (run / "steps.jsonl").read_text().splitlines())}
    shown = {}
    for at, state in seen.states:
        step = (state.get("progress") or {}).get("step")
        if step is not None and step not in shown:
            shown[step] = at
    lags = [shown[step] - ended[step] for step in ended if step in shown]
    print(f"sdk progress lag, seconds: median {statistics.median(lags):.2f}, max {max(lags):.2f}", flush=True)
    assert len(lags) >= 6 and max(lags) < 30, lags


def _the_failure_names_its_line(world: World, ns: str, final: dict[str, Any]) -> None:
    assert final["phase"] == "Failed", final
    failed = condition(final, ConditionType.FAILED)
    lines = failed["message"].splitlines()
    assert lines[0] == "ValueError: label 7 out of range 0..2", failed["message"]
    assert lines[1].endswith('fails.py", line 10, in check') and "raise ValueError" in lines[2], lines[:3]
    assert failed["reason"] == "AppFailed" and "Job entrypoint command failed with exit code 1" in failed["message"]
    warning = world.cluster.wait_for(
        lambda: next((e for e in events(world.cluster, ns, "fails") if e["reason"] == "Failed"), None),
        30,
        "the Failed event",
    )
    assert "ValueError: label 7 out of range 0..2" in warning["message"]


def _nothing_reported_is_said(folder: Path, ns: str, final: dict[str, Any]) -> None:
    assert final["phase"] == "Succeeded", final
    assert "progress" not in final and _reported(final) == ("False", Reason.NO_PROGRESS_REPORTED)
    assert condition(final, ConditionType.PROGRESS_REPORTED)["message"].startswith("your code reported no progress")
    assert condition(final, ConditionType.STALLED).get("status") != "True"
    seen = json.loads((run_folder(folder, ns, "silent") / "contract.json").read_text())
    for where in ("driver", "worker"):
        contract = seen[where]
        assert contract["ROCMTRAIN_WORLD_SIZE"] == "1" and contract["ROCMTRAIN_JOB_NAME"] == "silent", where
        assert contract["ROCMTRAIN_STORAGE_PATH"] == str(run_folder(folder, ns, "silent")), where
        assert contract["KUBEFLOW_TRAINER_SERVER_URL"].startswith("https://"), where
        assert contract["KUBEFLOW_TRAINER_SERVER_URL"].endswith(
            f"/v1/namespaces/{ns}/rocmtrainingjobs/silent/trainerstatus"
        )
        assert contract["KUBEFLOW_TRAINER_SERVER_TOKEN"] == contract["ROCMTRAIN_PROGRESS_TOKEN"], where
