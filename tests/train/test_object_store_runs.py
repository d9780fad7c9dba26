"""Runs on real object storage: data, checkpoints and the exported model on the test world's S3 server
(SeaweedFS, `rocmtrain_testworld.s3`), reached through pyarrow's and Ray Train's own S3 clients.

Configured as a user would: the standard AWS variables (`AWS_ENDPOINT_URL`, the key pair, `AWS_REGION`) and
`s3://` URIs in the job, nothing else. The embedded Ray starts after the variables are set, since Ray's
workers take the environment of the `ray.init` that started them. The model is the tiny BERT: only the
mechanics count here, and MiniLM's checkpoints (270 MB with the optimiser's state) would cost most of the time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForSequenceClassification

from rocmtrain_testworld.s3 import S3Path, S3Server
from rocmtrain_train.driver.train_job import run_local
from train.conftest import start_ray
from train.jobs import EXAMPLES, job, settings
from train.test_training import FAULTS, GLOBAL_BATCH, assert_trained_exactly_once

pytestmark = pytest.mark.ray

NAME = "store-lost"
# A checkpoint directory name newer than any Ray Train writes: a cut-off upload that the test plants.
CUT_OFF = "checkpoint_2999-01-01_00-00-00.000000"


@pytest.fixture(scope="module")
def s3_env(s3: S3Server) -> Iterator[dict[str, str]]:
    """The server's AWS variables in this process's environment, and the embedded Ray started after them."""
    import ray

    ray.shutdown()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3.env().items():
            patch.setenv(name, value)
        start_ray()
        yield s3.env()
        ray.shutdown()


def _job_on_s3(data: S3Path, storage: S3Path, *specs: dict) -> dict:
    return {
        "data": {"train": {"uri": (data / "train.jsonl").uri}, "eval": {"uri": (data / "eval.jsonl").uri}},
        "checkpoint": {"storagePath": storage.uri},
        "faultTolerance": {"maxWorkerFailures": 0},
    } | {k: v for spec in specs for k, v in spec.items()}


def _wait_for_a_checkpoint(snapshot: S3Path, driver: subprocess.Popen, log: Path) -> None:
    """Until Ray Train has recorded the run's first checkpoint in its snapshot. It records one report of each
    rank per look at the workers, 2 s apart: the snapshot of the next checkpoint, or the model's export if
    the ranks are faster, is still to be written when the test stops the server a tenth of a second later."""
    deadline = time.monotonic() + 300
    while not snapshot.is_file():
        assert driver.poll() is None, f"the run ended before its first checkpoint:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint within 5 minutes"
        time.sleep(0.1)


def test_a_run_that_loses_its_store_fails_and_the_next_resumes_from_the_last_complete_checkpoint(
    s3: S3Server, s3_env: dict[str, str], tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rocmtrain run` with data and storagePath on `s3://`: the server is stopped once Ray Train has recorded a
    checkpoint, and the run fails at its next write with the store's error. With the server back, a cut-off
    checkpoint newer than any other is planted; the next run, with one rank instead of two (half the global
    batch, a whole-job retry at another world size), resumes from the last complete checkpoint after the samples
    it had seen, trains each sample once, and exports a model to the bucket that `from_pretrained` loads."""
    prefix = s3.path(f"runs-{uuid.uuid4().hex[:8]}")
    data, storage = prefix / "data", prefix / "runs"
    for name in ("train.jsonl", "eval.jsonl"):
        s3.put(EXAMPLES / "data" / name, data / name)
    run = storage / NAME
    first = job(NAME, FAULTS, _job_on_s3(data, storage), model=tiny_bert)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(first.model_dump(by_alias=True, exclude_none=True, mode="json")))
    log = tmp_path / "first.log"
    with log.open("w") as out:
        driver = subprocess.Popen(
            [str(Path(sys.executable).parent / "rocmtrain"), "run", "job.yaml"],
            cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | s3_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_for_a_checkpoint(run / "checkpoint_manager_snapshot.json", driver, log)
            s3.stop(grace=1)
            assert driver.wait(timeout=600) == 1
        finally:
            driver.kill()
    printed = log.read_text()
    assert "training failed:" in printed and "NETWORK_CONNECTION" in printed, printed[-3000:]
    assert s3_env["AWS_SECRET_ACCESS_KEY"] not in printed

    s3.restart()
    # The last checkpoint whose upload completed: Ray Train records one in its snapshot after the upload only.
    latest = json.loads((run / "checkpoint_manager_snapshot.json").read_text())["latest_checkpoint_result"]
    complete = latest["checkpoint_dir_name"]
    (run / CUT_OFF / "model.safetensors").write_bytes(b"cut off")

    (tmp_path / "second").mkdir()
    monkeypatch.chdir(tmp_path / "second")  # the local logs of a run on object storage: ./runs/<name>/logs
    one_rank = {"resources": {"workers": 1, "cpusPerWorker": "2"}}
    second = settings(job(NAME, FAULTS, _job_on_s3(data, storage), one_rank, model=tiny_bert), None)
    assert second.run_path == run.uri
    outcome = run_local(second, console=False)
    assert outcome.worker_failures == 0 and outcome.summary["world_size"] == 1
    assert_trained_exactly_once(outcome, batch_after=GLOBAL_BATCH // 2)
    resumed = outcome.summary["resumed_from_step"]
    log_text = Path(second.log_dir, "rank-0.log").read_text()
    samples = resumed * GLOBAL_BATCH
    assert (
        f"written by 2 ranks with other steps; continuing after {samples} samples of epoch 1, at step {samples // 16}"
        in log_text
    )
    assert CUT_OFF not in log_text and f"resuming from {run.path}/{complete}" in log_text, log_text

    model = (run / "model").download(tmp_path / "model")
    assert outcome.summary["model_path"] == (run / "model").uri
    assert AutoModelForSequenceClassification.from_pretrained(model).config.num_labels == 3
