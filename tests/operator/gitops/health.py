"""What GitOps tools make of a RocmTrainingJob: Argo CD's health (manifests/argocd/health.lua run by a real
Lua 5.1 interpreter, as Argo CD runs it) and Flux's (kstatus, built from sigs.k8s.io/cli-utils).

`CASES` names each situation a job can be in and what both tools must say about it; the
live test (test_gitops.py) produces each one on the control plane, and
can record them under `recorded/` (`ROCMTRAIN_RECORD_STATUSES=tests/operator/gitops/recorded`), which
test_gitops_recorded.py checks without a cluster.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import lupa.lua51 as lua51

from rocmtrain_testworld.gotools import go_tool

REPO = Path(__file__).resolve().parents[3]
HEALTH_LUA = REPO / "manifests" / "argocd" / "health.lua"
ARGOCD_CM_PATCH = REPO / "manifests" / "argocd" / "argocd-cm-patch.yaml"
ARGOCD_KEY = "resource.customizations.health.rocmtrain.dev_RocmTrainingJob"
RECORDED = Path(__file__).resolve().parent / "recorded"

# case -> (Argo CD health, kstatus status)
CASES: dict[str, tuple[str, str]] = {
    "not-yet-seen": ("Progressing", "InProgress"),
    "spec-change-not-yet-seen": ("Progressing", "InProgress"),
    "pending": ("Progressing", "InProgress"),
    "unschedulable": ("Degraded", "InProgress"),
    "queued": ("Suspended", "InProgress"),
    "initializing": ("Progressing", "InProgress"),
    "running": ("Healthy", "Current"),
    "stalled": ("Degraded", "Failed"),
    "suspended": ("Suspended", "Current"),
    "succeeded": ("Healthy", "Current"),
    "failed": ("Degraded", "Failed"),
    "invalid-spec": ("Degraded", "Failed"),
}


def argocd_health(job: Mapping[str, Any]) -> dict[str, str]:
    """Argo CD's health of `job`: health.lua with the object as its global `obj`."""
    runtime = lua51.LuaRuntime()
    runtime.globals().obj = runtime.table_from(json.loads(json.dumps(job)), recursive=True)
    result = runtime.execute(HEALTH_LUA.read_text())
    return {"status": result["status"], "message": result["message"]}


def kstatus(jobs: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """kstatus' computed status of each job (Flux's health check)."""
    lines = "".join(json.dumps(job) + "\n" for job in jobs)
    result = subprocess.run([str(go_tool("kstatus"))], input=lines, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in result.stdout.splitlines()]


def record(folder: Path, case: str, job: Mapping[str, Any]) -> None:
    """Write `job` as recorded fixture `case`: the parts the health checks read."""
    meta = job["metadata"]
    kept = {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "metadata": {"name": meta["name"], "namespace": "ml-team", "generation": meta["generation"]},
        "spec": job["spec"],
        **({"status": job["status"]} if "status" in job else {}),
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{case}.json").write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
