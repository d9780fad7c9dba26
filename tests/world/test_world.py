"""Smoke tests of the full world: each fails without the real component it names.

kube-scheduler binds pods, kwok runs the nodes and plays pod lifecycles, the
KubeRay operator turns a rendered RayJob into a RayCluster and a submitter Job,
Kueue admits queued RayJobs through its webhooks. Faked: GPUs and containers.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from rocmtrain.api.validate import validate_job
from rocmtrain.render import render_rayjob
from rocmtrain_testworld import kuberay, kueue, kwok
from rocmtrain_testworld.nodes import GPU_RESOURCE, KWOK_ANNOTATION, MI300X_LABELS, PRODUCT_LABEL, WORLD_NODES
from rocmtrain_testworld.sandbox import RESOLVER
from rocmtrain_testworld.world import Scope, World

pytestmark = pytest.mark.cluster

MI300X = MI300X_LABELS[PRODUCT_LABEL]


def _pod(name: str, namespace: str, *, gpus: int = 0, product: str | None = None, **spec: Any) -> dict[str, Any]:
    resources = {"cpu": "1", "memory": "1Gi", **({GPU_RESOURCE: str(gpus)} if gpus else {})}
    pod_spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "rocm/pytorch:latest", "resources": {"limits": resources, "requests": resources}}
        ],
        **spec,
    }
    if product:
        pod_spec["nodeSelector"] = {PRODUCT_LABEL: product}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": pod_spec}


def _get_pod(world: World, namespace: str, name: str) -> dict[str, Any]:
    return world.cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == kind), {})


def _rayjob(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    """The RayJob the renderer makes for a valid MiniLM job (two 8-GPU workers unless ``spec`` says otherwise)."""
    spec.setdefault("resources", {"workers": 2, "gpusPerWorker": 8})
    job = {
        "apiVersion": "rocmtrain.dev/v1alpha1",
        "kind": "RocmTrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"source": "/models/all-MiniLM-L6-v2", "numLabels": 3},
            "data": {"train": {"uri": "/data/train.jsonl"}},
            "checkpoint": {"storagePath": f"s3://checkpoints/{namespace}/{name}"},
            **spec,
        },
    }
    valid, errors = validate_job(job, context="cluster")
    assert valid is not None, errors
    return render_rayjob(valid)


# ---- kwok nodes and the scheduler ----------------------------------------------------------


def test_kwok_nodes_are_ready_heartbeating_amd_gpu_nodes(world: World) -> None:
    nodes = {
        n["metadata"]["name"]: n
        for n in world.cluster.request("GET", "/api/v1/nodes")["items"]
        if (n["metadata"].get("annotations") or {}).get(KWOK_ANNOTATION) == "fake"
    }
    assert sorted(nodes) == sorted(n.name for n in WORLD_NODES)
    for spec in WORLD_NODES:
        node = nodes[spec.name]
        assert node["status"]["allocatable"].get(GPU_RESOURCE) == (str(spec.gpus) if spec.gpus else None)
        assert {k: node["metadata"]["labels"].get(k) for k in spec.gpu_labels} == spec.gpu_labels
        ready = _condition(node, "Ready")
        # Written by kwok, not by the harness (which writes no conditions on kwok nodes).
        assert ready["status"] == "True", ready
        assert node["status"]["nodeInfo"]["kubeletVersion"]
    models = {n["metadata"]["labels"].get(PRODUCT_LABEL) for n in nodes.values()} - {None}
    assert len(models) == 2
    # kwok renews each node's Lease like a kubelet; the node lifecycle controller relies on it.
    leases = world.cluster.request("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")["items"]
    renewed = {lease["metadata"]["name"]: lease["spec"]["renewTime"] for lease in leases}
    assert set(renewed) >= set(nodes)
    first = renewed[WORLD_NODES[0].name]
    world.cluster.wait_for(
        lambda: (
            world.cluster.request(
                "GET", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{WORLD_NODES[0].name}"
            )["spec"]["renewTime"]
            != first
        ),
        30,
        "kwok to renew the node lease",
    )


def test_scheduler_binds_by_gpu_model_and_explains_what_does_not_fit(world: World, scope: Scope) -> None:
    ns = scope.namespace("sched")
    world.cluster.create(_pod("mi300x", ns, gpus=8, product=MI300X))
    world.cluster.create(_pod("too-big", ns, gpus=16))
    world.cluster.create(_pod("mi250", ns, gpus=4, product="AMD_Instinct_MI250"))

    placed = world.cluster.wait_for(
        lambda: _get_pod(world, ns, "mi300x")["status"].get("podIP") and _get_pod(world, ns, "mi300x"),
        30,
        "the MI300X pod to be bound and running",
    )
    assert placed["spec"]["nodeName"].startswith("gpu-mi300x-")
    assert placed["status"]["phase"] == "Running" and _condition(placed, "Ready")["status"] == "True"
    assert placed["status"]["podIP"].startswith("127.40.")  # loopback: nothing ever leaves this machine
    mi250 = world.cluster.wait_for(lambda: _get_pod(world, ns, "mi250")["spec"].get("nodeName"), 30, "MI250 pod")
    assert mi250 == "gpu-mi250-0"

    unschedulable = world.cluster.wait_for(
        lambda: (
            _condition(_get_pod(world, ns, "too-big"), "PodScheduled").get("reason") == "Unschedulable"
            and _condition(_get_pod(world, ns, "too-big"), "PodScheduled")
        ),
        30,
        "the scheduler's verdict",
    )
    assert unschedulable["message"].startswith(f"0/{len(world.nodes)} nodes are available:"), unschedulable
    assert f"Insufficient {GPU_RESOURCE}" in unschedulable["message"]


# ---- kwok behaviours ----------------------------------------------------------------------


def test_kwok_behaviours_on_live_pods_and_per_namespace_scripts(world: World, scope: Scope) -> None:
    ns = scope.namespace("kwok")
    cluster = world.cluster
    # A script chosen before the pods exist: this namespace's "pull-*" pods fail to pull.
    kwok.script(cluster, ns, "image-pull-error", labels={"app": "pull"})
    cluster.create(
        {**_pod("never-pulls", ns), "metadata": {"name": "never-pulls", "namespace": ns, "labels": {"app": "pull"}}}
    )
    cluster.create(_pod("job-like", ns, restartPolicy="Never"))
    cluster.create(_pod("server", ns))

    def waiting_reason(name: str) -> str | None:
        statuses = _get_pod(world, ns, name)["status"].get("containerStatuses") or [{}]
        return (statuses[0].get("state") or {}).get("waiting", {}).get("reason")

    cluster.wait_for(lambda: waiting_reason("never-pulls") == "ImagePullBackOff", 30, "ImagePullBackOff")
    pulled = _get_pod(world, ns, "never-pulls")
    assert pulled["status"]["phase"] == "Pending"
    assert (
        'Back-off pulling image "rocm/pytorch:latest"'
        in pulled["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    )

    for name in ("job-like", "server"):
        cluster.wait_for(lambda n=name: _condition(_get_pod(world, ns, n), "Ready").get("status") == "True", 30, name)
    # By default a pod runs until a test says otherwise.
    kwok.set_behaviour(cluster, _get_pod(world, ns, "job-like"), "exit", exit_code=3)
    failed = cluster.wait_for(
        lambda: _get_pod(world, ns, "job-like")["status"]["phase"] == "Failed" and _get_pod(world, ns, "job-like"),
        30,
        "the pod to fail",
    )
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3

    kwok.set_behaviour(cluster, _get_pod(world, ns, "server"), "crash-loop")
    cluster.wait_for(lambda: waiting_reason("server") == "CrashLoopBackOff", 30, "CrashLoopBackOff")
    crashed = _get_pod(world, ns, "server")
    assert _condition(crashed, "Ready")["status"] == "False"
    assert crashed["status"]["containerStatuses"][0]["restartCount"] == 1
    # The cause goes away.
    kwok.set_behaviour(cluster, crashed, "running")
    cluster.wait_for(lambda: _condition(_get_pod(world, ns, "server"), "Ready").get("status") == "True", 30, "recovery")
    assert _get_pod(world, ns, "server")["status"]["containerStatuses"][0]["restartCount"] == 1


# ---- KubeRay -------------------------------------------------------------------------------


def test_kuberay_runs_a_rendered_rayjob_on_the_gpu_nodes_it_asks_for(world: World, scope: Scope) -> None:
    ns = scope.namespace("kuberay")
    cluster = world.cluster
    rayjob = _rayjob(ns, "bert", resources={"workers": 2, "gpusPerWorker": 8, "gpu": {"productName": MI300X}})
    # One submission attempt (KubeRay's default is 3, spaced by the Job controller's back-off).
    rayjob["spec"]["submitterConfig"] = {"backoffLimit": 0}
    name = rayjob["metadata"]["name"]
    cluster.create(rayjob)

    raycluster = cluster.wait_for(lambda: kuberay.raycluster(cluster, ns, name), 60, "KubeRay's RayCluster")
    cluster_name = raycluster["metadata"]["name"]
    cluster.wait_for(
        lambda: (kuberay.raycluster(cluster, ns, name) or {}).get("status", {}).get("state") == "ready",
        60,
        "the RayCluster to be ready (its pods scheduled and running)",
    )
    workers = kuberay.ray_pods(cluster, ns, cluster_name, "worker")
    assert len(workers) == 2
    assert {w["spec"]["nodeName"] for w in workers} == {"gpu-mi300x-0", "gpu-mi300x-1"}  # 8 GPUs each: one per node
    assert kuberay.ray_pods(cluster, ns, cluster_name, "head")[0]["status"]["phase"] == "Running"

    # K8sJobMode: KubeRay starts the submitter Job; its pod runs until the test ends it.
    submitter = cluster.wait_for(lambda: kuberay.submitter_pods(cluster, ns, name), 60, "the submitter pod")[0]
    cluster.wait_for(
        lambda: kuberay.rayjob(cluster, ns, name)["status"].get("jobDeploymentStatus") == "Running", 30, "Running"
    )
    cluster.wait_for(
        lambda: kuberay.submitter_pods(cluster, ns, name)[0]["status"].get("podIP"), 30, "submitter running"
    )
    # Meanwhile KubeRay polls the head's dashboard by its DNS name: the lookup may only reach
    # the sandbox's resolver address, where nothing answers (no Ray runs here).
    cluster.wait_for(
        lambda: any(
            f"{ns}.svc.cluster.local" in line and f"{RESOLVER}:53" in line
            for line in world.kuberay.log.read_text(errors="replace").splitlines()
        ),
        30,
        "KubeRay's failed dashboard lookup",
    )
    kwok.set_behaviour(cluster, submitter, "exit", exit_code=1)
    status = cluster.wait_for(
        lambda: (
            kuberay.rayjob(cluster, ns, name)["status"].get("jobDeploymentStatus") == "Failed"
            and kuberay.rayjob(cluster, ns, name)["status"]
        ),
        60,
        "KubeRay to report the failed submission",
    )
    assert status["reason"] == "SubmissionFailed", status
    assert "BackoffLimitExceeded" in status["message"]


def test_kuberay_restarts_and_picks_up_new_rayjobs(world: World, scope: Scope) -> None:
    ns = scope.namespace("restart")
    before = world.kuberay.pid
    world.kuberay.restart()
    assert world.kuberay.pid != before and world.kuberay.running()
    rayjob = _rayjob(
        ns, "after", resources={"workers": 1, "gpusPerWorker": 4, "gpu": {"productName": "AMD_Instinct_MI250"}}
    )
    world.cluster.create(rayjob)
    made = world.cluster.wait_for(lambda: kuberay.raycluster(world.cluster, ns, "after"), 60, "a RayCluster")
    worker = world.cluster.wait_for(
        lambda: [
            p
            for p in kuberay.ray_pods(world.cluster, ns, made["metadata"]["name"], "worker")
            if p["spec"].get("nodeName")
        ],
        60,
        "the worker to be bound",
    )[0]
    assert worker["spec"]["nodeName"] == "gpu-mi250-0"


# ---- Kueue ---------------------------------------------------------------------------------


def _gpu_pool(scope: Scope, ns: str, gpus: int) -> str:
    """A MI300X flavor, a ClusterQueue with ``gpus`` GPUs of it, and a LocalQueue ``gpus`` in ``ns``."""
    suffix = ns.rsplit("-", 1)[-1]
    flavor, queue = f"mi300x-{suffix}", f"pool-{suffix}"
    scope.apply(
        kueue.resource_flavor(flavor, {PRODUCT_LABEL: MI300X}),
        kueue.cluster_queue(queue, {flavor: {"cpu": 1000, "memory": "8Ti", GPU_RESOURCE: gpus}}),
        kueue.local_queue(ns, "gpus", queue),
    )
    return flavor


def test_kueue_admits_queued_rayjobs_within_quota(world: World, scope: Scope) -> None:
    ns = scope.namespace("kueue")
    cluster = world.cluster
    flavor = _gpu_pool(scope, ns, gpus=16)
    made = {name: cluster.create(_rayjob(ns, name, scheduling={"queueName": "gpus"})) for name in ("one", "two")}
    assert all(rayjob["spec"]["suspend"] for rayjob in made.values())

    def unsuspended() -> list[dict[str, Any]]:
        return [r for name in made if not (r := kuberay.rayjob(cluster, ns, name))["spec"].get("suspend")]

    # 16 GPUs of quota, 16 asked by each: Kueue admits (unsuspends) one of them.
    (admitted,) = cluster.wait_for(unsuspended, 60, "Kueue to admit one RayJob")
    # Admission to the flavor pins the pods to its nodes.
    worker_spec = admitted["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker_spec["nodeSelector"] == {PRODUCT_LABEL: MI300X}
    (workload,) = kueue.workloads(cluster, ns, admitted["metadata"]["uid"])
    assert _condition(workload, "Admitted")["status"] == "True"
    assignments = workload["status"]["admission"]["podSetAssignments"]
    assert {a["flavors"][GPU_RESOURCE] for a in assignments if GPU_RESOURCE in a["flavors"]} == {flavor}

    # The other waits, and Kueue says what is missing in which flavor.
    (waiting,) = (r for name, r in made.items() if name != admitted["metadata"]["name"])
    pending = cluster.wait_for(
        lambda: (
            (found := kueue.workloads(cluster, ns, waiting["metadata"]["uid"]))
            and _condition(found[0], "QuotaReserved").get("message")
        ),
        60,
        "the waiting Workload's reason",
    )
    assert f"insufficient unused quota for {GPU_RESOURCE} in flavor {flavor}" in pending, pending
    assert len(unsuspended()) == 1


def test_kueue_webhooks_mutate_and_refuse(world: World, scope: Scope) -> None:
    ns = scope.namespace("webhook")
    _gpu_pool(scope, ns, gpus=8)
    rayjob = _rayjob(ns, "hook", scheduling={"queueName": "gpus"})
    # Kueue's mutating webhook suspends a queued RayJob created running. (Its Go types write
    # `rayStartParams: null` for a group without them when it patches, which the CRD refuses.)
    unsuspended = copy.deepcopy(rayjob)
    unsuspended["spec"]["suspend"] = False
    unsuspended["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["rayStartParams"] = {}
    assert world.cluster.create(unsuspended, dry_run=True)["spec"]["suspend"] is True

    kept = copy.deepcopy(rayjob)
    kept["spec"]["shutdownAfterJobFinishes"] = False
    with pytest.raises(ApiException) as refused:
        world.cluster.create(kept)
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert 'admission webhook "vrayjob.kb.io" denied the request' in message
    assert "a kueue managed job should delete the cluster after finishing" in message


def test_kueue_certificates_are_the_harness_ones(world: World) -> None:
    """Kueue's rotator kept the harness's certificate (valid for 127.0.0.1) and injected its CA."""
    hook = world.cluster.request(
        "GET",
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/kueue-validating-webhook-configuration",
    )["webhooks"][0]["clientConfig"]
    assert hook["url"].startswith("https://127.0.0.1:")
    secret = world.cluster.request("GET", "/api/v1/namespaces/kueue-system/secrets/kueue-webhook-server-cert")["data"]
    assert secret["ca.crt"] == hook["caBundle"]
    log = world.kueue.log.read_text(errors="replace")
    assert "no cert refresh needed" in log and "server certs refreshed" not in log
