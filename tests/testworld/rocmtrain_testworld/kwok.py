"""kwok (sigs.k8s.io/kwok): the world's kubelets. It keeps the fake nodes Ready and plays pod lifecycles.

Stages are API objects (kwok's Stage CRD), so tests add and remove them while
kwok runs. Installed at start: kwok's stock node stages (initialize, heartbeat
with lease), its stock pod-ready and pod-delete stages (pod-ready skips pods
with a behaviour annotation), and the harness's behaviours
(kwok_behaviours.yaml). What a test can do:

- ``set_behaviour(pod, "exit", exit_code=0)``: a live pod's containers now
  exit, crash-loop, fail to pull their image, or run again;
- ``script(namespace, behaviour, labels)``: pods of that namespace (and
  labels) that get scheduled from now on take that behaviour at once (until
  the returned stage is deleted): e.g. every worker's image fails to pull.

A pod that cannot be scheduled stays Pending with the scheduler's reason: no
stage is needed for that.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import yaml

from rocmtrain_testworld.api import KubeCluster, load_cached, load_documents
from rocmtrain_testworld.nodes import KWOK_ANNOTATION
from rocmtrain_testworld.paths import MANIFESTS_DIR
from rocmtrain_testworld.processes import Process

BEHAVIOUR = "kwok.rocmtrain.dev/behaviour"
EXIT_CODE = "kwok.rocmtrain.dev/exit-code"
BEHAVIOURS = ("running", "exit", "crash-loop", "image-pull-error")
BEHAVIOURS_FILE = Path(__file__).with_name("kwok_behaviours.yaml")
STAGE_API = "/apis/kwok.x-k8s.io/v1alpha1/stages"
# Node leases, renewed by kwok; the node lifecycle controller marks a node
# NotReady when its lease is older than its grace period.
NODE_LEASE_SECONDS = 40
_script_ids = itertools.count()


def _manifests() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """kwok's Stage CRD and stock stages (from its module), the stock pod-ready made to skip annotated pods."""
    crd, *stages = load_cached(MANIFESTS_DIR / "kwok.yaml")
    for stage in stages:
        if stage["metadata"]["name"] == "pod-ready":
            stage["spec"]["selector"]["matchExpressions"].append(
                {"key": f'.metadata.annotations["{BEHAVIOUR}"]', "operator": "DoesNotExist"}
            )
    return crd, stages


def crd() -> dict[str, Any]:
    return _manifests()[0]


def install_stages(cluster: KubeCluster) -> None:
    """The stock and harness stages (the Stage CRD must be Established)."""
    _, stages = _manifests()
    for stage in [*stages, *load_documents(BEHAVIOURS_FILE)]:
        cluster.apply(stage)


def process(cluster: KubeCluster, workdir: Path, *, detach: bool = False) -> Process:
    """kwok (not started), managing the nodes annotated ``kwok.x-k8s.io/node: fake``.

    Pod IPs come from each node's spec.podCIDR (loopback, see nodes.py); the
    fallback CIDR is loopback too. No kwok server (logs, exec, metrics) runs.
    """
    assert cluster.pki is not None, "kwok runs beside a local control plane"
    # kwok writes the status of nodes and pods like a kubelet, and Leases: an admin credential.
    kubeconfig = cluster.pki.kubeconfig(cluster.server, "kwok", "kwok", "system:masters")
    config = workdir / "kwok.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
                "kind": "KwokConfiguration",
                "options": {
                    "cidr": "127.40.255.0/24",
                    "enableCRDs": ["Stage"],
                    "manageNodesWithAnnotationSelector": f"{KWOK_ANNOTATION}=fake",
                    "nodeLeaseDurationSeconds": NODE_LEASE_SECONDS,
                    "enableDebuggingHandlers": False,
                    # kwok defaults these only when it reads no configuration file.
                    "podPlayStageParallelism": 4,
                    "nodePlayStageParallelism": 4,
                    "nodeLeaseParallelism": 4,
                    "podsOnNodeSyncParallelism": 2,
                    "enablePodsOnNodeSyncListPager": True,
                    "enablePodsOnNodeSyncStreamWatch": False,
                },
            }
        )
    )
    return Process(
        "kwok",
        [f"--config={config}", f"--kubeconfig={kubeconfig}"],
        logs=workdir / "logs",
        cwd=workdir,
        detach=detach,
    )


def set_behaviour(cluster: KubeCluster, pod: dict[str, Any], behaviour: str, exit_code: int | None = None) -> None:
    """Make a live pod's containers take ``behaviour`` (see the module docstring)."""
    annotations = {BEHAVIOUR: _check(behaviour), EXIT_CODE: None if exit_code is None else str(exit_code)}
    meta = pod["metadata"]
    cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
        body={"metadata": {"annotations": annotations}},
        content_type="application/merge-patch+json",
    )


def script(
    cluster: KubeCluster,
    namespace: str,
    behaviour: str,
    labels: dict[str, str] | None = None,
    exit_code: int | None = None,
) -> str:
    """Pods in ``namespace`` with ``labels`` take ``behaviour`` as soon as they are scheduled; the stage's name.

    Pods scheduled before the stage exists are not touched (use
    :func:`set_behaviour`). Delete the stage with :func:`delete_stage`, or let
    :func:`delete_scripts` do it with the namespace.
    """
    annotations = {BEHAVIOUR: _check(behaviour)}
    if exit_code is not None:
        annotations[EXIT_CODE] = str(exit_code)
    name = f"script-{namespace}-{next(_script_ids)}-{uuid.uuid4().hex[:4]}"
    stage = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name, "labels": {"kwok.rocmtrain.dev/namespace": namespace}},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            # Outweighs the stock pod-ready stage (weight 0), so it wins the pod.
            "weight": 10,
            "selector": {
                "matchLabels": dict(labels or {}),
                "matchExpressions": [
                    {"key": ".metadata.namespace", "operator": "In", "values": [namespace]},
                    {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                    {"key": f'.metadata.annotations["{BEHAVIOUR}"]', "operator": "DoesNotExist"},
                ],
            },
            "next": {
                "patches": [{"type": "merge", "template": yaml.safe_dump({"metadata": {"annotations": annotations}})}]
            },
        },
    }
    cluster.create(stage)
    return name


def delete_stage(cluster: KubeCluster, name: str) -> None:
    cluster.delete({"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}})


def delete_scripts(cluster: KubeCluster, namespace: str) -> None:
    """Delete every stage :func:`script` made for ``namespace``."""
    cluster.request("DELETE", STAGE_API, query={"labelSelector": f"kwok.rocmtrain.dev/namespace={namespace}"})


def _check(behaviour: str) -> str:
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"unknown kwok behaviour {behaviour!r}; one of {', '.join(BEHAVIOURS)}")
    return behaviour
