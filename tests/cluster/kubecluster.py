"""The test clusters, and `up`/`down` for people.

Two clusters, both local processes on loopback ports (built by
``tests/cluster/build.sh`` into ``.cluster/bin``):

- lean (:func:`running_cluster`): etcd, kube-apiserver, kube-controller-manager,
  our CRDs and KubeRay's, two plain fake MI300X nodes; no scheduler, no
  kubelet, no KubeRay controller: pods stay Pending and tests write RayJob
  status themselves. When ``ROCMTRAIN_TEST_KUBECONFIG`` names an existing
  cluster's kubeconfig, that cluster is used instead (CRDs installed there).
- the world (:func:`running_world`, see world.py): the same control plane plus
  kube-scheduler, kwok nodes, the KubeRay operator and Kueue.

For people (from the repo root)::

    PYTHONPATH=tests python -m cluster.kubecluster up     # the world; prints the kubeconfig path
    PYTHONPATH=tests python -m cluster.kubecluster down

`up` also starts the operator (with its progress endpoint) and sends the pods
of the `default` namespace to the process runtime, where this machine can run
it: a RocmTrainingJob applied there really trains (see `make demo`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from cluster import control_plane, rocmtrain_operator, runtime, world
from cluster.api import KubeCluster, request
from cluster.control_plane import SA_ISSUER, binaries_present
from cluster.nodes import GPU_RESOURCE
from cluster.paths import BIN_DIR, CRDS_DIR, KUBECONFIG_FILE, KUBERAY_CRDS_DIR, PIDS_FILE, STATE_DIR
from cluster.processes import ClusterError, free_port, is_ours, stop_pids
from cluster.runtime import network

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
    stop_pids(pids)
    if network.available() is None:
        network.sweep_stale()  # a process runtime that was killed outright leaves its namespaces
    PIDS_FILE.unlink(missing_ok=True)
    KUBECONFIG_FILE.unlink(missing_ok=True)
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    print(f"stopped {len(pids)} process(es)")
    return 0


def up() -> int:
    """Start the world detached, for people; print the kubeconfig path."""
    running = [(n, p) for n, p, identity in _read_pids() if is_ours(identity, p)]
    if running and KUBECONFIG_FILE.is_file():
        print(f"already running; kubeconfig: {KUBECONFIG_FILE}")
        return 0
    if running:
        down()
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    start = time.monotonic()
    # On failure world.start stops what it started.
    started = world.start(STATE_DIR, kubeconfig_path=KUBECONFIG_FILE, detach=True)
    try:
        if started.runtime is not None:
            runtime.serve_namespace(started.cluster, "default")
            rocmtrain_operator.start(started, detach=True)
        else:
            print(f"note: no process runtime ({network.available()}): pods run on kwok nodes only", file=sys.stderr)
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


def main(argv: list[str] | None = None) -> int:
    """``up`` or ``down``."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["up"]:
        return up()
    if args == ["down"]:
        return down()
    print("usage: python -m cluster.kubecluster up|down", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
