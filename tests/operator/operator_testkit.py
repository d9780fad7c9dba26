"""Helpers for the operator's tests: the admin's view of jobs and RayJobs, a KubeRay
status writer for the lean cluster, and the operator under KopfRunner.

No KubeRay controller runs in the lean cluster: `Api.fake_kuberay` writes RayJob
status the way KubeRay v1.5.1 does, for the states that need a running Ray.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain_testworld import rocmtrain_operator
from rocmtrain_testworld.gotools import go_tool
from rocmtrain_testworld.kubecluster import KubeCluster, free_port
from rocmtrain_testworld.processes import healthz_ok
from rocmtrain_testworld.rocmtrain_operator import kustomize

REPO = Path(__file__).resolve().parents[2]
OPERATOR_NAMESPACE, OPERATOR_SA = rocmtrain_operator.NAMESPACE, rocmtrain_operator.ACCOUNT
JOBS = "/apis/rocmtrain.dev/v1alpha1/namespaces/{ns}/rocmtrainingjobs"
RAYJOBS = "/apis/ray.io/v1/namespaces/{ns}/rayjobs"
STALL_SECONDS = 3
RETRY_SECONDS = 1
# Seconds for what KubeRay, the scheduler and kwok do in a few seconds on an idle machine.
WORLD_TIMEOUT = 60
# A RayJob as an older operator version rendered it (the upgrade tests): another head image, another entrypoint.
OLDER_IMAGE = "ghcr.io/rocm-train-operator/training:0.0.9"
OLDER_ENTRYPOINT = "python -m rocmtrain_train.driver_of_an_older_version"
# Kinds that are applied for real; the Deployment and Service only as a server-side dry run (no kubelet).
APPLIED_KINDS = {
    "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
    "CustomResourceDefinition",
}  # fmt: skip

# KubeRay's status writes for a RayJob whose Ray job starts (each with the job's phase it gives), and then succeeds:
# written by hand on the lean cluster (`Api.fake_kuberay`), as Ray's job states need a running Ray.
_NOW = "2026-01-02T03:04:05Z"
_UP = {"readyWorkerReplicas": 2, "desiredWorkerReplicas": 2, "availableWorkerReplicas": 2, "state": "ready"}
RUNNING_STEPS: list[tuple[dict[str, Any], str]] = [
    (
        {
            "jobDeploymentStatus": "Initializing",
            "jobStatus": "",
            "jobId": "bert-x1",
            "rayClusterName": "bert-abcde",
            "startTime": _NOW,
        },
        "Initializing",
    ),
    (
        {"jobDeploymentStatus": "Running", "rayClusterStatus": _UP, "dashboardURL": "bert-head-svc.ns.svc:8265"},
        "Initializing",
    ),
    ({"jobStatus": "RUNNING"}, "Running"),
]
SUCCEEDED_STEP: tuple[dict[str, Any], str] = (
    {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "endTime": _NOW, "succeeded": 1, "failed": 0},
    "Succeeded",
)


def wait_until(check: Callable[[], Any], timeout: float = 2.0, what: str = "condition", interval: float = 0.02) -> Any:
    """Poll `check` until it returns something truthy; return that, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}; last value: {value!r}")
        time.sleep(interval)


def not_in(small: Any, big: Any, path: str = "") -> list[str]:
    """The paths of `small` that `big` does not hold, field by field (the API server adds defaults to what was
    sent): none when `small` is contained in `big`."""
    if isinstance(small, dict) and isinstance(big, dict):
        return [found for k, v in small.items() for found in not_in(v, big.get(k), f"{path}.{k}")]
    if isinstance(small, list) and isinstance(big, list) and len(small) == len(big):
        return [
            found for i, (a, b) in enumerate(zip(small, big, strict=True)) for found in not_in(a, b, f"{path}[{i}]")
        ]
    return [] if small == big else [f"{path}: {small!r}, not {big!r}"]


def job_manifest(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """A small valid job (two 8-GPU workers, checkpoints in an object store) with `spec` overrides."""
    base: dict[str, Any] = {
        "model": {"source": "distilbert/distilbert-base-uncased", "numLabels": 2},
        "data": {"train": {"uri": "s3://datasets/reviews/train.jsonl"}},
        "resources": {"workers": 2, "gpusPerWorker": 8},
        "checkpoint": {"storagePath": f"s3://checkpoints/{namespace}/{name}"},
    }
    return {
        "apiVersion": "rocmtrain.dev/v1alpha1",
        "kind": "RocmTrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {**base, **spec},
    }


class Api:
    """The few reads and writes the tests make, as the cluster admin."""

    def __init__(self, kube: KubeCluster) -> None:
        self.kube = kube

    def job(self, ns: str, name: str) -> dict[str, Any] | None:
        return self._get(JOBS.format(ns=ns) + f"/{name}")

    def rayjob(self, ns: str, name: str) -> dict[str, Any] | None:
        return self._get(RAYJOBS.format(ns=ns) + f"/{name}")

    def _get(self, path: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.kube.request("GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create_job(self, ns: str, name: str, *, timeout: float = 10, **spec: Any) -> dict[str, Any]:
        """Create a job (`job_manifest` with `spec`) and wait for its RayJob; the RayJob."""
        self.kube.create(job_manifest(name, ns, **spec))
        return wait_until(lambda: self.rayjob(ns, name), timeout=timeout, what=f"RayJob {ns}/{name}")

    def status(self, ns: str, name: str) -> dict[str, Any]:
        return (self.job(ns, name) or {}).get("status") or {}

    def wait_status(
        self, ns: str, name: str, what: str, check: Callable[[dict[str, Any]], Any], timeout: float = WORLD_TIMEOUT
    ) -> dict[str, Any]:
        """Wait until `check(status)` holds for job `name`; its status."""
        return wait_until(lambda: check(s := self.status(ns, name)) and s, timeout=timeout, what=f"{ns}/{name}: {what}")

    def phase(self, ns: str, name: str) -> str | None:
        return self.status(ns, name).get("phase")

    def condition(self, ns: str, name: str, kind: str) -> dict[str, Any]:
        job = self.job(ns, name) or {}
        return next((c for c in (job.get("status") or {}).get("conditions", []) if c["type"] == kind), {})

    def events(self, ns: str, name: str) -> list[tuple[str, str]]:
        """(type, reason) of the events on job `name`, oldest first."""
        return [(type_, reason) for type_, reason, _ in self.event_messages(ns, name)]

    def event_messages(self, ns: str, name: str) -> list[tuple[str, str, str]]:
        """(type, reason, message) of the events on job `name`, oldest first."""
        items = self.kube.request(
            "GET", f"/api/v1/namespaces/{ns}/events", query={"fieldSelector": f"involvedObject.name={name}"}
        )["items"]
        items = [e for e in items if e["involvedObject"]["kind"] == "RocmTrainingJob"]
        items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))  # creation order
        return [(e["type"], e["reason"], e.get("message", "")) for e in items]

    def patch_job(self, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.kube.request(
            "PATCH", JOBS.format(ns=ns) + f"/{name}", body=patch, content_type="application/merge-patch+json"
        )

    def fake_kuberay(self, ns: str, name: str, status: dict[str, Any]) -> None:
        """Write RayJob status as the KubeRay controller does: on the status subresource, as its field manager."""
        self.kube.request(
            "PATCH",
            RAYJOBS.format(ns=ns) + f"/{name}/status",
            body={"status": status},
            content_type="application/merge-patch+json",
            query={"fieldManager": "kuberay-operator"},
        )


class Operator:
    """The operator under KopfRunner, restartable; `env`: more (or other) `ROCMTRAIN_*` variables."""

    def __init__(self, kubeconfig: Path, env: dict[str, str] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.extra_env = dict(env or {})
        self.metrics_port = free_port()
        self.health_port = free_port()
        self._runner: KopfRunner | None = None
        self._saved: dict[str, str | None] = {}

    def start(self) -> None:
        env = {
            "KUBECONFIG": str(self.kubeconfig),
            "ROCMTRAIN_STALL_SECONDS": str(STALL_SECONDS),
            "ROCMTRAIN_QUEUE_ESTIMATE_SECONDS": "1",
            "ROCMTRAIN_RETRY_SECONDS": str(RETRY_SECONDS),
            "ROCMTRAIN_METRICS_PORT": str(self.metrics_port),
            "ROCMTRAIN_NAMESPACES": "",
            **self.extra_env,
        }
        self._saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        args = ["run", "--standalone", "--all-namespaces", "-m", "rocmtrain.controller.handlers"]
        args.append(f"--liveness=http://127.0.0.1:{self.health_port}/healthz")
        self._runner = KopfRunner(args, timeout=60)
        self._runner.__enter__()
        wait_until(self.healthy, timeout=30, what="the operator's liveness endpoint")

    def healthy(self) -> bool:
        return healthz_ok(self.health_port)

    def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        try:
            runner.__exit__(None, None, None)  # re-raises what the operator died of
        finally:
            for key, value in self._saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


# ---- the world ---------------------------------------------------------------------------------

# Resources of a job that fits any world node and takes no GPU, for what does not depend on GPUs.
SMALL = {
    "workers": 1,
    "gpusPerWorker": 0,
    "cpusPerWorker": "500m",
    "memoryPerWorker": "1Gi",
    "sharedMemory": "256Mi",
    "head": {"cpu": "500m", "memory": "1Gi"},
}


def submitting(status: dict[str, Any]) -> bool:
    """KubeRay made the Ray cluster and started the submitter: `Initializing`, reason `Submitting`.

    No Ray runs in the world, so KubeRay's RayJob is `Running` without a Ray job status
    until the submitter pod ends.
    """
    ready = next((c for c in status.get("conditions") or [] if c["type"] == ConditionType.READY), {})
    return status.get("phase") == "Initializing" and ready.get("reason") == Reason.SUBMITTING


def kustomize_build(folder: Path) -> list[dict[str, Any]]:
    """`kustomize build folder`, as objects (YAML 1.2 numbers, `5e-05`, as kubectl reads them)."""
    go_tool("kustomize")  # skips, or fails under CI, when it is not built
    return kustomize(folder)


def head_container(cluster_spec: dict[str, Any]) -> dict[str, Any]:
    """The Ray head's container in a RayJob's `rayClusterSpec` or a RayCluster's spec."""
    return dict(cluster_spec["headGroupSpec"]["template"]["spec"]["containers"][0])
