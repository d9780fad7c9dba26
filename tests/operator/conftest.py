"""Fixtures for the operator's tests, on two clusters.

The operator runs in-process under `kopf.testing.KopfRunner`, authenticated as
its own ServiceAccount (a TokenRequest token), with the RBAC objects of
`kustomize build manifests/` really applied: every test also checks the
ClusterRole is enough.

- lean (`kube`; fixtures `api`, `operator`, `ns`): the control plane without KubeRay's
  controller, for what needs no other controller, and for states that need a running
  Ray, which tests write by hand (each says so);
- the world (`world`; fixtures `world_api`, `world_operator`, `world_ns`): the real
  kube-scheduler, kwok GPU nodes, KubeRay and Kueue.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from operator_testkit import APPLIED_KINDS, OPERATOR_NAMESPACE, OPERATOR_SA, REPO, Api, Operator, kustomize_build

from rocmtrain_testworld.kubecluster import KubeCluster

if TYPE_CHECKING:
    from rocmtrain_testworld.world import Scope, World


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


# The world's operator retries a failed submitter pod at once rather than twice (KubeRay's
# default, 10 s and 20 s apart): failure paths then take seconds (see RenderOptions.submitter_retries).
WORLD_SETTINGS = {"ROCMTRAIN_SUBMITTER_RETRIES": "0"}


def _install(cluster: KubeCluster, kustomized: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifests on `cluster`: RBAC and CRD applied, Deployment and Service dry-run applied (no kubelet)."""
    for name, message in cluster.crd_errors.items():
        pytest.fail(f"crds/{name} was rejected by kube-apiserver: {message}")
    for obj in kustomized:
        cluster.apply(obj, dry_run=obj["kind"] not in APPLIED_KINDS)
    return kustomized


def _running(kubeconfig: Path, settings: dict[str, str] | None = None) -> Iterator[Operator]:
    running = Operator(kubeconfig, settings)
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def kustomized() -> list[dict[str, Any]]:
    """`kustomize build manifests/`: the objects `kubectl apply -k manifests/` would apply."""
    return kustomize_build(REPO / "manifests")


# ---- the lean control plane -------------------------------------------------------------------


@pytest.fixture(scope="session")
def api(kube: KubeCluster) -> Api:
    return Api(kube)


@pytest.fixture(scope="session")
def installed(kube: KubeCluster, kustomized: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return _install(kube, kustomized)


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
    yield from _running(operator_kubeconfig)


@pytest.fixture
def ns(kube: KubeCluster, operator: Operator) -> str:
    """A fresh namespace, with the operator running."""
    return kube.new_namespace("op")


# ---- the world -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def world_api(world: World) -> Api:
    return Api(world.cluster)


@pytest.fixture(scope="session")
def world_operator_kubeconfig(
    world: World, kustomized: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    _install(world.cluster, kustomized)
    path = tmp_path_factory.mktemp("world-operator") / "kubeconfig"
    return world.cluster.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SA, path)


@pytest.fixture(scope="module")
def world_operator(world_operator_kubeconfig: Path) -> Iterator[Operator]:
    """The operator in the world, for one test module (see `operator`), with `WORLD_SETTINGS`."""
    yield from _running(world_operator_kubeconfig, WORLD_SETTINGS)


@pytest.fixture
def world_ns(scope: Scope, world_operator: Operator) -> str:
    """A fresh namespace in the world, with the operator running; removed after the test, its pods gone."""
    return scope.namespace("op")
