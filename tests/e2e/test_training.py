"""A RocmTrainingJob trains on a Ray cluster that KubeRay starts, and its status tells the truth.

Every link runs for real: the operator renders the RayJob, KubeRay starts the
head and two workers and the submitter Job, `ray job submit` runs the driver on
the head, the workers join over their own addresses, Ray Train trains with
checkpoints on a shared volume, the driver pushes progress over HTTPS with its
projected token, KubeRay reports SUCCEEDED or FAILED, and the Ray cluster is
torn down. See conftest.py for what is real and what stands in.
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rocmtrain.api.models import RocmTrainingJobStatus
from rocmtrain_testworld import kuberay
from rocmtrain_testworld.jobs import (
    JOBS,
    TIMEOUT,
    Watch,
    condition,
    cpu_job,
    events,
    job,
    ray_cluster_gone,
    reports,
    run_folder,
    status,
    volume,
)
from rocmtrain_testworld.processes import Process
from rocmtrain_testworld.runtime.container import processes_in
from rocmtrain_testworld.world import Scope, World
from train.jobs import EXAMPLES, example_script

pytestmark = [pytest.mark.cluster, pytest.mark.ray]

ORDER = ["Pending", "Initializing", "Running", "Succeeded"]
# The two jobs at once: 3 and 12 steps; the larger one loses a worker.
LOSES_A_WORKER = 192
SAMPLES = (48, LOSES_A_WORKER)


def _finished(state: dict) -> bool:
    return state.get("phase") in ("Succeeded", "Failed")


def _assert_trained(
    world: World, ns: str, name: str, folder: Path, watch: Watch, quality: tuple[str, ...] = ("evalAccuracy",)
) -> dict:
    """The checks every successful job passes (`quality`: the evaluation metrics of its task); its final status."""
    final = watch.until(_finished, "the job to end")
    assert final["phase"] == "Succeeded", final
    RocmTrainingJobStatus.model_validate(final)
    # The driver's own reports (written beside the checkpoints) are what reached the status.
    pushed = reports(folder, ns, name)
    last = pushed[-1]
    assert last["final"] and final["progress"] == last["progress"] and final["metrics"] == last["metrics"]
    assert final["progress"]["percent"] == 100 and final["progress"]["step"] == final["progress"]["totalSteps"]
    metrics = final["metrics"]
    for key in (*quality, "evalLoss", "trainLoss", "trainSeconds", "samplesPerSecond", "tokensPerSecond"):
        assert math.isfinite(metrics[key]), key
    assert all(0 <= metrics[key] <= 1 for key in quality if key != "evalPerplexity") and metrics["samplesPerSecond"] > 0
    assert final["history"] and final["history"][-1]["step"] == final["progress"]["step"]
    # Both workers ready while it trained. (At the end KubeRay tears the cluster down, and the status
    # counts only pods not being deleted: the first Succeeded status may already count fewer.)
    assert final["lastProgressTime"] and max(watch.workers_running, default=0) == 2, watch.workers_running
    assert 0 <= final["workersReady"] <= 2
    # Phases as polled, and the operator's events, in the one order a job goes.
    assert watch.phases == [p for p in ORDER if p in watch.phases] and "Running" in watch.phases, watch.phases
    # (The operator posts a transition's event right after it writes the status.)
    reasons = world.cluster.wait_for(
        lambda: "Succeeded" in (found := [e["reason"] for e in events(world.cluster, ns, name)]) and found,
        30,
        "the Succeeded event",
    )
    assert [r for r in reasons if r in ORDER] == ORDER, reasons
    # shutdownAfterJobFinishes: KubeRay deletes the Ray cluster; the runtime ends its processes.
    world.cluster.wait_for(lambda: ray_cluster_gone(world.cluster, ns, name), 120, "the Ray cluster to go")
    world.cluster.wait_for(lambda: not watch.processes(), 60, "the Ray pods' processes to end")
    assert len(watch.pods) >= 4, "head, two workers and the submitter ran as processes"
    return final


def test_two_jobs_at_once_succeed_each_with_its_own_live_metrics_one_after_losing_a_worker(
    world: World, scope: Scope, operator: Process, shared_dir: Path
) -> None:
    """Success, twice at once: Pending → Initializing → Running → Succeeded, progress to 100%, the
    driver's metrics and history through the authenticated push, events in order, the Ray cluster
    gone afterwards. The same job name in two namespaces, with different data sizes (so different
    step counts): each status holds its own driver's metrics only. The larger job loses a worker after
    its first checkpoint (see `_recovers_a_lost_worker`); the other goes on untouched."""
    jobs = {}
    for samples in SAMPLES:
        ns = scope.namespace("pair", processes=True)
        folder = volume(scope, ns, shared_dir / f"volume-{samples}")
        # 12 steps, a checkpoint every 2: the worker is lost after the first checkpoint, before the end.
        extra = {"checkpoint": {"everySteps": 2}} if samples == LOSES_A_WORKER else {}
        world.cluster.create(cpu_job("minilm", ns, folder, samples=samples, **extra))
        jobs[ns] = (folder, samples)
    with ThreadPoolExecutor(max_workers=2) as pool:  # both watched from the start, side by side
        running = {
            ns: pool.submit(
                _recovers_a_lost_worker if samples == LOSES_A_WORKER else _assert_trained,
                world,
                ns,
                "minilm",
                folder,
                Watch(world.cluster, ns, "minilm"),
            )
            for ns, (folder, samples) in jobs.items()
        }
        finals = {ns: future.result() for ns, future in running.items()}
    steps = {ns: finals[ns]["progress"]["totalSteps"] for ns in jobs}
    # 2 workers x 8 a batch: 3 and 12 steps; each status has its own count, and its own driver's metrics.
    assert sorted(steps.values()) == [3, 12], steps
    for ns, (folder, samples) in jobs.items():
        assert steps[ns] == samples // 16
        assert finals[ns]["metrics"] == reports(folder, ns, "minilm")[-1]["metrics"]
        assert bool(finals[ns].get("workerFailures")) == (samples == LOSES_A_WORKER), finals[ns]
    assert len({str(f["metrics"]) for f in finals.values()}) == 2


def _recovers_a_lost_worker(world: World, ns: str, name: str, folder: Path, watch: Watch) -> dict:
    """A worker lost after the first checkpoint (SIGKILL, as the OOM killer or a node loss would): the
    job still passes `_assert_trained`, its status and a Warning event show the recovery, and it went on
    from the checkpoint, not from scratch."""
    watch.until(lambda s: (s.get("progress") or {}).get("step", 0) >= 2, "a checkpoint (step 2)")
    killed = _kill_a_training_worker(world, ns, watch)
    final = _assert_trained(world, ns, name, folder, watch)
    assert final["workerFailures"] >= 1, "the status shows the recovery"
    recovered = [e for e in events(world.cluster, ns, name) if e["reason"] == "WorkerFailureRecovered"]
    assert recovered and recovered[0]["type"] == "Warning", killed
    assert "training continued from the checkpoint at step" in recovered[0]["message"]
    resumed = [r["resumedFromStep"] for r in reports(folder, ns, name) if r.get("workerFailures")]
    assert resumed and min(resumed) >= 2, "restored a checkpoint, not from scratch"
    return final


def _kill_a_training_worker(world: World, ns: str, watch: Watch) -> str:
    """SIGKILL the Ray Train worker process in one worker pod; what was killed."""
    for key, record in sorted(watch.pods.items()):
        if "-worker-" not in key:
            continue
        for pid in processes_in(f"net:[{record['netnsInode']}]", "net"):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if cmdline.startswith("ray::RayTrainWorker"):
                os.kill(pid, signal.SIGKILL)
                return f"{key}: pid {pid} {cmdline[:60]}"
    raise AssertionError(f"no Ray Train worker process in {sorted(watch.pods)}")


def test_operator_restarted_mid_run_then_job_deleted(
    world: World, scope: Scope, operator: Process, shared_dir: Path
) -> None:
    ns = scope.namespace("restart", processes=True)
    folder = volume(scope, ns, shared_dir / "volume")
    # 100 steps: it runs well past the restart; it is deleted long before its end.
    world.cluster.create(cpu_job("minilm", ns, folder, samples=1600, checkpoint={"everySteps": 2}))
    watch = Watch(world.cluster, ns, "minilm")
    before = watch.until(lambda s: (s.get("progress") or {}).get("step", 0) >= 2, "progress to arrive")
    rayjob_uid = kuberay.rayjob(world.cluster, ns, "minilm")["metadata"]["uid"]

    operator.restart()  # SIGTERM, as a rollout would, then start again
    restarted = time.time()
    after = watch.until(
        lambda s: (
            s.get("progress", {}).get("step", 0) > before["progress"]["step"]
            and time.mktime(time.strptime(s["lastProgressTime"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone >= restarted - 1
        ),
        "progress pushed to the restarted operator",
    )
    assert after["phase"] == "Running" and condition(after, "Ready")["status"] == "True"
    rayjobs = world.cluster.request("GET", kuberay.RAYJOBS.format(ns=ns))["items"]
    assert [r["metadata"]["uid"] for r in rayjobs] == [rayjob_uid], "no second RayJob"
    assert after["rayJobName"] == "minilm" and after["workersReady"] == 2
    _dashboard_takes_only_the_clusters_token(world, ns, "minilm")

    # Deleting the job ends every process of its pods within seconds (garbage collection, then the runtime).
    assert watch.processes()
    world.cluster.delete(job(world.cluster, ns, "minilm"))
    deleted = time.monotonic()
    world.cluster.wait_for(lambda: not watch.processes(), 60, "every process of the job to end")
    gone_after = time.monotonic() - deleted
    world.cluster.wait_for(lambda: ray_cluster_gone(world.cluster, ns, "minilm"), 60, "the Ray cluster to go")
    assert not world.cluster.request("GET", kuberay.RAYJOBS.format(ns=ns))["items"]
    assert gone_after < 60


def _dashboard_takes_only_the_clusters_token(world: World, ns: str, name: str) -> None:
    """Ray's job API on the running head, asked from outside the job (this machine reaches every pod):
    `ray job submit` without KubeRay's token for the cluster is refused and runs nothing; HTTP without the
    token is refused (401), with another too (403), and served with it."""
    (head,) = world.cluster.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=ray.io/node-type=head")["items"]
    cluster = head["metadata"]["labels"]["ray.io/cluster"]
    secret = world.cluster.request("GET", f"/api/v1/namespaces/{ns}/secrets/{cluster}")
    token = base64.b64decode(secret["data"]["auth_token"]).decode()
    ip = head["status"]["podIP"]
    dashboard, url = f"http://{ip}:8265", f"http://{ip}:8265/api/jobs/"

    ray_cli = [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", "--address", dashboard, "--no-wait"]
    no_token = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    intruder = subprocess.run(
        [*ray_cli, "--", "python", "-c", "print('not yours')"],
        env=no_token,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert intruder.returncode != 0, intruder.stdout
    assert "Authentication required: Unauthorized: Missing authentication token" in intruder.stderr, intruder.stderr

    def status_of(headers: dict[str, str]) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as refused:
            return refused.code, b""

    assert status_of({})[0] == 401
    assert status_of({"Authorization": "Bearer not-the-token"})[0] == 403
    served, body = status_of({"Authorization": f"Bearer {token}"})
    assert served == 200 and [j["entrypoint"] for j in json.loads(body)] == ["python -m rocmtrain_train"]


def test_a_lora_adapter_of_a_language_model_trains_with_its_loss_and_perplexity_in_the_status(
    world: World, scope: Scope, operator: Process, shared_dir: Path
) -> None:
    """A causal-lm job with a LoRA adapter (the language-model example's tiny Llama, made from a config, on a
    volume): it succeeds with its pushed loss, perplexity, exact match and parameter counts in the status, the
    Loss and Perplexity columns of `kubectl get` show them, and the adapter lands in the run folder."""
    ns = scope.namespace("lora", processes=True)
    folder = volume(scope, ns, shared_dir / "volume")
    example_script("make_model").build(folder / "model", hidden_size=32, intermediate_size=64)
    shutil.copytree(EXAMPLES / "sft" / "data", folder / "sft")
    spec = {
        "model": {"source": str(folder / "model"), "task": "causal-lm", "maxSeqLength": 48},
        "data": {
            "train": {"uri": str(folder / "sft" / "train.jsonl"), "maxSamples": 64},
            "eval": {"uri": str(folder / "sft" / "eval.jsonl"), "maxSamples": 16},
            "promptField": "prompt",
            "responseField": "response",
        },
        "training": {"learningRate": 1e-2},
        "adapter": {"rank": 4, "targetModules": ["q_proj", "v_proj"]},
        "evaluation": {"generate": {"maxNewTokens": 3, "records": 8}},
    }
    manifest = cpu_job("llama", ns, folder, **spec)
    del manifest["spec"]["model"]["numLabels"]
    world.cluster.create(manifest)
    quality = ("evalPerplexity", "evalExactMatch")
    final = _assert_trained(world, ns, "llama", folder, Watch(world.cluster, ns, "llama"), quality)
    metrics = final["metrics"]
    assert metrics["evalPerplexity"] == pytest.approx(math.exp(metrics["evalLoss"]))
    assert 0 < metrics["trainableParameters"] < metrics["totalParameters"] and "evalAccuracy" not in metrics
    printed = world.cluster.printed(JOBS.format(ns=ns) + "/llama")
    assert printed["Perplexity"] == metrics["evalPerplexity"] and printed["Loss"] == metrics["trainLoss"]
    assert printed["Accuracy"] is None
    model = run_folder(folder, ns, "llama") / "model"
    assert json.loads((model / "adapter_config.json").read_text())["r"] == 4
    assert (model / "adapter_model.safetensors").is_file() and not (model / "model.safetensors").exists()


def test_a_job_whose_data_does_not_parse_fails_with_the_drivers_error(
    world: World, scope: Scope, operator: Process, shared_dir: Path
) -> None:
    ns = scope.namespace("broken", processes=True)
    folder = volume(scope, ns, shared_dir / "volume")
    (folder / "broken.jsonl").write_text('{"text": "fine", "label": 1}\n{"text": "cut off here\n')
    world.cluster.create(cpu_job("minilm", ns, folder, train="broken.jsonl"))
    watch = Watch(world.cluster, ns, "minilm")
    final = watch.until(_finished, "the job to end", timeout=TIMEOUT)
    assert final["phase"] == "Failed", final
    failed = condition(final, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "AppFailed"
    first = failed["message"].splitlines()[0]
    assert first.startswith(f"{folder / 'broken.jsonl'}: ") or f"{folder / 'broken.jsonl'}" in first, failed["message"]
    assert "Job entrypoint command failed with exit code 2" in failed["message"]
    warning = world.cluster.wait_for(
        lambda: next((e for e in events(world.cluster, ns, "minilm") if e["reason"] == "Failed"), None),
        30,
        "the Failed event",
    )
    assert warning["type"] == "Warning" and first in warning["message"]
    world.cluster.wait_for(lambda: ray_cluster_gone(world.cluster, ns, "minilm"), 120, "the Ray cluster to go")
    assert status(world.cluster, ns, "minilm")["phase"] == "Failed"


def test_a_search_runs_its_trials_at_once_on_one_ray_cluster_and_reports_the_best(
    world: World, scope: Scope, operator: Process, shared_dir: Path
) -> None:
    """spec.tuning on the cluster: a worker pod for each trial that runs at once, both trials training
    side by side on the one Ray cluster, status.tuning that counts them and names the best, its metric
    in `kubectl get`, the NewBestTrial event, and the best trial's model where a job's model goes."""
    ns = scope.namespace("search", processes=True)
    folder = volume(scope, ns, shared_dir / "volume")
    tuning = {
        "searchSpace": {"learningRate": {"min": 1e-5, "max": 1e-3}},
        "numTrials": 2,
        "maxConcurrentTrials": 2,
        "scheduler": {"type": "None"},
    }
    world.cluster.create(cpu_job("search", ns, folder, samples=48, resources={"workers": 1}, tuning=tuning))
    rayjob = world.cluster.wait_for(lambda: kuberay.rayjob(world.cluster, ns, "search"), 60, "the RayJob")
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == 2, "1 worker for each of 2 concurrent trials"

    watch = Watch(world.cluster, ns, "search")
    final = watch.until(_finished, "the search to end")
    assert final["phase"] == "Succeeded", final
    RocmTrainingJobStatus.model_validate(final)
    searched = final["tuning"]
    counts = [searched[k] for k in ("trialsTotal", "trialsDone", "trialsRunning", "trialsPending")]
    assert counts == [2, 2, 0, 0], searched
    rows = searched["trials"]
    assert len(rows) == 2 and {r["state"] for r in rows} == {"Succeeded"}, rows
    best = max(rows, key=lambda r: r["metric"])
    assert (searched["bestTrialId"], searched["bestMetric"]) == (best["id"], best["metric"])
    assert searched["bestConfig"] == best["config"] and final["metrics"]["evalAccuracy"] == best["metric"]
    assert final["progress"]["percent"] == 100
    assert max(watch.workers_running, default=0) == 2, watch.workers_running
    pushed = reports(folder, ns, "search")
    assert any(r["tuning"]["trialsRunning"] == 2 for r in pushed if r.get("tuning")), "the trials ran at once"

    assert world.cluster.printed(JOBS.format(ns=ns) + "/search")["Best"] == best["metric"]
    announced = world.cluster.wait_for(
        lambda: [e for e in events(world.cluster, ns, "search") if e["reason"] == "NewBestTrial"],
        30,
        "the NewBestTrial event",
    )
    assert f"trial {best['id']} is the best so far" in announced[-1]["message"], announced
    run = run_folder(folder, ns, "search")
    assert searched["bestCheckpoint"] == str(run / "model")
    assert (run / "model" / "model.safetensors").is_file() and (run / "model" / "config.json").is_file()
    summary = json.loads((run / "search-summary.json").read_text())
    assert sorted(t["id"] for t in summary["trials"]) == sorted(r["id"] for r in rows)
    world.cluster.wait_for(lambda: ray_cluster_gone(world.cluster, ns, "search"), 120, "the Ray cluster to go")
