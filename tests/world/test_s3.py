"""The test world's S3 server (SeaweedFS, `rocmtrain_testworld.s3`): its standard AWS variables configure the
training image's own client, its keys are checked, its data outlives a stop, its env file and Secret hold the
variables. The session's `s3` serves the most; one server of its own is stopped, restarted and closed."""

from __future__ import annotations

import base64
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from rocmtrain_testworld import s3 as object_store
from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.processes import free_port
from rocmtrain_testworld.s3 import S3Path, S3Server
from rocmtrain_train.storage import object_store_filesystem


@pytest.fixture
def prefix(s3: S3Server) -> S3Path:
    return s3.path(f"t-{uuid.uuid4().hex[:8]}")


def test_the_standard_variables_alone_configure_the_training_image_s_client(
    s3: S3Server, prefix: S3Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    assert set(s3.env()) == {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"}
    (prefix / "a.txt").write_text("one")
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("two")
    (folder / "sub" / "c.txt").write_text("three")
    assert s3.put(folder, prefix / "folder") == prefix / "folder"
    fs, path = object_store_filesystem((prefix / "a.txt").uri)
    with fs.open_input_stream(path) as source:
        assert source.read() == b"one"
    with fs.open_output_stream(f"{prefix.path}/d.txt") as out:
        out.write(b"four")
    assert (prefix / "d.txt").read_text() == "four" and (prefix / "a.txt").is_file()
    assert not prefix.is_file() and str(prefix) == prefix.uri == f"s3://{s3.bucket}/{prefix.key}"
    assert prefix.files() == ["a.txt", "d.txt", "folder/b.txt", "folder/sub/c.txt"]
    local = (prefix / "folder").download(tmp_path / "copy")
    assert sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()) == ["b.txt", "sub/c.txt"]
    assert (local / "sub" / "c.txt").read_text() == "three"


def test_wrong_keys_are_refused(s3: S3Server, prefix: S3Path):
    (prefix / "a.txt").write_text("one")
    wrong = pafs.S3FileSystem(
        access_key=s3.access_key,
        secret_key="x" * 40,
        region=object_store.REGION,
        endpoint_override=s3.endpoint,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    )
    with pytest.raises(OSError, match=r"ACCESS_DENIED|SignatureDoesNotMatch|InvalidAccessKeyId"):
        wrong.open_input_stream((prefix / "a.txt").path).read()


def test_the_env_file_sources_into_a_shell(s3: S3Server, prefix: S3Path, tmp_path: Path):
    (prefix / "a.txt").write_text("sourced")
    env_file = s3.env_file(tmp_path / "s3.env")
    script = (
        "from rocmtrain_train.storage import object_store_filesystem as f; import os, sys;"
        "fs, path = f(f's3://{os.environ[\"S3_BUCKET\"]}/' + sys.argv[1]);"
        "print(fs.open_input_stream(path).read().decode())"
    )
    shown = subprocess.run(
        [
            "bash",
            "-c",
            'source "$0" && exec "$1" -c "$2" "$3"',
            env_file,
            sys.executable,
            script,
            prefix.key + "/a.txt",
        ],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert shown.stdout.strip() == "sourced"


def test_the_secret_holds_the_four_variables(s3: S3Server, kube: KubeCluster):
    namespace = kube.new_namespace("s3")
    s3.apply_secret(kube, namespace)
    s3.apply_secret(kube, namespace)  # applied again: replaced
    secret = kube.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{object_store.SECRET_NAME}")
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == s3.env()
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in object_store.spec_env()}
    assert refs == {name: {"name": object_store.SECRET_NAME, "key": name} for name in s3.env()}
    assert s3.spec_env() == object_store.spec_env()


def test_a_stopped_server_keeps_its_data_and_close_removes_it(s3: S3Server, tmp_path: Path):
    """A server of its own (``s3`` for the skip without `weed`: the session's serves on)."""
    server = S3Server.start(tmp_path / "server")
    try:
        (server.path("kept") / "x.txt").write_text("kept")
        server.stop(grace=1)  # weed's own shutdown takes 15 s (see S3Server.stop): killed, its data kept all the same
        assert not server.process.running()
        server.restart()
        assert (server.path("kept") / "x.txt").read_text() == "kept"
    finally:
        server.close()
    assert not server.process.running() and not (tmp_path / "server" / "data").exists()


def test_the_servers_ports_never_repeat():
    """Each of the server's eight listeners gets a port of its own: `free_port` never returns a port twice in
    a process, where the kernel may offer a port again once its probe socket has closed (a repeat once made
    the filer's listener fail with "address already in use", beside the master on the same port)."""
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
