"""Soak: 200 jobs in flight, the operator killed five times at random points, kube-apiserver restarted once.

Real parts: kube-apiserver (restarted with the same flags while etcd and the
controller-manager stay up, `faults.apiserver`), the operator as its own process, killed
with SIGKILL (`faults.operator_process`). Faked, as in the other lean-cluster operator tests:
KubeRay's status writes (`Api.fake_kuberay`), so that each status is one the test chose (the real
KubeRay controller runs in the world's tests, test_kuberay). Afterwards: one RayJob per
job, never recreated, no job lost, every status as KubeRay last wrote it, and the operator's memory
flat over rounds of status changes.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from operator_testkit import RAYJOBS, Api, job_manifest

from faults.apiserver import restart_apiserver
from faults.operator_process import OperatorProcess
from rocmtrain_testworld.kubecluster import KubeCluster

pytestmark = pytest.mark.cluster

JOBS = 200
KILLS_WHILE_CREATING = 4
CHURN_ROUNDS = 3  # odd: the last round leaves two workers ready
JOBS_PATH = "/apis/rocmtrain.dev/v1alpha1/namespaces/{ns}/rocmtrainingjobs"


def _jobs(kube: KubeCluster, ns: str) -> dict[str, dict[str, Any]]:
    return {j["metadata"]["name"]: j for j in kube.request("GET", JOBS_PATH.format(ns=ns))["items"]}


def _wait(kube: KubeCluster, ns: str, done: Callable[[dict[str, Any]], bool], what: str, timeout: float = 180) -> float:
    """Seconds until `done(status)` holds for every job."""
    start = time.monotonic()
    while True:
        try:
            pending = [name for name, job in _jobs(kube, ns).items() if not done(job.get("status") or {})]
        except Exception:  # the API server may be restarting
            pending = ["?"]
        if not pending:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"{len(pending)} jobs not {what}, e.g. {pending[:3]}"
        time.sleep(0.25)


def _write_all(api: Api, ns: str, statuses: dict[str, dict[str, Any]]) -> None:
    """KubeRay's status writes for every job, retried while the API server is away."""

    def write(name: str) -> None:
        for _ in range(300):
            try:
                api.fake_kuberay(ns, name, statuses[name])
                return
            except Exception:  # connection refused or 503 while kube-apiserver restarts
                time.sleep(0.2)
        raise AssertionError(f"could not write {name}'s RayJob status")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(write, statuses))


def test_soak_two_hundred_jobs_through_kills_and_an_apiserver_restart(
    kube: KubeCluster, api: Api, operator_kubeconfig: Path, tmp_path: Path
):
    if kube.external:
        pytest.skip("restarts the local control plane's kube-apiserver")
    ns = kube.new_namespace("soak")
    rng = random.Random(20261130)
    names = [f"soak-{i:03d}" for i in range(JOBS)]
    operator = OperatorProcess(operator_kubeconfig, tmp_path, [ns])
    figures: dict[str, Any] = {"kills_at": [], "rss_mib": []}

    def kill_and_restart() -> None:
        operator.kill()
        operator.start()

    operator.start()
    try:
        # Jobs arrive while the operator dies at random moments, creates and status writes under way.
        with ThreadPoolExecutor(max_workers=8) as pool:
            started = time.monotonic()
            created = [pool.submit(kube.create, job_manifest(name, ns)) for name in names]
            for _ in range(KILLS_WHILE_CREATING):
                time.sleep(rng.uniform(0.3, 2.5))
                figures["kills_at"].append(round(time.monotonic() - started, 2))
                kill_and_restart()
            for future in created:
                future.result()
        figures["reconciled_s"] = _wait(
            kube, ns, lambda s: s.get("phase") == "Pending" and s.get("rayJobName"), "Pending"
        )
        first = {
            r["metadata"]["name"]: r["metadata"]["uid"] for r in kube.request("GET", RAYJOBS.format(ns=ns))["items"]
        }
        assert sorted(first) == names

        # KubeRay starts every job while kube-apiserver restarts (etcd stays up).
        running = {
            name: {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": f"{name}-c1x2y"}
            for name in names
        }
        writer = threading.Thread(target=_write_all, args=(api, ns, running))
        writer.start()
        time.sleep(rng.uniform(0.2, 1.5))
        figures["apiserver_away_s"] = round(restart_apiserver(kube), 2)
        writer.join()
        figures["running_s"] = _wait(kube, ns, lambda s: s.get("phase") == "Running", "Running")

        # The fifth kill, in the middle of a round of worker changes.
        ready = {name: {"rayClusterStatus": {"readyWorkerReplicas": 1, "desiredWorkerReplicas": 2}} for name in names}
        writer = threading.Thread(target=_write_all, args=(api, ns, ready))
        writer.start()
        time.sleep(rng.uniform(0.2, 1.5))
        figures["kills_at"].append(round(time.monotonic() - started, 2))
        kill_and_restart()
        writer.join()
        _wait(kube, ns, lambda s: s.get("workersReady") == 1, "with one worker ready")

        # Memory over rounds of status changes of every job, in the last process.
        for round_ in range(CHURN_ROUNDS):
            count = 2 if round_ % 2 == 0 else 1
            churn = {name: {"rayClusterStatus": {"readyWorkerReplicas": count}} for name in names}
            _write_all(api, ns, churn)
            _wait(kube, ns, lambda s, count=count: s.get("workersReady") == count, f"with {count} workers ready")
            figures["rss_mib"].append(round(operator.rss_mib(), 1))

        # The end: half succeed, half fail.
        final = {
            name: (
                {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "succeeded": 1}
                if i % 2 == 0
                else {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed", "failed": 1}
            )
            for i, name in enumerate(names)
        }
        _write_all(api, ns, final)
        figures["final_s"] = _wait(kube, ns, lambda s: s.get("phase") in ("Succeeded", "Failed"), "finished")
        figures["remembered"] = operator.metric("rocmtrain_jobs_remembered")
        figures["in_flight"] = operator.metric("rocmtrain_reconciles_in_flight")
    finally:
        operator.stop()
    print("\nsoak figures:", json.dumps(figures))

    assert operator.starts == 1 + KILLS_WHILE_CREATING + 1
    rayjobs = kube.request("GET", RAYJOBS.format(ns=ns))["items"]
    assert {r["metadata"]["name"]: r["metadata"]["uid"] for r in rayjobs} == first, "no duplicate, none recreated"
    jobs = _jobs(kube, ns)
    assert sorted(jobs) == names, "no job lost"
    for i, name in enumerate(names):
        status, uid = jobs[name]["status"], jobs[name]["metadata"]["uid"]
        owners = next(r for r in rayjobs if r["metadata"]["name"] == name)["metadata"]["ownerReferences"]
        assert [o["uid"] for o in owners] == [uid], name
        conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
        expected = ("Succeeded", "Succeeded") if i % 2 == 0 else ("Failed", "AppFailed")
        assert (status["phase"], conditions[expected[0]]) == (expected[0], ("True", expected[1])), name
        assert (status["rayJobName"], status["rayClusterName"]) == (name, f"{name}-c1x2y"), name
        assert (status["observedGeneration"], status["workersReady"], status["restarts"]) == (1, 2, 0), name
    assert figures["remembered"] == JOBS and figures["in_flight"] == 0
    rss = figures["rss_mib"]
    assert max(rss[1:]) <= rss[0] * 1.1 + 5, f"RSS flat over rounds of status changes: {rss}"
