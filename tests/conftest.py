"""Shared pytest configuration: the lean ``kube`` cluster and the full ``world`` (of ``rocmtrain_testworld``).

The test folders import each other from ``tests/`` (pytest's rootdir-based import of this conftest puts it first
on sys.path), the test world from its installed package (``make install``: ``tests/testworld``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from rocmtrain_testworld.kubecluster import KubeCluster
    from rocmtrain_testworld.s3 import S3Server
    from rocmtrain_testworld.world import Scope, World


def _missing(msg: str) -> None:
    """Skip, or fail under CI, where every part must be there."""
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeCluster]:
    """The lean control plane (etcd, kube-apiserver, kube-controller-manager) for the session.

    No scheduler, kubelet or KubeRay controller: tests write RayJob status
    themselves. Uses the cluster at $ROCMTRAIN_TEST_KUBECONFIG when set.
    """
    from rocmtrain_testworld import kubecluster

    if not os.environ.get(kubecluster.EXTERNAL_KUBECONFIG_ENV) and not kubecluster.binaries_present():
        _missing(f"no control-plane binaries in {kubecluster.BIN_DIR}; run `make cluster-binaries`")
    with kubecluster.running_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def world() -> Iterator[World]:
    """The full world for the session, apart from ``kube``: the control plane plus kube-scheduler,
    kwok GPU nodes, the KubeRay operator and Kueue (rocmtrain_testworld.world)."""
    from rocmtrain_testworld import kubecluster, world

    if os.environ.get(kubecluster.EXTERNAL_KUBECONFIG_ENV):
        pytest.skip("the world runs its own processes; not against $ROCMTRAIN_TEST_KUBECONFIG")
    if not world.binaries_present():
        _missing(f"no world binaries in {kubecluster.BIN_DIR}; run `make cluster-binaries`")
    with kubecluster.running_world() as started:
        yield started


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """An S3 server on 127.0.0.1 for the session (SeaweedFS, rocmtrain_testworld.s3), with its bucket: tests
    share it, each below a prefix of its own. Closed, its data removed, at the end."""
    from rocmtrain_testworld import s3 as object_store
    from rocmtrain_testworld.gotools import go_tool

    go_tool(object_store.BINARY)
    server = object_store.S3Server.start(tmp_path_factory.mktemp("s3"))
    yield server
    server.close()


# Fixtures that start a control plane (etcd, kube-apiserver, kube-controller-manager; the world's adds more).
CLUSTER_FIXTURES = frozenset({"kube", "world"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of the embedded Ray's tests first, before a control plane starts: an idle control plane
    still takes CPU (the world's and the lean one's together about 13% of a core), which the Ray tests,
    bound by CPU, would lose. Otherwise the order stays as collected; a file moves as a whole, so that
    its module fixtures are set up once."""
    ray_files = {
        item.path for item in items if item.get_closest_marker("ray") and not CLUSTER_FIXTURES & set(item.fixturenames)
    }
    items.sort(key=lambda item: item.path not in ray_files)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test in the world reports its namespaces' pods and their logs (and the process runtime's): those
    of its `scope`, or of another Scope it was given (such as a module's)."""
    report = yield
    if report.when == "call" and report.failed:
        from rocmtrain_testworld.world import Scope

        given = getattr(item, "funcargs", {}).values()
        if (scope := next((value for value in given if isinstance(value, Scope)), None)) is not None:
            report.sections.append(("the world's pods and logs", scope.describe()))
    return report


@pytest.fixture
def scope(world: World) -> Iterator[Scope]:
    """Namespaces and objects for one test in the world, removed after it (freeing the GPUs)."""
    from rocmtrain_testworld.world import Scope

    made = Scope(world)
    try:
        yield made
    finally:
        made.close()
