"""The operator's wiring of the endpoint and of /metrics: config, startup, CA publishing, rendering, cleanup.

The operator's own configuration and runtime (`open_runtime`, not started) run here, on
one event loop, as the operator's ServiceAccount (manifests/rbac.yaml), against
kube-apiserver; kopf's event loop is not started, so this test never competes with the operator
that tests/operator run. Not real: no KubeRay controller, so the test writes the
RayJob's `status.rayClusterName` and creates the RayCluster and the head pod from
the rendered template as KubeRay would; no kubelet, so that pod never runs.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from progress.endpoint import (
    OPERATOR_NAMESPACE,
    Client,
    LoopThread,
    RayHead,
    bound_token,
    controlled_by,
    operator_kubeconfig,
)
from rocmtrain.api.contract import API_VERSION, KIND, PROGRESS_AUDIENCE
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.controller import handlers
from rocmtrain.controller.runtime import open_runtime, publish_progress_ca
from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.progress import tls
from rocmtrain.progress.server import METRICS_SERVICE_NAME
from rocmtrain.render import render_rayjob
from rocmtrain.status.objects import owner_reference
from rocmtrain_testworld.kubecluster import KubeCluster, free_port

pytestmark = pytest.mark.cluster

METRICS_READER = "rocm-train-operator-metrics-reader"  # manifests/rbac.yaml
SPEC = {
    "model": {"source": "sentence-transformers/all-MiniLM-L6-v2", "numLabels": 2},
    "data": {"train": {"uri": "/data/train.jsonl"}},
    "resources": {"workers": 1, "gpusPerWorker": 0, "cpusPerWorker": "1", "memoryPerWorker": "2Gi"},
    "checkpoint": {"storagePath": "s3://checkpoints/wiring"},
}


def test_the_progress_endpoint_is_off_unless_configured():
    config = OperatorConfig.from_env({})
    assert config.progress is None
    assert config.render_options.progress_base_url is None


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


def test_operator_serves_progress_for_the_jobs_it_renders(
    kube: KubeCluster, loop: LoopThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    port = free_port()
    config = OperatorConfig.from_env(
        {
            "ROCMTRAIN_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE,
            "ROCMTRAIN_PROGRESS_PORT": str(port),
            "ROCMTRAIN_PROGRESS_ADVERTISE_HOST": "localhost",
            "ROCMTRAIN_PROGRESS_ADVERTISE_PORT": str(port),
            "ROCMTRAIN_METRICS_PORT": "0",
        }
    )
    assert config.progress is not None
    kubeconfig = operator_kubeconfig(kube, tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))  # the runtime's clients read it, as in the operator
    runtime = loop.run(
        open_runtime(config, {}, {}, rayjob_changed=handlers.rayjob_changed, rayjob_touched=handlers.rayjob_touched)
    )
    assert runtime.progress is not None
    try:
        namespace, name = kube.new_namespace("wired"), "wired-job"
        job = kube.create(
            {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": namespace}, "spec": SPEC}
        )
        # What the `reconcile` handler does: publish the CA, then create the RayJob rendered with the
        # operator's render options (the Reconciler's own run needs kopf's context for its events).
        assert loop.run(publish_progress_ca(runtime.progress, runtime.kube, namespace)) is None
        rendered = render_rayjob(RocmTrainingJob.model_validate(job), options=config.render_options)
        rendered["metadata"]["ownerReferences"] = [owner_reference(job)]
        rayjob_object = kube.create(rendered)

        ca = kube.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{tls.CA_CONFIGMAP}")["data"]["ca.crt"]
        rayjob = kube.request("GET", f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}")
        template = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
        env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
        url = f"https://localhost:{port}/v1/namespaces/{namespace}/rocmtrainingjobs/{name}/progress"
        assert env["ROCMTRAIN_PROGRESS_URL"] == url

        # KubeRay's part: the RayCluster, its name in the RayJob's status, the head pod from the template.
        cluster = f"{name}-b4x7z"
        raycluster = kube.create(
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayCluster",
                "metadata": {"name": cluster, "namespace": namespace, "ownerReferences": controlled_by(rayjob_object)},
                "spec": rayjob["spec"]["rayClusterSpec"],
            }
        )
        kube.request(
            "PATCH",
            f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}/status",
            body={"status": {"rayClusterName": cluster}},
            content_type="application/merge-patch+json",
            query={"fieldManager": "kuberay-operator"},
        )
        kube.apply(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ray-head", "namespace": namespace}}
        )
        labels = {**template["metadata"]["labels"], "ray.io/cluster": cluster, "ray.io/node-type": "head"}
        pod = kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{cluster}-head-q9w8e",
                    "namespace": namespace,
                    "labels": labels,
                    "ownerReferences": controlled_by(raycluster),
                },
                "spec": {**template["spec"], "serviceAccountName": "ray-head"},
            }
        )
        head = RayHead(namespace, name, cluster, pod, raycluster)

        client = Client(port, ca.encode())
        report = {"progress": {"step": 3, "totalSteps": 30, "percent": 10.0}, "metrics": {"trainLoss": 0.9}}
        resp = client.post(namespace, name, report, bound_token(kube, head))
        client.close()
        assert resp.status == 204, resp.body
        status = head.job_object(kube)["status"]
        assert status["progress"]["step"] == 3 and status["metrics"]["trainLoss"] == 0.9
    finally:
        loop.run(runtime.close())


def _scrape(port: int, ca: bytes, token: str | None) -> tuple[int, str]:
    """GET /metrics over TLS verified with `ca` for the metrics Service's name, with `token` as bearer."""
    import aiohttp

    async def get() -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        context = ssl.create_default_context(cadata=ca.decode())
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                f"https://127.0.0.1:{port}/metrics", headers=headers, ssl=context, server_hostname=METRICS_SERVICE_NAME
            ) as response,
        ):
            return response.status, await response.text()

    return asyncio.run(get())


def test_the_operators_metrics_are_served_only_to_scrapers_rbac_lets_get_them(
    kube: KubeCluster, loop: LoopThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """HTTPS with the operator's certificate, the real TokenReview, SubjectAccessReview and RBAC: the operator's own
    rights and the metrics-reader ClusterRole, both of manifests/rbac.yaml (issue 20, finding 9)."""
    port = free_port()
    config = OperatorConfig.from_env(
        {
            "ROCMTRAIN_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE,
            "ROCMTRAIN_PROGRESS_PORT": str(free_port()),
            "ROCMTRAIN_PROGRESS_ADVERTISE_HOST": "localhost",  # the names the other tests' certificate has
            "ROCMTRAIN_METRICS_PORT": str(port),
        }
    )
    assert config.metrics_secure, "the default where the progress endpoint runs"
    monkeypatch.setenv("KUBECONFIG", str(operator_kubeconfig(kube, tmp_path / "kubeconfig")))
    runtime = loop.run(
        open_runtime(config, {}, {}, rayjob_changed=handlers.rayjob_changed, rayjob_touched=handlers.rayjob_touched)
    )
    scrapers = kube.new_namespace("scrapers")
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{scrapers}-metrics-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": METRICS_READER},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": scrapers}],
    }
    try:
        assert runtime.progress is not None
        ca = runtime.progress.ca_crt

        def token(account: str, audiences: list[str] | None = None) -> str:
            kube.apply(
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": scrapers}}
            )
            spec = {"audiences": audiences} if audiences else {}
            path = f"/api/v1/namespaces/{scrapers}/serviceaccounts/{account}/token"
            request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
            return kube.request("POST", path, body=request)["status"]["token"]

        kube.apply(binding)
        assert _scrape(port, ca, None)[0] == 401
        assert _scrape(port, ca, "not-a-token")[0] == 401
        assert _scrape(port, ca, token("prometheus", [PROGRESS_AUDIENCE]))[0] == 401, (
            "a token made for the progress endpoint"
        )
        status, text = _scrape(port, ca, token("stranger"))
        assert status == 403 and "rocmtrain_" not in text, text
        status, text = _scrape(port, ca, token("prometheus"))
        assert status == 200, text
        assert 'rocmtrain_jobs{phase="Pending"}' in text and "# TYPE rocmtrain_reconcile_errors_total counter" in text
    finally:
        loop.run(runtime.close())
        kube.delete(binding)
