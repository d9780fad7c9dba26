"""The rocm-train-operator as a process of the world, its progress endpoint reachable from the pods.

For the end-to-end tests and `make demo`: `python -m rocmtrain.controller` (the
operator image's command) as its own ServiceAccount with the RBAC of
`manifests/`, its metrics, liveness and progress servers listening on this
machine's address on the process runtime's pod network (nowhere else), and
the Service `rocmtrain-progress` of its namespace made to point there
(`runtime.expose_host_service`), so that the training driver in a Ray head pod
reaches it by the name the operator renders into the pod
(`https://rocmtrain-progress.rocm-train-system.svc:<port>`) and checks its
certificate, which the operator issues for that name. Stop and start it like
a rollout would (`Process.restart`).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmtrain.api.contract import OPERATOR_NAME
from rocmtrain.api.manifests import load_documents
from rocmtrain_testworld import runtime
from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.paths import BIN_DIR, REPO_ROOT
from rocmtrain_testworld.processes import ClusterError, Process, free_port, http_ok
from rocmtrain_testworld.world import World

NAMESPACE = "rocm-train-system"
ACCOUNT = "rocm-train-operator"
PROGRESS_SERVICE = "rocmtrain-progress"
# What `kubectl apply -k manifests/` makes that a process outside the cluster needs (no Deployment, no Services).
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
NAME = OPERATOR_NAME
IDENTITY = "rocmtrain.controller"  # what `processes.is_ours` finds in its command line
TOKEN_SECONDS = 30 * 24 * 3600


def kustomize(folder: Path) -> list[dict[str, Any]]:
    """`kustomize build folder` (the kustomize of `make cluster-binaries`), as objects read as kubectl
    reads them (YAML 1.2 numbers: `5e-05`)."""
    binary = BIN_DIR / "kustomize"
    if not binary.is_file():
        raise ClusterError(f"no kustomize in {BIN_DIR}; run `make cluster-binaries`")
    out = subprocess.run([str(binary), "build", str(folder)], capture_output=True, text=True, check=True)
    return load_documents(out.stdout)


def install(cluster: KubeCluster, workdir: Path) -> Path:
    """The operator's namespace, ServiceAccount and RBAC from manifests/; a kubeconfig with its token."""
    for obj in kustomize(REPO_ROOT / "manifests"):
        if obj["kind"] in RBAC_KINDS:
            cluster.apply(obj)
    return cluster.service_account_kubeconfig(NAMESPACE, ACCOUNT, workdir / f"{ACCOUNT}.kubeconfig", TOKEN_SECONDS)


@dataclass(frozen=True)
class Ports:
    """The operator's ports on this machine. Running jobs were told the progress port: an operator
    that replaces another (a restart, `make run-operator`) keeps its ports."""

    metrics: int
    health: int
    progress: int

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port())


def process(
    cluster: KubeCluster,
    workdir: Path,
    kubeconfig: Path,
    address: str,
    *,
    ports: Ports | None = None,
    detach: bool = False,
    **env: str,
) -> Process:
    """The operator (not started), serving on ``address`` (the runtime's hostAddress); ``env`` adds settings."""
    ports = ports or Ports.free()
    runtime.expose_host_service(cluster, NAMESPACE, PROGRESS_SERVICE, address, ports.progress)
    return Process(
        NAME,
        ["-m", "rocmtrain.controller"],
        binary=sys.executable,
        identity=IDENTITY,
        logs=workdir / "logs",
        cwd=workdir,
        env={
            "KUBECONFIG": str(kubeconfig),
            "ROCMTRAIN_METRICS_HOST": address,
            "ROCMTRAIN_HEALTH_HOST": address,
            "ROCMTRAIN_PROGRESS_HOST": address,
            "ROCMTRAIN_METRICS_PORT": str(ports.metrics),
            "ROCMTRAIN_HEALTH_PORT": str(ports.health),
            "ROCMTRAIN_OPERATOR_NAMESPACE": NAMESPACE,
            "ROCMTRAIN_PROGRESS_PORT": str(ports.progress),
            "ROCMTRAIN_PROGRESS_ADVERTISE_PORT": str(ports.progress),
            **env,
        },
        ready=lambda: http_ok(f"http://{address}:{ports.health}/healthz"),
        detach=detach,
    )


def start(world: World, *, detach: bool = False, **env: str) -> Process:
    """Install and start the operator in ``world`` (which runs the process runtime); it joins the world's processes."""
    kubeconfig = install(world.cluster, world.workdir)
    address = runtime.info(world.workdir)["hostAddress"]
    operator = process(world.cluster, world.workdir, kubeconfig, address, detach=detach, **env)
    world.processes[operator.name] = operator
    operator.start()
    operator.wait_ready(60)
    return operator
