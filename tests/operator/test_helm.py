"""The Helm chart (manifests/helm/rocm-train-operator): generated from manifests/, rendering what kustomize
builds for each of its modes, and installed, upgraded and uninstalled by the real Helm (helm.sh/helm/v4,
built with the test world) on the lean control plane.

No kubelet runs there: the release's Deployment makes its ReplicaSets and Pods, which never start; the
operator runs beside it under KopfRunner as the release's ServiceAccount, with the settings of the release's
Deployment, and takes a job to Succeeded (KubeRay's status written by the test, as in every lean test).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_kit import CHART, helm, keyed, overlay, template
from operator_testkit import (
    OPERATOR_NAMESPACE,
    OPERATOR_SA,
    REPO,
    Api,
    Operator,
    job_manifest,
    kustomize_build,
    wait_until,
)  # fmt: skip

from rocmtrain.api.manifests import load_documents
from rocmtrain.chart import chart_files
from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.progress.server import ProgressServerConfig
from rocmtrain_testworld.helm import literal_env, live_env, operator_container, outside_settings
from rocmtrain_testworld.kubecluster import KubeCluster


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def test_the_chart_is_what_make_manifests_generates():
    wanted = chart_files(REPO)
    present = {str(p.relative_to(CHART)) for p in CHART.rglob("*") if p.is_file()}
    assert present == set(wanted), "run `make manifests`"
    for name, text in wanted.items():
        assert (CHART / name).read_text() == text, f"run `make manifests`: {name}"


def test_helm_lint(helm_home: Path):
    out = helm(["lint", "--strict", str(CHART)], helm_home)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_default_values_render_what_kustomize_builds(helm_home: Path, kustomized: list[dict[str, Any]]):
    """Every object of `kustomize build manifests/`, the CRD included (crds/), and nothing else; the
    Namespace only with namespace.create (Helm keeps its release record in it, so it exists before)."""
    rendered = keyed(template(helm_home, OPERATOR_NAMESPACE))
    built = keyed(kustomized)
    namespace = ("Namespace", "", OPERATOR_NAMESPACE)
    assert set(built) - set(rendered) == {namespace} and set(rendered) <= set(built)
    assert all(rendered[key] == built[key] for key in rendered), [k for k in rendered if rendered[k] != built[k]]
    assert keyed(template(helm_home, OPERATOR_NAMESPACE, {"namespace.create": "true"})) == built


def test_cert_manager_and_monitoring_values_render_what_their_components_build(helm_home: Path, tmp_path: Path):
    values = {"namespace.create": "true", "certManager.enabled": "true"}
    with_cert_manager = overlay(tmp_path / "cm", namespace=OPERATOR_NAMESPACE, components=["cert-manager"])
    assert keyed(template(helm_home, OPERATOR_NAMESPACE, values)) == keyed(with_cert_manager)
    # In another namespace: every object there, the Namespace named so, the ServiceAccount bound there, the
    # certificate for the Services' names there. (An overlay of manifests/ with another `namespace:` keeps
    # the bindings' subjects in rocm-train-system: kustomize's namespace transformer moves only subjects
    # named `default` unless told `setRoleBindingSubjects: allServiceAccounts`.)
    rendered = template(helm_home, "ml-platform", values)
    namespaced = [o for o in rendered if o["kind"] not in ("ClusterRole", "ClusterRoleBinding", "Namespace")]
    namespaced = [o for o in namespaced if o["kind"] != "CustomResourceDefinition"]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"ml-platform"}
    assert [o["metadata"]["name"] for o in rendered if o["kind"] == "Namespace"] == ["ml-platform"]
    subjects = [s for o in rendered if o["kind"].endswith("RoleBinding") for s in o["subjects"]]
    assert subjects and {s["namespace"] for s in subjects} == {"ml-platform"}
    (certificate,) = [
        o for o in rendered if o["kind"] == "Certificate" and o["metadata"]["name"] == "rocmtrain-progress"
    ]
    assert certificate["spec"]["dnsNames"] == ProgressServerConfig("ml-platform").hosts
    monitoring = {f"monitoring.{key}": "true" for key in ("serviceMonitor", "prometheusRule", "dashboard")}
    base = keyed(template(helm_home, OPERATOR_NAMESPACE))
    added = {k: v for k, v in keyed(template(helm_home, OPERATOR_NAMESPACE, monitoring)).items() if k not in base}
    assert added == keyed(kustomize_build(REPO / "manifests" / "monitoring"))


def test_watched_namespaces_render_what_the_namespaced_component_builds(helm_home: Path, tmp_path: Path):
    folder = tmp_path / "namespaced"
    folder.mkdir()
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "rocm-train-operator", "namespace": team},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rocm-train-operator"},
            "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NAMESPACE}],
        }
        for team in ("ml-team", "research")
    ]
    (folder / "rolebindings.yaml").write_text(yaml.safe_dump_all(bindings))
    patch = (
        "patches:\n"
        "  - target: {kind: Deployment, name: rocm-train-operator}\n"
        "    patch: |-\n"
        "      - op: add\n"
        "        path: /spec/template/spec/containers/0/env/-\n"
        '        value: {name: ROCMTRAIN_NAMESPACES, value: "ml-team,research"}\n'
    )
    built = overlay(folder, components=["namespaced"], resources=["rolebindings.yaml"], extra=patch)
    values = {"namespace.create": "true", "watchNamespaces": "{ml-team,research}"}
    assert keyed(template(helm_home, OPERATOR_NAMESPACE, values)) == keyed(built)


def test_values_set_the_image_resources_policy_and_network_policy(helm_home: Path):
    values = {
        "image.repository": "registry.example.com/ml/operator",
        "image.tag": "0.2.0",
        "resources.limits.memory": "1Gi",
        "stallSeconds": "600",
        "policy.allowedImages": "{registry.example.com/ml/,ghcr.io/rocm-train-operator/}",
        "policy.allowedPriorityClasses": "{training}",
        "policy.allowedKueuePriorityClasses": "{batch-low,batch-high}",
        "policy.protectedNamespaces": "{kube-system,finance}",
        "policy.maxWorkerPods": "64",
        "policy.maxJobGpus": "256",
        "policy.allowedNfsServers": "{nfs.storage.local}",
        "policy.allowedCsiDrivers": "{s3.csi.aws.com,gcsfuse.csi.storage.gke.io}",
        "policy.defaultQueue": "team",
        "policy.requireQueue": "true",
        "networkPolicy.enabled": "false",
        "extraEnv[0].name": "ROCMTRAIN_NOTIFY_URL",
        "extraEnv[0].value": "https://hooks.example.com/training",
    }
    objs = template(helm_home, OPERATOR_NAMESPACE, values)
    container = operator_container(objs)
    assert container["image"] == "registry.example.com/ml/operator:0.2.0"
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    config = OperatorConfig.from_env({**literal_env(container), "ROCMTRAIN_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE})
    policy = config.policy
    assert policy.images == ("registry.example.com/ml/", "ghcr.io/rocm-train-operator/")
    assert policy.priority_classes == ("training",) and policy.kueue_priority_classes == ("batch-low", "batch-high")
    assert (policy.max_worker_pods, policy.max_gpus) == (64, 256)
    assert policy.protected_namespaces == ("kube-system", "finance")
    assert policy.nfs_servers == ("nfs.storage.local",)
    assert policy.csi_drivers == ("s3.csi.aws.com", "gcsfuse.csi.storage.gke.io")
    assert (policy.default_queue, policy.require_queue) == ("team", True)
    assert config.stall_seconds == 600
    assert config.notification is not None and config.notification.url == "https://hooks.example.com/training"
    assert "NetworkPolicy" not in {o["kind"] for o in objs}


def test_the_egress_value_renders_what_the_egress_component_builds_with_the_allowed_receivers(
    helm_home: Path, tmp_path: Path
):
    values = {"namespace.create": "true", "networkPolicy.egress": "true"}
    built = overlay(tmp_path / "egress", components=["egress"])
    assert keyed(template(helm_home, OPERATOR_NAMESPACE, values)) == keyed(built)
    cidrs = {"notifications.allowedCidrs": "{10.20.0.0/16,fd00::/8}", "notifications.clusterCidrs": "{100.96.0.0/12}"}
    objs = template(helm_home, OPERATOR_NAMESPACE, {**values, **cidrs})
    (policy,) = [o for o in objs if o["metadata"]["name"] == "rocm-train-operator-egress"]
    allowed = [{"ipBlock": {"cidr": "10.20.0.0/16"}}, {"ipBlock": {"cidr": "fd00::/8"}}]
    assert policy["spec"]["egress"][-1] == {"to": allowed}
    env = {**literal_env(operator_container(objs)), "ROCMTRAIN_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE}
    receivers = OperatorConfig.from_env(env).receivers
    assert [str(n) for n in (*receivers.allowed, *receivers.cluster)] == ["10.20.0.0/16", "fd00::/8", "100.96.0.0/12"]


# ---- on the lean control plane ------------------------------------------------------------------

RELEASE = "rto-helm"


def _replica_sets(kube: KubeCluster, namespace: str) -> list[dict[str, Any]]:
    items = kube.request("GET", f"/apis/apps/v1/namespaces/{namespace}/replicasets")["items"]
    return [r for r in items if any(o["kind"] == "Deployment" for o in r["metadata"].get("ownerReferences", []))]


@pytest.fixture(scope="module")
def release(kube: KubeCluster, helm_home: Path) -> Iterator[str]:
    """The chart installed as release rto-helm in a namespace of its own (its cluster-scoped names are the
    release's, so it stands beside the session's `kubectl apply -k manifests/`); uninstalled at the end."""
    namespace = f"{RELEASE}-system"
    args = ["install", RELEASE, str(CHART), "--namespace", namespace, "--create-namespace"]
    helm([*args, "--set", "policy.allowedImages={ghcr.io/rocm-train-operator/}"], helm_home, kube.kubeconfig)
    kube.namespaces.append(namespace)
    yield namespace
    helm(["uninstall", RELEASE, "--namespace", namespace, "--ignore-not-found"], helm_home, kube.kubeconfig)


@pytest.mark.cluster
def test_helm_install_runs_a_job_to_succeeded_with_the_releases_account_and_settings(
    kube: KubeCluster, release: str, tmp_path: Path
):
    manifest = load_documents(helm(["get", "manifest", RELEASE, "-n", release], tmp_path, kube.kubeconfig))
    assert "CustomResourceDefinition" not in {o["kind"] for o in manifest}, "crds/ are never the release's"
    assert {o["metadata"]["name"] for o in manifest if o["kind"] == "ClusterRole"} == {
        RELEASE, f"{RELEASE}-cluster", f"{RELEASE}-notifications", f"{RELEASE}-metrics-reader"
    }  # fmt: skip
    env = live_env(kube, release)
    assert env["ROCMTRAIN_ALLOWED_IMAGES"] == "ghcr.io/rocm-train-operator/"
    settings = outside_settings(env)
    kubeconfig = kube.service_account_kubeconfig(release, OPERATOR_SA, tmp_path / "kubeconfig")
    api, ns = Api(kube), kube.new_namespace("helm")
    operator = Operator(kubeconfig, settings)
    operator.start()
    try:
        kube.create(job_manifest("from-helm", ns))
        kube.create(job_manifest("elsewhere", ns, image="docker.io/someone/training:1"))
        wait_until(lambda: api.rayjob(ns, "from-helm"), timeout=15, what="the RayJob")
        api.fake_kuberay(ns, "from-helm", {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "succeeded": 1})
        wait_until(lambda: api.phase(ns, "from-helm") == "Succeeded", timeout=15, what="the job to succeed")
        # The release's allow-list is the operator's: a job from another registry is refused.
        wait_until(lambda: api.phase(ns, "elsewhere") == "Failed", timeout=15, what="the other registry refused")
        assert api.rayjob(ns, "elsewhere") is None
    finally:
        operator.stop()


@pytest.mark.cluster
def test_helm_upgrade_with_changed_values_rolls_the_deployment(kube: KubeCluster, release: str, tmp_path: Path):
    wait_until(lambda: len(_replica_sets(kube, release)) == 1, timeout=15, what="the first ReplicaSet")
    args = ["upgrade", RELEASE, str(CHART), "--namespace", release, "--reuse-values"]
    helm([*args, "--set", "policy.maxJobGpus=64"], tmp_path, kube.kubeconfig)
    assert live_env(kube, release)["ROCMTRAIN_MAX_JOB_GPUS"] == "64"
    wait_until(lambda: len(_replica_sets(kube, release)) == 2, timeout=15, what="a second ReplicaSet: a rollout")
    newest = max(
        _replica_sets(kube, release),
        key=lambda r: int(r["metadata"]["annotations"]["deployment.kubernetes.io/revision"]),
    )
    assert literal_env(newest["spec"]["template"]["spec"]["containers"][0])["ROCMTRAIN_MAX_JOB_GPUS"] == "64"
    assert live_env(kube, release)["ROCMTRAIN_ALLOWED_IMAGES"] == "ghcr.io/rocm-train-operator/", "values reused"


@pytest.mark.cluster
def test_helm_uninstall_leaves_the_crd_and_the_jobs(kube: KubeCluster, release: str, tmp_path: Path):
    ns = kube.new_namespace("helm-kept")
    kube.create(job_manifest("kept", ns))
    helm(["uninstall", RELEASE, "--namespace", release, "--wait"], tmp_path, kube.kubeconfig)
    assert kube.request("GET", f"/apis/rocmtrain.dev/v1alpha1/namespaces/{ns}/rocmtrainingjobs/kept")
    assert kube.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rocmtrainingjobs.rocmtrain.dev")
    roles = kube.request("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles")["items"]
    assert not [r for r in roles if r["metadata"]["name"].startswith(RELEASE)], "the release's own objects went"
