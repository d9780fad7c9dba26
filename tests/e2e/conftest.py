"""End to end on a real Ray cluster that KubeRay starts: the world, its process runtime, the operator.

Real: the control plane, kube-scheduler, KubeRay, Ray, Ray Train, the MiniLM
model, the authenticated progress push, and the operator as a Helm release:
`helm install rto-e2e manifests/helm/rocm-train-operator` (the real Helm) into
`rto-e2e-system` makes every object of the chart, and the operator (`python -m
rocmtrain.controller`, the image's command) runs as a process here, as the
release's ServiceAccount with the settings of the release's Deployment, its
progress endpoint behind the chart's `rocmtrain-progress` Service. Faked: the
Deployment's pod, which kwok plays Running on one of its nodes (there is no
operator image here). Stood in for: the images and kubelets of the CPU nodes the
Ray pods run on (the TEST-ONLY process runtime, rocmtrain_testworld/runtime).
Each job is small: 2 CPU workers, a few steps, data and checkpoints on a
PersistentVolume at an absolute path here, or on the world's S3 server.
(`make cluster-up` and `make demo` install the operator from manifests/ with
kustomize instead: both install paths run jobs on the process runtime.)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocmtrain_testworld import rocmtrain_operator, runtime
from rocmtrain_testworld import s3 as object_store
from rocmtrain_testworld.gotools import go_tool
from rocmtrain_testworld.paths import VOLUMES_DIR
from rocmtrain_testworld.processes import Process
from rocmtrain_testworld.world import World


@pytest.fixture(scope="module")
def release(world: World) -> Iterator[rocmtrain_operator.Release]:
    """The chart installed as the release rto-e2e in rto-e2e-system (its pod on a kwok node), with
    `ROCMTRAIN_RETRY_SECONDS=2` among its settings; uninstalled after the module (the CRD stays), its
    namespace deleted. Its names never clash with the objects later modules apply from manifests/."""
    if world.runtime is None:
        reason = f"no process runtime here: {runtime.network.available()}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    installed = rocmtrain_operator.install_release(world.cluster, world.workdir, env={"ROCMTRAIN_RETRY_SECONDS": "2"})
    yield installed
    rocmtrain_operator.uninstall_release(world.cluster, installed)


@pytest.fixture(scope="module")
def operator(world: World, release: rocmtrain_operator.Release) -> Iterator[Process]:
    """The release's operator, with its progress endpoint on the pod network, for the e2e tests (they may
    restart it); stopped after them, before the release is uninstalled."""
    process = rocmtrain_operator.start(world, release=release)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def world_s3(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object_store.S3Server]:
    """An S3 server for the module's jobs, on the process runtime's address on this machine (its pods reach it
    there; 127.0.0.1 without a runtime); closed, its data removed, after the module."""
    go_tool(object_store.BINARY)
    address = runtime.info(world.workdir)["hostAddress"] if world.runtime is not None else "127.0.0.1"
    server = object_store.S3Server.start(tmp_path_factory.mktemp("world-s3"), address)
    yield server
    server.close()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A fresh folder for one test's data and checkpoints, outside /tmp (which the operator reserves
    in pods: pytest's tmp_path lies there), removed afterwards."""
    VOLUMES_DIR.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="e2e-", dir=VOLUMES_DIR))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
