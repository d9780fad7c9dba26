"""`rocmtrain pool`, `status` and `plot` against real clusters.

`pool` runs in the world (rocmtrain_testworld/world.py): kube-scheduler binds the Ray pods KubeRay makes,
Kueue admits RayJobs against a ClusterQueue's quota, kwok runs the nodes (2 x MI300X, 1 x MI250, 1 CPU)
and the pods; faked there: the GPUs and the containers. `status` and `plot` run on the lean control
plane, where the test writes the job's status and events as the operator would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from operator_testkit import job_manifest
from PIL import Image

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.cli import cluster as cluster_cli
from rocmtrain.render import render_rayjob
from rocmtrain_testworld import kuberay, kueue
from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.nodes import GPU_RESOURCE, MI250_LABELS, MI300X_LABELS, PRODUCT_LABEL
from rocmtrain_testworld.world import Scope, World

pytestmark = pytest.mark.cluster

JOBS = "/apis/rocmtrain.dev/v1alpha1/namespaces/{ns}/rocmtrainingjobs"
MI300X, MI250 = MI300X_LABELS[PRODUCT_LABEL], MI250_LABELS[PRODUCT_LABEL]


def job(namespace: str, name: str, workers: int, gpus: int, **spec: Any) -> dict[str, Any]:
    return job_manifest(name, namespace, resources={"workers": workers, "gpusPerWorker": gpus}, **spec)


def set_status(kube: KubeCluster, namespace: str, name: str, status: dict[str, Any]) -> None:
    path = JOBS.format(ns=namespace) + f"/{name}/status"
    kube.request("PATCH", path, body={"status": status}, content_type="application/merge-patch+json")


def run(capsys: pytest.CaptureFixture[str], command: Any, *argv: str) -> tuple[int, str, str]:
    code = command(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def gpu_pod(
    namespace: str, name: str, gpus: int, job_name: str, *, product: str | None = None, node: str | None = None
) -> dict[str, Any]:
    """A pod of `job_name` asking for `gpus`: for the scheduler (`product`), or bound to `node` (no scheduler)."""
    resources = {"cpu": "1", "memory": "1Gi", GPU_RESOURCE: str(gpus)}
    container = {"name": "main", "image": "rocm/pytorch:latest", "resources": {"limits": resources}}
    spec: dict[str, Any] = {"containers": [container]}
    if product:
        spec["nodeSelector"] = {PRODUCT_LABEL: product}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"rocmtrain.dev/job-name": job_name}},
        "spec": spec,
    }


def test_pool_per_gpu_model_with_holders_and_real_kueue(world: World, scope: Scope, capsys: pytest.CaptureFixture[str]):
    cluster = world.cluster
    ns = scope.namespace("pool")
    suffix = ns.rsplit("-", 1)[-1]
    flavor, queue = f"mi300x-{suffix}", f"pool-{suffix}"
    scope.apply(
        kueue.resource_flavor(flavor, {PRODUCT_LABEL: MI300X}),
        kueue.cluster_queue(queue, {flavor: {"cpu": 1000, "memory": "8Ti", GPU_RESOURCE: 16}}, cohort="ml"),
        kueue.local_queue(ns, "gpus", queue),
    )
    rayjobs = {}
    for name in ("first", "second"):  # 16 GPUs each, 16 of quota: Kueue admits one
        manifest = job(ns, name, 2, 8, scheduling={"queueName": "gpus"})
        cluster.create(manifest)
        rayjobs[name] = cluster.create(render_rayjob(RocmTrainingJob.model_validate(manifest)))
    cluster.create(gpu_pod(ns, "small-worker", 2, "small", product=MI250))

    def admitted() -> str | None:
        running = [n for n in rayjobs if not (kuberay.rayjob(cluster, ns, n) or {})["spec"].get("suspend")]
        if len(running) != 1:
            return None
        pods = cluster.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        bound = [
            p for p in pods if p["spec"].get("nodeName") and p["metadata"]["labels"].get("ray.io/node-type") == "worker"
        ]
        return running[0] if len(bound) == 2 else None

    first = cluster.wait_for(admitted, 90, "Kueue to admit one RayJob and its two workers to be bound")
    waiting = next(n for n in rayjobs if n != first)
    set_status(cluster, ns, first, {"phase": "Running"})
    cluster.wait_for(
        lambda: (kueue.workloads(cluster, ns, rayjobs[waiting]["metadata"]["uid"]) or [None])[0] is not None,
        60,
        "the waiting RayJob's Workload",
    )

    def usage_reported() -> bool:  # Kueue writes the ClusterQueue's usage a moment after it admits
        cq = cluster.request("GET", f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{queue}")
        used = [
            r.get("total")
            for f in (cq.get("status") or {}).get("flavorsUsage") or []
            for r in f.get("resources") or []
            if r.get("name") == GPU_RESOURCE
        ]
        return used == ["16"]

    cluster.wait_for(usage_reported, 60, "the ClusterQueue's usage of the admitted job")
    code, out, err = run(capsys, cluster_cli.pool, "-o", "json", "--kubeconfig", str(cluster.kubeconfig))
    assert (code, err) == (0, "")
    view = json.loads(out)
    models = {m["model"]: m for m in view["models"]}
    assert set(models) == {MI300X, MI250}  # the CPU node is no GPU model
    mi300x, mi250 = models[MI300X], models[MI250]
    assert (mi300x["nodes"], mi300x["allocatable"], mi250["nodes"], mi250["allocatable"]) == (2, 16, 1, 4)
    assert mi300x["free"] == mi300x["allocatable"] - mi300x["requested"]
    assert [h for h in mi300x["holders"] if h["namespace"] == ns] == [
        {"namespace": ns, "name": first, "kind": "RocmTrainingJob", "gpus": 16, "phase": "Running"}
    ]
    assert [h for h in mi250["holders"] if h["namespace"] == ns] == [
        {"namespace": ns, "name": "small", "kind": "RocmTrainingJob", "gpus": 2, "phase": None}
    ]
    (cq,) = [q for q in view["kueue"] if q["name"] == queue]
    assert cq["cohort"] == "ml" and cq["local_queues"] == [f"{ns}/gpus"]
    gpus = next(r for r in cq["quotas"] if r["resource"] == GPU_RESOURCE)
    assert (gpus["flavor"], gpus["nominal"], gpus["usage"], gpus["borrowed"]) == (flavor, "16", "16", "0")
    assert (cq["pending_workloads"], cq["admitted_workloads"]) == (1, 1)
    (pending,) = cq["pending"]
    assert pending.startswith(f"{ns}/rayjob-{waiting}-")

    code, table, _ = run(capsys, cluster_cli.pool, "--kubeconfig", str(cluster.kubeconfig))
    assert code == 0 and MI300X in table and "CLUSTERQUEUE" in table and pending in table


def test_status_shows_one_job_on_one_screen(kube: KubeCluster, capsys: pytest.CaptureFixture[str]):
    ns = kube.new_namespace("status")
    created = kube.create(job(ns, "bert", 2, 8))
    kube.create(gpu_pod(ns, "bert-workers-abc", 8, "bert", node="fake-mi300x-0"))
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
