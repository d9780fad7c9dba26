"""The rocm-train-operator as a process of the world, its progress endpoint reachable from the pods.

For the end-to-end tests and `make demo`: `python -m rocmtrain.controller` (the
operator image's command) as its own ServiceAccount, its metrics, liveness and
progress servers listening on this machine's address on the process runtime's
pod network (nowhere else), and the Service `rocmtrain-progress` of its
namespace pointing there (an EndpointSlice of that address), so that the
training driver in a Ray head pod reaches it by the name the operator renders
into the pod (`https://rocmtrain-progress.<namespace>.svc:<port>`) and checks
its certificate, which the operator issues for that name. Stop and start it
like a rollout would (`Process.restart`). Installed one of two ways:

- from `manifests/` (`install`, `start`; `make cluster-up` and `make demo`):
  the Namespace, ServiceAccount and RBAC of `kustomize build manifests/`
  (rocm-train-system), and a headless Service `rocmtrain-progress` without
  selector (`runtime.expose_host_service`) in place of the base's;
- as a Helm release (`install_release`, `start(world, release=...)`; the e2e
  tests): `helm install` of the chart manifests/helm/rocm-train-operator into a
  namespace of the release's own (`<release>-system`), every object of the
  chart made by Helm (its cluster-scoped names are the release's, so it stands
  beside the kustomize objects in rocm-train-system). The operator runs as the
  release's ServiceAccount with the settings of the release's Deployment (its
  literal `env`, less where its servers listen), and the chart's own
  `rocmtrain-progress` Service gets this machine's address as one more
  EndpointSlice (`runtime.expose_host_endpoints`). Faked: the Deployment's pod,
  which lands on a kwok node (the namespace is annotated so) and is played
  Running there, as there is no operator image here (on a process node it would
  really start, and fail: pods cannot reach the API server).
  `uninstall_release` removes it all but the CRD (Helm's convention).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rocmtrain.api.contract import OPERATOR_NAME
from rocmtrain.api.manifests import load_documents
from rocmtrain_testworld import runtime
from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.helm import CHART, helm, live_env, outside_settings
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
RELEASE = "rto-e2e"  # the e2e tests' release (in its namespace `rto-e2e-system`)


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
class Release:
    """A Helm release of the operator chart in the world: its name and namespace, Helm's folders (``home``)
    and the kubeconfig it was installed with."""

    name: str
    namespace: str
    home: Path
    kubeconfig: Path

    def helm(self, *args: str) -> str:
        """`helm <args>` in the release's namespace, as it was installed; its stdout."""
        return helm([*args, "--namespace", self.namespace], self.home, self.kubeconfig)

    def listed(self) -> dict[str, Any]:
        """The release as `helm list --output json` shows it (name, namespace, revision, status, chart, ...);
        Helm lists only deployed and failed releases unless asked for more."""
        (found,) = [r for r in json.loads(self.helm("list", "--output", "json")) if r["name"] == self.name]
        return dict(found)

    def kubeconfig_of_account(self, cluster: KubeCluster, workdir: Path) -> Path:
        """A kubeconfig with a token of the release's ServiceAccount."""
        path = workdir / f"{self.name}-{ACCOUNT}.kubeconfig"
        return cluster.service_account_kubeconfig(self.namespace, ACCOUNT, path, TOKEN_SECONDS)


def install_release(
    cluster: KubeCluster, workdir: Path, name: str = RELEASE, *, env: Mapping[str, str] | None = None
) -> Release:
    """`helm install <name>` of the chart into the namespace `<name>-system`, made first with the annotations
    that keep its pods on kwok's nodes (see the module docstring); ``env``: more settings, as the chart's
    `extraEnv`. The chart's CRD is the world's already (Helm installs crds/ only where missing)."""
    namespace = f"{name}-system"
    metadata = {"name": namespace, "annotations": runtime.namespace_annotations(processes=False)}
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": metadata})
    home = workdir / "helm" / name
    home.mkdir(parents=True, exist_ok=True)
    values = home / "values.yaml"
    values.write_text(yaml.safe_dump({"extraEnv": [{"name": k, "value": v} for k, v in (env or {}).items()]}))
    release = Release(name, namespace, home, cluster.kubeconfig)
    release.helm("install", name, str(CHART), "--values", str(values))
    return release


def uninstall_release(cluster: KubeCluster, release: Release) -> None:
    """Undo `install_release` and what `start` added for it (stop its operator first): this machine's
    EndpointSlice, `helm uninstall` (the CRD stays, as Helm leaves crds/), the namespace."""
    runtime.withdraw_host_endpoints(cluster, release.namespace, PROGRESS_SERVICE)
    release.helm("uninstall", release.name, "--ignore-not-found", "--wait")
    cluster.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": release.namespace}})


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
    namespace: str = NAMESPACE,
    service: bool = True,
    detach: bool = False,
    **env: str,
) -> Process:
    """The operator of ``namespace`` (not started), serving on ``address`` (the runtime's hostAddress), its
    progress endpoint an EndpointSlice of the Service `rocmtrain-progress`, which it makes too with ``service``
    (without: the Service is there, a Helm release's); ``env`` adds settings."""
    ports = ports or Ports.free()
    if service:
        runtime.expose_host_service(cluster, namespace, PROGRESS_SERVICE, address, ports.progress)
    else:
        runtime.expose_host_endpoints(cluster, namespace, PROGRESS_SERVICE, address, ports.progress)
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
            "ROCMTRAIN_OPERATOR_NAMESPACE": namespace,
            "ROCMTRAIN_PROGRESS_PORT": str(ports.progress),
            "ROCMTRAIN_PROGRESS_ADVERTISE_PORT": str(ports.progress),
            **env,
        },
        ready=lambda: http_ok(f"http://{address}:{ports.health}/healthz"),
        detach=detach,
    )


def start(world: World, *, release: Release | None = None, detach: bool = False, **env: str) -> Process:
    """Start the operator in ``world`` (which runs the process runtime); it joins the world's processes.
    Without ``release``, installed from manifests/ (`install`); with it, as that Helm release's ServiceAccount
    with the settings of its Deployment as it is now. ``env`` adds settings."""
    cluster, workdir = world.cluster, world.workdir
    address = runtime.info(workdir)["hostAddress"]
    if release is None:
        operator = process(cluster, workdir, install(cluster, workdir), address, detach=detach, **env)
    else:
        kubeconfig = release.kubeconfig_of_account(cluster, workdir)
        settings = {**outside_settings(live_env(cluster, release.namespace)), **env}
        operator = process(
            cluster, workdir, kubeconfig, address, namespace=release.namespace, service=False, detach=detach, **settings
        )
    world.processes[operator.name] = operator
    operator.start()
    operator.wait_ready(60)
    return operator
