"""Supervised watches: a watch that meets a bug starts again; one that keeps failing turns `/healthz` red.

The operator runs as in the other tests (KopfRunner, its own ServiceAccount), with a
view function of its RayJob watch replaced before it starts: one that raises once,
or one that raises for every RayJob of the test's namespace. Hand-written: the RayJob
status a running Ray would give (`Api.fake_kuberay`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from operator_testkit import Api, Operator, wait_until

from rocmtrain.controller import rayjob_watch
from rocmtrain.metrics import prometheus
from rocmtrain.status.objects import rayjob_view
from rocmtrain_testworld.kubecluster import KubeCluster

pytestmark = pytest.mark.cluster

RUNNING = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}


def _restarts() -> float:
    return prometheus.REGISTRY.get_sample_value("rocmtrain_watch_restarts_total", {"watch": "RayJobs"}) or 0.0


def _failing_in(namespace: str, times: int | None) -> Any:
    """`rayjob_view`, raising KeyError for the RayJobs of `namespace` the first `times` times (None: always)."""
    failures: list[str] = []

    def view(rayjob: Mapping[str, Any]) -> dict[str, Any]:
        if rayjob["metadata"]["namespace"] == namespace and (times is None or len(failures) < times):
            failures.append(rayjob["metadata"]["name"])
            raise KeyError("injected")
        return rayjob_view(rayjob)

    return view


@pytest.fixture
def started() -> Iterator[list[Operator]]:
    """Operators a test starts; stopped after it."""
    running: list[Operator] = []
    yield running
    for operator in running:
        operator.stop()


def _start(started: list[Operator], kubeconfig: Path, env: dict[str, str] | None = None) -> Operator:
    operator = Operator(kubeconfig, env)
    started.append(operator)
    operator.start()
    return operator


def test_a_watch_that_raised_starts_again_and_status_updates_still_arrive(
    kube: KubeCluster,
    api: Api,
    operator_kubeconfig: Path,
    started: list[Operator],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    ns = kube.new_namespace("restart")
    monkeypatch.setattr(rayjob_watch, "rayjob_view", _failing_in(ns, times=1))
    before = _restarts()
    operator = _start(started, operator_kubeconfig)
    api.create_job(ns, "bert")  # its RayJob's first event meets the bug
    wait_until(lambda: _restarts() == before + 1, timeout=10, what="the RayJob watch restarted")
    api.fake_kuberay(ns, "bert", RUNNING)
    api.wait_status(ns, "bert", "Running after the restart", lambda s: s.get("phase") == "Running", timeout=15)
    logged = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert logged and logged[0].levelno == logging.ERROR and logged[0].exc_info is not None
    assert logged[0].exc_info[0] is KeyError, "logged with its traceback"
    assert operator.healthy(), "a watch that recovered keeps the operator healthy"


def test_a_watch_that_keeps_failing_turns_healthz_red(
    kube: KubeCluster,
    api: Api,
    operator_kubeconfig: Path,
    started: list[Operator],
    monkeypatch: pytest.MonkeyPatch,
):
    ns = kube.new_namespace("broken")
    monkeypatch.setattr(rayjob_watch, "rayjob_view", _failing_in(ns, times=None))
    operator = _start(started, operator_kubeconfig, {"ROCMTRAIN_WATCH_FAILING_SECONDS": "2"})
    assert operator.healthy()
    before = _restarts()
    api.create_job(ns, "bert")  # from now on, every list and watch of RayJobs meets the bug
    # kopf keeps a healthy probe result for 10 s; then the watch has failed for longer than 2 s.
    wait_until(lambda: not operator.healthy(), timeout=25, interval=0.5, what="/healthz failing")
    assert _restarts() >= before + 3, "restarted again and again before giving up"
