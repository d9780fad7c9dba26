"""TEST-ONLY: an S3-compatible server for the test world: SeaweedFS's ``weed server`` (master, volume
server, filer and S3 gateway in one process), built by build.sh from the pinned module in seaweedfs/.

One server holds one bucket and one generated access key pair (an admin identity), region us-east-1,
on free ports of one address: 127.0.0.1 for the tests that run here, the process runtime's host
address for pods (which reach this machine there). Clients configure themselves from the standard
AWS variables (:meth:`S3Server.env`); in the cluster from the Secret ``s3-credentials`` through a
RocmTrainingJob's ``spec.env`` (:func:`spec_env`). Its data lives in ``<workdir>/data``, its log in
``<workdir>/logs/s3.log``.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import secrets
import shlex
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.paths import BIN_DIR
from rocmtrain_testworld.processes import Process, free_port, kill_groups

BINARY = "weed"
NAME = "s3"
REGION = "us-east-1"
SECRET_NAME = "s3-credentials"
# The standard variables of the AWS SDKs (and of pyarrow's S3 client, which is one), set from the Secret in pods.
VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
# The flags of every listener of `weed server -filer -s3` (but the loopback twins it opens beside an address
# that is not loopback, on the same ports).
PORTS = tuple(f"{part}.port{grpc}" for part in ("master", "volume", "filer", "s3") for grpc in ("", ".grpc"))
# Written at start and deleted once a write goes through: the server answers, with a volume to write to.
PROBE_KEY = ".rocmtrain-ready"


def binary_present() -> bool:
    """Whether build.sh built ``weed`` into the binaries folder."""
    return os.access(BIN_DIR / BINARY, os.X_OK)


def _sockets(ports: dict[str, int]) -> list[Path]:
    """The gRPC sockets weed puts in /tmp whatever its flags say (``ports``: flag -> port)."""
    return [
        Path(f"/tmp/seaweedfs-{flag.split('.')[0]}-grpc-{port}.sock")
        for flag, port in ports.items()
        if flag.endswith(".grpc")
    ]


def kill(pid: int) -> None:
    """Kill the server ``pid`` at once and remove the sockets it leaves in /tmp (`down`: its data goes)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        argv = []
    kill_groups([pid], grace=0)
    flags = [arg[1:].split("=", 1) for arg in argv if arg.startswith("-") and ".port.grpc=" in arg]
    for path in _sockets({flag: int(port) for flag, port in flags}):
        path.unlink(missing_ok=True)


def spec_env() -> list[dict[str, Any]]:
    """A RocmTrainingJob's ``spec.env``: each standard AWS variable from the Secret ``s3-credentials``."""
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET_NAME, "key": name}}} for name in VARIABLES]


@dataclass(eq=False)
class S3Server:
    """A running ``weed server`` (see the module docstring); :meth:`start` makes one."""

    workdir: Path
    host: str
    ports: dict[str, int]
    bucket: str
    access_key: str
    secret_key: str
    process: Process

    @classmethod
    def start(
        cls,
        workdir: Path,
        host: str = "127.0.0.1",
        bucket: str = "rocmtrain",
        detach: bool = False,
        timeout: float = 60,
    ) -> S3Server:
        """Start a server with fresh keys on free ports of ``host``, its data in ``workdir``; wait until it
        answers and create ``bucket``. ``detach`` keeps it running after this Python process ends."""
        data = workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        access_key = "RT" + secrets.token_hex(9).upper()
        secret_key = secrets.token_urlsafe(30)
        identities = {
            "identities": [
                {
                    "name": "rocmtrain",
                    "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        config = workdir / "identities.json"
        config.touch(mode=0o600)
        config.write_text(json.dumps(identities))
        # Read first from `-config_dir`: no filer.toml or security.toml elsewhere on this machine applies.
        (workdir / "filer.toml").write_text(f'[leveldb2]\nenabled = true\ndir = "{data / "filer"}"\n')
        (workdir / "security.toml").write_text("# none: plain HTTP on local addresses\n")
        ports = {name: free_port() for name in PORTS}
        args = [
            "-logtostderr",
            f"-config_dir={workdir}",
            "server",
            f"-ip={host}",
            f"-ip.bind={host}",
            f"-dir={data}",
            "-master.telemetry=false",
            # A restarted master waits this long for a leader before it elects itself (the only peer): 10 s by default.
            "-master.electionTimeout=1s",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=0",
            "-volume.preStopSeconds=0",
            "-filer",
            "-s3",
            f"-s3.config={config}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-filer.localSocket={workdir / 'filer.sock'}",
            f"-s3.localSocket={workdir / 's3.sock'}",
            *(f"-{flag}={port}" for flag, port in ports.items()),
        ]
        process = Process(
            NAME, args, binary=BINARY, logs=workdir / "logs", cwd=workdir, env={"SENTRY_DSN": ""}, detach=detach
        )
        server = cls(workdir, host, ports, bucket, access_key, secret_key, process)
        process.start()
        try:
            process.wait_until(server._answers, timeout, "answering")
        except BaseException:
            server.close()
            raise
        return server

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.ports['s3.port']}"

    def env(self) -> dict[str, str]:
        """The standard AWS variables that configure a client for this server."""
        values = (self.endpoint, self.access_key, self.secret_key, REGION)
        return dict(zip(VARIABLES, values, strict=True))

    def env_file(self, path: Path) -> Path:
        """Write ``export NAME=value`` lines of :meth:`env` and ``S3_BUCKET``, for a person to `source`."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        values = self.env() | {"S3_BUCKET": self.bucket}
        path.write_text("".join(f"export {name}={shlex.quote(value)}\n" for name, value in values.items()))
        return path

    def secret(self, namespace: str) -> dict[str, Any]:
        """The Secret ``s3-credentials`` in ``namespace``, holding :meth:`env` (what :func:`spec_env` reads)."""
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET_NAME, "namespace": namespace},
            "type": "Opaque",
            "data": {name: base64.b64encode(value.encode()).decode() for name, value in self.env().items()},
        }

    def apply_secret(self, cluster: KubeCluster, namespace: str) -> None:
        """Create or replace the Secret ``s3-credentials`` in ``namespace``."""
        cluster.apply(self.secret(namespace))

    def spec_env(self) -> list[dict[str, Any]]:
        """See the module-level :func:`spec_env`."""
        return spec_env()

    @functools.cached_property
    def _filesystem(self) -> pafs.S3FileSystem:
        return self.filesystem()

    def filesystem(self, **options: Any) -> pafs.S3FileSystem:
        """A pyarrow S3 filesystem for this server (``options``: more of S3FileSystem's arguments)."""
        return pafs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=REGION,
            endpoint_override=self.endpoint,
            **options,
        )

    def path(self, *parts: str) -> S3Path:
        """``s3://<bucket>/<parts joined by />``."""
        return S3Path(self, "/".join(p.strip("/") for p in parts if p.strip("/")))

    def put(self, local: Path, dest: S3Path) -> S3Path:
        """Upload a file, or a folder with everything below it, to ``dest``; return ``dest``."""
        pafs.copy_files(
            str(local.resolve()),
            dest.path,
            source_filesystem=pafs.LocalFileSystem(),
            destination_filesystem=self._filesystem,
        )
        return dest

    def _volume_server_joined(self) -> bool:
        """Whether the master knows the volume server: writes before that stall ~10 s on a restart."""
        url = f"http://{self.host}:{self.ports['master.port']}/dir/status"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                topology = json.load(response)["Topology"]
        except (OSError, ValueError, KeyError):
            return False
        return any(rack.get("DataNodes") for dc in topology.get("DataCenters") or [] for rack in dc.get("Racks") or [])

    def _answers(self) -> bool:
        """Whether a write to the bucket goes through (the bucket is created first where missing)."""
        if not self._volume_server_joined():
            return False
        # A restarted master assigns no volume for 15 s (its warm-up, fixed in SeaweedFS): the write waits that out.
        fs = self.filesystem(
            allow_bucket_creation=True,
            connect_timeout=1,
            request_timeout=30,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        )
        probe = f"{self.bucket}/{PROBE_KEY}"
        try:
            fs.create_dir(self.bucket)
            with fs.open_output_stream(probe) as out:
                out.write(b"ok")
            fs.delete_file(probe)
        except OSError:
            return False
        return True

    def stop(self, grace: float = 10) -> None:
        """SIGTERM the server, SIGKILL it after ``grace`` s; its data stays (see :meth:`restart`).

        weed's own shutdown mostly outlasts the grace: it stops its volume server before its filer, which
        then retries its change log's last write for 15 s. What it acknowledged is on disk by then."""
        self.process.stop(grace)

    def restart(self, timeout: float = 60, grace: float = 2) -> None:
        """Stop the server if it runs, start it again on the same ports and data, wait until it answers."""
        self.stop(grace)
        self.process.start()
        self.process.wait_until(self._answers, timeout, "answering")

    def close(self) -> None:
        """Stop the server (no grace: its data goes) and remove its data, keys and sockets (its log stays)."""
        self.stop(grace=0)
        shutil.rmtree(self.workdir / "data", ignore_errors=True)
        for path in [self.workdir / name for name in ("identities.json", "filer.sock", "s3.sock")]:
            path.unlink(missing_ok=True)
        for path in _sockets(self.ports):
            path.unlink(missing_ok=True)


@dataclass(frozen=True)
class S3Path:
    """An object, or a prefix of objects, in an :class:`S3Server`'s bucket."""

    server: S3Server
    key: str

    @property
    def uri(self) -> str:
        return f"s3://{self.path}"

    @property
    def path(self) -> str:
        """``<bucket>/<key>``: the path pyarrow's S3 filesystem takes."""
        return f"{self.server.bucket}/{self.key}".rstrip("/")

    def __str__(self) -> str:
        return self.uri

    def __truediv__(self, part: str) -> S3Path:
        return self.server.path(self.key, part)

    def is_file(self) -> bool:
        return bool(self.server._filesystem.get_file_info(self.path).type == pafs.FileType.File)

    def read_bytes(self) -> bytes:
        with self.server._filesystem.open_input_stream(self.path) as source:
            return bytes(source.read())

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        with self.server._filesystem.open_output_stream(self.path) as out:
            out.write(data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def files(self) -> list[str]:
        """The keys of every object below this prefix, relative to it, sorted."""
        selector = pafs.FileSelector(self.path, recursive=True, allow_not_found=True)
        found = self.server._filesystem.get_file_info(selector)
        return sorted(info.path.removeprefix(self.path + "/") for info in found if info.type == pafs.FileType.File)

    def download(self, local: Path) -> Path:
        """Copy every object below this prefix into the folder ``local`` (made if missing); return it."""
        local.mkdir(parents=True, exist_ok=True)
        source, destination = self.server._filesystem, pafs.LocalFileSystem()
        pafs.copy_files(self.path, str(local), source_filesystem=source, destination_filesystem=destination)
        return local
