"""The full test world: the control plane plus kube-scheduler, kwok nodes, KubeRay and Kueue,
and the process runtime's nodes.

Real: etcd, kube-apiserver, kube-controller-manager (with the node lifecycle
controller: kwok renews node leases), kube-scheduler, the KubeRay operator,
Kueue with its webhooks. Faked: the GPUs and machines (kwok nodes), and what
containers do (kwok stages: Running by default; tests choose otherwise).
Stood in for (TEST-ONLY, runtime/): the kubelets and images of the process
nodes, whose pods really run, as processes on this machine; it needs root
(network namespaces), and the world starts without it where that is missing
(`World.runtime` None). Where it runs, the pods of every namespace go to its
nodes (`default` and any namespace a person creates: a job there really
trains), apart from namespaces annotated for kwok's nodes
(`runtime.namespace_annotations`, as `Scope.namespace` makes them).

Services get no endpoints: pod IPs are loopback addresses (nothing may reach
a fake pod off this machine), which EndpointSlices refuse, so the endpoint
controllers are off; nothing routes to pods here anyway (no kube-proxy, no DNS).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from rocmtrain.api.contract import OPERATOR_NAME
from rocmtrain_testworld import control_plane, kuberay, kwok, nodes, runtime, scheduler
from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.kueue import NAMESPACE as KUEUE_NAMESPACE
from rocmtrain_testworld.kueue import SERVICE_ACCOUNT as KUEUE_ACCOUNT
from rocmtrain_testworld.kueue import Kueue
from rocmtrain_testworld.paths import WORLDS_DIR
from rocmtrain_testworld.processes import ClusterError, Process, log_tail
from rocmtrain_testworld.runtime import network
from rocmtrain_testworld.sandbox import LoopbackNames

WORLD_BINARIES = ("kube-scheduler", "kwok", "kuberay-operator", "kueue")
WORLD_CONTROLLERS = (
    "*",
    "-endpointslice-controller",
    "-endpoints-controller",
    "-endpointslice-mirroring-controller",
)
TOKEN_SECONDS = 30 * 24 * 3600  # the components' ServiceAccount tokens outlive any `make cluster-up` session


class World:
    """A running world: ``cluster`` (the API, as in the lean fixture) and its component processes."""

    def __init__(self, cluster: KubeCluster, names: LoopbackNames) -> None:
        self.cluster = cluster
        self.names = names
        self.processes = cluster.processes  # the control plane's, then the components' (in start order)
        self.nodes: list[str] = []
        self.timings: dict[str, float] = {}

    @property
    def kuberay(self) -> Process:
        return self.processes["kuberay-operator"]

    @property
    def kueue(self) -> Process:
        return self.processes["kueue"]

    @property
    def kwok(self) -> Process:
        return self.processes["kwok"]

    @property
    def runtime(self) -> Process | None:
        """The process runtime (None where this machine cannot run it: see `network.available`)."""
        return self.processes.get(runtime.NAME)

    @property
    def workdir(self) -> Path:
        assert self.cluster.workdir is not None
        return self.cluster.workdir

    def schedulable_nodes(self) -> list[str]:
        items = self.cluster.request("GET", "/api/v1/nodes")["items"]
        return sorted(n["metadata"]["name"] for n in items if nodes.schedulable(n))

    def stop(self) -> None:
        """Stop every process (components first) and remove the workdir (see KubeCluster.stop)."""
        self.cluster.stop()


class Scope:
    """What one test makes in the world, removed after it so that the next test finds free GPUs.

    Namespaces (their pods gone, their kwok scripts deleted) and the objects
    passed to :meth:`apply` (cluster-scoped ones, such as Kueue's queues).
    """

    def __init__(self, world: World) -> None:
        self.world = world
        self.cluster = world.cluster
        self._namespaces: list[str] = []
        self._objects: list[dict[str, Any]] = []

    def namespace(self, prefix: str = "world", *, processes: bool | None = False) -> str:
        """A new namespace whose pods run as processes (the process runtime's nodes) with ``processes``,
        on kwok's nodes without; None: as a person makes one (no annotations: the world's default)."""
        annotations = None if processes is None else runtime.namespace_annotations(processes=processes)
        name = self.cluster.new_namespace(prefix, annotations=annotations)
        self._namespaces.append(name)
        return name

    def describe(self, lines: int = 40) -> str:
        """The pods of this test's namespaces (phase, node, container states), the tails of their
        process runtime logs, and of the runtime's and the operator's own: for failure reports."""
        out = []
        logs = self.world.workdir / "logs"
        for name in self._namespaces:
            with contextlib.suppress(Exception):
                for pod in self.cluster.request("GET", f"/api/v1/namespaces/{name}/pods")["items"]:
                    status = pod.get("status") or {}
                    states = {c["name"]: c.get("state") for c in status.get("containerStatuses") or []}
                    out.append(
                        f"pod {name}/{pod['metadata']['name']} on {pod['spec'].get('nodeName')}: "
                        f"{status.get('phase')} {states}"
                    )
            for log in sorted((logs / "pods" / name).glob("*/*.log")):
                out.append(f"---- {log.relative_to(logs)} (last {lines} lines)\n{log_tail(log, lines)}")
        for name in (runtime.NAME, OPERATOR_NAME):
            if (process := self.world.processes.get(name)) is not None:
                out.append(f"---- {process.log.name}\n{log_tail(process.log, lines)}")
        return "\n".join(out)

    def apply(self, *objects: dict[str, Any]) -> list[dict[str, Any]]:
        """Server-side apply ``objects``; they are deleted after the test (last first)."""
        self._objects.extend(objects)
        return [applied for obj in objects for applied in self.cluster.apply(obj)]

    def close(self, timeout: float = 60) -> None:
        for obj in reversed(self._objects):
            self.cluster.delete(obj)
        for name in self._namespaces:
            kwok.delete_scripts(self.cluster, name)
            self.cluster.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
            # The namespace controller reaches the pods after ~5 s; a terminating namespace takes no new
            # pods, so deleting them now frees their GPUs at once (kwok's pod-delete stage is immediate).
            with contextlib.suppress(ApiException):
                self.cluster.request("DELETE", f"/api/v1/namespaces/{name}/pods")
        for name in self._namespaces:
            self.cluster.wait_for(
                lambda ns=name: not self.cluster.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"],
                timeout,
                f"the pods of namespace {name} to be gone",
            )


def binaries_present() -> bool:
    return control_plane.binaries_present(WORLD_BINARIES)


def start(workdir: Path | None = None, *, kubeconfig_path: Path | None = None, detach: bool = False) -> World:
    """Start the whole world and wait until every component is ready (see the module docstring).

    Call it from a long-lived thread unless ``detach`` (see processes.Process).
    """
    if not binaries_present():
        raise ClusterError("world binaries missing; run `make cluster-binaries`")
    began = time.monotonic()
    runs_pods = network.available() is None
    # A fresh workdir outside /tmp (paths.WORLDS_DIR): the runtime's pod folders must stay visible in pods.
    cluster = control_plane.start(
        workdir,
        kubeconfig_path=kubeconfig_path,
        detach=detach,
        controllers=WORLD_CONTROLLERS,
        under=WORLDS_DIR,
        admission=runtime.admission_config() if runs_pods else None,
    )
    assert cluster.workdir is not None
    workdir = cluster.workdir
    world = World(cluster, LoopbackNames(workdir / "names"))
    world.timings["control plane"] = time.monotonic() - began
    try:
        _start_components(world, workdir, detach, runs_pods)
    except BaseException:
        world.stop()
        if not detach:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    world.timings["total"] = time.monotonic() - began
    return world


def _start_components(world: World, workdir: Path, detach: bool, runs_pods: bool) -> None:
    cluster, wrap = world.cluster, world.names.wrap
    began = time.monotonic()

    def add(proc: Process) -> Process:
        world.processes[proc.name] = proc
        return proc.start()

    add(scheduler.process(cluster, workdir, detach=detach))
    kueue = Kueue(workdir)
    # The CRDs first (KubeRay's, Kueue's, kwok's Stage, ours), in parallel.
    control_plane.install_crds(cluster, *kueue.crds, kwok.crd())
    world.timings["CRDs"] = time.monotonic() - began

    # API work in parallel; processes start from this thread (PR_SET_PDEATHSIG fires when the
    # thread that started a process ends, so a pool thread must not start one).
    def kuberay_rbac() -> Path:
        namespace, account = kuberay.install(cluster)
        return _token_kubeconfig(cluster, workdir, namespace, account)

    def kueue_objects() -> Path:
        kueue.install(cluster)
        return _token_kubeconfig(cluster, workdir, KUEUE_NAMESPACE, KUEUE_ACCOUNT)

    with ThreadPoolExecutor(max_workers=3) as pool:
        stages = pool.submit(kwok.install_stages, cluster)
        kuberay_kubeconfig = pool.submit(kuberay_rbac)
        kueue_kubeconfig = pool.submit(kueue_objects)
        stages.result()
        add(kwok.process(cluster, workdir, detach=detach))
        world.nodes = nodes.register_kwok(cluster)
        add(kuberay.process(cluster, workdir, kuberay_kubeconfig.result(), wrap, detach=detach))
        add(kueue.process(kueue_kubeconfig.result(), wrap, detach=detach))
        if runs_pods:
            assert cluster.pki is not None
            admin = cluster.pki.kubeconfig(cluster.server, runtime.NAME, runtime.NAME, "system:masters")
            add(runtime.process(workdir, admin, world.names.hosts.parent, detach=detach))
            world.nodes += list(runtime.PROCESS_NODES)
    world.processes["kuberay-operator"].wait_ready(60)
    world.processes["kueue"].wait_ready(90)
    world.processes["kube-scheduler"].wait_ready(60)
    if world.runtime is not None:
        world.runtime.wait_ready(60)
    control_plane.wait_controller_manager(cluster)
    # kwok marks the nodes Ready; the node lifecycle controller then lifts the not-ready taint.
    cluster.wait_for(
        lambda: world.schedulable_nodes() == sorted(world.nodes), 60, "the nodes to be Ready and untainted"
    )
    world.timings["components"] = time.monotonic() - began


def _token_kubeconfig(cluster: KubeCluster, workdir: Path, namespace: str, account: str) -> Path:
    path = workdir / f"{account}.kubeconfig"
    return cluster.service_account_kubeconfig(namespace, account, path, seconds=TOKEN_SECONDS)


def describe(world: World) -> dict[str, Any]:
    """What runs where, for people (`up` prints it)."""
    return {
        "server": world.cluster.server,
        "nodes": world.nodes,
        "processes": {name: proc.pid for name, proc in world.processes.items()},
        "timings": {k: round(v, 1) for k, v in world.timings.items()},
    }
