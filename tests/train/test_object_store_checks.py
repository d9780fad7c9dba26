"""The driver's pre-flight of object storage, and the driver's logs kept beside a run in a bucket.

What is faked: the buckets. `s3://<bucket>/...` is served by a pyarrow SubTreeFileSystem over a local
folder (a bucket is a folder there), injected where the real code calls `object_store_filesystem`, as
in test_data; a store that refuses writes is the same folder behind a handler that answers writes as
S3 answers a key without the right. An unreachable store is real: pyarrow's S3 client against a port
nobody listens on, configured by the AWS variables alone. The real S3 server is tests/storage's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import yaml

from fakes import Sent
from rocmtrain.api.contract import DRIVER_ERROR_PREFIX, JOB_ENV, PROGRESS_TOKEN_ENV, PROGRESS_URL_ENV
from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain_train.cli import run as cli
from rocmtrain_train.config import RunSettings
from rocmtrain_train.driver.driver_checks import WRITE_CHECK, check_object_store
from rocmtrain_train.reporting.local_endpoint import LocalEndpoint
from rocmtrain_train.reporting.log_upload import keep_logs
from rocmtrain_train.storage import ObjectStoreFactory, store_error
from train.jobs import EXAMPLES, job, settings

KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
DENIED = "AWS Error ACCESS_DENIED during PutObject operation: Access Denied"
TRAIN = str(EXAMPLES / "data" / "train.jsonl")


def buckets(root: Path, handler: type[pafs.FSSpecHandler] | None = None) -> ObjectStoreFactory:
    """`s3://<bucket>/<key>` as `root/<bucket>/<key>`; through `handler` (over the local disk) when given."""
    local: pafs.FileSystem = pafs.LocalFileSystem()
    if handler is not None:
        import fsspec

        local = pafs.PyFileSystem(handler(fsspec.filesystem("file")))

    def object_store(uri: str) -> tuple[pafs.FileSystem, str]:
        return pafs.SubTreeFileSystem(str(root), local), uri.removeprefix("s3://")

    return object_store


class RefusesWrites(pafs.FSSpecHandler):
    """A store whose credentials may read but not write: S3's answer to every new object."""

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        raise OSError(f"When initiating multiple part upload for key '{path}' in bucket 'ckpt': {DENIED}")


def on_s3(name: str, *specs: dict[str, Any]) -> RunSettings:
    """Local-run settings of a job whose checkpoints go to `s3://ckpt/runs` (run folder s3://ckpt/runs/<name>); its
    logs in ./runs/<name>/logs, as `rocmtrain run` has them."""
    return settings(job(name, {"checkpoint": {"storagePath": "s3://ckpt/runs"}}, *specs), None)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The AWS variables of a store nobody answers on (a port bound, never listening): its endpoint URL."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
        for name, value in {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        yield endpoint


def test_buckets_that_answer_pass_and_the_write_check_leaves_nothing_behind(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "ckpt").mkdir()
    run = on_s3("fine", {"data": {"train": {"uri": "s3://data/train.jsonl"}, "eval": {"uri": "s3://data/eval.jsonl"}}})
    check_object_store(run, buckets(tmp_path))
    assert (tmp_path / "ckpt" / "runs" / "fine").is_dir()
    assert not [path for path in tmp_path.rglob(f"{WRITE_CHECK}*")]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"data": {"train": {"uri": "s3://nodata/train.jsonl"}}},
            "spec.data.train.uri: s3://nodata/train.jsonl is not readable: bucket 'nodata' does not exist",
        ),
        (
            {"data": {"eval": {"uri": "s3://nodata/eval.jsonl"}}},
            "spec.data.eval.uri: s3://nodata/eval.jsonl is not readable: bucket 'nodata' does not exist",
        ),
        (
            {"model": {"source": "s3://nomodels/minilm"}},
            "spec.model.source: s3://nomodels/minilm is not readable: bucket 'nomodels' does not exist",
        ),
        (
            {"checkpoint": {"storagePath": "s3://nockpt/runs"}},
            "spec.checkpoint.storagePath: s3://nockpt/runs/missing is not writable: bucket 'nockpt' does not exist",
        ),
    ],
    ids=["train", "eval", "model", "storage"],
)
def test_a_missing_bucket_is_named_with_its_field(tmp_path, spec, message):
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(ConfigError) as refused:
        check_object_store(on_s3("missing", spec), buckets(tmp_path))
    assert str(refused.value) == message


def test_storage_the_credentials_cannot_write_is_refused_in_the_stores_words(tmp_path):
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(ConfigError) as refused:
        check_object_store(on_s3("read-only"), buckets(tmp_path, RefusesWrites))
    assert str(refused.value) == f"spec.checkpoint.storagePath: s3://ckpt/runs/read-only is not writable: {DENIED}"


def test_an_unreachable_store_is_refused_with_the_aws_error_and_no_secret(aws):
    """The real S3 client, configured by the AWS variables alone, against an endpoint nobody answers."""
    with pytest.raises(ConfigError) as refused:
        check_object_store(on_s3("unreachable", {"data": {"train": {"uri": "s3://data/train.jsonl"}}}))
    message = str(refused.value)
    assert message.startswith(
        "spec.data.train.uri: s3://data/train.jsonl is not readable: "
        "AWS Error NETWORK_CONNECTION during HeadBucket operation"
    ), message
    assert SECRET not in message and KEY_ID not in message and "\n" not in message


def test_store_errors_are_short_one_line_and_never_hold_a_secret(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "x" * 600)
    error = OSError(
        f"When reading information for key 'k' in bucket 'b': AWS Error ACCESS_DENIED during HeadObject operation: "
        f"the signature of {KEY_ID} with {SECRET} does not match\nsession {'x' * 600}"
    )
    said = store_error(error)
    assert said.startswith("AWS Error ACCESS_DENIED during HeadObject operation: the signature of *** with ***")
    assert KEY_ID not in said and SECRET not in said and "xxx" not in said and "\n" not in said
    assert len(said) <= 500
    assert store_error(OSError("bucket 'b' does not exist")) == "bucket 'b' does not exist"


def test_rocmtrain_run_refuses_an_unreachable_store_in_one_line_without_the_secret(aws, tmp_path, capsys):
    raw = job("unreachable", {"checkpoint": {"storagePath": "s3://ckpt/runs"}}).dump()
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(raw))
    assert cli.main([str(tmp_path / "job.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: spec.checkpoint.storagePath: s3://ckpt/runs/unreachable is not writable: ")
    assert "NETWORK_CONNECTION" in err and err.count("\n") == 1
    assert SECRET not in err and "Traceback" not in err


def test_a_store_lost_mid_run_fails_rocmtrain_run_with_the_stores_words(aws, tmp_path, monkeypatch, capsys):
    """A checkpoint upload the store cuts off fails the rank, and Ray Train the run (the real server's case is
    test_object_store_runs'): `rocmtrain run` says so in one line, the store's words in it, no secret."""
    from ray.train import WorkerGroupError

    from rocmtrain_train.driver import train_job

    lost = OSError(
        "When uploading part for key 'runs/lost/checkpoint_x/model.safetensors' in bucket 'ckpt': AWS Error "
        f"NETWORK_CONNECTION during UploadPart operation: curlCode: 7, Could not connect to server ({SECRET})"
    )

    def store_lost(*args: Any, **kwargs: Any) -> None:
        raise WorkerGroupError("[Rank 0]\nTraceback (most recent call last): ...", {0: lost})

    monkeypatch.setattr(train_job, "run_local", store_lost)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job("lost").dump()))
    assert cli.main([str(tmp_path / "job.yaml"), "--storage", str(tmp_path / "runs")]) == 1
    said = capsys.readouterr().err.splitlines()[0]
    assert said.startswith("training failed: rank 0: OSError: When uploading part for key"), said
    assert "AWS Error NETWORK_CONNECTION during UploadPart operation" in said and SECRET not in said


# ---- the driver's refusal on a cluster ---------------------------------------------------------


def test_the_cluster_driver_reports_its_refusal_to_the_operator_and_exits_2(aws, tmp_path):
    """`python -m rocmtrain_train` as the RayJob runs it: a storagePath on a store it cannot reach is refused
    before Ray starts, in a last report with `preflightError` to the progress endpoint (the loopback one of
    `rocmtrain run`, which reads bodies as the operator's does), then the driver's error line, exit 2."""
    refused = job(
        "refused",
        {"data": {"train": {"uri": TRAIN}, "eval": None}, "checkpoint": {"storagePath": "s3://ckpt/runs"}},
    )
    reports = Sent()
    endpoint = LocalEndpoint(refused.metadata.namespace, refused.metadata.name, [reports], tmp_path)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "rocmtrain_train"],
            env={
                **os.environ,
                JOB_ENV: refused.model_dump_json(by_alias=True),
                PROGRESS_URL_ENV: endpoint.progress_url,
                PROGRESS_TOKEN_ENV: str(endpoint.token_file),
                "RAY_ADDRESS": "127.0.0.1:1",  # were Ray to start, it would find no cluster
            },
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        endpoint.close()
    assert done.returncode == 2, done.stderr
    (report,) = reports.reports
    assert report.final and report.preflight_error is not None
    assert report.preflight_error.startswith(
        f"spec.checkpoint.storagePath: s3://ckpt/runs/{refused.metadata.namespace}/refused is not writable: "
        "AWS Error NETWORK_CONNECTION"
    ), report.preflight_error
    assert done.stderr.splitlines()[-1] == DRIVER_ERROR_PREFIX + report.preflight_error
    assert SECRET not in done.stderr + done.stdout


# ---- the driver's logs beside a run on object storage -----------------------------------------------


def test_logs_go_beside_a_run_in_a_bucket_as_on_a_volume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = on_s3("kept")
    logs = Path(run.log_dir)
    logs.mkdir(parents=True)
    (logs / "metrics.jsonl").write_text(json.dumps({"progress": {"step": 1}}) + "\n")
    (logs / "rank-0.log").write_text("rank 0 trained\n")
    (tmp_path / "ckpt").mkdir()
    assert keep_logs(run, buckets(tmp_path)) == "s3://ckpt/runs/kept/logs"
    kept = tmp_path / "ckpt" / "runs" / "kept" / "logs"
    assert (kept / "metrics.jsonl").read_text() == (logs / "metrics.jsonl").read_text()
    assert (kept / "rank-0.log").read_text() == "rank 0 trained\n"


def test_a_store_that_refuses_the_logs_costs_the_copy_only(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    run = on_s3("lost")
    Path(run.log_dir).mkdir(parents=True)
    (Path(run.log_dir) / "main.log").write_text("trained\n")
    (tmp_path / "ckpt").mkdir()
    assert keep_logs(run, buckets(tmp_path, RefusesWrites)) is None
    assert DENIED in caplog.text
    local = settings(job("local"), tmp_path / "runs")
    assert keep_logs(local, buckets(tmp_path)) is None  # a local run folder holds its logs already


def test_a_run_keeps_its_logs_however_it_ends(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    from rocmtrain_train.driver import train_job

    kept: list[RocmTrainingJob] = []

    def fails(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the store went away")

    monkeypatch.setattr(train_job, "run", fails)
    monkeypatch.setattr(train_job, "keep_logs", lambda settings: kept.append(settings.job))
    run = on_s3("failed")
    with pytest.raises(RuntimeError, match="the store went away"):
        train_job.train(run, [], echo_log=False)
    assert kept == [run.job]
