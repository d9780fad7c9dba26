"""The real KubeRay operator (github.com/ray-project/kuberay/ray-operator, the renderer's version).

It runs as its own ServiceAccount with the RBAC of its module's
config/default, in the name sandbox (sandbox.py): it polls each Ray head's
dashboard at `<cluster>-head-svc.<ns>.svc.cluster.local:8265`. For pods on the
kwok nodes that fails at once (no Ray runs there), so a RayJob reaches Running
and then ends the way its submitter pod ends (kwok.set_behaviour on that pod);
for pods the process runtime runs, the name resolves to the real head.

Helpers below find what KubeRay made for a RayJob.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocmtrain_testworld.api import KubeCluster, load_cached
from rocmtrain_testworld.paths import MANIFESTS_DIR
from rocmtrain_testworld.processes import Process, free_port, http_ok

RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
RAYJOBS = "/apis/ray.io/v1/namespaces/{ns}/rayjobs"
RAYCLUSTERS = "/apis/ray.io/v1/namespaces/{ns}/rayclusters"


def install(cluster: KubeCluster) -> tuple[str, str]:
    """KubeRay's ServiceAccount and RBAC (its CRDs are installed with the control plane's); (namespace, account)."""
    account = None
    for obj in load_cached(MANIFESTS_DIR / "kuberay.yaml"):
        if obj["kind"] in RBAC_KINDS:
            cluster.apply(obj)
            if obj["kind"] == "ServiceAccount":
                account = (obj["metadata"].get("namespace", "default"), obj["metadata"]["name"])
    assert account is not None, "no ServiceAccount in KubeRay's config/default"
    return account


def process(
    cluster: KubeCluster,
    workdir: Path,
    kubeconfig: Path,
    wrap: Callable[[list[str]], list[str]],
    *,
    detach: bool = False,
) -> Process:
    """The operator (not started): no leader election, probes and metrics on loopback ports."""
    probe = free_port()
    return Process(
        "kuberay-operator",
        [
            f"--health-probe-bind-address=127.0.0.1:{probe}",
            f"--metrics-addr=127.0.0.1:{free_port()}",
            "--enable-metrics",
            "--enable-leader-election=false",
            "--log-stdout-encoder=console",
        ],
        logs=workdir / "logs",
        cwd=workdir,
        env={"KUBECONFIG": str(kubeconfig)},
        wrap=wrap,
        ready=lambda: http_ok(f"http://127.0.0.1:{probe}/readyz"),
        detach=detach,
    )


def _get(cluster: KubeCluster, path: str) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return cluster.request("GET", path)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def rayjob(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any] | None:
    return _get(cluster, RAYJOBS.format(ns=namespace) + f"/{name}")


def raycluster(cluster: KubeCluster, namespace: str, rayjob_name: str) -> dict[str, Any] | None:
    """The RayCluster KubeRay made for the RayJob (named in its status), or None yet."""
    name = ((rayjob(cluster, namespace, rayjob_name) or {}).get("status") or {}).get("rayClusterName")
    return _get(cluster, RAYCLUSTERS.format(ns=namespace) + f"/{name}") if name else None


def ray_pods(
    cluster: KubeCluster, namespace: str, raycluster_name: str, node_type: str | None = None
) -> list[dict[str, Any]]:
    """The RayCluster's pods (``node_type``: "head" or "worker" for only those), by name."""
    selector = f"ray.io/cluster={raycluster_name}"
    if node_type:
        selector += f",ray.io/node-type={node_type}"
    pods = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector})["items"]
    return sorted(pods, key=lambda p: p["metadata"]["name"])


def submitter_pods(cluster: KubeCluster, namespace: str, rayjob_name: str) -> list[dict[str, Any]]:
    """The pods of the RayJob's submitter Job (K8sJobMode: the Job has the RayJob's name), oldest first."""
    pods = cluster.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/pods",
        query={"labelSelector": f"batch.kubernetes.io/job-name={rayjob_name}"},
    )["items"]
    return sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"])
