"""Real Kueue (sigs.k8s.io/kueue), with its CRDs, RBAC and webhooks from its module's config/default.

Kueue starts no controller before its webhooks are wired up: its certificate
rotator (internalCertManagement) must find valid serving certificates in its
Secret and inject their CA into the webhook configurations and the conversion
webhooks of its CRDs. So the harness:

- points every webhook (admission and CRD conversion) at loopback:
  ``clientConfig.url: https://127.0.0.1:<port><path>``, keeping only those of
  the integrations enabled here (``ray.io/rayjob``) and Kueue's own API;
- makes a CA and a serving certificate valid for 127.0.0.1 and for the name
  the rotator checks (kueue-webhook-service.kueue-system.svc), stores them in
  Kueue's Secret and in its cert dir (what a kubelet would mount);
- lets Kueue's own rotator accept them and inject the CA (it would replace a
  certificate that is invalid or expires within 90 days).

Builders below make the objects of a GPU pool (flavors, queues, priorities).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from rocmtrain_testworld.api import KubeCluster, load_cached
from rocmtrain_testworld.paths import MANIFESTS_DIR
from rocmtrain_testworld.pki import webhook_serving_pair
from rocmtrain_testworld.processes import Process, free_port, http_ok

NAMESPACE = "kueue-system"
SERVICE_ACCOUNT = "kueue-controller-manager"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
FRAMEWORKS = {"ray.io/rayjob": ("ray.io", "rayjobs")}
API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Not installed: Kueue's Deployment and Services (it runs as a process here),
# its own config (written below) and the visibility API (VisibilityOnDemand is off).
_SKIPPED_KINDS = {"Deployment", "Service", "ConfigMap", "APIService"}


def _webhook_kept(hook: dict[str, Any]) -> bool:
    """Kueue's own API, and the enabled integrations: Kueue serves no other path, so the rest would fail."""
    wanted = {("kueue.x-k8s.io", None), *FRAMEWORKS.values()}
    for rule in hook["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                if (group, None) not in wanted and (group, resource.split("/")[0]) not in wanted:
                    return False
    return True


def _to_loopback(client_config: dict[str, Any], port: int, ca: bytes) -> dict[str, Any]:
    path = client_config["service"].get("path", "/")
    return {"url": f"https://127.0.0.1:{port}{path}", "caBundle": base64.b64encode(ca).decode()}


def manifests(port: int, ca: bytes) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(CRDs, everything else) of Kueue's config/default, webhooks rewritten to https://127.0.0.1:``port``."""
    crds, rest = [], []
    for obj in load_cached(MANIFESTS_DIR / "kueue.yaml"):
        kind = obj["kind"]
        if kind in _SKIPPED_KINDS:
            continue
        if kind == "CustomResourceDefinition":
            webhook = (obj["spec"].get("conversion") or {}).get("webhook")
            if webhook:
                webhook["clientConfig"] = _to_loopback(webhook["clientConfig"], port, ca)
            crds.append(obj)
        elif kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            obj["webhooks"] = [
                {**hook, "clientConfig": _to_loopback(hook["clientConfig"], port, ca)}
                for hook in obj["webhooks"]
                if _webhook_kept(hook)
            ]
            rest.append(obj)
        elif kind == "Secret":
            continue  # written by install(), with the harness's certificates
        else:
            rest.append(obj)
    return crds, rest


class Kueue:
    """Ports, certificates and manifests of one Kueue; ``install`` then ``process``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.cert_dir = workdir / "kueue" / "certs"
        self.certs = webhook_serving_pair("kueue-ca", [f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc", "127.0.0.1"], days=365)
        self.crds, self.objects = manifests(self.webhook_port, self.certs["ca.crt"])

    def install(self, cluster: KubeCluster) -> None:
        """Namespace, RBAC, webhook configurations and the certificate Secret (the CRDs: ``self.crds``)."""
        for obj in self.objects:
            cluster.apply(obj)
        data = {key: base64.b64encode(value).decode() for key, value in self.certs.items()}
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": WEBHOOK_SECRET, "namespace": NAMESPACE},
                "data": data,
            }
        )
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        for key in ("tls.crt", "tls.key"):
            (self.cert_dir / key).write_bytes(self.certs[key])

    def config(self) -> dict[str, Any]:
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "manageJobsWithoutQueueName": False,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(self.cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {
                "enable": True,
                "webhookServiceName": WEBHOOK_SERVICE,
                "webhookSecretName": WEBHOOK_SECRET,
            },
            "integrations": {"frameworks": list(FRAMEWORKS)},
            "featureGates": {"VisibilityOnDemand": False},
            "clientConnection": {"qps": 100, "burst": 200},
        }

    def process(self, kubeconfig: Path, wrap: Any, *, detach: bool = False) -> Process:
        """Kueue (not started): ready once its certificates are in place and its webhooks serve."""
        config = self.workdir / "kueue.yaml"
        config.write_text(yaml.safe_dump(self.config()))
        return Process(
            "kueue",
            [f"--config={config}", "--zap-log-level=info"],
            logs=self.workdir / "logs",
            cwd=self.workdir,
            env={"KUBECONFIG": str(kubeconfig)},
            wrap=wrap,
            ready=lambda: http_ok(f"http://127.0.0.1:{self.health_port}/readyz"),
            detach=detach,
        )


# ---- the objects of a GPU pool ------------------------------------------------------------


def resource_flavor(name: str, node_labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": node_labels},
    }


def cluster_queue(
    name: str,
    quotas: dict[str, dict[str, str | int]],
    *,
    cohort: str | None = None,
    preemption: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ClusterQueue with one resource group: ``quotas`` is flavor -> {resource: nominal quota}."""
    resources = sorted({r for quota in quotas.values() for r in quota})
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": resources,
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [{"name": r, "nominalQuota": str(quota.get(r, 0))} for r in resources],
                    }
                    for flavor, quota in quotas.items()
                ],
            }
        ],
    }
    if cohort:
        spec["cohortName"] = cohort
    if preemption:
        spec["preemption"] = preemption
    return {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}


def workloads(cluster: KubeCluster, namespace: str, owner_uid: str) -> list[dict[str, Any]]:
    """The Workloads Kueue made for the object with ``owner_uid`` (a RayJob)."""
    items = cluster.request("GET", f"/apis/{API}/namespaces/{namespace}/workloads")["items"]
    return [w for w in items if any(o["uid"] == owner_uid for o in w["metadata"].get("ownerReferences", []))]
