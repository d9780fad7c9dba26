"""Record the upgrade fixtures: what this operator version writes for a running, a queued and a finished job.

    PYTHONPATH=tests/operator python -m upgrade.record tests/operator/upgrade/recorded

(from the checkout, with the test world built: `make cluster-binaries`). It starts the lean control plane,
installs the manifests, runs the operator as its ServiceAccount, and makes three jobs in the namespace
`NAMESPACE`, with KubeRay's status writes faked as in tests/operator/test_cluster.py (no KubeRay controller, no Ray):

- `running`: Ray job RUNNING, with progress and metrics as the progress endpoint writes them;
- `queued`: a job of the Kueue queue `team-a` (Kueue is not installed: it waits for Kueue's admission);
- `succeeded`: a Ray job that SUCCEEDED.

Each becomes `<case>.yaml`, one mapping: `applied`, the job as it was sent; `job` and `rayjob`, the job and its
RayJob as the API server holds them (spec with the CRD's defaults, status, labels, annotations, owner references),
without what the server sets on every object (uid, resourceVersion, generation, creationTimestamp,
managedFields) or the owner reference's uid; the job's uid reads `UID` wherever the RayJob names it.
test_crd_compat.py checks the current CRD against them; test_upgrade.py makes them
again in a fresh namespace and starts the current operator on them. The fixtures stand for an earlier
version's writes: they are recorded once per release, never by the tests.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from operator_testkit import (
    APPLIED_KINDS,
    JOBS,
    OPERATOR_NAMESPACE,
    OPERATOR_SA,
    REPO,
    RUNNING_STEPS,
    SUCCEEDED_STEP,
    Api,
    Operator,
    job_manifest,
    kustomize_build,
    wait_until,
)

import rocmtrain
from rocmtrain_testworld.kubecluster import KubeCluster, running_cluster
from upgrade.fixtures import RECORDED

NAMESPACE = "rocmtrain-upgrade-fixtures"
APPLIED = {
    "running": job_manifest("running", NAMESPACE),
    "queued": job_manifest("queued", NAMESPACE, scheduling={"queueName": "team-a"}),
    "succeeded": job_manifest("succeeded", NAMESPACE),
}
PROGRESS = {
    "progress": {"epoch": 0.4, "step": 120, "totalSteps": 285, "percent": 42.1, "etaSeconds": 610.0},
    "metrics": {"trainLoss": 0.412, "evalAccuracy": 0.91, "samplesPerSecond": 1520.0},
}
# Stands for the job's uid wherever the RayJob names it (the job's configuration in the head's environment).
UID = "RECORDED-JOB-UID"
SERVER_SET = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink")


def stripped(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` without what the API server sets on every object, and without its owners' uids."""
    meta = {key: value for key, value in obj["metadata"].items() if key not in SERVER_SET}
    if "ownerReferences" in meta:
        meta["ownerReferences"] = [{k: v for k, v in ref.items() if k != "uid"} for ref in meta["ownerReferences"]]
    return {**obj, "metadata": meta}


def _settled(api: Api, name: str, phase: str) -> None:
    wait_until(lambda: api.phase(NAMESPACE, name) == phase, timeout=10, what=f"{name} {phase}")
    time.sleep(1)  # the writes that follow a transition (events, accounting) go through


def produce(kube: KubeCluster, api: Api) -> None:
    """The three jobs, each in the state of its case, on the running operator."""
    for manifest in APPLIED.values():
        kube.create(manifest)
        name = manifest["metadata"]["name"]
        wait_until(lambda name=name: api.rayjob(NAMESPACE, name), timeout=10, what=f"RayJob {name}")
    for status, phase in RUNNING_STEPS:
        api.fake_kuberay(NAMESPACE, "running", status)
        wait_until(lambda phase=phase: api.phase(NAMESPACE, "running") == phase, timeout=5, what=phase)
    kube.request(
        "PATCH",
        JOBS.format(ns=NAMESPACE) + "/running/status",
        body={"status": {**PROGRESS, "lastProgressTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}},
        content_type="application/merge-patch+json",
    )
    _settled(api, "running", "Running")
    _settled(api, "queued", "Queued")
    for status, _ in [*RUNNING_STEPS, SUCCEEDED_STEP]:
        api.fake_kuberay(NAMESPACE, "succeeded", status)
    _settled(api, "succeeded", "Succeeded")


def _commit() -> str:
    """The commit of the operator code that runs (the `rocmtrain` package imported)."""
    code = Path(rocmtrain.__file__).parent
    result = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=code, capture_output=True, text=True)
    return result.stdout.strip() or "an unknown commit"


def record(folder: Path) -> None:
    with running_cluster() as kube, tempfile.TemporaryDirectory() as tmp:
        for obj in kustomize_build(REPO / "manifests"):
            kube.apply(obj, dry_run=obj["kind"] not in APPLIED_KINDS)
        kubeconfig = kube.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SA, Path(tmp) / "kubeconfig")
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        api, operator = Api(kube), Operator(kubeconfig, {"ROCMTRAIN_STALL_SECONDS": "900"})  # the default
        operator.start()
        try:
            produce(kube, api)
            objects = {case: (api.job(NAMESPACE, case), api.rayjob(NAMESPACE, case)) for case in APPLIED}
        finally:
            operator.stop()
    folder.mkdir(parents=True, exist_ok=True)
    header = f"# Recorded by tests/operator/upgrade/record.py from the operator at {_commit()}.\n"
    for case, (job, rayjob) in objects.items():
        assert job is not None and rayjob is not None, case
        recorded = {"applied": APPLIED[case], "job": stripped(job), "rayjob": stripped(rayjob)}
        text = yaml.safe_dump(recorded, sort_keys=True, width=1 << 20).replace(job["metadata"]["uid"], UID)
        (folder / f"{case}.yaml").write_text(header + text)


if __name__ == "__main__":
    record(Path(sys.argv[1]) if len(sys.argv) > 1 else RECORDED)
