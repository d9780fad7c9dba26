"""`make demo`: the quick start as a cluster job on the local world, followed to its end.

Brings the world up if it is not (`make cluster-up`: the control plane,
KubeRay, the process runtime and the operator), and its operator if none runs
(one `make run-operator` runs in the foreground is used as it is), then applies
examples/quickstart.yaml as a cluster job: the same model, data and
hyper-parameters, its data copied to an absolute folder that a
PersistentVolume holds (`.cluster/volumes/demo/`), its checkpoints and model
saved there, in the `default` namespace (whose pods the process runtime
runs). It prints the job, then its phase, progress and metrics as the status
changes, and exits 0 once the job has Succeeded (1 if it failed). The world
stays up: look around with the kubeconfig it prints, stop it with
`make cluster-down`.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from rocmtrain.api.manifests import load_documents
from rocmtrain_testworld import kubecluster, rocmtrain_operator
from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.paths import KUBECONFIG_FILE, REPO_ROOT, VOLUMES_DIR

QUICKSTART = REPO_ROOT / "examples" / "quickstart.yaml"
NAMESPACE = "default"
CLAIM = "demo-storage"
JOBS = f"/apis/rocmtrain.dev/v1alpha1/namespaces/{NAMESPACE}/rocmtrainingjobs"
TIMEOUT_SECONDS = 1800
DEMO_DIR = VOLUMES_DIR / "demo"  # removed by `make cluster-down`


def cluster_job(folder: Path, namespace: str = NAMESPACE, claim: str = CLAIM) -> dict[str, Any]:
    """The quick start with its `./` data copied into ``folder`` and its storage on ``claim``, mounted there."""
    (job,) = load_documents(QUICKSTART.read_text())
    data = job["spec"]["data"]
    for part in ("train", "eval"):
        source = QUICKSTART.parent / data[part]["uri"]
        shutil.copy(source, folder / source.name)
        data[part]["uri"] = str(folder / source.name)
    job["metadata"]["namespace"] = namespace
    job["spec"]["checkpoint"] = {"storagePath": str(folder / "runs")}
    job["spec"]["volumes"] = [{"name": "storage", "persistentVolumeClaim": {"claimName": claim}}]
    job["spec"]["volumeMounts"] = [{"name": "storage", "mountPath": str(folder)}]
    return job


def storage(cluster: KubeCluster, folder: Path) -> None:
    """A PersistentVolume at ``folder`` and the claim on it (made again for a clean run)."""
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": CLAIM}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": NAMESPACE}}
    for obj in (pvc, pv):
        cluster.delete(obj)
        cluster.wait_for(lambda o=obj: _absent(cluster, o), 60, f"the old {obj['kind']} to go")
    spec = {"accessModes": ["ReadWriteMany"], "storageClassName": ""}
    cluster.create(
        {**pv, "spec": {**spec, "capacity": {"storage": "1Gi"}, "hostPath": {"path": str(folder), "type": "Directory"}}}
    )
    cluster.create({**pvc, "spec": {**spec, "volumeName": CLAIM, "resources": {"requests": {"storage": "1Gi"}}}})


def _absent(cluster: KubeCluster, obj: dict[str, Any]) -> bool:
    try:
        cluster.request("GET", cluster.path_for(obj))
    except ApiException as exc:
        return exc.status == 404
    return False


def _line(status: dict[str, Any]) -> str:
    progress, metrics = status.get("progress") or {}, status.get("metrics") or {}
    parts = [f"{status.get('phase', '-'):<12}"]
    if progress:
        parts.append(
            f"step {progress.get('step', 0)}/{progress.get('totalSteps', '?')} ({progress.get('percent', 0):.0f}%)"
        )
    for key, label in (("trainLoss", "loss"), ("evalAccuracy", "eval accuracy"), ("samplesPerSecond", "samples/s")):
        if key in metrics:
            parts.append(f"{label} {metrics[key]:.3g}")
    return "  ".join(parts)


def follow(cluster: KubeCluster, name: str) -> dict[str, Any]:
    """Print the job's status whenever it changes; its final status."""
    began, last = time.monotonic(), ""
    while time.monotonic() - began < TIMEOUT_SECONDS:
        status = cluster.request("GET", f"{JOBS}/{name}").get("status") or {}
        if (line := _line(status)) != last:
            print(f"{time.monotonic() - began:6.1f}s  {line}", flush=True)
            last = line
        if status.get("phase") in ("Succeeded", "Failed"):
            return status
        time.sleep(1)
    raise TimeoutError(f"job {name} did not end within {TIMEOUT_SECONDS}s")


def main() -> int:
    kubecluster.up()  # the world and its operator, where either is not running yet
    if not kubecluster.running(rocmtrain_operator.NAME):
        print("error: the world runs no operator (no process runtime here: it needs root)", file=sys.stderr)
        return 1
    cluster = KubeCluster(KUBECONFIG_FILE)
    folder = DEMO_DIR
    (previous,) = load_documents(QUICKSTART.read_text())
    name = previous["metadata"]["name"]
    previous["metadata"]["namespace"] = NAMESPACE
    cluster.delete(previous)  # a clean run: no job, checkpoints or model of an earlier demo
    cluster.wait_for(lambda: _absent(cluster, previous), 120, f"the previous {name} job to go")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    job = cluster_job(folder)
    storage(cluster, folder)
    (folder / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    print(f"applying {folder / 'job.yaml'} (examples/quickstart.yaml as a cluster job):\n")
    print(yaml.safe_dump(job, sort_keys=False))
    applied = time.monotonic()
    cluster.create(job)
    status = follow(cluster, name)
    seconds = time.monotonic() - applied
    print(f"\n{name}: {status['phase']} {seconds:.0f}s after it was applied")
    for key, value in (status.get("metrics") or {}).items():
        print(f"  {key:<24} {value:.4g}" if isinstance(value, float) else f"  {key:<24} {value}")
    failed = next((c for c in status.get("conditions", []) if c["type"] == "Failed"), None)
    if failed:
        print(f"  why: {failed['message'].splitlines()[0]}")
    print(f"\nmodel: {folder / 'runs' / name / 'model'}\nthe world stays up: export KUBECONFIG={KUBECONFIG_FILE}")
    print("stop it with `make cluster-down`")
    return 0 if status["phase"] == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
