"""Data, models and the pre-flight on a real S3 server (the test world's SeaweedFS, `rocmtrain_testworld.s3`),
through the training image's own client: pyarrow's S3FileSystem configured by the standard AWS variables
(`rocmtrain_train.storage.object_store_filesystem`), as on a cluster. Nothing is injected or faked here;
tests/train/test_data.py keeps its injected bucket as a unit test of what follows the client."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import DataSource, DataSpec, ModelSpec
from rocmtrain_testworld.processes import free_port
from rocmtrain_testworld.s3 import S3Path, S3Server
from rocmtrain_train.data.records import read_records
from rocmtrain_train.driver.driver_checks import check_object_store
from rocmtrain_train.model.pretrained import CACHE_ENV, packaged_model, resolve_model
from train.jobs import job, settings

ROWS = [{"text": f"review number {i}", "label": i % 3} for i in range(10)]
EXPECTED = [(r["text"], r["label"]) for r in ROWS]
CLASSIFY = ModelSpec(source="/models/x", numLabels=3)
DATA = DataSpec(train=DataSource(uri="/unused"))


@pytest.fixture
def aws(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server's AWS variables in the environment, as a Secret through `spec.env` sets them in a pod."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    return s3


@pytest.fixture
def prefix(s3: S3Server) -> S3Path:
    """A fresh prefix in the bucket for one test."""
    return s3.path(f"t-{uuid.uuid4().hex[:8]}")


def encode(rows: list[dict], fmt: str) -> bytes:
    table = pa.Table.from_pylist(rows)
    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in rows).encode()
    sink = pa.BufferOutputStream()
    if fmt == "csv":
        pacsv.write_csv(table, sink)
    else:
        pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def read(uri: str) -> list[tuple[str, int]]:
    records = read_records(DataSource(uri=uri), DATA, CLASSIFY, None)
    return list(zip(records.texts, records.labels, strict=True))


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_data_reads_from_one_object_and_from_a_folder_of_shards(aws: S3Server, prefix: S3Path, fmt: str):
    (prefix / f"train.{fmt}").write_bytes(encode(ROWS, fmt))
    assert read((prefix / f"train.{fmt}").uri) == EXPECTED
    for shard, rows in enumerate((ROWS[:4], ROWS[4:7], ROWS[7:])):
        (prefix / "shards" / f"part-{shard:05d}.{fmt}").write_bytes(encode(rows, fmt))
    assert read((prefix / "shards").uri) == EXPECTED


def test_a_model_folder_is_copied_into_the_cache_once(
    aws: S3Server, prefix: S3Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    minilm = packaged_model("sentence-transformers/all-MiniLM-L6-v2")
    assert minilm is not None
    model = aws.put(minilm, prefix / "minilm")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    assert resolve_model(model.uri, None, download=False) is None  # the pre-flight: it exists, nothing fetched
    local = resolve_model(model.uri, None)
    assert local is not None and tmp_path / "cache" in local.parents
    assert sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()) == model.files()
    (prefix / "minilm" / "config.json").write_text("{}")  # changed in the bucket: the cached copy serves on
    assert resolve_model(model.uri, None) == local and json.loads((local / "config.json").read_text())["model_type"]
    with pytest.raises(ConfigError, match=r"model not found: s3://.*/nothing-here has no config.json"):
        resolve_model((prefix / "nothing-here").uri, None)


@pytest.mark.parametrize("failure", ["wrong keys", "no bucket", "no server"])
def test_unreadable_data_names_the_store_s_error(aws: S3Server, prefix: S3Path, failure: str, monkeypatch):
    (prefix / "train.jsonl").write_bytes(encode(ROWS, "jsonl"))
    uri = (prefix / "train.jsonl").uri
    expected = {
        "wrong keys": r"ACCESS_DENIED|InvalidAccessKeyId|SignatureDoesNotMatch",
        "no bucket": r"no such file or folder|NoSuchBucket|NOT_FOUND",
        "no server": r"NETWORK_CONNECTION|Could not connect",
    }[failure]
    if failure == "wrong keys":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-key-" + "x" * 28)
    elif failure == "no bucket":
        uri = uri.replace(f"s3://{aws.bucket}/", "s3://no-such-bucket/")
    else:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ConfigError, match=expected) as refused:
        read(uri)
    assert aws.secret_key not in str(refused.value)


def test_the_preflight_writes_and_removes_its_check_and_refuses_in_the_stores_words(aws: S3Server, prefix: S3Path):
    """The driver's pre-flight against the real server: a bucket that answers passes and keeps no trace of the write
    check; wrong keys and a missing bucket are refused with the field, the URI and the store's words."""
    (prefix / "data" / "train.jsonl").write_bytes(encode(ROWS, "jsonl"))
    data = {"data": {"train": {"uri": (prefix / "data" / "train.jsonl").uri}}}
    storage = {"checkpoint": {"storagePath": (prefix / "runs").uri}}
    check_object_store(settings(job("fine", data, storage), None))
    assert (prefix / "runs").files() == []
    (prefix / "runs" / "fine" / "kept").write_text("")  # the check leaves what is there alone
    check_object_store(settings(job("fine", data, storage), None))
    assert (prefix / "runs").files() == ["fine/kept"]

    elsewhere = {"checkpoint": {"storagePath": "s3://no-such-bucket/runs"}}
    with pytest.raises(ConfigError) as refused:
        check_object_store(settings(job("nobucket", data, elsewhere), None))
    assert str(refused.value) == (
        "spec.checkpoint.storagePath: s3://no-such-bucket/runs/nobucket is not writable: "
        "bucket 'no-such-bucket' does not exist"
    )

    aws_key = aws.secret_key
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-key-" + "x" * 28)
        with pytest.raises(ConfigError) as refused:
            check_object_store(settings(job("wrongkeys", data, storage), None))
    message = str(refused.value)
    assert message == (
        f"spec.data.train.uri: {(prefix / 'data' / 'train.jsonl').uri} is not readable: "
        "AWS Error ACCESS_DENIED during HeadBucket operation: No response body."
    )
    assert "not-the-key-" not in message and aws_key not in message
