"""Fixtures for the operator's control-plane tests.

The operator runs in-process under `kopf.testing.KopfRunner`, authenticated as
its own ServiceAccount (a TokenRequest token), with the RBAC objects of
`kustomize build manifests/` really applied: every test also checks the
ClusterRole is enough.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_testkit import APPLIED_KINDS, OPERATOR_NAMESPACE, OPERATOR_SA, REPO, Api, Operator, kustomize_build

from cluster.kubecluster import KubeCluster


@pytest.fixture(scope="module", autouse=True)
def _delete_module_namespaces(request: pytest.FixtureRequest) -> Iterator[None]:
    """Delete the lean cluster's namespaces a test module made, with their jobs, when it ends.

    Later modules start operators that list every job in the cluster: a module's
    leftovers (the soak's 200 jobs, say) would otherwise queue in front of theirs.
    """
    items = [item for item in request.session.items if item.module is request.module]
    if not any("kube" in item.fixturenames for item in items):  # a world-only module: no lean cluster
        yield
        return
    cluster: KubeCluster = request.getfixturevalue("kube")
    before = len(cluster.namespaces)
    yield
    for name in cluster.namespaces[before:]:
        cluster.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


@pytest.fixture(scope="session")
def api(kube: KubeCluster) -> Api:
    for name, message in kube.crd_errors.items():
        pytest.fail(f"crds/{name} was rejected by kube-apiserver: {message}")
    return Api(kube)


@pytest.fixture(scope="session")
def kustomized() -> list[dict[str, Any]]:
    """`kustomize build manifests/`: the objects `kubectl apply -k manifests/` would apply."""
    return kustomize_build(REPO / "manifests")


@pytest.fixture(scope="session")
def installed(kube: KubeCluster, kustomized: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifests on the cluster: RBAC and CRD applied, Deployment and Service dry-run applied."""
    for obj in kustomized:
        kube.apply(obj, dry_run=obj["kind"] not in APPLIED_KINDS)
    return kustomized


@pytest.fixture(scope="session")
def operator_kubeconfig(
    kube: KubeCluster, installed: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A kubeconfig holding a token of the operator's ServiceAccount (TokenRequest)."""
    path = tmp_path_factory.mktemp("operator") / "kubeconfig"
    return kube.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SA, path)


@pytest.fixture(scope="module")
def operator(operator_kubeconfig: Path) -> Iterator[Operator]:
    """The operator, running for one test module (tests may restart it).

    Not longer: a running operator reconciles every job in the cluster, including
    other test folders' jobs in the same pytest session.
    """
    running = Operator(operator_kubeconfig)
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def ns(kube: KubeCluster, operator: Operator) -> str:
    """A fresh namespace, with the operator running."""
    return kube.new_namespace("op")
