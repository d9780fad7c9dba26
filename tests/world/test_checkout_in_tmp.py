"""A checkout under /tmp, as a new user clones one: `make cluster-up` from it runs a real Ray pod.

The operator gives Ray pods an emptyDir at /tmp. Over a checkout in /tmp, that mount covers the
checkout (which stands in for the pods' image) and whatever of the world's state lies in it: the world
keeps its state outside /tmp (`paths.outside_tmp`), and the process runtime binds the checkout back
over the pod's /tmp (`container.mount_script`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocmtrain_testworld import runtime, world
from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.paths import BIN_DIR, REPO_ROOT, outside_tmp
from rocmtrain_testworld.processes import log_tail

pytestmark = pytest.mark.cluster

# What the world reads of its checkout (the working tree as it is, uncommitted changes too).
COPIED = ("pyproject.toml", "crds", "manifests", "examples", "tests/testworld")
STARTED = "Ray runtime started."


def test_the_state_of_a_checkout_under_tmp_lies_outside_tmp_and_is_its_own() -> None:
    here = Path("/srv/checkout/.cluster")
    assert outside_tmp(here, "state") == here / "state"
    first, second = (outside_tmp(Path(f"/tmp/{name}/.cluster"), "state") for name in ("a", "b"))
    assert not first.is_relative_to("/tmp") and not second.is_relative_to("/tmp")
    assert first != second, "two clones under /tmp do not share (or remove) each other's world"


@pytest.fixture
def checkout() -> Iterator[Path]:
    """A copy under /tmp of what the world reads of this checkout."""
    if reason := runtime.network.available():
        pytest.skip(f"no process runtime here: {reason}")
    if not world.binaries_present():
        pytest.skip(f"no world binaries in {BIN_DIR}; run `make cluster-binaries`")
    root = Path(tempfile.mkdtemp(prefix="rocmtrain-clone-", dir="/tmp"))
    ignored = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for part in COPIED:
        source, target = REPO_ROOT / part, root / part
        if source.is_dir():
            shutil.copytree(source, target, ignore=ignored)
        else:
            shutil.copy2(source, target)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def kubecluster(checkout: Path, command: str) -> subprocess.CompletedProcess[str]:
    """`python -m rocmtrain_testworld.kubecluster COMMAND` of the copy: run in its package's folder, which
    `python -m` puts first on sys.path, so that the world's paths are the copy's."""
    return subprocess.run(
        [sys.executable, "-m", "rocmtrain_testworld.kubecluster", command],
        cwd=checkout / "tests" / "testworld",
        env={**os.environ, "CLUSTER_BIN_DIR": str(BIN_DIR)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def ray_head(checkout: Path) -> dict:
    """A pod as KubeRay makes a Ray head (a `bash -lc` command line, an emptyDir at /tmp and /dev/shm),
    in `default`, that first checks that it sees the checkout."""
    line = f"test -f {checkout}/pyproject.toml && exec ray start --head --block --num-cpus=1 --include-dashboard=false"
    container = {
        "name": "ray-head",
        "image": "rayproject/ray:2.60.0",
        "command": ["/bin/bash", "-lc", "--"],
        "args": [line],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "shm", "mountPath": "/dev/shm"}],
    }
    volumes = [{"name": "tmp", "emptyDir": {}}, {"name": "shm", "emptyDir": {"medium": "Memory"}}]
    spec = {"containers": [container], "volumes": volumes, "restartPolicy": "Never", "terminationGracePeriodSeconds": 2}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ray-head", "namespace": "default"}, "spec": spec}


def test_a_ray_pod_runs_from_a_checkout_under_tmp(checkout: Path) -> None:
    up = kubecluster(checkout, "up")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        cluster = KubeCluster(checkout / ".cluster" / "kubeconfig")
        cluster.create(ray_head(checkout))
        log = outside_tmp(checkout / ".cluster", "state") / "logs" / "pods" / "default" / "ray-head" / "ray-head.log"
        path = "/api/v1/namespaces/default/pods/ray-head"

        def started() -> bool:
            status = cluster.request("GET", path)["status"]
            assert status.get("phase") in ("Pending", "Running"), f"the Ray head: {status}\n{log_tail(log)}"
            return log.is_file() and STARTED in log.read_text()

        cluster.wait_for(started, 180, "the Ray head to start")
        assert cluster.request("GET", path)["spec"]["nodeName"] in runtime.PROCESS_NODES  # `default`: the runtime's
    finally:
        down = kubecluster(checkout, "down")
        assert down.returncode == 0, down.stdout + down.stderr
