"""Status mapping: the RayJob status sequences KubeRay v1.5.1 writes, mapped onto the job.

The sequences follow `ray-operator/controllers/ray/rayjob_controller.go` (v1.5.1):
New ("") → Initializing → Running (jobStatus "", PENDING, RUNNING) → Complete/Failed,
Failed → Retrying → New → … while `failed <= backoffLimit`, and
Initializing/Running → Suspending → Suspended → New when `spec.suspend` flips.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.models import RocmTrainingJobSpec
from rocmtrain.api.timestamps import rfc3339
from rocmtrain.api.validate import validate_job
from rocmtrain.status.accounting import Price
from rocmtrain.status.condition_merge import Condition, merge_conditions
from rocmtrain.status.events import transition_events
from rocmtrain.status.hold import KUBERAY_NOT_INSTALLED, Hold, HoldKind, refused_create
from rocmtrain.status.messages import CONDITION_MESSAGE_LIMIT
from rocmtrain.status.phase import (
    NOT_ALLOWED,
    OWNED_FIELDS,
    Observation,
    compute_status,
    has_ended,
    invalid_status,
    last_rayjob_change,
    status_patch,
)
from unit.samples import minimal_job

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def spec(**overrides: Any) -> RocmTrainingJobSpec:
    base: dict[str, Any] = {
        "model": {"source": "distilbert/distilbert-base-uncased", "numLabels": 2},
        "data": {"train": {"uri": "s3://data/train.jsonl"}},
        "resources": {"workers": 2, "gpusPerWorker": 8},
    }
    return RocmTrainingJobSpec.model_validate({**base, **overrides})


def rayjob(deployment: str | None, job_status: str = "", *, suspend: bool = False, **status: Any) -> dict[str, Any]:
    """A RayJob as KubeRay leaves it; `deployment=None` is a RayJob KubeRay has not touched yet."""
    st: dict[str, Any] = dict(status)
    if deployment is not None:
        st["jobDeploymentStatus"] = deployment
        st["jobStatus"] = job_status
    return {"metadata": {"name": "job"}, "spec": {"suspend": suspend}, "status": st}


def cluster(ready: int, desired: int = 2) -> dict[str, Any]:
    return {"readyWorkerReplicas": ready, "desiredWorkerReplicas": desired, "state": "ready" if ready else ""}


def run(
    sequence: list[dict[str, Any] | None],
    job_spec: RocmTrainingJobSpec | None = None,
    *,
    pods: list[list[dict[str, Any]]] | None = None,
    workloads: list[dict[str, Any] | None] | None = None,
) -> list[dict[str, Any]]:
    """Feed RayJob states in order (one second apart), with the job's pods and Workload at each; each status."""
    current: dict[str, Any] = {}
    out = []
    for i, rj in enumerate(sequence):
        obs = Observation(
            spec=job_spec or spec(),
            generation=1,
            current=current,
            rayjob=rj,
            now=T0 + dt.timedelta(seconds=i),
            stall_after=900,
            pods=pods[i] if pods else (),
            workload=workloads[i] if workloads else None,
        )
        merged = {**current, **status_patch(current, compute_status(obs))}  # as the merge patch applies
        current = {k: v for k, v in merged.items() if v is not None}
        out.append(current)
    return out


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


RUN = {"jobId": "job-abc12", "rayClusterName": "job-x7k2p", "startTime": "2026-01-02T03:04:05Z"}

SUCCESS = [
    None,
    rayjob(None),
    rayjob("Initializing", **RUN, rayClusterStatus=cluster(0)),
    rayjob("Initializing", **RUN, rayClusterStatus=cluster(1)),
    rayjob("Running", **RUN, rayClusterStatus=cluster(2), dashboardURL="job-head-svc.ns.svc.cluster.local:8265"),
    rayjob("Running", "PENDING", **RUN, rayClusterStatus=cluster(2), dashboardURL="job-head-svc.ns.svc:8265"),
    rayjob("Running", "RUNNING", **RUN, rayClusterStatus=cluster(2), dashboardURL="job-head-svc.ns.svc:8265"),
    rayjob("Running", "SUCCEEDED", **RUN, rayClusterStatus=cluster(2), dashboardURL="job-head-svc.ns.svc:8265"),
    rayjob(
        "Complete",
        "SUCCEEDED",
        **RUN,
        rayClusterStatus=cluster(2),
        dashboardURL="job-head-svc.ns.svc:8265",
        endTime="2026-01-02T04:00:00Z",
        succeeded=1,
        failed=0,
    ),
]


def test_success_sequence_phases_conditions_and_fields():
    statuses = run(SUCCESS)
    assert [s["phase"] for s in statuses] == [
        "Pending",
        "Pending",
        "Initializing",
        "Initializing",
        "Initializing",
        "Initializing",
        "Running",
        "Running",
        "Succeeded",
    ]
    running, done = statuses[6], statuses[-1]
    assert conditions(running)[ConditionType.READY] == ("True", Reason.RUNNING)
    assert running["workersReady"] == 2 and running["workersDesired"] == 2 and running["gpus"] == 16
    assert running["rayClusterName"] == "job-x7k2p" and running["jobId"] == "job-abc12"
    assert running["dashboardUrl"] == "job-head-svc.ns.svc:8265"
    assert running["startTime"] == "2026-01-02T03:04:05Z" and "completionTime" not in running
    assert conditions(done)[ConditionType.SUCCEEDED] == ("True", Reason.SUCCEEDED)
    assert conditions(done)[ConditionType.READY] == (
        "True",
        Reason.SUCCEEDED,
    )  # where its spec asks it to be (kstatus: Current)
    assert done["completionTime"] == "2026-01-02T04:00:00Z" and done["restarts"] == 0
    assert statuses[2]["workersReady"] == 0 and statuses[3]["workersReady"] == 1


def test_ready_keeps_transition_time_while_running_and_after_success():
    statuses = run(SUCCESS)
    ready = [next(c for c in s["conditions"] if c["type"] == ConditionType.READY) for s in statuses]
    assert ready[6]["lastTransitionTime"] == "2026-01-02T03:04:11Z"  # turned True at step 6
    assert ready[7]["lastTransitionTime"] == ready[6]["lastTransitionTime"]
    assert ready[8]["lastTransitionTime"] == ready[6]["lastTransitionTime"]  # still True when it succeeds
    assert ready[8]["reason"] == Reason.SUCCEEDED
    assert all(c["observedGeneration"] == 1 for s in statuses for c in s["conditions"])


def test_events_tell_the_story_once_per_transition():
    statuses = run(SUCCESS)
    events = [e for old, new in zip([{}, *statuses], statuses, strict=False) for e in transition_events(old, new)]
    assert [(e.type, e.reason) for e in events] == [
        ("Normal", "Pending"),
        ("Normal", "Initializing"),
        ("Normal", "Running"),
        ("Normal", "Succeeded"),
    ]
    assert events[1].message.startswith("Pending → Initializing: starting the Ray cluster (0/2 workers ready)")


@pytest.mark.parametrize(
    ("final", "reason", "message"),
    [
        (
            rayjob("Failed", "FAILED", **RUN, reason="AppFailed", message="exit code 1", failed=1),
            "AppFailed",
            "exit code 1",
        ),
        (
            rayjob("Failed", "", **RUN, reason="DeadlineExceeded", message="passed activeDeadlineSeconds", failed=1),
            "DeadlineExceeded",
            "passed activeDeadlineSeconds",
        ),
        (
            rayjob("Failed", "", **RUN, reason="SubmissionFailed", message="Job submission has failed", failed=1),
            "SubmissionFailed",
            "Job submission has failed",
        ),
        (
            rayjob("Failed", "FAILED", **RUN, reason="JobDeploymentStatusTransitionGracePeriodExceeded", failed=1),
            "JobDeploymentStatusTransitionGracePeriodExceeded",
            "the RayJob failed",
        ),
        (rayjob("ValidationFailed", reason="ValidationFailed", message="bad spec"), "ValidationFailed", "bad spec"),
        (rayjob("Complete", "STOPPED", **RUN, succeeded=0, failed=0), "Stopped", "the Ray job ended STOPPED"),
    ],
)
def test_failures_carry_kuberay_reason_and_message(final, reason, message):
    statuses = run([rayjob("Initializing", **RUN), rayjob("Running", "RUNNING", **RUN), final])
    last = statuses[-1]
    assert last["phase"] == "Failed"
    assert conditions(last)[ConditionType.FAILED] == ("True", reason)
    assert next(c for c in last["conditions"] if c["type"] == ConditionType.FAILED)["message"] == message
    assert "completionTime" in last and last["restarts"] == 0
    assert conditions(last)[ConditionType.STALLED] == ("True", reason)  # kstatus reads Stalled=True as Failed
    assert conditions(last)[ConditionType.READY] == ("False", reason)
    events = transition_events(statuses[-2], last)
    assert [(e.type, e.reason) for e in events] == [("Warning", "Failed")]  # one event, not one per condition


def test_the_drivers_own_error_comes_first_in_the_failed_condition():
    ray_message = (
        "Job entrypoint command failed with exit code 2, last available logs (truncated to 20,000 chars):\n"
        "2026-01-02 03:04:05,000 INFO worker.py:1 -- Connecting to existing Ray cluster\n"
        "rocmtrain driver error: /data/train.jsonl: cannot read it as jsonl: JSON parse error\n"
    )
    final = rayjob("Failed", "FAILED", **RUN, reason="AppFailed", message=ray_message, failed=1)
    statuses = run([rayjob("Running", "RUNNING", **RUN), final])
    failed = next(c for c in statuses[-1]["conditions"] if c["type"] == ConditionType.FAILED)
    first, _, rest = failed["message"].partition("\n")
    assert first == "/data/train.jsonl: cannot read it as jsonl: JSON parse error"
    assert rest == "(the Ray job's entrypoint exited with code 2)", "the exit code follows, not the log"
    (event,) = transition_events(statuses[0], statuses[1])
    assert event.message.startswith("Running → Failed: /data/train.jsonl: cannot read it as jsonl")


def test_retrying_counts_restarts_and_returns_to_initializing():
    retry = {**RUN, "reason": "AppFailed", "failed": 1}
    sequence = [
        rayjob("Running", "RUNNING", **RUN, failed=0),
        rayjob("Retrying", "FAILED", **retry),
        rayjob(None, failed=1),  # KubeRay resets the status to New after deleting the cluster
        rayjob("Initializing", **RUN, failed=1),
        rayjob("Running", "RUNNING", **RUN, failed=1),
        rayjob("Complete", "SUCCEEDED", **RUN, failed=1, succeeded=1),
    ]
    statuses = run(sequence, spec(faultTolerance={"jobRetries": 1}))
    assert [s["phase"] for s in statuses] == [
        "Running",
        "Initializing",
        "Initializing",
        "Initializing",
        "Running",
        "Succeeded",
    ]
    assert [s["restarts"] for s in statuses] == [0, 1, 1, 1, 1, 1]
    assert conditions(statuses[1])[ConditionType.READY] == ("False", Reason.RETRYING)
    assert [e.reason for e in transition_events(statuses[0], statuses[1])] == ["Initializing", "Retrying"]


def test_final_failure_after_retries_counts_retries_not_failures():
    statuses = run(
        [
            rayjob("Running", "RUNNING", **RUN, failed=1),
            rayjob("Failed", "FAILED", **RUN, reason="AppFailed", failed=2),
        ],
        spec(faultTolerance={"jobRetries": 1}),
    )
    assert statuses[-1]["phase"] == "Failed" and statuses[-1]["restarts"] == 1


REFUSAL = (
    "spec.checkpoint.storagePath: s3://ckpt/runs/ns is not writable: "
    "AWS Error ACCESS_DENIED during PutObject operation: Access Denied"
)


@pytest.mark.parametrize(
    "kuberay",
    [
        rayjob("Running", "RUNNING", **RUN),  # the report came before KubeRay saw the driver exit
        rayjob("Running", "FAILED", **RUN),
        rayjob("Retrying", "FAILED", **RUN, reason="AppFailed", failed=1),  # KubeRay began a retry first
        rayjob(None, failed=1),
        rayjob("Initializing", **RUN, failed=1),
        rayjob("Failed", "FAILED", **RUN, reason="AppFailed", message="Job entrypoint command failed", failed=1),
        None,  # the operator deleted the RayJob
    ],
    ids=["running", "ray-job-failed", "retrying", "new-again", "initializing-again", "kuberay-failed", "deleted"],
)
def test_the_drivers_preflight_refusal_fails_the_job_whatever_kuberay_says_and_spends_no_retry(kuberay):
    job_spec = spec(faultTolerance={"jobRetries": 2})
    running = run([rayjob("Running", "RUNNING", **RUN)], job_spec)[-1]
    current = {**running, "preflightError": REFUSAL}  # as the progress endpoint writes the driver's last report
    obs = Observation(
        spec=job_spec, generation=1, current=current, rayjob=kuberay, now=T0 + dt.timedelta(seconds=5), stall_after=900
    )
    status = {**current, **status_patch(current, compute_status(obs))}
    assert status["phase"] == "Failed" and status["restarts"] == 0 and "completionTime" in status
    assert conditions(status)[ConditionType.FAILED] == ("True", Reason.PREFLIGHT_FAILED)
    assert conditions(status)[ConditionType.STALLED] == ("True", Reason.PREFLIGHT_FAILED)
    assert conditions(status)[ConditionType.READY] == ("False", Reason.PREFLIGHT_FAILED)
    assert next(c for c in status["conditions"] if c["type"] == ConditionType.FAILED)["message"] == REFUSAL
    (event,) = transition_events(running, status)
    assert (event.type, event.reason) == ("Warning", "Failed") and REFUSAL in event.message


@pytest.mark.parametrize(
    ("status", "ended"),
    [
        ({}, False),
        ({"phase": "Running"}, False),
        ({"phase": "Succeeded"}, True),
        ({"phase": "Failed"}, True),
        ({"phase": "Running", "preflightError": REFUSAL}, True),  # refused, not yet written Failed
        ({"phase": "Running", "preflightError": ""}, False),
    ],
)
def test_a_job_has_ended_once_terminal_or_refused_by_its_driver(status, ended):
    assert has_ended(status) is ended


def test_kueue_queued_then_admitted():
    queued = spec(scheduling={"queueName": "team-a"})
    sequence = [
        None,
        rayjob(None, suspend=True),
        rayjob("Initializing", suspend=True, jobId="j", rayClusterName="c"),
        rayjob("Suspending", suspend=True),
        rayjob("Suspended", suspend=True),
        rayjob("Suspended", suspend=False),  # Kueue admitted it: unsuspended
        rayjob(None, suspend=False),
        rayjob("Initializing", **RUN),
        rayjob("Running", "RUNNING", **RUN),
    ]
    statuses = run(sequence, queued)
    assert [s["phase"] for s in statuses] == [
        "Pending",
        "Queued",
        "Queued",
        "Queued",
        "Queued",
        "Pending",
        "Pending",
        "Initializing",
        "Running",
    ]
    admitted = [conditions(s)[ConditionType.ADMITTED] for s in statuses]
    assert admitted[0] == ("False", Reason.PENDING)
    assert admitted[1:5] == [("False", Reason.QUEUED_BY_KUEUE)] * 4
    assert admitted[5:] == [("True", Reason.ADMITTED)] * 4
    assert conditions(statuses[1])[ConditionType.READY] == ("False", Reason.QUEUED_BY_KUEUE)
    assert ("Normal", "Admitted") in [(e.type, e.reason) for e in transition_events(statuses[4], statuses[5])]


def test_the_queue_estimate_is_kept_while_queued_and_cleared_on_admission():
    queued = spec(scheduling={"queueName": "team-a"})
    estimate = {"position": 1, "expectedStartTime": "2026-01-02T04:00:00Z", "basis": "1 running job's ETA"}

    def status_after(rj: dict[str, Any]) -> dict[str, Any]:
        current = {"phase": "Queued", "queue": estimate}
        return compute_status(
            Observation(spec=queued, generation=1, current=current, rayjob=rj, now=T0, stall_after=60)
        )

    still = status_after(rayjob("Suspended", suspend=True))
    assert still["phase"] == "Queued" and still["queue"] == estimate
    admitted = status_after(rayjob("Suspended", suspend=False))
    assert admitted["phase"] == "Pending" and "queue" not in admitted
    assert status_patch({"phase": "Queued", "queue": estimate}, admitted)["queue"] is None


def test_kueue_preemption_goes_back_to_queued():
    queued = spec(scheduling={"queueName": "team-a"})
    statuses = run(
        [
            rayjob("Running", "RUNNING", **RUN),
            rayjob("Suspending", "RUNNING", suspend=True),
            rayjob("Suspended", suspend=True),
        ],
        queued,
    )
    assert [s["phase"] for s in statuses] == ["Running", "Queued", "Queued"]
    assert conditions(statuses[-1])[ConditionType.ADMITTED] == ("False", Reason.QUEUED_BY_KUEUE)


def test_user_suspend_and_resume_without_queue():
    sequence = [
        rayjob("Running", "RUNNING", **RUN),
        rayjob("Running", "RUNNING", suspend=True, **RUN),  # before KubeRay reacts
        rayjob("Suspending", "RUNNING", suspend=True),
        rayjob("Suspended", suspend=True),
        rayjob("Suspended"),
        rayjob(None),
        rayjob("Initializing", **RUN),
    ]
    statuses = run(sequence, spec(suspend=True))
    assert [s["phase"] for s in statuses] == [
        "Running",
        "Running",
        "Suspended",
        "Suspended",
        "Pending",
        "Pending",
        "Initializing",
    ]
    assert "Admitted" not in conditions(statuses[0])
    assert "dashboardUrl" not in statuses[3] and "jobId" not in statuses[3]
    # Suspended is what the spec asks for: Ready (kstatus: Current); resuming is not Ready until it runs.
    assert [conditions(s)[ConditionType.READY][0] for s in statuses] == [
        "True",
        "True",
        "True",
        "True",
        "False",
        "False",
        "False",
    ]


def test_terminal_phase_is_sticky_even_when_the_rayjob_goes():
    statuses = run([rayjob("Complete", "SUCCEEDED", **RUN, succeeded=1, endTime="2026-01-02T04:00:00Z"), None])
    assert statuses[1]["phase"] == "Succeeded"
    assert statuses[1]["jobId"] == "job-abc12" and statuses[1]["completionTime"] == "2026-01-02T04:00:00Z"


def test_unknown_deployment_status_is_pending_not_a_crash():
    (status,) = run([rayjob("SomethingNew")])
    assert status["phase"] == "Pending" and conditions(status)[ConditionType.READY] == ("False", Reason.UNKNOWN_STATE)


# ---- holds, stall, invalid -----------------------------------------------------------------


def observe(current: dict[str, Any] | None = None, rj: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    defaults: dict[str, Any] = {"spec": spec(), "generation": 3, "now": T0, "stall_after": 900}
    return compute_status(Observation(current=current or {}, rayjob=rj, **{**defaults, **kw}))


def test_unschedulable_hold_then_resolved():
    hold = Hold(
        HoldKind.UNSCHEDULABLE, Reason.INSUFFICIENT_GPUS, "needs 16 amd.com/gpu per worker; the largest node has 8"
    )
    held = observe(hold=hold)
    assert held["phase"] == "Pending"
    assert conditions(held)[ConditionType.UNSCHEDULABLE] == ("True", Reason.INSUFFICIENT_GPUS)
    assert conditions(held)[ConditionType.READY] == ("False", Reason.INSUFFICIENT_GPUS)
    assert ConditionType.KUBERAY_MISSING not in conditions(held)
    (event,) = [e for e in transition_events({}, held) if e.type == "Warning"]
    assert event.reason == Reason.INSUFFICIENT_GPUS and "largest node has 8" in event.message
    created = observe(held, rayjob(None))
    assert conditions(created)[ConditionType.UNSCHEDULABLE] == ("False", Reason.SCHEDULABLE)


def test_kuberay_missing_condition():
    missing = observe(hold=KUBERAY_NOT_INSTALLED)
    assert conditions(missing)[ConditionType.KUBERAY_MISSING] == ("True", Reason.KUBERAY_NOT_INSTALLED)
    assert conditions(missing)[ConditionType.READY] == ("False", Reason.KUBERAY_NOT_INSTALLED)
    assert conditions(observe(missing, rayjob(None)))[ConditionType.KUBERAY_MISSING] == (
        "False",
        Reason.KUBERAY_INSTALLED,
    )


def test_a_name_conflict_holds_without_a_condition_of_its_own():
    conflict = Hold(HoldKind.CONFLICT, Reason.RAYJOB_CONFLICT, "a RayJob named job exists and is not this job's", 5)
    held = observe(hold=conflict)
    assert held["phase"] == "Pending" and conditions(held) == {"Ready": ("False", Reason.RAYJOB_CONFLICT)}
    assert conflict.retry_after(30) == 5 and KUBERAY_NOT_INSTALLED.retry_after(30) == 30


def test_a_refused_rayjob_create_shows_the_api_servers_message_once():
    message = 'rayjobs.ray.io "job" is forbidden: exceeded quota: rayjobs, requested: count/rayjobs.ray.io=1'
    refused = refused_create(403, message)
    held = observe(hold=refused)
    assert held["phase"] == "Pending"
    assert conditions(held)[ConditionType.BLOCKED] == ("True", Reason.RAYJOB_FORBIDDEN)
    blocked = next(c for c in held["conditions"] if c["type"] == ConditionType.BLOCKED)
    assert blocked["message"] == f"the API server refused the RayJob: {message}"
    assert [(e.type, e.reason) for e in transition_events({}, held) if e.reason == Reason.RAYJOB_FORBIDDEN] == [
        ("Warning", Reason.RAYJOB_FORBIDDEN)
    ]
    again = observe(held, hold=refused)
    assert not [e for e in transition_events(held, again) if e.reason == Reason.RAYJOB_FORBIDDEN], "one event"
    assert conditions(observe(again, rayjob(None)))[ConditionType.BLOCKED] == ("False", Reason.UNBLOCKED)
    assert refused_create(422, "x").reason == Reason.RAYJOB_INVALID
    long = refused_create(422, "y" * 5000)
    assert len(long.message) == 1024 and long.message.endswith("…")


def test_a_job_outside_the_allow_lists_fails_with_every_field():
    problem = "spec.image: x is not from an allowed registry (y)"
    failed = invalid_status({}, [problem], generation=1, now=T0, why=NOT_ALLOWED)
    assert failed["phase"] == "Failed" and conditions(failed)[ConditionType.FAILED] == ("True", Reason.NOT_ALLOWED)
    ready = next(c for c in failed["conditions"] if c["type"] == ConditionType.READY)
    assert ready["message"] == f"not allowed by the operator's settings: {problem}"


def test_a_job_refused_after_it_started_counts_its_gpus_up_to_then_and_holds_none():
    held = {"phase": "Running", "gpusHeld": 8, "gpuSeconds": 100.0, "accountedUntil": rfc3339(T0)}
    held["cost"] = {"amount": 0.1, "currency": "USD"}
    later = T0 + dt.timedelta(seconds=60)
    failed = invalid_status(held, ["spec.image: x"], generation=1, now=later, why=NOT_ALLOWED, price=Price(3.6, "USD"))
    assert failed["phase"] == "Failed" and failed["gpusHeld"] == 0 and failed["accountedUntil"] == rfc3339(later)
    assert failed["gpuSeconds"] == 100.0 + 8 * 60
    assert failed["cost"] == {"amount": round(0.1 + 480 * 3.6 / 3600, 6), "currency": "USD"}
    never_started = invalid_status({}, ["spec.image: x"], generation=1, now=later)
    assert "gpuSeconds" not in never_started and "accountedUntil" not in never_started


def running_rayjob(last_write: dt.datetime) -> dict[str, Any]:
    rj = rayjob("Running", "RUNNING", **RUN)
    rj["metadata"]["managedFields"] = [
        {"manager": "kuberay-operator", "subresource": "status", "time": last_write.strftime("%Y-%m-%dT%H:%M:%SZ")},
        {"manager": "rocm-train-operator", "time": "2020-01-01T00:00:00Z"},
    ]
    return rj


def test_stall_from_rayjob_status_age_and_progress_time():
    rj = running_rayjob(T0)
    assert last_rayjob_change(rj) == T0
    fresh = observe(rj=rj, now=T0 + dt.timedelta(seconds=100))
    assert ConditionType.STALLED not in conditions(fresh)
    stalled = observe(fresh, rj, now=T0 + dt.timedelta(seconds=1000))
    assert conditions(stalled)[ConditionType.STALLED] == ("True", Reason.NO_PROGRESS)
    assert ("Warning", Reason.NO_PROGRESS) in [(e.type, e.reason) for e in transition_events(fresh, stalled)]
    progressed = {**stalled, "lastProgressTime": "2026-01-02T03:20:00Z"}
    recovered = observe(progressed, rj, now=T0 + dt.timedelta(seconds=1000))
    assert conditions(recovered)[ConditionType.STALLED] == ("False", Reason.PROGRESSING)


def test_invalid_spec_lists_every_field_path():
    errors = ["spec.model.source: must be a location", "spec.resources.workers: too many"]
    status = invalid_status({}, errors, generation=2, now=T0)
    assert status["phase"] == "Failed" and status["observedGeneration"] == 2
    ready = next(c for c in status["conditions"] if c["type"] == ConditionType.READY)
    assert ready["status"] == "False" and ready["reason"] == Reason.INVALID_SPEC
    assert "spec.model.source" in ready["message"] and "spec.resources.workers" in ready["message"]
    assert conditions(status)[ConditionType.STALLED] == ("True", Reason.INVALID_SPEC)  # kstatus: Failed


def test_a_refusal_of_any_size_leaves_the_status_writable():
    """The issue's case: a 40,000-character nodeSelector key made a refusal `invalid_status` could not hold."""
    manifest = minimal_job()
    manifest["spec"]["scheduling"] = {"nodeSelector": {"k" * 40_000: "v"}}
    job, errors = validate_job(manifest)
    assert job is None
    for problems in ([str(e) for e in errors], ["x" * 40_000] * 5):  # what validation says, and any text
        status = invalid_status({}, problems, generation=1, now=T0)
        assert status["phase"] == "Failed"
        assert all(len(c["message"]) <= CONDITION_MESSAGE_LIMIT for c in status["conditions"])


def test_merge_conditions_keeps_foreign_conditions_and_transition_times():
    before = [
        {"type": "Ready", "status": "False", "reason": "A", "lastTransitionTime": "2020-01-01T00:00:00Z"},
        {"type": "Progressing", "status": "True", "reason": "Reported"},
    ]
    merged = merge_conditions(before, [Condition(ConditionType.READY, False, "B", "m")], now=T0, generation=4)
    assert merged[0]["lastTransitionTime"] == "2020-01-01T00:00:00Z" and merged[0]["reason"] == "B"
    assert merged[1] == before[1]
    flipped = merge_conditions(before, [Condition(ConditionType.READY, True, Reason.RUNNING)], now=T0, generation=4)
    assert flipped[0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"


def test_status_patch_touches_only_owned_fields_and_clears_vanished_ones():
    current = {"phase": "Running", "dashboardUrl": "x:8265", "progress": {"step": 3}, "lastProgressTime": "t"}
    new = {"phase": "Suspended"}
    patch = status_patch(current, new)
    assert patch == {"phase": "Suspended", "dashboardUrl": None}
    assert set(patch) <= set(OWNED_FIELDS)
    assert status_patch(new, new) == {}


# ---- the Ray pods ---------------------------------------------------------------------------


def ray_pod(
    name: str, *, cluster: str = "job-x7k2p", ready: bool = True, node_type: str = "worker", **status: Any
) -> dict[str, Any]:
    """A pod view (`rocmtrain.status.pods.pod_view`) of a worker (or `node_type`) of Ray cluster `cluster`."""
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "labels": {"rocmtrain.dev/job-name": "job", "ray.io/cluster": cluster, "ray.io/node-type": node_type},
            "deleting": False,
            "controller": {"kind": "RayCluster", "name": cluster},
        },
        "phase": "Running",
        "ready": ready,
        "scheduled": status.pop("scheduled", {"status": "True"}),
        "containers": status.pop("containers", []),
    }


UNSCHEDULED = {
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/4 nodes are available: 2 Insufficient amd.com/gpu.",
}


def test_pods_that_cannot_run_raise_a_condition_with_one_event_per_cause():
    starting = rayjob("Initializing", **RUN, rayClusterStatus=cluster(0))
    crash = [{"name": "ray-worker", "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}]
    steps = [
        (starting, [ray_pod("w-1"), ray_pod("w-2", ready=False, scheduled=UNSCHEDULED)]),
        (starting, [ray_pod("w-1"), ray_pod("w-2", ready=False, scheduled={**UNSCHEDULED, "message": "0/5 nodes"})]),
        (starting, [ray_pod("w-1"), ray_pod("w-2", ready=False, containers=crash)]),
        (starting, [ray_pod("w-1"), ray_pod("w-2")]),
        (rayjob("Running", "RUNNING", **RUN, rayClusterStatus=cluster(1)), [ray_pod("w-1"), ray_pod("w-2")]),
    ]
    statuses = run([rj for rj, _ in steps], pods=[pods for _, pods in steps])
    pods_condition = [
        next(c for c in s["conditions"] if c["type"] == ConditionType.RAY_PODS_UNAVAILABLE) for s in statuses
    ]
    assert [(c["status"], c["reason"]) for c in pods_condition] == [
        ("True", Reason.UNSCHEDULABLE),
        ("True", Reason.UNSCHEDULABLE),
        ("True", Reason.CRASH_LOOP_BACK_OFF),
        ("False", Reason.RAY_PODS_AVAILABLE),
        ("False", Reason.RAY_PODS_AVAILABLE),
    ]
    assert pods_condition[0]["message"] == f"pod w-2: {UNSCHEDULED['message']}"
    assert pods_condition[1]["message"] == "pod w-2: 0/5 nodes"  # the scheduler's latest words, no new event
    assert statuses[0]["workersReady"] == 1
    # The pods count, not KubeRay's copy in the RayJob (it lags while KubeRay cannot reach the dashboard).
    assert statuses[4]["workersReady"] == 2 and "(2/2 workers ready)" in conditions_of(statuses[4])["Ready"]
    events = [e for old, new in zip([{}, *statuses], statuses, strict=False) for e in transition_events(old, new)]
    assert [(e.type, e.reason) for e in events if e.type == "Warning"] == [
        ("Warning", "Unschedulable"),
        ("Warning", "CrashLoopBackOff"),
    ]


def test_ready_workers_never_exceed_the_desired_count_nor_count_look_alike_pods():
    running = rayjob("Running", "RUNNING", **RUN, rayClusterStatus=cluster(2))
    extra = [ray_pod(f"w-{i}") for i in range(50)]  # more ready workers than the job asks for
    fake = [ray_pod(f"f-{i}") for i in range(50)]  # labels copied, not controlled by the RayCluster
    for pod in fake:
        pod["metadata"]["controller"] = {}
    (capped,) = run([running], pods=[extra])
    assert capped["workersReady"] == 2 and capped["gpusHeld"] == 2 * spec().resources.gpus_per_worker
    (counted,) = run([running], pods=[[ray_pod("w-1"), *fake]])
    assert counted["workersReady"] == 1


def replica_failure(reason: str, message: str, status: str = "True") -> dict[str, Any]:
    """KubeRay's RayCluster condition while it cannot reconcile the cluster's pods."""
    return {"type": "ReplicaFailure", "status": status, "reason": reason, "message": message}


QUOTA = 'pods "job-x7k2p-head" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=0, limited: pods=0'


def test_a_pod_kubernetes_refuses_to_create_is_explained_with_the_api_servers_words():
    """No pod exists to show it: KubeRay's ReplicaFailure condition, copied into the RayJob, says why."""
    head = {**cluster(0), "conditions": [replica_failure("FailedCreateHeadPod", f"FailedCreateHeadPod: {QUOTA}")]}
    worker = {**cluster(1), "conditions": [replica_failure("FailedCreateWorkerPod", "FailedCreateWorkerPod: x")]}
    other = {**cluster(1), "conditions": [replica_failure("FailedDeleteWorkerPod", "failed to delete worker pod")]}
    cleared = {**cluster(2), "conditions": [replica_failure("FailedCreateHeadPod", QUOTA, status="False")]}
    unschedulable = [ray_pod("w-1", ready=False, scheduled=UNSCHEDULED)]
    statuses = run(
        [
            rayjob("Initializing", **RUN, rayClusterStatus=head),
            rayjob("Initializing", **RUN, rayClusterStatus=worker),
            rayjob("Initializing", **RUN, rayClusterStatus=other),
            rayjob("Running", "RUNNING", **RUN, rayClusterStatus=cleared),
        ],
        pods=[[], unschedulable, unschedulable, [ray_pod("w-1"), ray_pod("w-2")]],
    )
    found = [next(c for c in s["conditions"] if c["type"] == ConditionType.RAY_PODS_UNAVAILABLE) for s in statuses]
    assert [(c["status"], c["reason"]) for c in found] == [
        ("True", Reason.POD_CREATION_FAILED),
        ("True", Reason.POD_CREATION_FAILED),  # before the pods' own problems: it is why a worker is missing
        ("True", Reason.UNSCHEDULABLE),  # KubeRay failing to delete a pod is not a pod that cannot run
        ("False", Reason.RAY_PODS_AVAILABLE),
    ]
    assert found[0]["message"] == f"KubeRay cannot create the head pod: FailedCreateHeadPod: {QUOTA}"
    assert found[1]["message"] == "KubeRay cannot create the worker pod: FailedCreateWorkerPod: x"
    events = [e for old, new in zip([{}, *statuses], statuses, strict=False) for e in transition_events(old, new)]
    assert [(e.reason, e.message) for e in events if e.type == "Warning"] == [
        (Reason.POD_CREATION_FAILED, found[0]["message"]),  # one event per cause, as for the pods' own
        (Reason.UNSCHEDULABLE, found[2]["message"]),
    ]


def test_a_refusal_ends_when_the_pods_show_kubernetes_made_them():
    """KubeRay stops copying its cluster's status into the RayJob once the cluster is ready, until Ray's
    dashboard answers: a refusal left in that copy is over when the refused role's pods all exist."""
    head = {**cluster(0), "conditions": [replica_failure("FailedCreateHeadPod", f"FailedCreateHeadPod: {QUOTA}")]}
    worker = {**cluster(1), "conditions": [replica_failure("FailedCreateWorkerPod", "FailedCreateWorkerPod: x")]}
    head_pod = ray_pod("h", node_type="head")
    sequence = [
        rayjob("Initializing", **RUN, rayClusterStatus=worker),
        rayjob("Running", **RUN, rayClusterStatus=worker),
        rayjob("Initializing", **RUN, rayClusterStatus=head),
        rayjob("Initializing", **RUN, rayClusterStatus=head),
    ]
    pods = [[head_pod, ray_pod("w-1")], [head_pod, ray_pod("w-1"), ray_pod("w-2", ready=False)], [], [head_pod]]
    found = [conditions(s)[ConditionType.RAY_PODS_UNAVAILABLE] for s in run(sequence, pods=pods)]
    assert found == [
        ("True", Reason.POD_CREATION_FAILED),  # one of two workers: still refused
        ("False", Reason.RAY_PODS_AVAILABLE),  # both workers made (one not yet ready is no refusal)
        ("True", Reason.POD_CREATION_FAILED),  # no pods seen: KubeRay's word stands
        ("False", Reason.RAY_PODS_AVAILABLE),  # the head pod exists: its refusal is over
    ]


def conditions_of(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["message"] for c in status["conditions"]}


def test_pods_count_only_while_the_ray_cluster_should_run():
    suspended = rayjob("Suspending", suspend=True, rayClusterName="job-x7k2p")
    stuck = [ray_pod("w-1", ready=False, scheduled=UNSCHEDULED)]
    statuses = run([rayjob("Initializing", **RUN), suspended], spec(suspend=True), pods=[stuck, stuck])
    assert conditions(statuses[0])[ConditionType.RAY_PODS_UNAVAILABLE] == ("True", Reason.UNSCHEDULABLE)
    assert statuses[1]["phase"] == "Suspended"
    assert conditions(statuses[1])[ConditionType.RAY_PODS_UNAVAILABLE] == ("False", Reason.NO_RAY_PODS)
    # Pods of an earlier Ray cluster (before a retry) are not this one's.
    earlier = ray_pod("w-1", cluster="job-old", scheduled=UNSCHEDULED)
    (fresh,) = run([rayjob("Initializing", **RUN)], pods=[[earlier]])
    assert ConditionType.RAY_PODS_UNAVAILABLE not in conditions(fresh)


# ---- Kueue's Workload -------------------------------------------------------------------------

QUEUED = spec(scheduling={"queueName": "team-a"})
WAITING = (
    "couldn't assign flavors to pod set gpu: insufficient unused quota for amd.com/gpu in flavor mi300x, 8 more needed"
)
PREEMPTED = "Preempted to accommodate a workload (UID: 1, JobUID: 2) due to prioritization in the ClusterQueue"


def kueue_view(*conds: tuple[str, str, str, str], flavor: str | None = None) -> dict[str, Any]:
    """A Workload view (`rocmtrain.status.workload.workload_view`)."""
    return {
        "metadata": {
            "namespace": "ns",
            "name": "rayjob-job-1",
            "deleting": False,
            "owner": {"name": "job", "uid": "u"},
        },
        "conditions": [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conds],
        "clusterQueue": "team-a" if flavor else None,
        "flavors": [{"amd.com/gpu": flavor}] if flavor else [],
    }


def test_kueue_s_words_while_queued_admitted_preempted_and_readmitted():
    admitted = kueue_view(
        ("QuotaReserved", "True", "QuotaReserved", ""), ("Admitted", "True", "Admitted", ""), flavor="mi300x"
    )
    steps = [
        (rayjob("Suspended", suspend=True), kueue_view(("QuotaReserved", "False", "Pending", WAITING))),
        (rayjob("Initializing", **RUN), admitted),
        (
            rayjob("Running", "RUNNING", **RUN),
            kueue_view(
                ("Evicted", "True", "Preempted", PREEMPTED), ("Admitted", "True", "Admitted", ""), flavor="mi300x"
            ),
        ),
        (
            rayjob("Suspended", suspend=True),
            kueue_view(("QuotaReserved", "False", "Pending", WAITING), ("Evicted", "True", "Preempted", PREEMPTED)),
        ),
        (rayjob("Initializing", **RUN), admitted),
    ]
    statuses = run([rj for rj, _ in steps], QUEUED, workloads=[workload for _, workload in steps])
    assert [s["phase"] for s in statuses] == ["Queued", "Initializing", "Running", "Queued", "Initializing"]
    admitted_condition = [next(c for c in s["conditions"] if c["type"] == ConditionType.ADMITTED) for s in statuses]
    assert [(c["status"], c["reason"]) for c in admitted_condition] == [
        ("False", Reason.QUEUED_BY_KUEUE),
        ("True", Reason.ADMITTED),
        ("False", "Preempted"),
        ("False", "Preempted"),
        ("True", Reason.ADMITTED),
    ]
    assert admitted_condition[0]["message"] == f"waiting in Kueue queue team-a: {WAITING}"
    assert (
        admitted_condition[1]["message"]
        == "admitted by Kueue queue team-a (ClusterQueue team-a, amd.com/gpu flavor mi300x)"
    )
    assert admitted_condition[3]["message"] == f"{PREEMPTED}; waiting in Kueue queue team-a: {WAITING}"
    assert conditions(statuses[3])[ConditionType.READY] == ("False", "Preempted")
    events = [e for old, new in zip([{}, *statuses], statuses, strict=False) for e in transition_events(old, new)]
    preempted = [e for e in events if e.reason == "Preempted"]
    assert [e.type for e in preempted] == ["Warning"] and preempted[0].message.startswith(PREEMPTED)
    assert [e.reason for e in events if e.reason == Reason.ADMITTED] == ["Admitted", "Admitted"]


def test_a_namespace_s_default_queue_set_by_kueue_counts_as_the_job_s_queue():
    labelled = rayjob("Suspended", suspend=True)
    labelled["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "default"}
    (status,) = run([labelled])
    assert status["phase"] == "Queued"
    assert conditions(status)[ConditionType.ADMITTED] == ("False", Reason.QUEUED_BY_KUEUE)
    assert "queue default" in next(c for c in status["conditions"] if c["type"] == ConditionType.ADMITTED)["message"]


# ---- a job's own code (spec.code) --------------------------------------------------------------

CODE = spec(model=None, data=None, code={"command": ["python", "/code/train.py"]})


def test_own_code_that_never_reports_runs_without_stalling_and_succeeds_saying_so():
    rj = running_rayjob(T0)
    running = observe(rj=rj, spec=CODE, now=T0 + dt.timedelta(seconds=5000))
    assert running["phase"] == "Running" and ConditionType.STALLED not in conditions(running), "no report, no stall"
    waiting = next(c for c in running["conditions"] if c["type"] == ConditionType.PROGRESS_REPORTED)
    assert (waiting["status"], waiting["reason"]) == ("False", Reason.NO_PROGRESS_REPORTED)
    assert "stall detection starts with its first report" in waiting["message"]
    done = rayjob("Complete", "SUCCEEDED", **RUN)
    succeeded = observe(running, done, spec=CODE, now=T0 + dt.timedelta(seconds=5001))
    assert succeeded["phase"] == "Succeeded"
    said = next(c for c in succeeded["conditions"] if c["type"] == ConditionType.PROGRESS_REPORTED)
    assert (said["status"], said["reason"]) == ("False", Reason.NO_PROGRESS_REPORTED)
    assert said["message"].startswith("your code reported no progress")
    assert ConditionType.PROGRESS_REPORTED not in conditions(observe(rj=rj)), "the built-in driver always reports"


def test_once_own_code_reports_its_reports_alone_key_stall_detection():
    rj = running_rayjob(T0 + dt.timedelta(seconds=4000))  # the RayJob changed lately: it does not count
    reported = {"phase": "Running", "lastProgressTime": rfc3339(T0)}
    stalled = observe(reported, rj, spec=CODE, now=T0 + dt.timedelta(seconds=1000))
    assert conditions(stalled)[ConditionType.STALLED] == ("True", Reason.NO_PROGRESS)
    message = next(c for c in stalled["conditions"] if c["type"] == ConditionType.STALLED)["message"]
    assert message == "no progress report from your code since 2026-01-02T03:04:05Z (limit 900s)"
    assert conditions(stalled)[ConditionType.PROGRESS_REPORTED] == ("True", Reason.PROGRESS_REPORTED)
    fresh = observe({**stalled, "lastProgressTime": rfc3339(T0 + dt.timedelta(seconds=990))}, rj, spec=CODE,
                    now=T0 + dt.timedelta(seconds=1000))  # fmt: skip
    assert conditions(fresh)[ConditionType.STALLED] == ("False", Reason.PROGRESSING)


# What Ray's job supervisor says of a Ray Train script that raised in a worker: the last 10 lines of the driver's
# log (as the test world's e2e run had it): the end of the traceback Ray Train re-raised, then Ray's repeats.
RAY_TRAIN_FAILURE = (
    "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
    '  File "/code/train.py", line 10, in check\n'
    '    raise ValueError(f"label {label} out of range 0..2")\n'
    "ValueError: label 7 out of range 0..2\n"
    "\n"
    "\x1b[36m(TrainController pid=568)\x1b[0m Traceback (most recent call last):\x1b[32m [repeated 2x across cluster] "
    "(Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication.)\x1b[0m\n"
    '\x1b[36m(TrainController pid=568)\x1b[0m   File "/code/train.py", line 15, in train_func'
    "\x1b[32m [repeated 2x across cluster]\x1b[0m\n"
    "\x1b[36m(TrainController pid=568)\x1b[0m     check(label)\x1b[32m [repeated 2x across cluster]\x1b[0m\n"
    '\x1b[36m(TrainController pid=568)\x1b[0m   File "/code/train.py", line 10, in check'
    "\x1b[32m [repeated 2x across cluster]\x1b[0m\n"
    '\x1b[36m(TrainController pid=568)\x1b[0m     raise ValueError(f"label {label} out of range 0..2")'
    "\x1b[32m [repeated 2x across cluster]\x1b[0m\n"
    "\x1b[36m(TrainController pid=568)\x1b[0m ValueError: label 7 out of range 0..2"
    "\x1b[32m [repeated 2x across cluster]\x1b[0m\n"
)


def test_own_code_that_fails_shows_its_error_line_and_frame_first():
    final = rayjob("Failed", "FAILED", **RUN, reason="AppFailed", message=RAY_TRAIN_FAILURE, failed=1)
    statuses = run([rayjob("Running", "RUNNING", **RUN), final], CODE)
    failed = next(c for c in statuses[-1]["conditions"] if c["type"] == ConditionType.FAILED)
    lines = failed["message"].splitlines()
    assert lines[:3] == [
        "ValueError: label 7 out of range 0..2",
        '  File "/code/train.py", line 10, in check',
        '    raise ValueError(f"label {label} out of range 0..2")',
    ]
    assert lines[3:] == ["(the Ray job's entrypoint exited with code 1)"], "the exit code follows, not the log"
    (event,) = transition_events(statuses[0], statuses[1])
    assert event.message.startswith("Running → Failed: ValueError: label 7 out of range 0..2\n  File")
