"""Fixtures for the operator's control-plane tests.

The operator runs in-process under `kopf.testing.KopfRunner`, authenticated as
its own ServiceAccount (a TokenRequest token), with the RBAC objects of
`kustomize build manifests/` really applied: every test also checks the
ClusterRole is enough.
"""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_testkit import APPLIED_KINDS, OPERATOR_NAMESPACE, OPERATOR_SA, REPO, Api, Operator

from cluster.kubecluster import BIN_DIR, KubeCluster
from rocmtrain.manifests import load_documents


@pytest.fixture(scope="session")
def api(kube: KubeCluster) -> Api:
    for name, message in kube.crd_errors.items():
        pytest.fail(f"crds/{name} was rejected by kube-apiserver: {message}")
    return Api(kube)


@pytest.fixture(scope="session")
def kustomized() -> list[dict[str, Any]]:
    """`kustomize build manifests/`: the objects `kubectl apply -k manifests/` would apply."""
    binary = BIN_DIR / "kustomize"
    if not binary.is_file():
        message = f"no kustomize in {BIN_DIR}; run `make cluster-binaries`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    out = subprocess.run([str(binary), "build", str(REPO / "manifests")], capture_output=True, text=True, check=True)
    return load_documents(out.stdout)  # YAML 1.2 numbers (`5e-05`), as kubectl reads them


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
    token = kube.request(
        "POST",
        f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/serviceaccounts/{OPERATOR_SA}/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}},
    )["status"]["token"]
    admin = yaml.safe_load(kube.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    if "certificate-authority" in cluster:  # inline a CA file, so the kubeconfig stands alone
        ca = Path(cluster.pop("certificate-authority")).read_bytes()
        cluster = {**cluster, "certificate-authority-data": base64.b64encode(ca).decode()}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": OPERATOR_SA, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "test", "user": OPERATOR_SA}}],
        "current-context": "operator",
    }
    path = tmp_path_factory.mktemp("operator") / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def operator(operator_kubeconfig: Path) -> Iterator[Operator]:
    """The operator, running for the whole session (tests may restart it)."""
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
