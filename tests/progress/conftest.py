"""Fixtures for the progress endpoint against the real control plane (see `endpoint.py`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from progress.endpoint import OPERATOR_NAMESPACE, Client, ServerThread, operator_kubeconfig
from rocmtrain.progress.server import ProgressServerConfig
from rocmtrain_testworld.kubecluster import KubeCluster, free_port


@pytest.fixture(scope="module")
def progress_server(kube: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """The endpoint as the operator's ServiceAccount, reached as https://localhost:<port>.

    Its certificate covers that name besides the Service's names. Every test posts from
    127.0.0.1, so the per-address limit is lifted here (the job's own rate is what
    `test_a_flood_is_rate_limited` checks; `test_app` and the operator's flood test
    the per-address limit).
    """
    kubeconfig = operator_kubeconfig(kube, tmp_path_factory.mktemp("operator") / "kubeconfig")
    port = free_port()
    cfg = ProgressServerConfig(
        namespace=OPERATOR_NAMESPACE,
        host="127.0.0.1",
        port=port,
        advertise_host="localhost",
        advertise_port=port,
        source_rate_per_second=1000.0,
        source_burst=1000,
    )
    server = ServerThread(cfg, kubeconfig)
    yield server
    server.stop()


@pytest.fixture
def client(progress_server: ServerThread) -> Iterator[Client]:
    c = Client(progress_server.config.port, progress_server.server.ca_crt)
    yield c
    c.close()
