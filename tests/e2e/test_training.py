"""A RocmTrainingJob trains on a Ray cluster that KubeRay starts, and its status tells the truth.

Every link runs for real: the operator renders the RayJob, KubeRay starts the
head and two workers and the submitter Job, `ray job submit` runs the driver on
the head, the workers join over their own addresses, Ray Train trains with
checkpoints on a shared volume, the driver pushes progress over HTTPS with its
projected token, KubeRay reports SUCCEEDED or FAILED, and the Ray cluster is
torn down. See conftest.py for what is real and what stands in.

Jobs running their own code (spec.code) share this module's operator. Their scripts run from the jobs' volume as
a team's own code would be: the AMD blog's recipe (examples/own-code/recipe.py, a plain Hugging Face `Trainer`
under Ray Train, whose unmodified KubeflowCallback reports), and tests/own_code's loop reporting through
`rocmtrain_train.sdk`, script that fails, and script that reports nothing. The recipe trains a 2-layer BERT
built from a config (the test asserts mechanics, not learning), wide enough that its training outlasts the
callback's 5 s between reports. Beside them, Ray's own transformers example (tests/own_code/outside), unchanged
but for hub access, with no storage named: it runs in Ray Train's default storage.
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForSequenceClassification

from own_code.expected import SDK_STEPS_LAST_METRICS, SDK_STEPS_LAST_PROGRESS
from own_code.outside import stand_ins
from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.contract import PROGRESS_URL_ENV
from rocmtrain.api.models import RocmTrainingJobStatus
from rocmtrain_testworld import kuberay, rocmtrain_operator, runtime
from rocmtrain_testworld import s3 as object_store
from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.helm import DEPLOYMENT, live_env, outside_settings
from rocmtrain_testworld.jobs import (
    JOBS,
    MODEL,
    TIMEOUT,
    Watch,
    condition,
    cpu_job,
    events,
    job,
    ray_cluster_gone,
    reports,
    run_folder,
    s3_data,
    status,
    volume,
)
from rocmtrain_testworld.paths import REPO_ROOT, VOLUMES_DIR
from rocmtrain_testworld.processes import Process
from rocmtrain_testworld.rocmtrain_operator import Release
from rocmtrain_testworld.runtime.container import processes_in
from rocmtrain_testworld.s3 import S3Path, S3Server
from rocmtrain_testworld.world import Scope, World
from rocmtrain_train.model.pretrained import packaged_model
from train.conftest import save_tiny_bert
from train.jobs import EXAMPLES, example_script

pytestmark = [pytest.mark.cluster, pytest.mark.ray]

ORDER = ["Pending", "Initializing", "Running", "Succeeded"]
# The two jobs at once: 3 and 12 steps; the larger one loses a worker.
LOSES_A_WORKER = 192
SAMPLES = (48, LOSES_A_WORKER)
OWN_CODE_SCRIPTS = REPO_ROOT / "tests" / "own_code"


def _finished(state: dict) -> bool:
    return state.get("phase") in ("Succeeded", "Failed")


def _ended(progress: dict) -> dict:
    """A driver's last reported progress as an ended job's status shows it: without an ETA."""
    return {key: value for key, value in progress.items() if key != "etaSeconds"}


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
    assert last["final"] and final["progress"] == _ended(last["progress"]) and final["metrics"] == last["metrics"]
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


def test_two_jobs_at_once_on_object_storage_succeed_each_with_its_own_live_metrics_one_after_losing_a_worker(
    world: World, scope: Scope, release: Release, operator: Process, world_s3: S3Server, tmp_path: Path
) -> None:
    """Success, twice at once: Pending → Initializing → Running → Succeeded, progress to 100%, the
    driver's metrics and history through the authenticated push, events in order, the Ray cluster
    gone afterwards. The same job name in two namespaces, with different data sizes (so different
    step counts): each status holds its own driver's metrics only.

    Both read their data from the world's S3 server and keep checkpoints, model and logs there, with the
    keys from a Secret through `spec.env`; they share the bucket and `storagePath`, and each namespace's
    prefix holds its own run only. The larger job also reads MiniLM from the bucket, loses a worker after its
    first checkpoint and resumes from the checkpoint on S3 (see `_recovers_a_lost_worker`), and the operator
    is restarted while it trains (see `_restarted_mid_run`); the other goes on untouched. The exported model
    in the bucket loads with `from_pretrained`."""
    store = s3_data(world_s3.path("pair"))
    minilm = packaged_model(MODEL)
    assert minilm is not None
    model = world_s3.put(minilm, world_s3.path("models", "minilm"))
    jobs = {}
    for samples in SAMPLES:
        ns = scope.namespace("pair", processes=True)
        world_s3.apply_secret(world.cluster, ns)
        # 12 steps, a checkpoint every 2: the worker is lost after the first checkpoint, before the end.
        extra = {"checkpoint": {"everySteps": 2}, "model": {"source": model.uri}} if samples == LOSES_A_WORKER else {}
        world.cluster.create(cpu_job("minilm", ns, store, samples=samples, env=world_s3.spec_env(), **extra))
        jobs[ns] = samples
    larger = next(ns for ns, samples in jobs.items() if samples == LOSES_A_WORKER)
    with ThreadPoolExecutor(max_workers=2) as pool:  # both watched from the start, side by side
        running = {
            ns: pool.submit(
                _recovers_a_lost_worker if samples == LOSES_A_WORKER else _assert_trained,
                world,
                ns,
                "minilm",
                store,
                Watch(world.cluster, ns, "minilm"),
            )
            for ns, samples in jobs.items()
        }
        # From this thread: the operator's process dies with the thread that started it (processes.die_with_parent).
        _restarted_mid_run(world, operator, larger, release)
        finals = {ns: future.result() for ns, future in running.items()}
    steps = {ns: finals[ns]["progress"]["totalSteps"] for ns in jobs}
    # 2 workers x 8 a batch: 3 and 12 steps; each status has its own count, and its own driver's metrics.
    assert sorted(steps.values()) == [3, 12], steps
    for ns, samples in jobs.items():
        assert steps[ns] == samples // 16
        assert finals[ns]["metrics"] == reports(store, ns, "minilm")[-1]["metrics"]
        assert bool(finals[ns].get("workerFailures")) == (samples == LOSES_A_WORKER), finals[ns]
    assert len({str(f["metrics"]) for f in finals.values()}) == 2
    # One storagePath, a prefix per namespace: `<storagePath>/<namespace>/<name>`.
    assert {key.split("/")[0] for key in (store / "runs").files()} == set(jobs)
    exported = run_folder(store, larger, "minilm") / "model"
    loaded = AutoModelForSequenceClassification.from_pretrained(exported.download(tmp_path / "model"))
    assert loaded.config.num_labels == 3


def _restarted_mid_run(world: World, operator: Process, ns: str, release: Release) -> None:
    """The operator restarted (SIGTERM, as a rollout would, then started again) while the job trains: progress
    reaches the new one, and the job keeps its one RayJob. The driver pushes it by the name of the Helm release's
    `rocmtrain-progress` Service, in the release's namespace."""
    watch = Watch(world.cluster, ns, "minilm")
    before = watch.until(lambda s: (s.get("progress") or {}).get("step", 0) >= 1, "progress to arrive")
    rayjob = kuberay.rayjob(world.cluster, ns, "minilm")
    assert rayjob is not None
    rayjob_uid = rayjob["metadata"]["uid"]
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (url,) = [e["value"] for c in head["containers"] for e in c.get("env", []) if e["name"] == PROGRESS_URL_ENV]
    assert url.startswith(f"https://{rocmtrain_operator.PROGRESS_SERVICE}.{release.namespace}.svc:"), url
    operator.restart()
    restarted = time.time()
    after = watch.until(
        lambda s: (
            s.get("progress", {}).get("step", 0) > before["progress"]["step"]
            and time.mktime(time.strptime(s["lastProgressTime"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone >= restarted - 1
        ),
        "progress pushed to the restarted operator",
    )
    assert after["phase"] in ("Running", "Succeeded") and after["rayJobName"] == "minilm", after
    rayjobs = world.cluster.request("GET", kuberay.RAYJOBS.format(ns=ns))["items"]
    assert [r["metadata"]["uid"] for r in rayjobs] == [rayjob_uid], "no second RayJob"


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


def test_a_running_jobs_dashboard_takes_only_its_token_and_deleting_the_job_ends_its_processes(
    world: World, scope: Scope, operator: Process, shared_dir: Path
) -> None:
    ns = scope.namespace("running", processes=True)
    folder = volume(scope, ns, shared_dir / "volume")
    # 100 steps: it is deleted long before its end.
    world.cluster.create(cpu_job("minilm", ns, folder, samples=1600, checkpoint={"everySteps": 2}))
    watch = Watch(world.cluster, ns, "minilm")
    running = watch.until(lambda s: (s.get("progress") or {}).get("step", 0) >= 2, "progress to arrive")
    assert running["phase"] == "Running" and condition(running, "Ready")["status"] == "True"
    assert running["rayJobName"] == "minilm" and running["workersReady"] == 2
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


@dataclass
class Started:
    """A job of `side_by_side`: its namespace, its store (a volume's folder, or a prefix on S3), and what its
    thread waited for."""

    namespace: str
    folder: Any
    outcome: Future[Any]


class SideBySide(Scope):
    """The jobs of the three tests below, applied to the world at once and each watched from the start in a
    thread of its own; each test then checks its own job. They do not disturb each other, and on two cores
    one job's waits (its pods starting, `ray job submit`, KubeRay's and the operator's polls) leave the CPU
    to the others: the three take little more than the longest, not their sum."""

    def __init__(self, world: World, folder: Path) -> None:
        super().__init__(world)
        self.folder = folder
        self.jobs: dict[str, Started] = {}


@pytest.fixture(scope="module")
def side_by_side(world: World, operator: Process, world_s3: S3Server) -> Iterator[SideBySide]:
    """The three jobs; the search and the broken job keep their data and runs on the world's S3 server, the LoRA job
    on a volume."""
    VOLUMES_DIR.mkdir(parents=True, exist_ok=True)
    made = SideBySide(world, Path(tempfile.mkdtemp(prefix="e2e-", dir=VOLUMES_DIR)))
    starts = {"lora": _start_lora, "broken": _start_broken, "search": _start_search}
    try:
        with ThreadPoolExecutor(max_workers=len(starts)) as pool:
            for name, start in starts.items():
                ns = made.namespace(name, processes=True)
                store: Path | S3Path
                if name == "search":
                    world_s3.apply_secret(world.cluster, ns)
                    store = s3_data(world_s3.path(ns))
                elif name == "broken":
                    store = s3_data(world_s3.path(ns))
                else:
                    store = volume(made, ns, made.folder / name)
                made.jobs[name] = Started(ns, store, pool.submit(start(world, ns, store)))
            yield made
    finally:
        made.close()
        shutil.rmtree(made.folder, ignore_errors=True)


def _start_lora(world: World, ns: str, folder: Path) -> Callable[[], dict[str, Any]]:
    """A causal-lm job with a LoRA adapter on the language-model example's tiny Llama (made from a config,
    on the volume); waits for `_assert_trained`."""
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
    watch = Watch(world.cluster, ns, "llama")
    return lambda: _assert_trained(world, ns, "llama", folder, watch, ("evalPerplexity", "evalExactMatch"))


def test_a_lora_adapter_of_a_language_model_trains_with_its_loss_and_perplexity_in_the_status(
    world: World, side_by_side: SideBySide
) -> None:
    """The causal-lm job succeeds with its pushed loss, perplexity, exact match and parameter counts in the
    status, the Loss and Perplexity columns of `kubectl get` show them, and the adapter lands in the run folder."""
    started = side_by_side.jobs["lora"]
    ns, folder = started.namespace, started.folder
    metrics = started.outcome.result()["metrics"]
    assert metrics["evalPerplexity"] == pytest.approx(math.exp(metrics["evalLoss"]))
    assert 0 < metrics["trainableParameters"] < metrics["totalParameters"] and "evalAccuracy" not in metrics
    printed = world.cluster.printed(JOBS.format(ns=ns) + "/llama")
    assert printed["Perplexity"] == metrics["evalPerplexity"] and printed["Loss"] == metrics["trainLoss"]
    assert printed["Accuracy"] is None
    model = run_folder(folder, ns, "llama") / "model"
    assert json.loads((model / "adapter_config.json").read_text())["r"] == 4
    assert (model / "adapter_model.safetensors").is_file() and not (model / "model.safetensors").exists()


def _start_broken(world: World, ns: str, store: S3Path) -> Callable[[], dict[str, Any]]:
    """A job whose Secret holds a wrong secret key for the world's S3 server, with a whole-job retry to spare; waits
    for its end."""
    secret = store.server.secret(ns)
    secret["data"]["AWS_SECRET_ACCESS_KEY"] = base64.b64encode(b"not-the-key-" + b"x" * 28).decode()
    world.cluster.apply(secret)
    spec = {"resources": {"workers": 1}, "faultTolerance": {"jobRetries": 1}, "env": object_store.spec_env()}
    world.cluster.create(cpu_job("minilm", ns, store, **spec))
    watch = Watch(world.cluster, ns, "minilm")
    return lambda: watch.until(_finished, "the job to end", timeout=TIMEOUT)


def test_a_job_with_wrong_object_store_keys_fails_at_once_with_the_stores_error_and_spends_no_retry(
    world: World, side_by_side: SideBySide
) -> None:
    """The driver's pre-flight finds that the keys do not open the bucket: the job fails at once with the store's
    own words in the Failed condition and `status.preflightError`, its whole-job retry unspent (a retry could not
    fix the keys), its RayJob and Ray cluster gone, the secret key nowhere in what the user sees."""
    started = side_by_side.jobs["broken"]
    ns = started.namespace
    final = started.outcome.result()
    assert final["phase"] == "Failed", final
    failed = condition(final, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "PreflightFailed", failed
    assert "AWS Error ACCESS_DENIED" in failed["message"] or "InvalidAccessKeyId" in failed["message"], failed
    assert final["preflightError"] in failed["message"] and not final.get("restarts"), final
    warning = world.cluster.wait_for(
        lambda: next((e for e in events(world.cluster, ns, "minilm") if e["reason"] == "Failed"), None),
        30,
        "the Failed event",
    )
    assert warning["type"] == "Warning" and final["preflightError"].splitlines()[0] in warning["message"]
    world.cluster.wait_for(lambda: ray_cluster_gone(world.cluster, ns, "minilm"), 120, "the Ray cluster to go")
    assert not world.cluster.request("GET", kuberay.RAYJOBS.format(ns=ns))["items"], "the RayJob deleted"
    seen = json.dumps([status(world.cluster, ns, "minilm"), events(world.cluster, ns, "minilm")])
    assert "not-the-key-" not in seen and started.folder.server.secret_key not in seen
    assert status(world.cluster, ns, "minilm")["phase"] == "Failed"


def _start_search(world: World, ns: str, store: S3Path) -> Callable[[], tuple[dict[str, Any], Watch, dict[str, Any]]]:
    """A search of 2 trials at once, 1 worker each, its data and runs on S3; waits for its RayJob, then for its end."""
    tuning = {
        "searchSpace": {"learningRate": {"min": 1e-5, "max": 1e-3}},
        "numTrials": 2,
        "maxConcurrentTrials": 2,
        "scheduler": {"type": "None"},
    }
    world.cluster.create(
        cpu_job("search", ns, store, samples=48, resources={"workers": 1}, tuning=tuning, env=object_store.spec_env())
    )
    watch = Watch(world.cluster, ns, "search")

    def wait() -> tuple[dict[str, Any], Watch, dict[str, Any]]:
        rayjob = world.cluster.wait_for(lambda: kuberay.rayjob(world.cluster, ns, "search"), 60, "the RayJob")
        return rayjob, watch, watch.until(_finished, "the search to end")

    return wait


def test_a_search_runs_its_trials_at_once_on_one_ray_cluster_and_reports_the_best(
    world: World, side_by_side: SideBySide
) -> None:
    """spec.tuning on the cluster: a worker pod for each trial that runs at once, both trials training
    side by side on the one Ray cluster, status.tuning that counts them and names the best, its metric
    in `kubectl get`, the NewBestTrial event, and the best trial's model where a job's model goes: on S3,
    with the search's summary."""
    started = side_by_side.jobs["search"]
    ns, folder = started.namespace, started.folder
    rayjob, watch, final = started.outcome.result()
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == 2, "1 worker for each of 2 concurrent trials"

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


class Seen:
    """Every status a watch polled, with the time it saw it: a predicate that records, and holds at the end."""

    def __init__(self) -> None:
        self.states: list[tuple[float, dict[str, Any]]] = []

    def __call__(self, state: dict[str, Any]) -> bool:
        self.states.append((time.time(), state))
        return _finished(state)


def _watch(world: World, ns: str, name: str, seen: Seen) -> tuple[dict[str, Any], Watch]:
    watch = Watch(world.cluster, ns, name)
    return watch.until(seen, f"{name} to end"), watch


def test_five_scripts_of_their_own_at_once(world: World, scope: Scope, operator: Process, shared_dir: Path) -> None:
    """The recipe with an unmodified HF Trainer reaches Succeeded with progress, loss and ETA from
    KubeflowCallback in its status and in `kubectl get`; a loop reporting through the SDK, with hostile
    arguments that no shell reads, reaches Succeeded with each step; a script raising in its own function
    fails with that error line first; a script reporting nothing succeeds, saying that it reported nothing;
    Ray's own transformers example, unchanged but for hub access, succeeds on two pods with its loss, its
    run in Ray Train's default storage on the shared volume."""
    ns = scope.namespace("own", processes=True)
    folder = volume(scope, ns, shared_dir / "volume")
    shutil.copytree(OWN_CODE_SCRIPTS, folder / "own_code")
    shutil.copy(EXAMPLES / "own-code" / "recipe.py", folder / "recipe.py")
    save_tiny_bert(folder / "bert", hidden_size=128, intermediate_size=512)
    ray_example = stand_ins.ray_example(folder / "ray-example")
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
        "ray-example": cpu_job(
            "ray-example",
            ns,
            folder,
            code={"command": ["python", ray_example.name], "workingDir": str(ray_example.parent)},
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
    trained = finals["recipe"].get("metrics", {}).get("trainSeconds")
    print(f"apply to end, seconds: {took}; the recipe's Trainer trained for {trained} s", flush=True)

    _rays_example_trained_on_two_pods(world, ns, folder, finals["ray-example"], ended["ray-example"][1])
    _the_recipe_reported_through_kubeflows_callback(
        world, ns, folder, finals["recipe"], seen["recipe"], ended["recipe"][1]
    )
    _the_sdk_reported_each_step(folder, ns, finals["sdk"], seen["sdk"], hostile, pwned)
    _the_failure_names_its_line(world, ns, finals["fails"])
    _nothing_reported_is_said(folder, ns, finals["silent"])


def _rays_example_trained_on_two_pods(world: World, ns: str, folder: Path, final: dict[str, Any], watch: Watch) -> None:
    """Ray's example (tests/own_code/outside) names no storage: the operator made Ray Train's default the run
    folder's ray_results/, which both worker pods share; its Trainer logs no loss in 375 steps (logging_steps
    500), so the loss is its run's mean train_loss, in the status and in `kubectl get`."""
    assert final["phase"] == "Succeeded", final
    assert final["progress"]["percent"] == 100 and math.isfinite(final["metrics"]["trainLoss"]), final
    assert max(watch.workers_running, default=0) == 2, "two worker pods"
    printed = world.cluster.printed(JOBS.format(ns=ns) + "/ray-example")
    assert (printed["Progress"], printed["Loss"]) == (100, final["metrics"]["trainLoss"]), printed
    kept = list((run_folder(folder, ns, "ray-example") / "ray_results").glob("*/checkpoint_*"))
    assert kept, "Ray Train kept its checkpoints in the run folder's ray_results/"


def _reported(state: dict[str, Any]) -> tuple[str, str]:
    found = condition(state, ConditionType.PROGRESS_REPORTED)
    return found.get("status", ""), found.get("reason", "")


def _the_recipe_reported_through_kubeflows_callback(
    world: World, ns: str, folder: Path, final: dict[str, Any], seen: Seen, watch: Watch
) -> None:
    assert final["phase"] == "Succeeded", final
    RocmTrainingJobStatus.model_validate(final)
    progress, metrics = final["progress"], final["metrics"]
    assert progress["percent"] == 100 and "etaSeconds" not in progress, progress  # an ended job has no ETA
    for key in ("trainLoss", "evalLoss", "evalAccuracy", "learningRate", "trainSeconds", "samplesPerSecond"):
        assert math.isfinite(metrics[key]), key
    assert "grad_norm" in {m["name"] for m in metrics["custom"]}
    assert _reported(final) == ("True", Reason.PROGRESS_REPORTED)
    midway = [s for _, s in seen.states if 0 < (s.get("progress") or {}).get("percent", 0) < 100]
    assert midway and all(s["progress"]["etaSeconds"] >= 0 and s["progress"]["step"] > 0 for s in midway), midway
    # KubeflowCallback rounds the ETA down to whole seconds, and says 99% until the end: a report of the last
    # steps may rightly say 0 s. Before them, every report has an ETA.
    assert all(s["progress"]["etaSeconds"] > 0 for s in midway if s["progress"]["percent"] <= 90), midway
    assert {s["progress"]["totalSteps"] for s in midway} == {100}, "1600 samples for 2 workers of 8 a step"
    printed = world.cluster.printed(JOBS.format(ns=ns) + "/recipe")
    # An ended job shows no ETA.
    assert (printed["Progress"], printed["Loss"], printed["ETA"]) == (100, metrics["trainLoss"], None), printed
    assert max(watch.workers_running, default=0) == 2, "both workers of the data-parallel Trainer"
    checkpoints = list(run_folder(folder, ns, "recipe").glob("checkpoint_*"))
    assert checkpoints, "Ray Train kept the Trainer's checkpoint in the job's run folder"


def _the_sdk_reported_each_step(
    folder: Path, ns: str, final: dict[str, Any], seen: Seen, hostile: list[str], pwned: Path
) -> None:
    assert final["phase"] == "Succeeded", final
    run = run_folder(folder, ns, "sdk")
    assert json.loads((run / "argv.json").read_text()) == hostile and not pwned.exists()
    assert final["progress"] == _ended(SDK_STEPS_LAST_PROGRESS) and final["metrics"] == SDK_STEPS_LAST_METRICS
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
    assert lines[-3].endswith('fails.py", line 10, in check') and "raise ValueError" in lines[-2], lines
    assert failed["reason"] == "AppFailed" and lines[-1] == "(the Ray job's entrypoint exited with code 1)", lines
    assert "\\x1b" not in failed["message"] and len(lines) <= 8, "the error and the user's frames, not Ray's log"
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


def test_the_jobs_ran_under_the_helm_release_as_its_service_account_with_its_settings(
    world: World, release: Release, operator: Process
) -> None:
    """The module's operator is the Helm release's (no job of its own: the jobs above ran under it, and
    `_restarted_mid_run` saw a driver push by the name of the release's Service). The release is deployed,
    its Deployment made by Helm, its pod Running on a kwok node (faked: there is no operator image here);
    the operator process authenticates as the release's ServiceAccount and has the release's settings;
    the chart's `rocmtrain-progress` Service (with a selector) resolves on the pod network to this machine."""
    cluster = world.cluster
    listed = release.listed()
    assert (listed["status"], listed["chart"].rpartition("-")[0]) == ("deployed", "rocm-train-operator"), listed
    deployment = cluster.request("GET", f"/apis/apps/v1/namespaces/{release.namespace}/deployments/{DEPLOYMENT}")
    assert deployment["metadata"]["annotations"]["meta.helm.sh/release-name"] == release.name

    def running_pod() -> dict[str, Any] | None:
        pods = cluster.request("GET", f"/api/v1/namespaces/{release.namespace}/pods")["items"]
        return next((p for p in pods if (p.get("status") or {}).get("phase") == "Running"), None)

    pod = cluster.wait_for(running_pod, 30, "the release's pod to run on a kwok node")
    assert pod["spec"]["nodeName"] not in runtime.PROCESS_NODES, pod["spec"]["nodeName"]

    with KubeCluster(Path(operator.env["KUBECONFIG"])) as account:
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        who = account.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=review)
    user = f"system:serviceaccount:{release.namespace}:{rocmtrain_operator.ACCOUNT}"
    assert who["status"]["userInfo"]["username"] == user, who["status"]
    settings = outside_settings(live_env(cluster, release.namespace))
    assert settings["ROCMTRAIN_RETRY_SECONDS"] == "2" and "ROCMTRAIN_STALL_SECONDS" in settings, settings
    assert {name: operator.env.get(name) for name in settings} == settings
    assert operator.env["ROCMTRAIN_OPERATOR_NAMESPACE"] == release.namespace

    service = cluster.request("GET", f"/api/v1/namespaces/{release.namespace}/services/rocmtrain-progress")
    assert service["spec"]["selector"], service["spec"]
    assert service["metadata"]["annotations"]["meta.helm.sh/release-name"] == release.name
    host = runtime.info(world.workdir)["hostAddress"]
    assert f"{host} {rocmtrain_operator.PROGRESS_SERVICE}.{release.namespace}.svc\n" in world.names.hosts.read_text()
