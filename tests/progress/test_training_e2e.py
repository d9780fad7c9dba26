"""End to end: a real training run reports into a real job's status through the progress endpoint.

Real parts: the training loop (`rocmtrain run`'s local runner: an embedded Ray, Ray Train, a tiny BERT on
the CPU, since what it learns does not count here) with its HTTP sink, the endpoint with the real TokenReview,
and kube-apiserver. Not real: the Ray head pod the token is bound to is an object created here with KubeRay's
labels (no KubeRay, no kubelet), and the training runs on this machine instead of in that pod.
"""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import pytest

from progress.endpoint import ServerThread, bound_token, create_job, create_ray_head
from rocmtrain.api.contract import PROGRESS_CA_ENV, PROGRESS_TOKEN_ENV, PROGRESS_URL_ENV
from rocmtrain.api.models import RocmTrainingJob, RocmTrainingJobStatus
from rocmtrain_testworld.kubecluster import KubeCluster
from rocmtrain_train.config import local_settings
from rocmtrain_train.driver.train_job import run_local
from train.conftest import save_tiny_bert

pytestmark = [pytest.mark.cluster, pytest.mark.ray]

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"


def tiny_spec(model: Path) -> dict:
    return {
        "model": {"source": str(model), "numLabels": 3, "maxSeqLength": 32},
        "data": {
            "train": {"uri": str(DATA / "train.jsonl"), "maxSamples": 192},
            "eval": {"uri": str(DATA / "eval.jsonl"), "maxSamples": 64},
        },
        # 24 steps, evaluated every 8: at least three reports, however fast the machine.
        "training": {
            "epochs": 1,
            "batchSizePerWorker": 8,
            "learningRate": 1e-4,
            "precision": "fp32",
            "evalEverySteps": 8,
        },
        "resources": {"workers": 1, "gpusPerWorker": 0, "cpusPerWorker": "1", "memoryPerWorker": "2Gi"},
        # Required by the API server; this test trains locally, into --storage.
        "checkpoint": {"storagePath": "s3://checkpoints/tiny-bert"},
    }


def test_training_moves_the_job_status_to_its_final_metrics(
    kube: KubeCluster, progress_server: ServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    namespace, name = kube.new_namespace("train"), "tiny-bert"
    cluster = f"{name}-k2m9p"
    job = create_job(kube, namespace, name, cluster, tiny_spec(save_tiny_bert(tmp_path / "bert")))
    head = create_ray_head(kube, namespace, name, cluster)
    (tmp_path / "token").write_text(bound_token(kube, head))
    (tmp_path / "ca.crt").write_bytes(progress_server.server.ca_crt)
    monkeypatch.setenv(PROGRESS_URL_ENV, progress_server.url(namespace, name))
    monkeypatch.setenv(PROGRESS_CA_ENV, str(tmp_path / "ca.crt"))
    monkeypatch.setenv(PROGRESS_TOKEN_ENV, str(tmp_path / "token"))
    # Another Ray named on this machine (as `ray start` leaves one in /tmp/ray/ray_current_cluster): the
    # embedded Ray is a new one all the same, never a stranger's cluster.
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")

    settings = local_settings(
        RocmTrainingJob.model_validate(job),
        job_dir=str(tmp_path),
        run_id=uuid.uuid4().hex,
        storage=str(tmp_path / "runs"),
        force_cpu=True,
        cpu_count=2,
        report_interval_s=0.5,
    )
    outcome = run_local(settings, console=False)

    status = head.job_object(kube)["status"]
    RocmTrainingJobStatus.model_validate(status)
    total = outcome.summary["steps"]
    assert status["progress"]["step"] == status["progress"]["totalSteps"] == total
    assert status["progress"]["percent"] == 100.0
    assert status["metrics"]["evalAccuracy"] == pytest.approx(outcome.summary["eval_accuracy"])
    assert status["metrics"]["evalLoss"] == pytest.approx(outcome.summary["eval_loss"])
    assert math.isfinite(status["metrics"]["trainLoss"])
    history = status["history"]
    steps = [point["step"] for point in history]
    assert total == 24 and steps == sorted(steps) and steps[-1] == total
    assert [p["step"] for p in history if "evalAccuracy" in p] == [8, 16, 24], "each evaluation once in the curve"
    assert history[-1]["evalAccuracy"] == pytest.approx(outcome.summary["eval_accuracy"])
    assert status["lastProgressTime"]
