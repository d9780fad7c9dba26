"""The fake nodes: AMD GPU machines (and a CPU-only one) that no kubelet runs.

Faked: the GPUs (an `amd.com/gpu` count and the labels AMD's node labeller
would publish) and the machines. Two kinds of fake node:

- plain (the lean control plane): Node objects made Ready once, never
  heartbeating; pods on them stay Pending (no scheduler either);
- kwok (the full world): the same objects annotated for kwok, which keeps them
  Ready with heartbeats and leases and plays the lifecycle of the pods the real
  kube-scheduler binds to them;
- process nodes (the full world, TEST-ONLY): CPU machines whose pods the process
  runtime (runtime/) really runs; it registers them and renews their leases like
  a kubelet. Labelled and tainted so that only pods that ask for them land
  there (the world's default: see runtime.admission_config).

Addresses are loopback addresses (127.0.0.0/8): pod and node IPs that anything
would ever dial must keep that traffic on this machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rocmtrain_testworld.api import FIELD_MANAGER, KubeCluster

GPU_RESOURCE = "amd.com/gpu"
PRODUCT_LABEL = "amd.com/gpu.product-name"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KUBE_VERSION = "v1.36.3"
PLAIN_NODE_COUNT = 2

# Labels as AMD's node labeller publishes them, per GPU model.
MI300X_LABELS = {
    PRODUCT_LABEL: "AMD_Instinct_MI300X_OAM",
    "amd.com/gpu.family": "AI",
    "amd.com/gpu.vram": "192G",
    "amd.com/gpu.device-id": "74a1",
    "amd.com/gpu.cu-count": "304",
    "amd.com/gpu.simd-count": "1216",
    "amd.com/gpu.driver-version": "6.10.5",
    "amd.com/gpu.compute-partitioning-mode": "spx",
    "amd.com/gpu.memory-partitioning-mode": "nps1",
}
MI250_LABELS = {
    PRODUCT_LABEL: "AMD_Instinct_MI250",
    "amd.com/gpu.family": "AI",
    "amd.com/gpu.vram": "64G",
    "amd.com/gpu.device-id": "740c",
    "amd.com/gpu.cu-count": "104",
    "amd.com/gpu.simd-count": "416",
    "amd.com/gpu.driver-version": "6.10.5",
}


@dataclass(frozen=True)
class FakeNode:
    """One machine: its name, GPU model labels, allocatable resources and loopback addresses."""

    name: str
    index: int
    gpus: int = 0
    gpu_labels: dict[str, str] = field(default_factory=dict)
    cpu: str = "192"
    memory: str = "2Ti"
    pods: int = 110  # at most 254: kwok takes pod IPs from the node's /24
    gpu_resource: str = GPU_RESOURCE  # or a partition's, as the device plugin's mixed naming names it

    @property
    def address(self) -> str:
        return f"127.40.0.{self.index + 1}"

    runtime_version = "containerd://1.7.19"

    @property
    def pod_cidr(self) -> str:
        """Where kwok takes pod IPs from for this node: loopback, /24 per node."""
        return f"127.40.{self.index + 1}.0/24"

    @property
    def resources(self) -> dict[str, str]:
        out = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods), "ephemeral-storage": "1Ti"}
        if self.gpus:
            out[self.gpu_resource] = str(self.gpus)
        return out

    def labels(self) -> dict[str, str]:
        instance = f"fake-{self.gpu_labels[PRODUCT_LABEL].lower()}-{self.gpus}" if self.gpus else "fake-cpu"
        return {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": instance,
            **self.gpu_labels,
        }


# The full world: two GPU models, so that a job's GPU model picks its nodes.
WORLD_NODES = (
    FakeNode("gpu-mi300x-0", 0, gpus=8, gpu_labels=MI300X_LABELS),
    FakeNode("gpu-mi300x-1", 1, gpus=8, gpu_labels=MI300X_LABELS),
    FakeNode("gpu-mi250-0", 2, gpus=4, gpu_labels=MI250_LABELS, cpu="128", memory="1Ti"),
    FakeNode("cpu-0", 3, cpu="64", memory="256Gi"),
)


@dataclass(frozen=True)
class ProcessNode:
    """A node of the process runtime: this machine, at its address on the pod network."""

    name: str
    address: str
    cpu: str = "16"
    memory: str = "64Gi"
    runtime_version = "process://0.1.0"
    taint_key = "test.rocmtrain.dev/runtime"
    taint_value = "process"

    @property
    def resources(self) -> dict[str, str]:
        return {"cpu": self.cpu, "memory": self.memory, "pods": "110", "ephemeral-storage": "100Gi"}

    def labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "process",
            self.taint_key: self.taint_value,
        }

    def taint(self) -> dict[str, str]:
        return {"key": self.taint_key, "value": self.taint_value, "effect": "NoSchedule"}


def _status(node: FakeNode | ProcessNode, conditions: bool) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def cond(kind: str, status: str, reason: str) -> dict[str, str]:
        return {"type": kind, "status": status, "reason": reason, "lastHeartbeatTime": now, "lastTransitionTime": now}

    status: dict[str, Any] = {
        "capacity": node.resources,
        "allocatable": node.resources,
        "addresses": [{"type": "InternalIP", "address": node.address}, {"type": "Hostname", "address": node.name}],
        "nodeInfo": {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "osImage": "Ubuntu 22.04.4 LTS",
            "kernelVersion": "5.15.0-116-generic",
            "containerRuntimeVersion": node.runtime_version,
            "kubeletVersion": KUBE_VERSION,
            "kubeProxyVersion": "",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }
    if conditions:
        status["conditions"] = [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID"),
            cond("Ready", "True", "KubeletReady"),
        ]
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name}, "status": status}


def _register(cluster: KubeCluster, node: FakeNode, *, kwok: bool) -> None:
    meta: dict[str, Any] = {"name": node.name, "labels": node.labels()}
    if kwok:
        meta["annotations"] = {KWOK_ANNOTATION: "fake"}
    spec = {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr]} if kwok else {}
    cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec})
    # kwok writes the conditions (and keeps them fresh); plain nodes get them once, here.
    cluster.request(
        "PATCH",
        f"/api/v1/nodes/{node.name}/status",
        query={"fieldManager": FIELD_MANAGER, "force": "true"},
        body=_status(node, conditions=not kwok),
        content_type="application/apply-patch+yaml",
    )


def register_process(cluster: KubeCluster, node: ProcessNode) -> None:
    """Create (or update) a process node, tainted for the pods meant for it, and report it Ready."""
    meta = {"name": node.name, "labels": node.labels()}
    cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": {"taints": [node.taint()]}})
    heartbeat(cluster, node)


def heartbeat(cluster: KubeCluster, node: ProcessNode) -> None:
    """Report the node Ready now (its status), and renew its Lease, as a kubelet does."""
    cluster.request(
        "PATCH",
        f"/api/v1/nodes/{node.name}/status",
        query={"fieldManager": FIELD_MANAGER, "force": "true"},
        body=_status(node, conditions=True),
        content_type="application/apply-patch+yaml",
    )
    now = time.time()
    micro = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node.name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node.name, "leaseDurationSeconds": 40, "renewTime": micro},
    }
    cluster.apply(lease)


def register_plain(cluster: KubeCluster, count: int = PLAIN_NODE_COUNT, gpus: int = 8) -> list[str]:
    """``count`` Ready MI300X nodes with ``gpus`` GPUs each, for a control plane without kwok; their names."""
    names = []
    for i in range(count):
        node = FakeNode(f"fake-mi300x-{i}", 100 + i, gpus=gpus, gpu_labels=MI300X_LABELS)
        _register(cluster, node, kwok=False)
        # Admission (TaintNodesByCondition) taints new nodes not-ready; without
        # a node-lifecycle controller nothing would lift it.
        cluster.request(
            "PATCH",
            f"/api/v1/nodes/{node.name}",
            body={"spec": {"taints": None}},
            content_type="application/merge-patch+json",
        )
        names.append(node.name)
    return names


def register_kwok(cluster: KubeCluster, world: tuple[FakeNode, ...] = WORLD_NODES) -> list[str]:
    """Create the world's nodes for kwok to run; their names (kwok and the node controller make them Ready)."""
    for node in world:
        _register(cluster, node, kwok=True)
    return [node.name for node in world]


def schedulable(node: dict[str, Any]) -> bool:
    """Ready, and without the taints a not-ready or unreachable node carries."""
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))
    taints = node.get("spec", {}).get("taints") or []
    return (
        ready
        and not node.get("spec", {}).get("unschedulable")
        and not any(t["key"].startswith("node.kubernetes.io/") for t in taints)
    )
