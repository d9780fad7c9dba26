"""End to end on a real Ray cluster that KubeRay starts: the world, its process runtime, the operator.

Real: the control plane, kube-scheduler, KubeRay, the operator (`python -m
rocmtrain.controller`, as its own ServiceAccount with manifests/' RBAC), Ray,
Ray Train, the MiniLM model, the authenticated progress push. Stood in for: the
images and kubelets of the CPU nodes the pods run on (the TEST-ONLY process
runtime, tests/cluster/runtime). Each job is small: 2 CPU workers, a few
steps, data and checkpoints on a PersistentVolume at an absolute path here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from cluster import rocmtrain_operator, runtime
from cluster.processes import Process
from cluster.world import World


@pytest.fixture(scope="session")
def operator(world: World) -> Iterator[Process]:
    """The operator, with its progress endpoint on the pod network, for the e2e tests (they may restart it)."""
    if world.runtime is None:
        reason = f"no process runtime here: {runtime.network.available()}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    process = rocmtrain_operator.start(world, ROCMTRAIN_RETRY_SECONDS="2")
    yield process
    process.stop()
