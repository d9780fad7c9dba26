"""Fixtures for the progress endpoint against the real control plane (see `endpoint.py`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster.kubecluster import KubeCluster, free_port
from progress.endpoint import OPERATOR_NAMESPACE, Client, ServerThread, operator_kubeconfig
from rocmtrain.progress.server import ProgressServerConfig


@pytest.fixture(scope="module")
def progress_server(kube: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """The endpoint as the operator's ServiceAccount, reached as https://localhost:<port>.

    Its certificate covers that name besides the Service's names.
    """
    kubeconfig = operator_kubeconfig(kube, tmp_path_factory.mktemp("operator") / "kubeconfig")
    port = free_port()
    cfg = ProgressServerConfig(
        namespace=OPERATOR_NAMESPACE, host="127.0.0.1", port=port, advertise_host="localhost", advertise_port=port
    )
    server = ServerThread(cfg, kubeconfig)
    yield server
    server.stop()


@pytest.fixture
def client(progress_server: ServerThread) -> Iterator[Client]:
    c = Client(progress_server.config.port, progress_server.server.ca_crt)
    yield c
    c.close()
