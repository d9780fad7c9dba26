"""Helpers for the progress endpoint against the real control plane.

The endpoint runs in-process (an asyncio loop in a thread), with the real
TokenReview, pod authorisation and status patches against the test
kube-apiserver. There is no kubelet and no KubeRay controller: the tests create
what KubeRay would (the job's RayJob when no operator runs, its RayCluster, the Ray
pods with KubeRay's labels and controller references) themselves, and the pods
never run. Tokens bound to them come from the real TokenRequest API.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import threading
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException
from kubernetes_asyncio import config as async_config

from rocmtrain.api.contract import (
    API_VERSION,
    JOB_NAME_LABEL,
    KIND,
    PLURAL,
    PROGRESS_AUDIENCE,
    RAY_CLUSTER_LABEL,
    progress_path,
)
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.progress.auth import RAY_NODE_TYPE_LABEL
from rocmtrain.progress.server import ProgressServer, ProgressServerConfig, start_progress_server
from rocmtrain.render import render_rayjob
from rocmtrain.status.objects import owner_reference
from rocmtrain_testworld.kubecluster import KubeCluster
from rocmtrain_testworld.rocmtrain_operator import ACCOUNT as OPERATOR_SA
from rocmtrain_testworld.rocmtrain_operator import NAMESPACE as OPERATOR_NAMESPACE

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]


class LoopThread:
    """An asyncio event loop in a thread, driven from synchronous tests (which may block meanwhile)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="progress-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class ServerThread(LoopThread):
    """The progress server on its own event loop."""

    def __init__(self, cfg: ProgressServerConfig, kubeconfig: Path) -> None:
        super().__init__()
        self.config = cfg
        self.api = self.run(async_config.new_client_from_config(config_file=str(kubeconfig)))
        self.server: ProgressServer = self.run(start_progress_server(cfg, self.api))

    def url(self, namespace: str, name: str) -> str:
        """The job's endpoint URL as the renderer would write it."""
        return self.config.base_url + progress_path(namespace, name)

    def stop(self) -> None:
        self.run(self.server.stop())
        self.run(self.api.close())
        self.close()


@dataclass
class Post:
    status: int
    headers: dict[str, str]
    body: bytes


class Client:
    """Posts to the endpoint over verified TLS, as the training driver does."""

    def __init__(self, port: int, ca_crt: bytes) -> None:
        self.port = port
        self.context = ssl.create_default_context(cadata=ca_crt.decode())
        self._conn: http.client.HTTPSConnection | None = None

    def post(
        self, namespace: str, name: str, body: bytes | dict, token: str | None, *, path: str | None = None
    ) -> Post:
        """POST to the job's progress path (or `path`, such as its KEP-2779 one)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if self._conn is None:
            self._conn = http.client.HTTPSConnection("localhost", self.port, context=self.context, timeout=30)
        try:
            self._conn.request("POST", path or progress_path(namespace, name), body=data, headers=headers)
            resp = self._conn.getresponse()
            return Post(resp.status, dict(resp.headers), resp.read())
        except (http.client.HTTPException, OSError):
            self._conn.close()
            self._conn = None
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


@dataclass
class RayHead:
    """A job, its Ray cluster, and the (never running) head pod bound tokens are issued for."""

    namespace: str
    job: str
    cluster: str
    pod: dict[str, Any]
    raycluster: dict[str, Any]

    def job_object(self, kube: KubeCluster) -> dict[str, Any]:
        return kube.request("GET", self.job_path)

    @property
    def job_path(self) -> str:
        return f"/apis/rocmtrain.dev/v1alpha1/namespaces/{self.namespace}/{PLURAL}/{self.job}"


SMALL_SPEC = {
    "model": {"source": "sentence-transformers/all-MiniLM-L6-v2", "numLabels": 2},
    "data": {"train": {"uri": "/data/train.jsonl"}},
    "checkpoint": {"storagePath": "s3://checkpoints/small"},
}


def create_job(
    kube: KubeCluster, namespace: str, name: str, cluster: str | None, spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A RocmTrainingJob; with `cluster`, its status names the Ray cluster as the operator records it."""
    job = kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec or SMALL_SPEC,
        }
    )
    if cluster is not None:
        job = kube.request(
            "PATCH",
            f"/apis/rocmtrain.dev/v1alpha1/namespaces/{namespace}/{PLURAL}/{name}/status",
            body={"status": {"phase": "Running", "rayJobName": name, "rayClusterName": cluster}},
            content_type="application/merge-patch+json",
        )
    return job


def controlled_by(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The controller reference KubeRay and the operator set: controller, blockOwnerDeletion."""
    ref = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"]}
    return [{**ref, "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]


def _rayjob_of(kube: KubeCluster, namespace: str, job: str) -> dict[str, Any]:
    """The job's RayJob: the operator's, or as it would render and own it."""
    path = f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{job}"
    try:
        return kube.request("GET", path)
    except ApiException as exc:
        if exc.status != 404:
            raise
    job_object = kube.request("GET", f"/apis/rocmtrain.dev/v1alpha1/namespaces/{namespace}/{PLURAL}/{job}")
    rayjob = render_rayjob(RocmTrainingJob.model_validate(job_object))
    rayjob["metadata"]["ownerReferences"] = [owner_reference(job_object)]
    return kube.create(rayjob)


def create_ray_head(kube: KubeCluster, namespace: str, job: str, cluster: str) -> RayHead:
    """What KubeRay makes for the job's RayJob: the RayCluster `cluster` and its head pod (never scheduled)."""
    rayjob = _rayjob_of(kube, namespace, job)
    raycluster = kube.create(
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {"name": cluster, "namespace": namespace, "ownerReferences": controlled_by(rayjob)},
            "spec": rayjob["spec"]["rayClusterSpec"],
        }
    )
    head = RayHead(namespace, job, cluster, {}, raycluster)
    head.pod = create_ray_pod(kube, head, "head")
    return head


def create_ray_pod(kube: KubeCluster, head: RayHead, node_type: str, *, owned: bool = True) -> dict[str, Any]:
    """A pod of the job's Ray cluster as KubeRay labels it; `owned`: controlled by the RayCluster."""
    kube.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ray-head", "namespace": head.namespace}}
    )
    metadata: dict[str, Any] = {
        "name": f"{head.cluster}-{node_type}-{uuid.uuid4().hex[:5]}",
        "namespace": head.namespace,
        "labels": {RAY_CLUSTER_LABEL: head.cluster, RAY_NODE_TYPE_LABEL: node_type, JOB_NAME_LABEL: head.job},
    }
    if owned:
        metadata["ownerReferences"] = controlled_by(head.raycluster)
    return kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {
                "serviceAccountName": "ray-head",
                "automountServiceAccountToken": False,
                "containers": [{"name": "ray", "image": "rocm/ray:2.60.0"}],
            },
        }
    )


def bound_token_for(
    kube: KubeCluster, namespace: str, pod: dict[str, Any], audience: str = PROGRESS_AUDIENCE, seconds: int = 600
) -> str:
    """A TokenRequest token bound to `pod` (600 s is the API server's minimum lifetime)."""
    meta = pod["metadata"]
    review = kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{pod['spec']['serviceAccountName']}/token",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience],
                "expirationSeconds": seconds,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
            },
        },
    )
    return review["status"]["token"]


def bound_token(kube: KubeCluster, head: RayHead, audience: str = PROGRESS_AUDIENCE, seconds: int = 600) -> str:
    """A TokenRequest token bound to the head pod."""
    return bound_token_for(kube, head.namespace, head.pod, audience, seconds)


def operator_kubeconfig(kube: KubeCluster, path: Path) -> Path:
    """A kubeconfig of the operator's ServiceAccount, with the RBAC of manifests/rbac.yaml applied.

    The endpoint then runs with exactly the operator's permissions, so the tests
    also prove manifests/rbac.yaml grants what it needs.
    """
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}})
    kube.apply((REPO / "manifests" / "rbac.yaml").read_text(), namespace=OPERATOR_NAMESPACE)
    return kube.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SA, path)
