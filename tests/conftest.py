"""Shared pytest configuration: ``tests/`` on sys.path and the ``kube`` cluster fixture."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

if TYPE_CHECKING:
    from cluster.kubecluster import KubeCluster


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeCluster]:
    """A real control plane (etcd, kube-apiserver, kube-controller-manager) for the session.

    Uses the cluster at $ROCMTRAIN_TEST_KUBECONFIG when set. Without the
    binaries (`make cluster-binaries`) the tests are skipped, or fail under CI.
    """
    from cluster import kubecluster

    if not os.environ.get(kubecluster.EXTERNAL_KUBECONFIG_ENV) and not kubecluster.binaries_present():
        msg = f"no control-plane binaries in {kubecluster.BIN_DIR}; run `make cluster-binaries`"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    with kubecluster.running_cluster() as cluster:
        yield cluster
