"""The operator's kustomize base: what it builds, how it is hardened, and what its ServiceAccount may do."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config as k8s_config
from operator_testkit import OPERATOR_NAMESPACE, REPO, kustomize_build

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.metrics.access import METRICS_PATH
from rocmtrain.progress import tls
from rocmtrain.progress.server import METRICS_SERVICE_NAME, SERVICE_NAME, ProgressServerConfig
from rocmtrain.render import render_rayjob
from rocmtrain_testworld.kubecluster import KubeCluster, request
from unit.samples import full_job

CRDS = REPO / "crds"
MANIFEST_CRDS = REPO / "manifests" / "crd"


def _one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return obj


def test_manifest_crds_are_copies_of_crds():
    """kustomize reads no file outside manifests/, so `make manifests` copies crds/ there."""
    sources = sorted(p.name for p in CRDS.glob("*.yaml"))
    assert sources and sorted(p.name for p in MANIFEST_CRDS.glob("*.yaml")) == sources
    for name in sources:
        assert (MANIFEST_CRDS / name).read_text() == (CRDS / name).read_text(), f"run `make manifests`: {name}"


def test_kustomize_builds_the_operator(kustomized: list[dict[str, Any]]):
    kinds = {o["kind"] for o in kustomized}
    assert kinds >= {
        "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment", "Namespace", "Service",
        "ServiceAccount",
    }  # fmt: skip
    assert len([o for o in kustomized if o["kind"] == "Deployment"]) == 1
    namespaced = [o for o in kustomized if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding")]
    namespaced = [o for o in namespaced if o["kind"] != "CustomResourceDefinition"]
    assert {o["metadata"]["namespace"] for o in namespaced} == {OPERATOR_NAMESPACE}
    (subject,) = _one(kustomized, "ClusterRoleBinding", "rocm-train-operator")["subjects"]
    assert subject == {"kind": "ServiceAccount", "name": "rocm-train-operator", "namespace": OPERATOR_NAMESPACE}


def test_deployment_is_hardened(kustomized: list[dict[str, Any]]):
    deployment = _one(kustomized, "Deployment")["spec"]
    assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}
    pod = deployment["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert set(container["resources"]) == {"requests", "limits"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["port"] == "health"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (
        ports["metrics"] == int(env["ROCMTRAIN_METRICS_PORT"]) != ports["health"] == int(env["ROCMTRAIN_HEALTH_PORT"])
    )
    # The operator listens on loopback unless told: the pod says so for the scrapes and probes.
    assert env["ROCMTRAIN_METRICS_HOST"] == env["ROCMTRAIN_HEALTH_HOST"] == "0.0.0.0"  # noqa: S104
    config = OperatorConfig.from_env({**env, "ROCMTRAIN_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE})
    assert config.metrics_secure, "scrapes over HTTPS, authenticated and authorised"
    assert container["image"].startswith("ghcr.io/rocm-train-operator/operator:")
    service = _one(kustomized, "Service", METRICS_SERVICE_NAME)["spec"]
    assert service["ports"] == [{"name": "metrics", "port": ports["metrics"], "targetPort": "metrics"}]


def test_roles_name_every_verb_and_resource(kustomized: list[dict[str, Any]]):
    rules = [rule for o in kustomized if o["kind"] in ("ClusterRole", "Role") for rule in o["rules"]]
    assert rules
    for rule in rules:
        named = rule.get("resources", rule.get("nonResourceURLs"))
        assert "*" not in rule["verbs"] and named and "*" not in named and "*" not in rule.get("apiGroups", []), rule


def test_network_policy_admits_reports_from_ray_pods_and_scrapes_from_labelled_namespaces(
    kustomized: list[dict[str, Any]],
):
    policy = _one(kustomized, "NetworkPolicy")["spec"]
    deployment = _one(kustomized, "Deployment")["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= deployment["metadata"]["labels"].items()
    assert policy["policyTypes"] == ["Ingress"]
    ports = {p["name"] for p in deployment["spec"]["containers"][0]["ports"]}
    (progress,) = [rule for rule in policy["ingress"] if {"port": "progress"} in rule["ports"]]
    assert {p["port"] for rule in policy["ingress"] for p in rule["ports"]} == ports
    (peer,) = progress["from"]
    assert peer["namespaceSelector"] == {}, "jobs run in any namespace"
    head = render_rayjob(RocmTrainingJob.model_validate(full_job()))["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert peer["podSelector"]["matchLabels"].items() <= head["template"]["metadata"]["labels"].items()
    # Metrics name every team's jobs and cost: only namespaces the admin labels (Prometheus') reach them.
    (metrics,) = [rule for rule in policy["ingress"] if {"port": "metrics"} in rule["ports"]]
    assert metrics["ports"] == [{"port": "metrics"}]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"rocmtrain.dev/scrape-metrics": "true"}}}]
    (health,) = [rule for rule in policy["ingress"] if {"port": "health"} in rule["ports"]]
    assert "from" not in health, "the kubelet's probes come from the node"


def test_prometheus_scrapes_over_https_with_its_token_and_the_operators_ca(kustomized: list[dict[str, Any]]):
    """The ServiceMonitor verifies the operator's certificate for the metrics Service's name and sends Prometheus'
    token; the ClusterRole to bind to Prometheus grants exactly `get` on /metrics."""
    monitor = _one(kustomize_build(REPO / "manifests" / "monitoring"), "ServiceMonitor")["spec"]
    (endpoint,) = monitor["endpoints"]
    service = _one(kustomized, "Service", METRICS_SERVICE_NAME)
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] and endpoint["scheme"] == "https"
    assert endpoint["path"] == METRICS_PATH and endpoint["honorLabels"] is True
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": tls.SECRET_NAME, "key": tls.CA_KEY}}
    assert endpoint["tlsConfig"]["serverName"] in ProgressServerConfig(namespace=OPERATOR_NAMESPACE).hosts
    reader = _one(kustomized, "ClusterRole", "rocm-train-operator-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": [METRICS_PATH], "verbs": ["get"]}]


def _namespace_overlay(folder: Path, namespace: str) -> list[str]:
    """The lines of install.md's overlay into another namespace, for an overlay in `folder`."""
    section = (REPO / "docs" / "operations" / "install.md").read_text().split("## Another namespace", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    base = os.path.relpath(REPO / "manifests", folder)
    return block.replace("../rocm-train-operator/manifests", base).replace("ml-platform", namespace).splitlines()


def _cert_manager_overlay(folder: Path, namespace: str | None = None) -> list[dict[str, Any]]:
    """Build an overlay of the base with the cert-manager component (and, as documented, another namespace)."""
    component = REPO / "manifests" / "cert-manager"
    lines = [f"resources: [{os.path.relpath(REPO / 'manifests', folder)}]"]
    if namespace is not None:
        text = (component / "kustomization.yaml").read_text()
        lines = [*_namespace_overlay(folder, namespace), text[text.index("replacements:") :]]
    lines.append(f"components: [{os.path.relpath(component, folder)}]")
    (folder / "kustomization.yaml").write_text("\n".join(lines) + "\n")
    return kustomize_build(folder)


def test_the_documented_overlay_moves_the_operator_and_its_bindings_to_another_namespace(tmp_path: Path):
    """install.md's overlay: every object, the Namespace and every binding's subject in the new namespace
    (kustomize's `namespace:` alone leaves the subjects behind, and the operator without its permissions)."""
    (tmp_path / "kustomization.yaml").write_text("\n".join(_namespace_overlay(tmp_path, "ml-platform")) + "\n")
    objs = kustomize_build(tmp_path)
    assert OPERATOR_NAMESPACE not in str(objs)
    assert _one(objs, "Namespace")["metadata"]["name"] == "ml-platform"
    bindings = [o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    subjects = [s for o in bindings for s in o["subjects"]]
    assert len(bindings) >= 3 and {(s["name"], s["namespace"]) for s in subjects} == {
        ("rocm-train-operator", "ml-platform")
    }


@pytest.mark.parametrize("namespace", [None, "ml-platform"])
def test_cert_manager_component_issues_the_secret_the_operator_reads(tmp_path: Path, namespace: str | None):
    objs = _cert_manager_overlay(tmp_path, namespace)
    namespace = namespace or OPERATOR_NAMESPACE
    serving = _one(objs, "Certificate", "rocmtrain-progress")["spec"]
    assert serving["secretName"] == tls.SECRET_NAME
    assert serving["dnsNames"] == ProgressServerConfig(namespace).hosts, "the progress and metrics Services' names"
    assert _one(objs, "Service", SERVICE_NAME)["metadata"]["namespace"] == namespace
    # A CA issuer (so the Secret carries ca.crt, which the operator publishes), rooted in a self-signed CA.
    issuer = _one(objs, "Issuer", serving["issuerRef"]["name"])["spec"]
    root = _one(objs, "Certificate", "rocmtrain-progress-ca")["spec"]
    assert root["isCA"] is True and issuer["ca"]["secretName"] == root["secretName"] != tls.SECRET_NAME
    assert "selfSigned" in _one(objs, "Issuer", root["issuerRef"]["name"])["spec"]
    # The operator only reads that Secret: its setting, and a Role narrowed to `get`.
    container = _one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "") for e in container["env"]} | {"ROCMTRAIN_OPERATOR_NAMESPACE": namespace}
    config = ProgressServerConfig.from_env(env)
    assert config is not None and not config.manage_tls
    assert _one(objs, "Role", "rocm-train-operator-progress-tls")["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [tls.SECRET_NAME], "verbs": ["get"]}
    ]


# ---- on the cluster ---------------------------------------------------------------------------

ALLOWED = [
    ("get", "rocmtrain.dev", "rocmtrainingjobs", ""),
    ("list", "rocmtrain.dev", "rocmtrainingjobs", ""),
    ("watch", "rocmtrain.dev", "rocmtrainingjobs", ""),
    ("patch", "rocmtrain.dev", "rocmtrainingjobs", "status"),
    ("update", "rocmtrain.dev", "rocmtrainingjobs", "finalizers"),
    ("create", "ray.io", "rayjobs", ""),
    ("get", "ray.io", "rayjobs", ""),
    ("list", "ray.io", "rayjobs", ""),
    ("watch", "ray.io", "rayjobs", ""),
    ("patch", "ray.io", "rayjobs", ""),
    ("delete", "ray.io", "rayjobs", ""),  # a job refused after it started is stopped
    ("create", "networking.k8s.io", "networkpolicies", ""),
    ("list", "", "nodes", ""),
    ("watch", "", "nodes", ""),
    ("get", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("watch", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("create", "", "events", ""),
    ("list", "", "events", ""),  # the events on pods whose volumes cannot be mounted (field-selected by reason)
    ("watch", "", "events", ""),
    ("create", "authentication.k8s.io", "tokenreviews", ""),
    ("create", "authorization.k8s.io", "subjectaccessreviews", ""),  # who may scrape /metrics
    ("get", "", "pods", ""),
    ("get", "ray.io", "rayclusters", ""),
    ("list", "", "pods", ""),
    ("watch", "", "pods", ""),
    ("list", "kueue.x-k8s.io", "workloads", ""),
    ("watch", "kueue.x-k8s.io", "workloads", ""),
    ("get", "kueue.x-k8s.io", "clusterqueues", ""),
    ("list", "kueue.x-k8s.io", "clusterqueues", ""),  # a cohort's quotas, for status.queue
    ("get", "", "persistentvolumeclaims", ""),  # the access modes of a checkpoints' claim
]
DENIED = [
    ("update", "ray.io", "rayjobs", ""),
    ("patch", "networking.k8s.io", "networkpolicies", ""),
    ("delete", "networking.k8s.io", "networkpolicies", ""),
    ("create", "rocmtrain.dev", "rocmtrainingjobs", ""),
    ("patch", "rocmtrain.dev", "rocmtrainingjobs", ""),
    ("delete", "rocmtrain.dev", "rocmtrainingjobs", ""),
    ("get", "", "secrets", ""),
    ("create", "", "pods", ""),
    ("delete", "", "pods", ""),
    ("update", "kueue.x-k8s.io", "workloads", ""),
    ("patch", "kueue.x-k8s.io", "workloads", "status"),
    ("watch", "kueue.x-k8s.io", "clusterqueues", ""),
    ("get", "", "nodes", ""),
    ("patch", "", "nodes", ""),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", ""),
    ("patch", "", "events", ""),
    ("list", "ray.io", "rayclusters", ""),
    ("create", "ray.io", "rayclusters", ""),
    ("list", "", "persistentvolumeclaims", ""),  # one claim by name: get only
    ("watch", "", "persistentvolumeclaims", ""),
    ("patch", "", "persistentvolumeclaims", ""),
    ("get", "", "persistentvolumes", ""),
]


@pytest.mark.cluster
def test_manifests_apply_to_the_cluster(kube: KubeCluster, installed: list[dict[str, Any]]):
    for obj in installed:
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Namespace"):
            live = kube.request("GET", kube.path_for(obj))
            assert live["metadata"]["name"] == obj["metadata"]["name"]


@pytest.mark.cluster
def test_service_account_may_do_what_the_operator_needs_and_no_more(operator_kubeconfig: Path):
    """SelfSubjectAccessReviews made with the ServiceAccount's own token."""
    api = k8s_config.new_client_from_config(config_file=str(operator_kubeconfig))
    try:

        def allowed(verb: str, group: str, resource: str, subresource: str) -> bool:
            attributes = {"verb": verb, "group": group, "resource": resource, "subresource": subresource}
            cluster_scoped = (
                "nodes",
                "customresourcedefinitions",
                "tokenreviews",
                "subjectaccessreviews",
                "clusterqueues",
                "persistentvolumes",
            )
            if resource not in cluster_scoped:
                attributes["namespace"] = "some-team"
            review = request(
                api,
                "POST",
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                body={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                      "spec": {"resourceAttributes": attributes}},
            )  # fmt: skip
            return bool(review["status"]["allowed"])

        assert [check for check in ALLOWED if not allowed(*check)] == []
        assert [check for check in DENIED if allowed(*check)] == []
    finally:
        api.close()
