"""`rocmtrain pool`, `status` and `plot` against the real control plane.

Real: kube-apiserver with our CRD and Kueue's CRDs (v0.17.0), Nodes, Pods bound to nodes, events.
Faked: the AMD GPUs (nodes advertise `amd.com/gpu` and AMD's node-labeller labels; no kubelet
runs, so bound pods stay Pending, which the scheduler counts as holding their GPUs), and
Kueue's controller (the test writes ClusterQueue and Workload status as Kueue does).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_testkit import job_manifest
from PIL import Image

from cluster.kubecluster import AMD_MI300X_LABELS, KubeCluster
from rocmtrain import cluster_cli
from views import kueue

pytestmark = pytest.mark.cluster

MI250_LABELS = {
    "amd.com/gpu.product-name": "AMD_Instinct_MI250X_MI250",
    "amd.com/gpu.family": "AI",
    "amd.com/gpu.vram": "64G",
}
JOBS = "/apis/rocmtrain.dev/v1alpha1/namespaces/{ns}/rocmtrainingjobs"


def add_node(kube: KubeCluster, name: str, labels: dict[str, str], gpus: int) -> None:
    """A Ready node with `gpus` allocatable AMD GPUs (none: a CPU node)."""
    kube.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", **({"amd.com/gpu": str(gpus)} if gpus else {})}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    kube.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        body={"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}},
        content_type="application/strategic-merge-patch+json",
    )


def gpu_pod(namespace: str, name: str, gpus: int, node: str | None, job: str | None = None) -> dict[str, Any]:
    labels = {"rocmtrain.dev/job-name": job, "ray.io/node-type": "worker"} if job else {}
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "w",
                "image": "ghcr.io/rocm-train-operator/training:0.1.0",
                "resources": {"limits": {"amd.com/gpu": str(gpus)}},
            }
        ]
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def job(namespace: str, name: str, workers: int, gpus: int) -> dict[str, Any]:
    return job_manifest(name, namespace, resources={"workers": workers, "gpusPerWorker": gpus})


def set_status(kube: KubeCluster, namespace: str, name: str, status: dict[str, Any]) -> None:
    path = JOBS.format(ns=namespace) + f"/{name}/status"
    kube.request("PATCH", path, body={"status": status}, content_type="application/merge-patch+json")


@pytest.fixture
def pool_nodes(kube: KubeCluster) -> Iterator[None]:
    add_node(kube, "pool-mi250-0", {"kubernetes.io/hostname": "pool-mi250-0", **MI250_LABELS}, 4)
    add_node(kube, "pool-cpu-0", {"kubernetes.io/hostname": "pool-cpu-0"}, 0)
    try:
        yield
    finally:
        for name in ("pool-mi250-0", "pool-cpu-0"):
            kube.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


def run(capsys: pytest.CaptureFixture[str], command: Any, *argv: str) -> tuple[int, str, str]:
    code = command(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def kueue_installed(kube: KubeCluster) -> bool:
    groups = kube.request("GET", "/apis")["groups"]
    return any(g["name"] == "kueue.x-k8s.io" for g in groups)


def test_pool_per_gpu_model_with_holders_and_kueue_queues(
    kube: KubeCluster, pool_nodes: None, capsys: pytest.CaptureFixture[str]
):
    config = str(kube.kubeconfig)
    ns = kube.new_namespace("pool")
    kube.create(job(ns, "bert", 1, 8))
    set_status(kube, ns, "bert", {"phase": "Running"})
    kube.create(job(ns, "small", 1, 2))
    kube.create(gpu_pod(ns, "bert-workers-abc", 8, "fake-mi300x-0", job="bert"))
    kube.create(gpu_pod(ns, "small-workers-def", 2, "pool-mi250-0", job="small"))
    kube.create(gpu_pod(ns, "notebook", 2, "fake-mi300x-1"))
    kube.create(gpu_pod(ns, "waiting-workers-ghi", 8, None, job="waiting"))

    if not kueue_installed(kube):
        code, out, _ = run(capsys, cluster_cli.pool, "--kubeconfig", config)
        assert code == 0 and "Kueue is not installed." in out
        kube.install_crds(kueue.crd_paths())

    cq = kube.create(kueue.cluster_queue(f"{ns}-mi300x", "ml", "mi300x", quota=16, borrowing=8))
    kube.request(
        "PATCH",
        f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{cq['metadata']['name']}/status",
        body={
            "status": {
                "flavorsUsage": [
                    {"name": "mi300x", "resources": [{"name": "amd.com/gpu", "total": "12", "borrowed": "0"}]}
                ],
                "pendingWorkloads": 1,
                "admittedWorkloads": 1,
            }
        },
        content_type="application/merge-patch+json",
    )
    kube.create(
        {
            "apiVersion": kueue.API,
            "kind": "LocalQueue",
            "metadata": {"name": "team-a", "namespace": ns},
            "spec": {"clusterQueue": cq["metadata"]["name"]},
        }
    )
    kube.create(kueue.workload(ns, "rayjob-waiting", "team-a", 8))

    code, out, err = run(capsys, cluster_cli.pool, "-o", "json", "--kubeconfig", config)
    assert (code, err) == (0, "")
    view = json.loads(out)
    models = {m["model"]: m for m in view["models"]}
    mi250 = models["AMD_Instinct_MI250X_MI250"]
    assert (mi250["nodes"], mi250["allocatable"], mi250["requested"], mi250["free"]) == (1, 4, 2, 2)
    assert mi250["holders"] == [{"namespace": ns, "name": "small", "kind": "RocmTrainingJob", "gpus": 2, "phase": None}]
    mi300x = models[AMD_MI300X_LABELS["amd.com/gpu.product-name"]]
    assert mi300x["allocatable"] >= 16 and mi300x["free"] == mi300x["allocatable"] - mi300x["requested"]
    ours = [h for h in mi300x["holders"] if h["namespace"] == ns]
    assert ours == [
        {"namespace": ns, "name": "bert", "kind": "RocmTrainingJob", "gpus": 8, "phase": "Running"},
        {"namespace": ns, "name": "notebook", "kind": "Pod", "gpus": 2, "phase": None},
    ]
    assert {"namespace": ns, "name": "waiting", "kind": "RocmTrainingJob", "gpus": 8, "phase": None} in view["unbound"]
    assert not any(m["model"] == "(no product-name label)" for m in view["models"])  # the CPU node is not a GPU model
    (queue,) = [q for q in view["kueue"] if q["name"] == f"{ns}-mi300x"]
    assert queue["cohort"] == "ml" and queue["local_queues"] == [f"{ns}/team-a"]
    assert queue["quotas"] == [
        {
            "flavor": "mi300x",
            "resource": "amd.com/gpu",
            "nominal": "16",
            "borrowing_limit": "8",
            "lending_limit": None,
            "usage": "12",
            "borrowed": "0",
        }
    ]
    assert (queue["pending_workloads"], queue["admitted_workloads"]) == (1, 1)
    assert queue["pending"] == [f"{ns}/rayjob-waiting"]

    code, table, _ = run(capsys, cluster_cli.pool, "--kubeconfig", config)
    assert code == 0
    assert "AMD_Instinct_MI250X_MI250" in table and "CLUSTERQUEUE" in table and f"{ns}/rayjob-waiting" in table


def test_status_shows_one_job_on_one_screen(kube: KubeCluster, capsys: pytest.CaptureFixture[str]):
    ns = kube.new_namespace("status")
    created = kube.create(job(ns, "bert", 2, 8))
    kube.create(gpu_pod(ns, "bert-workers-abc", 8, "fake-mi300x-0", job="bert"))
    set_status(
        kube,
        ns,
        "bert",
        {
            "phase": "Running",
            "observedGeneration": 1,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Running",
                    "message": "Ray job bert-x1 is running (2/2 workers ready)",
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                }
            ],
            "progress": {"step": 50, "totalSteps": 200, "percent": 25.0, "epoch": 0.5, "etaSeconds": 750.0},
            "metrics": {"trainLoss": 0.4321, "evalAccuracy": 0.875, "samplesPerSecond": 512.5},
            "gpus": 16,
            "gpusHeld": 16,
            "gpuSeconds": 7200.0,
            "accountedUntil": "2026-01-02T03:04:05Z",
            "cost": {"amount": 6.4, "currency": "EUR"},
        },
    )
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": "bert.", "namespace": ns},
            "involvedObject": {
                "apiVersion": "rocmtrain.dev/v1alpha1",
                "kind": "RocmTrainingJob",
                "name": "bert",
                "namespace": ns,
                "uid": created["metadata"]["uid"],
            },
            "type": "Normal",
            "reason": "Running",
            "message": "Initializing → Running",
            "lastTimestamp": "2026-01-02T03:04:05Z",
            "firstTimestamp": "2026-01-02T03:04:05Z",
            "count": 1,
            "source": {"component": "rocm-train-operator"},
        }
    )
    code, out, err = run(capsys, cluster_cli.status, f"{ns}/bert", "--kubeconfig", str(kube.kubeconfig))
    assert (code, err) == (0, "")
    assert out.startswith(f"{ns}/bert   Running   Ray job bert-x1 is running (2/2 workers ready)")
    assert "[########----------------------]  25%  step 50/200  epoch 0.50  ETA 12m30s" in out
    assert "train loss 0.4321" in out and "eval accuracy 0.8750" in out and "samples/s 512.5" in out
    assert "16 requested (2 workers x 8), 16 held" in out and "cost 6.40 EUR" in out
    assert "bert-workers-abc" in out and "AMD_Instinct_MI300X_OAM" in out  # the pod, its node's GPU model
    assert "Initializing → Running" in out
    code, _, err = run(capsys, cluster_cli.status, "missing", "-n", ns, "--kubeconfig", str(kube.kubeconfig))
    assert code == 1 and f"no RocmTrainingJob {ns}/missing" in err


def test_plot_draws_the_curves_of_a_cluster_job(kube: KubeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    ns = kube.new_namespace("plot")
    kube.create(job(ns, "bert", 1, 8))
    history = [{"step": s, "trainLoss": 1.0 / (1 + s / 10)} for s in range(0, 100, 10)]
    history += [{"step": 50, "evalLoss": 0.5, "evalAccuracy": 0.8}, {"step": 100, "evalLoss": 0.3, "evalAccuracy": 0.9}]
    history.sort(key=lambda p: p["step"])
    set_status(kube, ns, "bert", {"history": history})
    out_png = tmp_path / "curves.png"
    code, out, err = run(
        capsys, cluster_cli.plot, "bert", "-n", ns, "-o", str(out_png), "--kubeconfig", str(kube.kubeconfig)
    )
    assert (code, err, out) == (0, "", f"wrote {out_png}\n")
    with Image.open(out_png) as image:
        assert image.format == "PNG" and image.size[0] > 800
    kube.create(job(ns, "fresh", 1, 8))
    code, _, err = run(
        capsys, cluster_cli.plot, "fresh", "-n", ns, "-o", str(tmp_path / "x.png"), "--kubeconfig", str(kube.kubeconfig)
    )
    assert code == 1 and "no loss or accuracy recorded yet" in err
