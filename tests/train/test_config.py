"""Run settings for local and cluster runs, the job transport, and the resume rule."""

from __future__ import annotations

import pytest

from rocmtrain.api.contract import JOB_ENV
from rocmtrain.api.errors import ConfigError
from rocmtrain_train.checkpoint.train_state import resumable
from rocmtrain_train.config import CLUSTER_LOG_ROOT, cluster_settings, job_from_env, local_settings
from train.jobs import EXAMPLES, job


@pytest.mark.parametrize(("value", "cpus", "threads"), [("8", 8.0, 8), ("1.5", 1.5, 1), ("500m", 0.5, 1)])
def test_cpus_are_kubernetes_quantities(value, cpus, threads):
    run = cluster_settings(job("cpus", CLUSTER, {"resources": {"cpusPerWorker": value}}), run_id="r")
    assert (run.cpus_per_worker, run.torch_threads) == (cpus, threads)


def test_each_gpu_is_a_rank_with_its_share_of_the_pod():
    run = cluster_settings(
        job("gpus", CLUSTER, {"resources": {"workers": 2, "gpusPerWorker": 8, "cpusPerWorker": "96"}}), run_id="r"
    )
    assert (run.world_size, run.layout.ranks_per_pod, run.total_gpus, run.torch_threads) == (16, 8, 16, 12)
    assert run.layout.resources_per_rank() == {"CPU": 12.0, "GPU": 1.0}


def test_local_runs_share_the_machine_cpus_among_ranks(tmp_path):
    quick = job("quick", {"resources": {"workers": 2, "cpusPerWorker": "8"}})
    assert local_settings(quick, job_dir=str(EXAMPLES), run_id="r", cpu_count=2).cpus_per_worker == 1.0
    assert local_settings(quick, job_dir=str(EXAMPLES), run_id="r", cpu_count=16).cpus_per_worker == 8.0
    assert local_settings(quick, job_dir=str(EXAMPLES), run_id="r", cpu_count=6).torch_threads == 3
    gpus = job("gpus", {"resources": {"workers": 1, "gpusPerWorker": 4, "cpusPerWorker": "32"}})
    on_gpus = local_settings(gpus, job_dir=str(EXAMPLES), run_id="r", cpu_count=16)
    assert (on_gpus.world_size, on_gpus.torch_threads) == (4, 4)
    on_cpu = local_settings(gpus, job_dir=str(EXAMPLES), run_id="r", cpu_count=16, force_cpu=True)
    assert (on_cpu.world_size, on_cpu.torch_threads) == (1, 16)


def test_local_storage_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain = job("quick")
    assert local_settings(plain, job_dir=str(EXAMPLES), run_id="r").storage == str(tmp_path / "runs")
    assert local_settings(plain, job_dir=str(EXAMPLES), run_id="r", storage="out").run_path == str(
        tmp_path / "out/quick"
    )
    spec_storage = job("quick", {"checkpoint": {"storagePath": "./ckpt"}})
    chosen = local_settings(spec_storage, job_dir=str(EXAMPLES), run_id="r")
    assert chosen.storage == str(EXAMPLES / "ckpt")
    assert chosen.log_dir == str(EXAMPLES / "ckpt" / "quick" / "logs")
    assert chosen.model_output == str(EXAMPLES / "ckpt" / "quick" / "model")


def test_cpu_flag_overrides_gpus():
    gpu_job = job("gpu", {"resources": {"gpusPerWorker": 1}})
    assert local_settings(gpu_job, job_dir="/x", run_id="r").use_gpu
    forced = local_settings(gpu_job, job_dir="/x", run_id="r", force_cpu=True)
    assert not forced.use_gpu and forced.gpus_per_worker == 0


# What makes the quickstart job a cluster job: data on a volume instead of `./` paths, shared storage.
CLUSTER = {
    "data": {"train": {"uri": "/data/train.jsonl"}, "eval": {"uri": "/data/eval.jsonl"}},
    "checkpoint": {"storagePath": "s3://bucket/runs"},
}


def test_cluster_settings():
    on_volume = cluster_settings(job("big", {"checkpoint": {"storagePath": "/mnt/ckpt"}}), run_id="r")
    assert on_volume.run_path == "/mnt/ckpt/default/big" and on_volume.log_dir == "/mnt/ckpt/default/big/logs"
    in_bucket = cluster_settings(job("big", {"checkpoint": {"storagePath": "s3://bucket/runs"}}), run_id="r")
    assert in_bucket.model_output == "s3://bucket/runs/default/big/model"
    assert in_bucket.log_dir == f"{CLUSTER_LOG_ROOT}/big/logs"
    with pytest.raises(ConfigError, match="storagePath is required for a cluster job"):
        cluster_settings(job("big"), run_id="r")
    assert cluster_settings(job("big", CLUSTER, {"resources": {"gpusPerWorker": 2}}), run_id="r").gpus_per_worker == 2


def test_jobs_of_one_name_in_two_namespaces_never_share_a_run_folder():
    foo = job("foo", CLUSTER)
    in_namespace = [
        foo.model_copy(update={"metadata": foo.metadata.model_copy(update={"namespace": ns})})
        for ns in ("team-a", "team-b")
    ]
    paths = {cluster_settings(j, run_id="r").run_path for j in in_namespace}
    assert paths == {"s3://bucket/runs/team-a/foo", "s3://bucket/runs/team-b/foo"}


def test_the_job_travels_in_the_environment_and_is_validated_as_a_cluster_job():
    sent = job("sent", CLUSTER)
    assert job_from_env({JOB_ENV: sent.model_dump_json(by_alias=True)}) == sent
    with pytest.raises(ConfigError, match="is not set"):
        job_from_env({})
    with pytest.raises(ConfigError, match="not hold a valid RocmTrainingJob"):
        job_from_env({JOB_ENV: '{"kind": "RocmTrainingJob"'})
    with pytest.raises(ConfigError, match=r"not hold a valid RocmTrainingJob: spec: required field is missing"):
        job_from_env(
            {JOB_ENV: '{"apiVersion": "rocmtrain.dev/v1alpha1", "kind": "RocmTrainingJob", "metadata": {"name": "x"}}'}
        )
    with pytest.raises(ConfigError, match=r"spec.data.train.uri: a ./relative path is only for `rocmtrain run`"):
        job_from_env({JOB_ENV: job("local").model_dump_json(by_alias=True)})


def test_resume_rule():
    saved = {"run_id": "first", "world_size": 2}
    assert resumable(saved, resume="auto", run_id="second")  # a whole-job retry, at any world size
    assert resumable(saved, resume="never", run_id="first")  # a worker restart within the run
    assert not resumable(saved, resume="never", run_id="second")
