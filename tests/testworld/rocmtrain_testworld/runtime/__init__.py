"""TEST-ONLY: a process runtime for the world, which runs the pods of Ray clusters as processes here.

This is not a container runtime and not a product part: it stands in for the
kubelets and the container images of a real cluster, so that KubeRay starts a
real Ray cluster and our training runs end to end (tests/e2e, `make demo`).

- Nodes: the world gets `PROCESS_NODES`, CPU nodes that this runtime registers
  and keeps Ready (status and Lease, like a kubelet); they carry the label and
  NoSchedule taint `test.rocmtrain.dev/runtime=process`, so only pods that ask
  for them land there. kube-apiserver's PodNodeSelector and
  PodTolerationRestriction admission plugins make every pod ask
  (`admission_config`: the cluster's default), apart from the pods of a
  namespace whose annotations say otherwise (`namespace_annotations`: the
  tests' kwok namespaces).
- Pods: every pod bound to those nodes runs here (pod.py): its init containers,
  then its containers' command and args as processes, with the pod's
  environment (downward API resolved) and its volumes as files at their mount
  paths; the checkout's Python environment stands in for the image. Status,
  probes, restarts, deletion and finalization follow the kubelet.
- Network: each pod has a network namespace and an address of its own on a
  small bridge that reaches this machine and nothing further (network.py);
  Service names resolve to pod addresses (kubelet.py, sandbox.py), and to
  this machine's address where an EndpointSlice puts a process here behind
  the Service (`expose_host_service`, `expose_host_endpoints`).
- Containment: no process outlives the runtime (container.py), the runtime dies
  with its parent, and a runtime that was killed outright has its namespaces
  removed by the next one (or by `make cluster-down`).

Run by the world as `python -m rocmtrain_testworld.runtime` (see __main__); it writes
`runtime.json` into its folder once its nodes are registered (`info`).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.nodes import ProcessNode
from rocmtrain_testworld.paths import REPO_ROOT
from rocmtrain_testworld.processes import Process

PROCESS_NODES = ("proc-0", "proc-1")
NAME = "pod-runtime"
MODULE = "rocmtrain_testworld.runtime"
INFO_FILE = "runtime.json"
_NODE_SELECTOR_ANNOTATION = "scheduler.alpha.kubernetes.io/node-selector"
_TOLERATIONS_ANNOTATION = "scheduler.alpha.kubernetes.io/defaultTolerations"
# EndpointSlice labels: the Service a slice serves, and who keeps it. The endpointslice controller's slices of a
# selector Service are `ENDPOINTSLICE_CONTROLLER`'s (none here: the world runs without that controller); a slice
# any other manager keeps adds to them (https://kubernetes.io/docs/concepts/services-networking/endpoint-slices/).
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
ENDPOINTSLICE_CONTROLLER = "endpointslice-controller.k8s.io"
HOST_ENDPOINTS_MANAGER = "host-endpoints.test.rocmtrain.dev"


_SELECTOR = f"{ProcessNode.taint_key}={ProcessNode.taint_value}"
_TOLERATIONS = [
    {"key": ProcessNode.taint_key, "operator": "Equal", "value": ProcessNode.taint_value, "effect": "NoSchedule"}
]


def namespace_annotations(*, processes: bool) -> dict[str, str]:
    """A namespace's annotations that place its pods, whatever the cluster's default: with ``processes``
    on the process nodes, else (no selector, no toleration) where the scheduler finds room: kwok's nodes."""
    if processes:
        return {_NODE_SELECTOR_ANNOTATION: _SELECTOR, _TOLERATIONS_ANNOTATION: json.dumps(_TOLERATIONS)}
    return {_NODE_SELECTOR_ANNOTATION: "", _TOLERATIONS_ANNOTATION: "[]"}


def admission_config() -> dict[str, Any]:
    """kube-apiserver's admission configuration that sends the pods of every namespace without
    `namespace_annotations` to the process nodes: the default of a world that runs them."""
    plugins = [
        {
            "name": "PodNodeSelector",
            "configuration": {"podNodeSelectorPluginConfig": {"clusterDefaultNodeSelector": _SELECTOR}},
        },
        {
            "name": "PodTolerationRestriction",
            "configuration": {
                "apiVersion": "podtolerationrestriction.admission.k8s.io/v1alpha1",
                "kind": "Configuration",
                "default": _TOLERATIONS,
            },
        },
    ]
    return {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration", "plugins": plugins}


def process(workdir: Path, kubeconfig: Path, names: Path, *, detach: bool = False) -> Process:
    """The runtime (not started), with the checkout's Python, this checkout standing in for the image;
    ready once it has written its info. ``workdir`` may not lie under /tmp (see __main__)."""
    folder = workdir / "runtime"
    return Process(
        NAME,
        [
            "-m",
            MODULE,
            f"--kubeconfig={kubeconfig}",
            f"--folder={folder}",
            f"--logs={workdir / 'logs' / 'pods'}",
            f"--names={names}",
            f"--image={REPO_ROOT}",
        ],
        binary=sys.executable,
        identity=MODULE,
        logs=workdir / "logs",
        cwd=workdir,
        ready=lambda: (folder / INFO_FILE).is_file(),
        detach=detach,
    )


def info(workdir: Path) -> dict[str, Any]:
    """What the running runtime wrote: its pid, its address on the pod network (hostAddress), its nodes."""
    return dict(json.loads((workdir / "runtime" / INFO_FILE).read_text()))


def pod_records(workdir: Path) -> dict[str, dict[str, Any]]:
    """`<namespace>/<pod>` -> the network namespace (netns, netnsInode) and address of each pod running now."""
    found = {}
    for record in (workdir / "runtime" / "pods").glob("*/pod.json"):
        namespace, name, _ = record.parent.name.split("_")
        with contextlib.suppress(FileNotFoundError):  # the pod ended and its folder went since the glob
            found[f"{namespace}/{name}"] = json.loads(record.read_text())
    return found


def withdraw_host_endpoints(cluster: KubeCluster, namespace: str, name: str) -> None:
    """Remove what `expose_host_endpoints` made (the Service stays)."""
    cluster.delete(
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": f"{name}-host"}}, namespace
    )


def expose_host_service(cluster: KubeCluster, namespace: str, name: str, address: str, port: int) -> None:
    """A Service without selector whose one endpoint is ``address:port`` on this machine: pods reach
    a process that runs outside them (the operator's progress endpoint) by the Service's name."""
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterIP": "None", "ports": [{"name": "main", "port": port, "targetPort": port}]},
        }
    )
    expose_host_endpoints(cluster, namespace, name, address, port)


def expose_host_endpoints(cluster: KubeCluster, namespace: str, name: str, address: str, port: int) -> None:
    """An EndpointSlice `<name>-host` of the Service ``name`` whose one endpoint is ``address:port`` on this
    machine, managed by `HOST_ENDPOINTS_MANAGER` (not the endpointslice controller): the runtime adds its
    address to the Service's name whether the Service has a selector or not, as real Kubernetes keeps such
    a slice beside those its controller makes for a selector. For a Service that exists already (a Helm
    release's `rocmtrain-progress`, whose selected pod runs on a kwok node) or that `expose_host_service` makes."""
    cluster.apply(
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-host",
                "namespace": namespace,
                "labels": {SERVICE_NAME_LABEL: name, MANAGED_BY_LABEL: HOST_ENDPOINTS_MANAGER},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": "main", "port": port, "protocol": "TCP"}],
        }
    )
