"""The test clusters, and `up`/`down` for people.

Two clusters, both local processes on loopback ports (built by
``build.sh`` into ``.cluster/bin``):

- lean (:func:`running_cluster`): etcd, kube-apiserver, kube-controller-manager,
  our CRDs and KubeRay's, two plain fake MI300X nodes; no scheduler, no
  kubelet, no KubeRay controller: pods stay Pending and tests write RayJob
  status themselves. When ``ROCMTRAIN_TEST_KUBECONFIG`` names an existing
  cluster's kubeconfig, that cluster is used instead (CRDs installed there).
- the world (:func:`running_world`, see world.py): the same control plane plus
  kube-scheduler, kwok nodes, the KubeRay operator and Kueue.

For people (from the repo root)::

    python -m rocmtrain_testworld.kubecluster up     # the world; prints the kubeconfig path
    python -m rocmtrain_testworld.kubecluster down
    python -m rocmtrain_testworld.kubecluster operator   # make run-operator

`up` also starts the operator (with its progress endpoint) where this machine
can run the process runtime; the pods of `default` and of every namespace a
person creates then run there: a RocmTrainingJob applied in any of them really
trains (see `make demo`). At most
one operator acts on the world: ``operator`` (`make run-operator`) stops the
one `up` started and runs it in the foreground, with the same ports (running
jobs keep reaching its progress endpoint); `up` again, or `make demo`, starts
it in the background when none runs; `down` stops whichever runs. `up` starts an S3 server too
(rocmtrain_testworld.s3, where the pods reach it): its AWS variables in ``.cluster/s3.env``, for a
person to `source`, and in the Secret ``s3-credentials`` of `default`; `down` removes its data.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from rocmtrain_testworld import control_plane, rocmtrain_operator, runtime, s3, world
from rocmtrain_testworld.api import KubeCluster, request
from rocmtrain_testworld.control_plane import SA_ISSUER, binaries_present
from rocmtrain_testworld.nodes import GPU_RESOURCE
from rocmtrain_testworld.paths import (
    BIN_DIR,
    CRDS_DIR,
    KUBECONFIG_FILE,
    KUBERAY_CRDS_DIR,
    PIDS_FILE,
    S3_ENV_FILE,
    STATE_DIR,
    VOLUMES_DIR,
)
from rocmtrain_testworld.processes import ClusterError, Process, die_with_parent, free_port, is_ours, stop_pids
from rocmtrain_testworld.runtime import network

__all__ = [
    "BIN_DIR",
    "CRDS_DIR",
    "GPU_RESOURCE",
    "KUBERAY_CRDS_DIR",
    "SA_ISSUER",
    "ClusterError",
    "KubeCluster",
    "binaries_present",
    "free_port",
    "open_cluster",
    "request",
    "running_cluster",
    "running_world",
]

EXTERNAL_KUBECONFIG_ENV = "ROCMTRAIN_TEST_KUBECONFIG"
FAKE_NODES_ENV = "ROCMTRAIN_TEST_FAKE_NODES"
# The ports of the world's operator, kept for the one that replaces it.
OPERATOR_PORTS_FILE = STATE_DIR / "operator-ports.json"


def open_cluster(
    *, detach: bool = False, kubeconfig_path: Path | None = None, workdir: Path | None = None
) -> KubeCluster:
    """The lean cluster: external when $ROCMTRAIN_TEST_KUBECONFIG is set, else a local one.

    The returned cluster has our and KubeRay's CRDs installed and (local, or
    external with $ROCMTRAIN_TEST_FAKE_NODES=1) fake MI300X nodes.
    """
    external = os.environ.get(EXTERNAL_KUBECONFIG_ENV)
    if external:
        path = Path(external).expanduser()
        if not path.is_file():
            raise ClusterError(f"${EXTERNAL_KUBECONFIG_ENV}={external} is not a file")
        cluster = KubeCluster(path, external=True)
        try:
            control_plane.install_crds(cluster)
            if os.environ.get(FAKE_NODES_ENV) == "1":
                cluster.register_fake_nodes()
        except BaseException:
            cluster.stop()
            raise
        return cluster
    cluster = control_plane.start(workdir, kubeconfig_path=kubeconfig_path, detach=detach)
    try:
        control_plane.install_crds(cluster)
        cluster.register_fake_nodes()
        control_plane.wait_controller_manager(cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _report_crd_errors(cluster: KubeCluster) -> None:
    for name, message in cluster.crd_errors.items():
        warnings.warn(f"crds/{name} rejected by kube-apiserver: {message}", stacklevel=1)


@contextlib.contextmanager
def _stopped_at_exit(cluster: KubeCluster) -> Iterator[None]:
    atexit.register(cluster.stop)
    _report_crd_errors(cluster)
    try:
        yield
    finally:
        cluster.stop()
        atexit.unregister(cluster.stop)


@contextlib.contextmanager
def running_cluster() -> Iterator[KubeCluster]:
    """The lean cluster (:func:`open_cluster`); stopped on exit and at interpreter exit."""
    cluster = open_cluster()
    with _stopped_at_exit(cluster):
        yield cluster


@contextlib.contextmanager
def running_world() -> Iterator[world.World]:
    """The full world (world.start); stopped on exit and at interpreter exit."""
    started = world.start()
    with _stopped_at_exit(started.cluster):
        yield started


# --------------------------------------------------------------------------
# CLI: up / down


def _read_pids() -> list[tuple[str, int, str]]:
    """(name, pid, identity) of each process `up` started (see processes.is_ours)."""
    if not PIDS_FILE.is_file():
        return []
    out = []
    for line in PIDS_FILE.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            out.append((parts[0], int(parts[1]), parts[2] if len(parts) > 2 else parts[0]))
    return out


def running(name: str | None = None) -> bool:
    """Whether `up`'s processes (or the one named ``name``) still run."""
    return any(is_ours(identity, pid) for n, pid, identity in _read_pids() if name in (None, n))


def down() -> int:
    """Stop the processes recorded in .cluster/pids and remove the cluster state."""
    pids = {name: pid for name, pid, identity in _read_pids() if is_ours(identity, pid)}
    if s3.NAME in pids:  # at once: its own shutdown takes 15 s (s3.S3Server.stop), and its data goes below
        s3.kill(pids[s3.NAME])
    stop_pids(pids)
    if network.available() is None:
        network.sweep_stale()  # a process runtime that was killed outright leaves its namespaces
    PIDS_FILE.unlink(missing_ok=True)
    KUBECONFIG_FILE.unlink(missing_ok=True)
    S3_ENV_FILE.unlink(missing_ok=True)
    shutil.rmtree(STATE_DIR, ignore_errors=True)  # the S3 server's data with the rest
    shutil.rmtree(VOLUMES_DIR / "demo", ignore_errors=True)
    print(f"stopped {len(pids)} process(es)")
    return 0


def up() -> int:
    """Start the world detached, for people (with the operator, where the process runtime runs);
    print the kubeconfig path. When it is up already, start only its operator (and its S3 server) if none runs."""
    alive = [(n, p) for n, p, identity in _read_pids() if is_ours(identity, p)]
    if alive and KUBECONFIG_FILE.is_file():
        if _runtime_running() and not _operator_running():
            operator = _world_operator(KubeCluster(KUBECONFIG_FILE))
            operator.start().wait_ready(60)
            _record(operator.name, operator.pid, operator.identity)
            print(f"started the operator (pid {operator.pid}; log: {operator.log})")
        if s3.binary_present() and not running(s3.NAME):
            server = _world_s3(KubeCluster(KUBECONFIG_FILE), _runtime_running())
            _record(server.process.name, server.process.pid, server.process.identity)
        print(f"already running; kubeconfig: {KUBECONFIG_FILE}")
        return 0
    if alive:
        down()
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    start = time.monotonic()
    # On failure world.start stops what it started.
    started = world.start(STATE_DIR, kubeconfig_path=KUBECONFIG_FILE, detach=True)
    try:
        if started.runtime is not None:
            operator = _world_operator(started.cluster)
            started.processes[operator.name] = operator
            operator.start().wait_ready(60)
        else:
            print(f"note: no process runtime ({network.available()}): pods run on kwok nodes only", file=sys.stderr)
        if s3.binary_present():
            started.processes[s3.NAME] = _world_s3(started.cluster, started.runtime is not None).process
        else:
            print(f"note: no S3 server: no {s3.BINARY} in {BIN_DIR} (make cluster-binaries)", file=sys.stderr)
    except BaseException:
        started.stop()
        raise
    PIDS_FILE.write_text("".join(f"{name} {proc.pid} {proc.identity}\n" for name, proc in started.processes.items()))
    for name, message in started.cluster.crd_errors.items():
        print(f"warning: crds/{name} rejected by kube-apiserver: {message}", file=sys.stderr)
    print(json.dumps(world.describe(started), indent=2))
    print(f"world up in {time.monotonic() - start:.1f}s (logs: {STATE_DIR / 'logs'})")
    print(f"export KUBECONFIG={KUBECONFIG_FILE}")
    print(KUBECONFIG_FILE)
    return 0


def _runtime_running() -> bool:
    return running(runtime.NAME)


def _operator_running() -> bool:
    return running(rocmtrain_operator.NAME)


def _record(name: str, pid: int, identity: str) -> None:
    """Put ``name`` in the pid file (in place of an earlier process of that name), for `down`."""
    kept = [f"{n} {p} {i}\n" for n, p, i in _read_pids() if n != name]
    PIDS_FILE.write_text("".join([*kept, f"{name} {pid} {identity}\n"]))


def _world_operator(cluster: KubeCluster) -> Process:
    """The world's operator (not started): as its ServiceAccount, serving on the process runtime's
    address, on the same ports every time (running jobs were told the progress endpoint's port)."""
    if OPERATOR_PORTS_FILE.is_file():
        ports = rocmtrain_operator.Ports(**json.loads(OPERATOR_PORTS_FILE.read_text()))
    else:
        ports = rocmtrain_operator.Ports.free()
        OPERATOR_PORTS_FILE.write_text(json.dumps(dataclasses.asdict(ports)))
    kubeconfig = rocmtrain_operator.install(cluster, STATE_DIR)
    address = runtime.info(STATE_DIR)["hostAddress"]
    return rocmtrain_operator.process(cluster, STATE_DIR, kubeconfig, address, ports=ports, detach=True)


def _world_s3(cluster: KubeCluster, on_runtime: bool) -> s3.S3Server:
    """A fresh S3 server for the world (detached): on the process runtime's address where it runs, so that
    pods reach it, else on 127.0.0.1; its variables in S3_ENV_FILE and its Secret in `default`."""
    folder = STATE_DIR / s3.NAME
    shutil.rmtree(folder, ignore_errors=True)
    host = runtime.info(STATE_DIR)["hostAddress"] if on_runtime else "127.0.0.1"
    server = s3.S3Server.start(folder, host, detach=True)
    try:
        server.env_file(S3_ENV_FILE)
        server.apply_secret(cluster, "default")
    except BaseException:
        server.close()
        raise
    print(
        f"S3 server at {server.endpoint}, bucket {server.bucket} (pid {server.process.pid}; log: {server.process.log})"
    )
    print(f"  its AWS variables: source {S3_ENV_FILE}; in pods: the Secret {s3.SECRET_NAME} of `default`")
    return server


def _serves_local_world() -> bool:
    """Whether the world `up` started runs and KUBECONFIG names it (or nothing)."""
    configured = os.environ.get("KUBECONFIG", "").strip()
    if configured and Path(configured).resolve() != KUBECONFIG_FILE.resolve():
        return False
    return KUBECONFIG_FILE.is_file() and running("kube-apiserver")


def run_operator() -> int:
    """`make run-operator`: the operator in the foreground (Ctrl-C stops it).

    On the world `up` started (KUBECONFIG unset or naming it), it takes over: the
    operator that runs there is stopped first, so that two never act on the same
    jobs, and this one is recorded for `down`. Anywhere else it is just
    `python -m rocmtrain.controller` against the current KUBECONFIG.
    """
    if not _serves_local_world():
        os.execv(sys.executable, [sys.executable, "-m", "rocmtrain.controller"])  # noqa: S606 - our own program
    stop_pids({n: p for n, p, identity in _read_pids() if n == rocmtrain_operator.NAME and is_ours(identity, p)})
    if _runtime_running():
        operator = _world_operator(KubeCluster(KUBECONFIG_FILE))
        argv, env = [sys.executable, *operator.args], operator.env
    else:  # pods run on kwok nodes only: no progress endpoint to reach
        argv, env = [sys.executable, "-m", "rocmtrain.controller"], {**os.environ, "KUBECONFIG": str(KUBECONFIG_FILE)}
    print(f"make run-operator: the operator of the local world, in the foreground (kubeconfig {KUBECONFIG_FILE})")
    child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    _record(rocmtrain_operator.NAME, child.pid, rocmtrain_operator.IDENTITY)

    def stop(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    return child.wait()


def main(argv: list[str] | None = None) -> int:
    """``up``, ``down`` or ``operator``."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["up"]:
        return up()
    if args == ["down"]:
        return down()
    if args == ["operator"]:
        return run_operator()
    print("usage: python -m rocmtrain_testworld.kubecluster up|down|operator", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
