"""The operator watching listed namespaces only, with RBAC there and nowhere else.

Real parts: `kustomize build` of an overlay with the `manifests/namespaced` component
(RoleBindings for the watched namespaces, written as the component's comment shows),
its RBAC applied to kube-apiserver, and the operator as its own process authenticated
as that ServiceAccount. The overlay adds a name prefix so that its ServiceAccount and
roles are separate from those the other operator tests use. Faked: KubeRay's status writes.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from faults.operator_process import OperatorProcess
from operator_testkit import OPERATOR_NAMESPACE, RAYJOBS, REPO, Api, job_manifest, kustomize_build, wait_until

from rocmtrain_testworld.kubecluster import KubeCluster, request

pytestmark = pytest.mark.cluster

PREFIX = "nsmode-"
# More namespaces than the reconciler's connection pool holds (32): one watch each must not starve it.
WATCHED = 40
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


@dataclass
class Namespaced:
    watched: list[str]
    outside: str
    objects: list[dict[str, Any]]
    kubeconfig: Path


def _overlay(folder: Path, watched: list[str]) -> list[dict[str, Any]]:
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "rocm-train-operator", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rocm-train-operator"},
            "subjects": [{"kind": "ServiceAccount", "name": "rocm-train-operator", "namespace": OPERATOR_NAMESPACE}],
        }
        for ns in watched
    ]
    (folder / "rolebindings.yaml").write_text(yaml.safe_dump_all(bindings))
    env = {"name": "ROCMTRAIN_NAMESPACES", "value": ",".join(watched)}
    kustomization = {
        "resources": [os.path.relpath(REPO / "manifests", folder), "rolebindings.yaml"],
        "components": [os.path.relpath(REPO / "manifests" / "namespaced", folder)],
        "namePrefix": PREFIX,
        "patches": [
            {
                "target": {"kind": "Deployment", "name": "rocm-train-operator"},
                "patch": yaml.safe_dump(
                    [{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": env}]
                ),
            }
        ],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return kustomize_build(folder)


@pytest.fixture(scope="module")
def namespaced(kube: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Namespaced:
    folder = tmp_path_factory.mktemp("namespaced")
    watched = [kube.new_namespace("watched") for _ in range(WATCHED)]
    outside = kube.new_namespace("outside")
    objects = _overlay(folder, watched)
    for obj in objects:
        if obj["kind"] == "Namespace":
            kube.apply(obj)
    for obj in objects:
        if obj["kind"] in RBAC_KINDS:
            kube.apply(obj)
    kubeconfig = kube.service_account_kubeconfig(OPERATOR_NAMESPACE, f"{PREFIX}rocm-train-operator", folder / "kc")
    return Namespaced(watched, outside, objects, kubeconfig)


def test_the_component_binds_the_namespaced_rules_in_the_watched_namespaces_only(namespaced: Namespaced):
    cluster_bindings = [o for o in namespaced.objects if o["kind"] == "ClusterRoleBinding"]
    assert [b["roleRef"]["name"] for b in cluster_bindings] == [f"{PREFIX}rocm-train-operator-cluster"]
    bound = {o["metadata"]["namespace"] for o in namespaced.objects if o["kind"] == "RoleBinding"}
    assert bound == {*namespaced.watched, OPERATOR_NAMESPACE}  # and the TLS Secret's Role at home
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(config_file=str(namespaced.kubeconfig))
    try:

        def allowed(verb: str, group: str, resource: str, namespace: str | None) -> bool:
            attributes = {"verb": verb, "group": group, "resource": resource}
            if namespace is not None:
                attributes["namespace"] = namespace
            review = request(
                api,
                "POST",
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                body={
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": attributes},
                },
            )
            return bool(review["status"]["allowed"])

        for ns in (namespaced.watched[0], namespaced.watched[-1]):
            assert allowed("create", "ray.io", "rayjobs", ns) and allowed(
                "watch", "rocmtrain.dev", "rocmtrainingjobs", ns
            )
            assert allowed("get", "", "pods", ns) and allowed("create", "", "events", ns)
            assert allowed("watch", "", "pods", ns) and allowed("watch", "kueue.x-k8s.io", "workloads", ns)
        for verb, group, resource in [("create", "ray.io", "rayjobs"), ("list", "rocmtrain.dev", "rocmtrainingjobs"),
                                      ("get", "", "pods"), ("list", "", "pods"), ("create", "", "configmaps"),
                                      ("list", "kueue.x-k8s.io", "workloads")]:  # fmt: skip
            assert not allowed(verb, group, resource, namespaced.outside), (verb, resource)
            assert not allowed(verb, group, resource, None), f"{verb} {resource} in every namespace"
        assert allowed("list", "", "nodes", None) and allowed("create", "authentication.k8s.io", "tokenreviews", None)
    finally:
        api.close()


def test_forty_namespaces_leave_the_reconciler_its_connections(
    kube: KubeCluster, api: Api, namespaced: Namespaced, tmp_path: Path
):
    operator = OperatorProcess(namespaced.kubeconfig, tmp_path, namespaced.watched)
    operator.start()
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda ns: kube.create(job_manifest("bert", ns)), [*namespaced.watched, namespaced.outside]))

        def reconciled() -> list[str]:
            return [ns for ns in namespaced.watched if not (api.rayjob(ns, "bert") and api.phase(ns, "bert"))]

        wait_until(lambda: not reconciled(), timeout=90, interval=0.5, what="a RayJob and a status in every namespace")
        last = namespaced.watched[-1]
        api.fake_kuberay(last, "bert", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
        wait_until(lambda: api.phase(last, "bert") == "Running", timeout=20, what="the 40th namespace's RayJob watched")
        assert kube.request("GET", RAYJOBS.format(ns=namespaced.outside))["items"] == [], "not watched, not touched"
        assert api.phase(namespaced.outside, "bert") is None
    finally:
        operator.stop()
