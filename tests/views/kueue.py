"""Kueue's CRDs (v0.17.0, from the sigs.k8s.io/kueue Go module) and objects as Kueue writes them.

No Kueue controller runs in the lean test cluster: the tests write ClusterQueue and
Workload status the way Kueue's controllers do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gotools import module_dir

MODULE, VERSION = "sigs.k8s.io/kueue", "v0.17.0"
API = "kueue.x-k8s.io/v1beta2"
KINDS = ("clusterqueues", "localqueues", "workloads", "resourceflavors")


def crd_paths() -> list[Path]:
    bases = module_dir(MODULE, VERSION) / "config" / "components" / "crd" / "bases"
    return [bases / f"kueue.x-k8s.io_{kind}.yaml" for kind in KINDS]


def cluster_queue(name: str, cohort: str, flavor: str, quota: int, borrowing: int) -> dict[str, Any]:
    resource = {"name": "amd.com/gpu", "nominalQuota": quota, "borrowingLimit": borrowing}
    return {
        "apiVersion": API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "cohortName": cohort,
            "namespaceSelector": {},
            "resourceGroups": [
                {"coveredResources": ["amd.com/gpu"], "flavors": [{"name": flavor, "resources": [resource]}]}
            ],
        },
    }


def workload(namespace: str, name: str, queue: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "queueName": queue,
            "podSets": [
                {
                    "name": "workers",
                    "count": 1,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "ray-worker",
                                    "image": "ghcr.io/rocm-train-operator/training:0.1.0",
                                    "resources": {"requests": {"amd.com/gpu": str(gpus)}},
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }
