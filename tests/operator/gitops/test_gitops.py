"""GitOps health of real jobs: each situation a job can be in, produced by the operator on the control plane
(KubeRay's status writes faked as in test_cluster; no Kueue installed, as there), then judged by
Argo CD's Lua health check and by Flux's kstatus (see health.py).

`ROCMTRAIN_RECORD_STATUSES=tests/operator/gitops/recorded pytest tests/operator/gitops/test_gitops.py` writes
the objects as the recorded fixtures that test_gitops_recorded.py checks without a cluster.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest
from operator_testkit import JOBS, STALL_SECONDS, Api, Operator, job_manifest, wait_until

from gitops.health import CASES, argocd_health, kstatus, record
from rocmtrain.api.condition_reasons import ConditionType
from rocmtrain_testworld.kubecluster import KubeCluster

pytestmark = pytest.mark.cluster

STARTED = {
    "jobDeploymentStatus": "Initializing",
    "jobStatus": "",
    "jobId": "job-x1",
    "rayClusterName": "job-abcde",
    "startTime": "2026-01-02T03:04:05Z",
}
RUNNING = {
    "jobDeploymentStatus": "Running",
    "jobStatus": "RUNNING",
    "rayClusterStatus": {"readyWorkerReplicas": 2, "desiredWorkerReplicas": 2, "state": "ready"},
}
EXIT_1 = "Job entrypoint command failed with exit code 1"
PROGRESS = {
    "progress": {"epoch": 0.4, "step": 120, "totalSteps": 285, "percent": 42.1, "etaSeconds": 610.0},
    "metrics": {"trainLoss": 0.412, "evalAccuracy": 0.91, "samplesPerSecond": 1520.0},
}


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _report_progress(kube: KubeCluster, ns: str, name: str) -> None:
    """Write progress as the progress endpoint does (status subresource)."""
    body = {"status": {**PROGRESS, "lastProgressTime": _now()}}
    path = JOBS.format(ns=ns) + f"/{name}/status"
    kube.request("PATCH", path, body=body, content_type="application/merge-patch+json")


# The session's operator may still be busy with earlier modules' jobs (their namespaces being deleted): a wait
# returns as soon as its state is there, and only a stuck one takes this long.
WAIT = 30


def _phase(api: Api, ns: str, name: str, phase: str, timeout: float = WAIT) -> dict[str, Any]:
    return wait_until(
        lambda: (job := api.job(ns, name)) and (job.get("status") or {}).get("phase") == phase and job,
        timeout=timeout,
        what=f"{name} {phase}",
    )


def _started(kube: KubeCluster, api: Api, ns: str, name: str, **spec: Any) -> None:
    kube.create(job_manifest(name, ns, **spec))
    wait_until(lambda: api.rayjob(ns, name), timeout=WAIT, what=f"RayJob {name}")
    api.fake_kuberay(ns, name, STARTED)
    _phase(api, ns, name, "Initializing")


def produce_cases(kube: KubeCluster, api: Api, ns: str, operator: Operator) -> dict[str, dict[str, Any]]:
    """Each case of `CASES`, as a job object read back from the API server."""
    jobs: dict[str, dict[str, Any]] = {}
    kube.create(job_manifest("running", ns))
    jobs["pending"] = _phase(api, ns, "running", "Pending")
    api.fake_kuberay(ns, "running", STARTED)
    jobs["initializing"] = _phase(api, ns, "running", "Initializing")
    api.fake_kuberay(ns, "running", RUNNING)
    _phase(api, ns, "running", "Running")
    _report_progress(kube, ns, "running")
    jobs["running"] = wait_until(
        lambda: (j := api.job(ns, "running")) and "progress" in j["status"] and j, timeout=WAIT
    )

    _started(kube, api, ns, "stalled")
    api.fake_kuberay(ns, "stalled", RUNNING)
    jobs["stalled"] = wait_until(
        lambda: api.condition(ns, "stalled", ConditionType.STALLED).get("status") == "True" and api.job(ns, "stalled"),
        timeout=STALL_SECONDS + 5,
        what="stalled Stalled=True",
    )

    for name, final in (
        ("succeeded", {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "succeeded": 1, "endTime": _now()}),
        ("failed", {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed", "message": EXIT_1}),
    ):
        _started(kube, api, ns, name)
        api.fake_kuberay(ns, name, RUNNING)
        _phase(api, ns, name, "Running")
        api.fake_kuberay(ns, name, final)
        jobs[name] = _phase(api, ns, name, name.capitalize())

    kube.create(job_manifest("queued", ns, scheduling={"queueName": "team-a"}))
    jobs["queued"] = _phase(api, ns, "queued", "Queued")

    _started(kube, api, ns, "suspended")
    api.patch_job(ns, "suspended", {"spec": {"suspend": True}})
    wait_until(
        lambda: (api.rayjob(ns, "suspended") or {}).get("spec", {}).get("suspend"),
        what="RayJob suspended",
        timeout=WAIT,
    )
    api.fake_kuberay(ns, "suspended", {"jobDeploymentStatus": "Suspended", "jobStatus": ""})
    jobs["suspended"] = _phase(api, ns, "suspended", "Suspended")

    kube.create(job_manifest("unschedulable", ns, resources={"workers": 1, "gpusPerWorker": 16}))
    jobs["unschedulable"] = wait_until(
        lambda: (
            api.condition(ns, "unschedulable", ConditionType.UNSCHEDULABLE).get("status") == "True"
            and api.job(ns, "unschedulable")
        ),
        what="Unschedulable=True",
        timeout=WAIT,
    )
    # Valid for the API server, refused by the operator: a path relative to a job file, in a cluster.
    kube.create(job_manifest("invalid", ns, data={"train": {"uri": "./data/train.jsonl"}}))
    jobs["invalid-spec"] = _phase(api, ns, "invalid", "Failed")

    operator.stop()  # what GitOps tools see before the operator has acted
    try:
        kube.create(job_manifest("not-yet-seen", ns))
        jobs["not-yet-seen"] = api.job(ns, "not-yet-seen")
        api.patch_job(ns, "running", {"spec": {"lifecycle": {"ttlSecondsAfterFinished": 60}}})
        jobs["spec-change-not-yet-seen"] = api.job(ns, "running")
    finally:
        operator.start()
    return jobs


def test_argocd_and_flux_read_every_situation_of_a_real_job(kube: KubeCluster, api: Api, ns: str, operator: Operator):
    jobs = produce_cases(kube, api, ns, operator)
    assert sorted(jobs) == sorted(CASES)
    flux = dict(zip(jobs, kstatus(jobs.values()), strict=True))
    seen = {case: (argocd_health(job)["status"], flux[case]["status"]) for case, job in jobs.items()}
    assert seen == CASES
    assert argocd_health(jobs["running"])["message"] == "training: 42% (step 120 of 285)"
    assert argocd_health(jobs["failed"])["message"] == EXIT_1
    assert "generation is 2, but latest observed generation is 1" in flux["spec-change-not-yet-seen"]["message"]
    if folder := os.environ.get("ROCMTRAIN_RECORD_STATUSES"):
        for case, job in jobs.items():
            record(Path(folder), case, job)
