"""A job with spec.tuning: its defaults, its Ray cluster, its pre-flight and its status size (pure)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from rocmtrain.admission import node_fit
from rocmtrain.admission.node_fit import NodeInfo
from rocmtrain.api import crd
from rocmtrain.api.condition_reasons import Reason
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.api.validate import validate_job
from rocmtrain.render import render_rayjob
from rocmtrain.status.objects import requested_gpus
from rocmtrain.status.phase import Observation, compute_status
from unit.samples import example, full_job

SEARCH = {"searchSpace": {"learningRate": {"min": 1e-5, "max": 1e-3}}, "numTrials": 6, "maxConcurrentTrials": 3}


def with_tuning(tuning: dict[str, Any] | None = SEARCH, **resources: Any) -> RocmTrainingJob:
    manifest = full_job()
    manifest["spec"]["resources"].update(resources)
    if tuning is not None:
        manifest["spec"]["tuning"] = tuning
    job, errors = validate_job(manifest)
    assert job is not None, errors
    return job


def test_metric_and_mode_default_from_the_task():
    tuning = with_tuning().spec.tuning
    assert tuning is not None
    assert (tuning.metric_for("sequence-classification"), tuning.mode_for("sequence-classification")) == (
        "evalAccuracy",
        "max",
    )
    assert (tuning.metric_for("regression"), tuning.mode_for("regression")) == ("evalMse", "min")
    loss = with_tuning({**SEARCH, "metric": "evalLoss"}).spec.tuning
    assert loss is not None and loss.mode_for("sequence-classification") == "min"
    explicit = with_tuning({**SEARCH, "metric": "evalLoss", "mode": "max"}).spec.tuning
    assert explicit is not None and explicit.mode_for("sequence-classification") == "max"


def test_the_worker_group_holds_the_workers_of_every_concurrent_trial():
    job = with_tuning(workers=2, gpusPerWorker=4)
    (group,) = render_rayjob(job)["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 6
    assert job.spec.total_gpus == 24
    assert requested_gpus(job.dump()) == 24
    status = compute_status(
        Observation(
            spec=job.spec,
            generation=1,
            current={},
            rayjob=None,
            now=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
            stall_after=900,
        )
    )
    assert (status["workersDesired"], status["gpus"]) == (6, 24)
    untuned = with_tuning(None, workers=2, gpusPerWorker=4)
    (group,) = render_rayjob(untuned)["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == 2 and untuned.spec.total_gpus == 8


@pytest.mark.parametrize(("nodes", "fits"), [(3, True), (2, False)])
def test_preflight_counts_the_trials_that_run_at_once(nodes: int, fits: bool):
    job = with_tuning(workers=2, gpusPerWorker=4, gpu=None)
    spec = job.spec.model_copy(update={"scheduling": job.spec.scheduling.model_copy(update={"node_selector": {}})})
    hold = node_fit.check(spec, [NodeInfo(name=f"n{i}", gpus=8) for i in range(nodes)])
    if fits:
        assert hold is None
    else:
        assert hold is not None and hold.reason == Reason.INSUFFICIENT_GPUS
        assert "needs 6 workers (2 for each of 3 concurrent trials) with 4 amd.com/gpu each" in hold.message


def test_the_tune_example_is_valid_and_has_a_best_column():
    job, errors = validate_job(example("tune.yaml"), context="local")
    assert job is not None and job.spec.tuning is not None, errors
    assert (job.spec.tuning.num_trials, job.spec.tuning.max_concurrent_trials) == (4, 2)
    columns = {c["name"]: c["jsonPath"] for c in crd.PRINTER_COLUMNS}
    assert columns["Best"] == ".status.tuning.bestMetric"
