"""Helm (the build's, helm.sh/helm/v4) and the operator chart manifests/helm/rocm-train-operator.

`helm` runs the binary `make cluster-binaries` builds with its folders under a
home of the caller's (nothing read or written elsewhere); the rest reads the
operator's Deployment as the chart renders it or as a release made it: its
container, and the settings its literal `env` entries give the operator.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.gotools import go_tool
from rocmtrain_testworld.paths import REPO_ROOT
from rocmtrain_testworld.processes import ClusterError

CHART = REPO_ROOT / "manifests" / "helm" / "rocm-train-operator"
DEPLOYMENT = "rocm-train-operator"
# Settings of where the operator's own servers listen (and how): an operator outside its pod listens where
# the world says instead.
SERVER_SUFFIXES = ("_HOST", "_PORT", "_SECURE")


def helm(args: Sequence[str], home: Path, kubeconfig: Path | None = None) -> str:
    """Run helm with its own folders under ``home`` (nothing read or written elsewhere); its stdout."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    done = subprocess.run([str(go_tool("helm")), *args], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise ClusterError(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def operator_container(objs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The one container of the one Deployment among ``objs`` (a render of the chart, or the live object)."""
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def literal_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's `env` entries with a literal `value` (not those `valueFrom` fills in)."""
    return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


def live_env(cluster: KubeCluster, namespace: str) -> dict[str, str]:
    """`literal_env` of the operator's Deployment as it is in ``namespace`` now (a release's, say)."""
    deployment = cluster.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{DEPLOYMENT}")
    return literal_env(operator_container([deployment]))


def outside_settings(env: dict[str, str]) -> dict[str, str]:
    """``env`` less where the servers listen (`SERVER_SUFFIXES`): the settings an operator running outside its
    pod takes from its Deployment."""
    return {name: value for name, value in env.items() if not name.endswith(SERVER_SUFFIXES)}
