"""End to end on a real Ray cluster that KubeRay starts: the world, its process runtime, the operator.

Real: the control plane, kube-scheduler, KubeRay, the operator (`python -m
rocmtrain.controller`, as its own ServiceAccount with manifests/' RBAC), Ray,
Ray Train, the MiniLM model, the authenticated progress push. Stood in for: the
images and kubelets of the CPU nodes the pods run on (the TEST-ONLY process
runtime, rocmtrain_testworld/runtime). Each job is small: 2 CPU workers, a few
steps, data and checkpoints on a PersistentVolume at an absolute path here.
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
def operator(world: World) -> Iterator[Process]:
    """The operator, with its progress endpoint on the pod network, for the e2e tests (they may restart it);
    stopped after them, as later modules run their own operator in the same world."""
    if world.runtime is None:
        reason = f"no process runtime here: {runtime.network.available()}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    process = rocmtrain_operator.start(world, ROCMTRAIN_RETRY_SECONDS="2")
    yield process
    process.stop()
    # Its headless progress Service would clash with the one later modules apply from manifests/.
    runtime.withdraw_host_service(world.cluster, rocmtrain_operator.NAMESPACE, rocmtrain_operator.PROGRESS_SERVICE)


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
