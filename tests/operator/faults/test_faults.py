"""The operator behind a slow, failing and hanging API server: it times out, retries, and converges.

Real parts: kube-apiserver, etcd and the controller-manager; the operator as its own process
(`python -m rocmtrain.controller`, as its ServiceAccount), talking to the API server through
a fault-injecting TLS proxy on 127.0.0.1 (`faults.proxy`). Faked: KubeRay's status writes
(`Api.fake_kuberay`, made directly, not through the proxy) and the operator's request
deadline, shortened to 2 s so that the test waits seconds, not minutes.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from operator_testkit import RAYJOBS, Api, job_manifest, wait_until

from faults.operator_process import OperatorProcess
from faults.proxy import Fault, FaultProxy
from rocmtrain.api.condition_reasons import ConditionType
from rocmtrain.api.contract import JOB_NAME_LABEL, MANAGED_LABELS, RAY_CLUSTER_LABEL, RAY_NODE_TYPE_LABEL
from rocmtrain.controller.reconciler import ACTIVE_RECONCILES
from rocmtrain_testworld.kubecluster import KubeCluster

pytestmark = pytest.mark.cluster

API_TIMEOUT = 2


@dataclass
class Faulty:
    proxy: FaultProxy
    operator: OperatorProcess
    ns: str


@pytest.fixture(scope="module")
def faulty(kube: KubeCluster, operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faulty]:
    if kube.external:
        pytest.skip("the proxy needs the local control plane's CA key")
    folder = tmp_path_factory.mktemp("faults")
    ns = kube.new_namespace("faults")
    proxy = FaultProxy(kube, folder)
    operator = OperatorProcess(
        proxy.kubeconfig(operator_kubeconfig, folder / "kubeconfig"),
        folder,
        [ns],
        env={"ROCMTRAIN_API_TIMEOUT_SECONDS": str(API_TIMEOUT)},
    )
    try:
        operator.start()
        yield Faulty(proxy, operator, ns)
    finally:
        operator.stop()
        proxy.stop()


def _is_status_patch(method: str, path: str) -> bool:
    return method == "PATCH" and "/rocmtrainingjobs/" in path and path.split("?")[0].endswith("/status")


def _is_rayjob_create(method: str, path: str) -> bool:
    return method == "POST" and path.split("?")[0].endswith("/rayjobs")


def _converged(kube: KubeCluster, api: Api, ns: str, names: list[str]) -> bool:
    rayjobs = {r["metadata"]["name"] for r in kube.request("GET", RAYJOBS.format(ns=ns))["items"]}
    return set(names) <= rayjobs and all(api.phase(ns, name) == "Pending" for name in names)


def test_errors_hangs_and_drops_time_out_retry_and_converge(kube: KubeCluster, api: Api, faulty: Faulty):
    proxy, operator, ns = faulty.proxy, faulty.operator, faulty.ns
    # 429, 500 and 503 in turn on every RayJob create and status write; every fourth goes through.
    turns = itertools.cycle([Fault.status(429), Fault.status(500), Fault.status(503), None])
    proxy.fault = lambda m, p: next(turns) if _is_rayjob_create(m, p) or _is_status_patch(m, p) else None
    errors = [f"err-{i}" for i in range(6)]
    for name in errors:
        kube.create(job_manifest(name, ns))
    wait_until(lambda: _converged(kube, api, ns, errors), timeout=60, interval=0.5, what="jobs through API errors")

    # Every RayJob create hangs, for more jobs than there are reconcile slots; hung requests stay hung.
    proxy.fault = lambda m, p: Fault.hang() if _is_rayjob_create(m, p) else None
    start = proxy.loop.time()
    hung = [f"hang-{i:02d}" for i in range(ACTIVE_RECONCILES + 4)]
    for name in hung:
        kube.create(job_manifest(name, ns))
    wait_until(
        lambda: len(proxy.requests("POST", "/rayjobs", since=start)) >= ACTIVE_RECONCILES,
        timeout=30,
        what="every reconcile slot on a hung request",
    )
    # The deadline frees the slots: the jobs beyond the slots get their turn, and everyone tries again.
    wait_until(
        lambda: len(proxy.requests("POST", "/rayjobs", since=start)) > 2 * len(hung),
        timeout=60,
        interval=0.5,
        what="hung creates timed out and retried",
    )
    assert operator.metric("rocmtrain_reconciles_in_flight") <= ACTIVE_RECONCILES

    # Connections dropped: half the creates, and every watch at once.
    drops = itertools.cycle([Fault.drop(), None])
    proxy.fault = lambda m, p: next(drops) if _is_rayjob_create(m, p) else None
    proxy.drop_connections()
    dropped = [f"drop-{i}" for i in range(4)]
    for name in dropped:
        kube.create(job_manifest(name, ns))

    # Faults off: everything converges, no slot stays held, and the watches work again.
    proxy.fault = lambda m, p: None
    everyone = errors + hung + dropped
    wait_until(lambda: _converged(kube, api, ns, everyone), timeout=90, interval=0.5, what="convergence")
    wait_until(
        lambda: operator.metric("rocmtrain_reconciles_in_flight") == 0, timeout=30, what="every reconcile slot free"
    )
    rayjobs = kube.request("GET", RAYJOBS.format(ns=ns))["items"]
    assert sorted(r["metadata"]["name"] for r in rayjobs) == sorted(everyone), "one RayJob per job"
    api.fake_kuberay(ns, "drop-0", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    wait_until(lambda: api.phase(ns, "drop-0") == "Running", timeout=20, what="the RayJob watch back after drops")


def test_a_status_write_that_failed_for_a_rayjob_change_is_retried(kube: KubeCluster, api: Api, faulty: Faulty):
    proxy, ns = faulty.proxy, faulty.ns
    kube.create(job_manifest("stale", ns))
    wait_until(lambda: api.phase(ns, "stale") == "Pending", timeout=30, what="Pending")
    proxy.fault = lambda m, p: Fault.status(500) if _is_status_patch(m, p) and "/stale/" in p else None
    api.fake_kuberay(ns, "stale", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    wait_until(lambda: proxy.requests("PATCH", "/stale/status"), timeout=10, what="the failing status write")
    time.sleep(3)  # longer than the quick retries of one write (0.1 + 0.5 + 1 s)
    assert api.phase(ns, "stale") == "Pending", "the fault holds the write"
    proxy.fault = lambda m, p: None
    # No RayJob event comes again: only the watch's own retry can bring the status in line.
    wait_until(lambda: api.phase(ns, "stale") == "Running", timeout=40, interval=0.2, what="Running after the fault")


def test_a_status_write_that_failed_for_a_pod_change_is_retried(kube: KubeCluster, api: Api, faulty: Faulty):
    """The pod watch retries too: a Ray pod that cannot run is reported once the API server takes the write."""
    proxy, ns = faulty.proxy, faulty.ns
    kube.create(job_manifest("unplaced", ns))
    wait_until(lambda: api.phase(ns, "unplaced") == "Pending", timeout=30, what="Pending")
    cluster = "unplaced-x7k2p"
    api.fake_kuberay(ns, "unplaced", {"jobDeploymentStatus": "Initializing", "rayClusterName": cluster})
    wait_until(lambda: api.phase(ns, "unplaced") == "Initializing", timeout=20, what="Initializing")
    proxy.fault = lambda m, p: Fault.status(500) if _is_status_patch(m, p) and "/unplaced/" in p else None
    start = proxy.loop.time()
    # A worker pod as KubeRay makes it (its labels, its RayCluster as controller), which the scheduler found no
    # room for (no KubeRay, kubelet or scheduler here: the RayCluster is only an object, which no one acts on).
    kube.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ray", "namespace": ns}})
    head = {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "ray-head", "image": "rocm/ray"}]}}}
    ray_cluster = kube.create(
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {"name": cluster, "namespace": ns},
            "spec": {"headGroupSpec": head},
        }
    )
    owner = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster, "controller": True}
    owner["uid"] = ray_cluster["metadata"]["uid"]
    labels = {**MANAGED_LABELS, JOB_NAME_LABEL: "unplaced", RAY_CLUSTER_LABEL: cluster, RAY_NODE_TYPE_LABEL: "worker"}
    pod = f"{cluster}-gpu-worker-q1w2e"
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": ns, "labels": labels, "ownerReferences": [owner]},
            "spec": {"serviceAccountName": "ray", "containers": [{"name": "ray", "image": "rocm/ray:2.60.0"}]},
        }
    )
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes"}
    kube.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{pod}/status",
        body={"status": {"conditions": [unschedulable]}},
        content_type="application/merge-patch+json",
    )
    wait_until(lambda: proxy.requests("PATCH", "/unplaced/status", since=start), timeout=10, what="the failing write")
    time.sleep(3)  # longer than the quick retries of one write (0.1 + 0.5 + 1 s)
    assert api.condition(ns, "unplaced", ConditionType.RAY_PODS_UNAVAILABLE) == {}, "the fault holds the write"
    proxy.fault = lambda m, p: None
    # No pod or RayJob event comes again: only the pod watch's own retry can bring the status in line.
    wait_until(
        lambda: api.condition(ns, "unplaced", ConditionType.RAY_PODS_UNAVAILABLE).get("reason") == "Unschedulable",
        timeout=40,
        interval=0.2,
        what="RayPodsUnavailable after the fault",
    )


def test_a_job_deleted_while_it_syncs_is_forgotten(kube: KubeCluster, api: Api, faulty: Faulty):
    """The job goes while a retry (a task of the operator's, not kopf's handler) waits on the API server."""
    proxy, operator, ns = faulty.proxy, faulty.operator, faulty.ns
    start = proxy.loop.time()
    # Every RayJob create answers after the deadline: each sync of the job fails, and is retried.
    proxy.fault = lambda m, p: Fault.delay(API_TIMEOUT + 1) if _is_rayjob_create(m, p) else None
    kube.create(job_manifest("doomed", ns))
    wait_until(
        lambda: len(proxy.requests("POST", "/rayjobs", since=start)) >= 2, timeout=30, what="a retry's create under way"
    )
    kube.delete(api.job(ns, "doomed"))  # while that create waits
    wait_until(lambda: api.job(ns, "doomed") is None, timeout=10, what="the job gone")
    time.sleep(API_TIMEOUT + 2)  # the create times out, and the failed sync would schedule its retry
    proxy.fault = lambda m, p: None
    jobs = kube.request("GET", f"/apis/rocmtrain.dev/v1alpha1/namespaces/{ns}/rocmtrainingjobs")["items"]
    time.sleep(2)  # that retry has fired
    assert operator.metric("rocmtrain_jobs_remembered") == len(jobs), f"state for the {len(jobs)} live jobs only"
    assert api.rayjob(ns, "doomed") is None
