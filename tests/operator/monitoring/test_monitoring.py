"""The operator's real /metrics output against what manifests/monitoring/ queries.

Every metric name of the dashboard and the alerts must be in what a running operator serves
(with jobs in several phases, priced GPUs and reported progress), and each per-job series must
carry the `namespace` and `job_name` labels the dashboard selects on. KubeRay is faked as in
test_cluster; progress is written as the progress endpoint writes it.
"""

from __future__ import annotations

import datetime as dt
import urllib.request

import pytest
from operator_testkit import JOBS, Api, Operator, job_manifest, wait_until
from prometheus_client.parser import text_string_to_metric_families

from monitoring.promql import EXTERNAL_METRICS, dashboard_expressions, metric_names, rule_expressions
from rocmtrain_testworld.kubecluster import KubeCluster

pytestmark = pytest.mark.cluster

# Seconds for a job to get its turn with the operator just restarted (see the test).
RESTARTED = 60
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
REPORT = {
    "progress": {"epoch": 0.5, "step": 50, "totalSteps": 100, "percent": 50.0, "etaSeconds": 120.0},
    "metrics": {
        "trainLoss": 0.5,
        "evalLoss": 0.45,
        "evalAccuracy": 0.9,
        "samplesPerSecond": 300.0,
        "gpuUtilizationPercent": 91.0,
        "gpuMemoryPeakBytes": 17179869184,
    },
}


def scrape(operator: Operator) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def served_names(text: str) -> dict[str, list[dict[str, str]]]:
    """Every sample name the output serves or declares (a family without samples yet: its type's names),
    with the label sets of its samples."""
    names: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.setdefault(family.name + suffix, [])
        for sample in family.samples:
            names.setdefault(sample.name, []).append(sample.labels)
    return names


def test_every_metric_the_dashboard_and_the_alerts_use_is_served(
    kube: KubeCluster, api: Api, ns: str, operator: Operator, monkeypatch: pytest.MonkeyPatch
):
    operator.stop()
    monkeypatch.setenv("ROCMTRAIN_GPU_PRICES", "AMD_Instinct_MI300X_OAM=3.2,default=2")
    monkeypatch.setenv("ROCMTRAIN_COST_CURRENCY", "EUR")
    operator.start()
    kube.create(job_manifest("training", ns))
    # The restarted operator checks every job of the lean cluster first (earlier modules' too, hundreds):
    # on a loaded machine that takes tens of seconds before these jobs get their turn.
    wait_until(lambda: api.rayjob(ns, "training"), timeout=RESTARTED, what="RayJob")
    ready = {"readyWorkerReplicas": 2, "desiredWorkerReplicas": 2, "state": "ready"}
    api.fake_kuberay(
        ns, "training", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterStatus": ready}
    )
    wait_until(lambda: api.phase(ns, "training") == "Running", timeout=RESTARTED, what="Running")
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.request(
        "PATCH",
        JOBS.format(ns=ns) + "/training/status",
        body={"status": {**REPORT, "lastProgressTime": now}},
        content_type="application/merge-patch+json",
    )
    kube.create(job_manifest("waiting", ns, scheduling={"queueName": "team-a"}))
    wait_until(lambda: api.phase(ns, "waiting") == "Queued", timeout=RESTARTED, what="Queued")

    def complete() -> dict[str, list[dict[str, str]]] | None:
        names = served_names(scrape(operator))
        per_job = [n for n in names if n.startswith("rocmtrain_job_") and n != "rocmtrain_job_series_dropped"]
        jobs_seen = {(s.get("namespace"), s.get("job_name")) for n in per_job for s in names[n]}
        priced = {(s.get("namespace"), s.get("job_name")) for s in names.get("rocmtrain_job_cost", [])}
        both = {(ns, "training"), (ns, "waiting")}
        return names if all(names[n] for n in per_job) and both <= jobs_seen and both <= priced else None

    # Both jobs' series (the queued one's come with a later reconcile than its status, on a loaded machine).
    names = wait_until(complete, timeout=RESTARTED, interval=0.2, what="every per-job series of both jobs")
    used = {name for _, expr in (*dashboard_expressions(), *rule_expressions()) for name in metric_names(expr)}
    assert used - EXTERNAL_METRICS - set(names) == set()
    assert used & EXTERNAL_METRICS == EXTERNAL_METRICS  # the exclusions are all in use
    for name in (n for n in names if n.startswith("rocmtrain_job_") and n != "rocmtrain_job_series_dropped"):
        assert all(labels.get("namespace") and labels.get("job_name") for labels in names[name]), name
    costs = {s["job_name"]: s["currency"] for s in names["rocmtrain_job_cost"] if s["namespace"] == ns}
    assert costs == {"training": "EUR", "waiting": "EUR"}  # priced from the start (the queued one at 0)
    held = {s["job_name"] for s in names["rocmtrain_job_gpus_held"] if s["namespace"] == ns}
    assert "training" in held
