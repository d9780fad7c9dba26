"""Per-job metric values (`rocmtrain.status.gauges`): what each gauge reads, the cardinality bound, queue wait; pure."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.status.gauges import JOB_GAUGES, gpu_kind, job_samples, queue_wait, waiting_since

NOW = dt.datetime(2026, 1, 2, 12, 0, 0, tzinfo=dt.UTC)


def view(name: str, phase: str | None, namespace: str = "ns", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"resources": {"workers": 2, "gpusPerWorker": 8}},
        "status": {**({"phase": phase} if phase else {}), **status},
    }


def ready(status: str, since: str) -> list[dict[str, Any]]:
    return [{"type": "Ready", "status": status, "lastTransitionTime": since}]


RUNNING = view(
    "bert",
    "Running",
    progress={"percent": 25.0, "etaSeconds": 300.0, "step": 10},
    metrics={
        "trainLoss": 0.5,
        "evalLoss": 0.4,
        "evalAccuracy": 0.9,
        "samplesPerSecond": 120.0,
        "gpuUtilizationPercent": 87.5,
        "gpuMemoryPeakBytes": 2**34,
    },
    gpusHeld=16,
    gpuSeconds=1000.0,
    accountedUntil="2026-01-02T11:59:00Z",
    cost={"amount": 1.5, "currency": "EUR"},
    conditions=[{"type": ConditionType.STALLED, "status": "True", "reason": Reason.NO_PROGRESS}],
)


def values(samples: Any, key: tuple[str, str] = ("ns", "bert")) -> dict[str, float]:
    return {name: value for name, rows in samples.values.items() for k, value in rows if k == key}


def test_every_gauge_reads_its_status_field():
    samples = job_samples([RUNNING], NOW, limit=10)
    assert values(samples) == {
        "progress_ratio": 0.25,
        "eta_seconds": 300.0,
        "train_loss": 0.5,
        "eval_loss": 0.4,
        "eval_accuracy": 0.9,
        "samples_per_second": 120.0,
        "gpu_utilization_percent": 87.5,
        "gpu_memory_peak_bytes": float(2**34),
        "gpus": 16.0,
        "gpus_held": 16.0,
        "gpu_seconds": 1000.0 + 16 * 60,  # brought forward to the scrape
        "stalled": 1.0,
    }
    assert {g.name for g in JOB_GAUGES} == {*values(samples), "waiting_since_timestamp_seconds"}
    assert samples.phases == [(("ns", "bert", "Running"), 1.0)]
    assert samples.costs == [(("ns", "bert", "EUR"), 1.5)]
    assert samples.kinds == [(("ns", "bert", "gpu"), 1.0)]


@pytest.mark.parametrize(
    ("resources", "kind"),
    [
        ({"gpusPerWorker": 8}, "gpu"),
        ({"gpusPerWorker": 0}, None),
        ({"gpusPerWorker": 4, "gpu": {"partition": "cpx_nps4"}}, "cpx_nps4"),
        ({"gpusPerWorker": 4, "gpu": {"resourceName": "amd.com/qpx_nps1"}}, "qpx_nps1"),
        ({"gpusPerWorker": 4, "gpu": {"productName": "AMD_Instinct_MI300X_OAM"}}, "gpu"),
    ],
)
def test_a_jobs_gpu_kind_names_its_partition(resources: dict[str, Any], kind: str | None):
    assert gpu_kind(resources) == kind


def test_a_new_job_has_only_what_is_known():
    samples = job_samples([view("fresh", None)], NOW, limit=10)
    assert values(samples, ("ns", "fresh")) == {"gpus": 16.0}
    assert samples.phases == [] and samples.costs == []


def test_waiting_jobs_say_since_when():
    queued = view("q", "Queued", conditions=ready("False", "2026-01-02T11:00:00Z"))
    assert waiting_since(queued) == dt.datetime(2026, 1, 2, 11, tzinfo=dt.UTC).timestamp()
    assert waiting_since(view("r", "Running", conditions=ready("True", "2026-01-02T11:00:00Z"))) is None


def test_cardinality_is_bounded_running_jobs_first_then_the_latest_ended():
    jobs = [
        view("old", "Succeeded", completionTime="2026-01-01T00:00:00Z"),
        view("new", "Failed", completionTime="2026-01-02T00:00:00Z"),
        *(view(f"run-{i}", "Running") for i in range(3)),
    ]
    kept = job_samples(jobs, NOW, limit=4)
    assert [k for k, _ in kept.values["gpus"]] == [("ns", "run-0"), ("ns", "run-1"), ("ns", "run-2"), ("ns", "new")]
    assert kept.dropped == 1
    assert job_samples(jobs, NOW, limit=0).values["gpus"] == [] and job_samples(jobs, NOW, limit=0).dropped == 5


def test_queue_wait_is_measured_when_a_waiting_job_starts():
    queued = {"phase": "Queued", "conditions": ready("False", "2026-01-02T11:00:00Z")}
    assert queue_wait(queued, {"phase": "Initializing"}, NOW) == 3600
    assert queue_wait(queued, {"phase": "Queued"}, NOW) is None
    assert queue_wait({"phase": "Running"}, {"phase": "Succeeded"}, NOW) is None
    assert queue_wait({"phase": "Pending"}, {"phase": "Running"}, NOW) is None  # no Ready condition: unknown
