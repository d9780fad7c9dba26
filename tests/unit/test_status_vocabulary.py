"""The typed vocabulary of the status mapping: every KubeRay state has its phase, and conditions round-trip; pure."""

from __future__ import annotations

import dataclasses

import pytest

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.kuberay import JobDeploymentStatus, JobStatus
from rocmtrain.api.workload_conditions import WorkloadCondition
from rocmtrain.status.accounting import account
from rocmtrain.status.condition_merge import Condition, merge_conditions
from rocmtrain.status.phase import OWNED_FIELDS
from unit.test_status import RUN, T0, cluster, conditions, observe, rayjob

D, J = JobDeploymentStatus, JobStatus
# The job's phase and Ready reason for each deployment status KubeRay writes (its Ray job's status as it
# comes with it; a first attempt, not suspended, no Kueue).
BY_DEPLOYMENT = {
    D.NEW: ("", "Pending", Reason.RAYJOB_CREATED),
    D.INITIALIZING: ("", "Initializing", Reason.INITIALIZING),
    D.WAITING: ("", "Initializing", Reason.INITIALIZING),
    D.RUNNING: ("RUNNING", "Running", Reason.RUNNING),
    D.COMPLETE: ("SUCCEEDED", "Succeeded", Reason.SUCCEEDED),
    D.FAILED: ("FAILED", "Failed", Reason.FAILED),
    D.VALIDATION_FAILED: ("", "Failed", Reason.VALIDATION_FAILED),
    D.SUSPENDING: ("", "Pending", Reason.RESUMING),
    D.SUSPENDED: ("", "Pending", Reason.RESUMING),
    D.RETRYING: ("FAILED", "Initializing", Reason.RETRYING),
}
# The job's phase and Ready reason for each Ray job status, under a Running and a Complete deployment.
UNDER_RUNNING = {
    J.NEW: ("Initializing", Reason.SUBMITTING),
    J.PENDING: ("Initializing", Reason.SUBMITTING),
    J.RUNNING: ("Running", Reason.RUNNING),
    J.STOPPED: ("Running", Reason.RUNNING),
    J.SUCCEEDED: ("Running", Reason.RUNNING),
    J.FAILED: ("Running", Reason.RUNNING),
}
UNDER_COMPLETE = {
    J.NEW: ("Failed", Reason.FAILED),
    J.PENDING: ("Failed", Reason.FAILED),
    J.RUNNING: ("Failed", Reason.FAILED),
    J.STOPPED: ("Failed", Reason.STOPPED),
    J.SUCCEEDED: ("Succeeded", Reason.SUCCEEDED),
    J.FAILED: ("Failed", Reason.FAILED),
}


def _ready(deployment: str, job_status: str) -> tuple[str, str]:
    status = observe(rj=rayjob(deployment, job_status, **RUN, rayClusterStatus=cluster(2)))
    return status["phase"], conditions(status)[ConditionType.READY][1]


def test_the_tables_name_every_state_kuberay_v1_5_1_writes() -> None:
    assert set(BY_DEPLOYMENT) == set(JobDeploymentStatus) and len(JobDeploymentStatus) == 10
    assert set(UNDER_RUNNING) == set(UNDER_COMPLETE) == set(JobStatus) and len(JobStatus) == 6
    assert [s.value for s in JobStatus] == ["", "PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"]


@pytest.mark.parametrize("deployment", list(JobDeploymentStatus))
def test_every_deployment_status_has_its_phase(deployment: JobDeploymentStatus) -> None:
    job_status, phase, reason = BY_DEPLOYMENT[deployment]
    assert _ready(deployment, job_status) == (phase, reason)


@pytest.mark.parametrize("job_status", list(JobStatus))
def test_every_ray_job_status_has_its_phase_while_running_and_once_complete(job_status: JobStatus) -> None:
    assert _ready(D.RUNNING, job_status) == UNDER_RUNNING[job_status]
    assert _ready(D.COMPLETE, job_status) == UNDER_COMPLETE[job_status]


@pytest.mark.parametrize("deployment", ["Scheduling", "Exploded"])
def test_a_deployment_status_kuberay_v1_5_1_does_not_write_is_reported_as_unknown(deployment: str) -> None:
    status = observe(rj=rayjob(deployment, **RUN))
    assert (status["phase"], conditions(status)[ConditionType.READY][1]) == ("Pending", Reason.UNKNOWN_STATE)
    assert repr(deployment) in next(c["message"] for c in status["conditions"] if c["type"] == ConditionType.READY)


@pytest.mark.parametrize("holds", [True, False])
def test_a_condition_round_trips_through_its_wire_form(holds: bool) -> None:
    condition = Condition(ConditionType.STALLED, holds, Reason.NO_PROGRESS, "no progress since then")
    wire = condition.wire(since="2026-01-02T03:04:05Z", generation=7)
    assert wire == {
        "type": "Stalled",
        "status": "True" if holds else "False",
        "reason": "NoProgress",
        "message": "no progress since then",
        "lastTransitionTime": "2026-01-02T03:04:05Z",
        "observedGeneration": 7,
    }
    assert all(type(value) in (str, int) for value in wire.values())  # plain strings, not enum members
    assert Condition.read(wire) == condition


def test_a_condition_of_a_type_the_operator_does_not_manage_is_not_read() -> None:
    assert Condition.read({"type": "Progressing", "status": "True", "reason": "Reported"}) is None
    assert Condition.read(None) is None
    assert Condition.read({"type": "Ready"}) == Condition(ConditionType.READY, False, "")


def test_merged_conditions_follow_the_order_of_the_condition_types() -> None:
    desired = [Condition(kind, False, Reason.PENDING) for kind in reversed(ConditionType)]
    merged = merge_conditions([], desired, now=T0, generation=1)
    assert [c["type"] for c in merged] == [kind.value for kind in ConditionType]


def test_usage_fields_are_the_accounting_status_fields() -> None:
    usage = account({}, 8, T0)
    fields = usage.fields()
    assert fields == {"gpuSeconds": 0.0, "gpusHeld": 8, "accountedUntil": "2026-01-02T03:04:05Z", "cost": None}
    assert set(fields) <= set(OWNED_FIELDS)
    assert len(fields) == len(dataclasses.fields(usage))


def test_condition_types_reasons_and_kueue_words_are_distinct_and_camel_case() -> None:
    for vocabulary in (ConditionType, Reason, WorkloadCondition):
        values = [member.value for member in vocabulary]
        assert len(set(values)) == len(values)
        assert all(value[:1].isupper() and value.isalnum() for value in values), vocabulary
