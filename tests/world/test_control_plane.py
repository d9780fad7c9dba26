"""Smoke tests proving the test control plane is a real Kubernetes API server."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from rocmtrain_testworld.kubecluster import CRDS_DIR, GPU_RESOURCE, KubeCluster

pytestmark = pytest.mark.cluster

OUR_CRD = CRDS_DIR / "rocmtrain.dev_rocmtrainingjobs.yaml"


def _status(err: ApiException) -> tuple[int, str]:
    return int(err.status or 0), str(err.body or "")


def _served_version(crd: dict[str, Any]) -> str:
    versions = crd["spec"]["versions"]
    return next((v["name"] for v in versions if v.get("storage")), versions[0]["name"])


def _rocm_training_job(namespace: str, version: str, model: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"rocmtrain.dev/{version}",
        "kind": "RocmTrainingJob",
        "metadata": {"name": "cel-check", "namespace": namespace},
        "spec": {
            "model": model,
            "data": {"train": {"uri": "s3://datasets/reviews/train.jsonl"}},
            "checkpoint": {"storagePath": "s3://checkpoints/cel-check"},
        },
    }


def test_our_crd_rejects_invalid_object_with_cel_message(kube: KubeCluster) -> None:
    if not OUR_CRD.is_file():
        pytest.skip(f"{OUR_CRD.name} not generated yet")
    assert OUR_CRD.name not in kube.crd_errors, f"kube-apiserver rejected the CRD: {kube.crd_errors[OUR_CRD.name]}"
    version = _served_version(yaml.safe_load(OUR_CRD.read_text()))
    ns = kube.new_namespace("cel")
    model = {"source": "distilbert/distilbert-base-uncased", "task": "sequence-classification"}

    with pytest.raises(ApiException) as info:
        kube.create(_rocm_training_job(ns, version, model))
    status, body = _status(info.value)
    assert status == 422, body
    assert "numLabels is required when task is sequence-classification" in body

    # The same object with numLabels passes, so the 422 came from that rule alone.
    kube.create(_rocm_training_job(ns, version, {**model, "numLabels": 2}), dry_run=True)


def _rayjob(name: str, namespace: str) -> dict[str, Any]:
    image = "rocm/ray:latest"
    worker_resources = {GPU_RESOURCE: "8", "cpu": "32", "memory": "256Gi"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "entrypoint": "python -m rocmtrain.train",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 60,
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {"num-gpus": "0"},
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "ray-head",
                                    "image": image,
                                    "resources": {"limits": {"cpu": "4", "memory": "16Gi"}},
                                }
                            ]
                        }
                    },
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "mi300x",
                        "replicas": 2,
                        "minReplicas": 2,
                        "maxReplicas": 2,
                        "rayStartParams": {},
                        "template": {
                            "spec": {
                                "nodeSelector": {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"},
                                "containers": [
                                    {
                                        "name": "ray-worker",
                                        "image": image,
                                        "resources": {"limits": worker_resources, "requests": worker_resources},
                                    }
                                ],
                            }
                        },
                    }
                ],
            },
        },
    }


def test_rayjob_dry_run_against_kuberay_crd(kube: KubeCluster) -> None:
    ns = kube.new_namespace("rayjob")
    good = _rayjob("smoke", ns)
    created = kube.request(
        "POST",
        f"/apis/ray.io/v1/namespaces/{ns}/rayjobs",
        query={"dryRun": "All", "fieldValidation": "Strict"},
        body=good,
    )
    assert created["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2
    # Dry run: nothing was stored.
    with pytest.raises(ApiException) as missing:
        kube.request("GET", f"/apis/ray.io/v1/namespaces/{ns}/rayjobs/smoke")
    assert missing.value.status == 404

    bad = copy.deepcopy(good)
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "two"
    with pytest.raises(ApiException) as info:
        kube.create(bad, dry_run=True)
    status, body = _status(info.value)
    assert status == 422, body
    assert "workerGroupSpecs[0].replicas" in body


def test_deleting_owner_garbage_collects_dependents(kube: KubeCluster) -> None:
    ns = kube.new_namespace("gc")
    owner = kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner", "namespace": ns}})
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "namespace": ns,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
            ],
        },
        "data": {"k": "v"},
    }
    kube.create(child)
    kube.delete(owner, propagation="Background")

    deadline = time.monotonic() + 30
    while True:
        try:
            kube.request("GET", f"/api/v1/namespaces/{ns}/configmaps/child")
        except ApiException as e:
            assert e.status == 404
            break
        assert time.monotonic() < deadline, "child ConfigMap not garbage-collected within 30s"
        time.sleep(0.2)


def test_bound_service_account_token_passes_token_review(kube: KubeCluster) -> None:
    ns = kube.new_namespace("token")
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer", "namespace": ns}})
    pod = kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "trainer-0", "namespace": ns},
            "spec": {
                "serviceAccountName": "trainer",
                "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}],
            },
        }
    )
    audience = "rocmtrain-test"
    token_request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [audience],
            "expirationSeconds": 600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "trainer-0", "uid": pod["metadata"]["uid"]},
        },
    }
    issued = kube.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/trainer/token", body=token_request)
    token = issued["status"]["token"]

    def review(audiences: list[str]) -> dict[str, Any]:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences},
        }
        return kube.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body)["status"]

    ok = review([audience])
    assert ok.get("authenticated") is True, ok
    assert ok["user"]["username"] == f"system:serviceaccount:{ns}:trainer"
    assert ok["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["trainer-0"]
    assert ok["audiences"] == [audience]

    wrong = review(["someone-else"])
    assert not wrong.get("authenticated"), wrong


def test_fake_amd_gpu_nodes_are_registered(kube: KubeCluster) -> None:
    with kube.api_client() as api:
        nodes = k8s.CoreV1Api(api).list_node().items
    gpu_nodes = [n for n in nodes if n.status and n.status.allocatable and GPU_RESOURCE in n.status.allocatable]
    assert gpu_nodes, "no node advertises amd.com/gpu"
    if not kube.external:
        assert len(gpu_nodes) == 2
        for node in gpu_nodes:
            assert node.status.allocatable[GPU_RESOURCE] == "8"
            assert node.status.capacity[GPU_RESOURCE] == "8"
            assert node.metadata.labels["amd.com/gpu.product-name"] == "AMD_Instinct_MI300X_OAM"
            ready = {c.type: c.status for c in node.status.conditions}
            assert ready["Ready"] == "True"
