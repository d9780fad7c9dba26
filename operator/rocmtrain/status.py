"""Map what the operator observes onto a RocmTrainingJob's status (pure).

Inputs are plain data: the job, the owned RayJob as KubeRay last wrote it (or
None), why the operator holds the RayJob back (a `Hold`: pre-flight, KubeRay
missing, a name conflict), and the time. The output is the part of `status` the operator owns (everything but
the progress fields the training driver reports) plus the events that explain
each transition. Conditions follow Kubernetes API conventions: a condition's
`lastTransitionTime` moves only when its status changes.

KubeRay (v1.5.1) writes `status.jobDeploymentStatus` (``""`` = New,
Initializing, Running, Complete, Failed, ValidationFailed, Suspending,
Suspended, Retrying, Waiting, Scheduling, Scheduled) and `status.jobStatus`
(``""``, PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED), with `reason`
(SubmissionFailed, DeadlineExceeded, AppFailed, ValidationFailed,
JobDeploymentStatusTransitionGracePeriodExceeded) and `message` on failures.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rocmtrain.api.contract import RAYJOB_API_VERSION
from rocmtrain.api.models import Condition, Phase, RocmTrainingJobSpec, RocmTrainingJobStatus
from rocmtrain.api.timestamps import parse_time, rfc3339

# Status fields the operator writes; the progress endpoint owns the others.
OWNED_FIELDS = (
    "phase",
    "conditions",
    "observedGeneration",
    "rayJobName",
    "rayClusterName",
    "jobId",
    "dashboardUrl",
    "workersDesired",
    "workersReady",
    "gpus",
    "startTime",
    "completionTime",
    "restarts",
)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# Condition types, in the order they are listed.
READY = "Ready"
ADMITTED = "Admitted"
UNSCHEDULABLE = "Unschedulable"
KUBERAY_MISSING = "KubeRayMissing"
STALLED = "Stalled"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
MANAGED_CONDITIONS = (READY, ADMITTED, UNSCHEDULABLE, KUBERAY_MISSING, STALLED, SUCCEEDED, FAILED)


class HoldKind(enum.Enum):
    """What holds a RayJob back; the first two also raise the condition of their name."""

    UNSCHEDULABLE = UNSCHEDULABLE  # pre-flight: no node can ever run the workers
    KUBERAY_MISSING = KUBERAY_MISSING  # the RayJob API is not served
    CONFLICT = "Conflict"  # the RayJob's name is taken by an object the job does not own


@dataclass(frozen=True)
class Hold:
    """Why the operator does not (yet) create or update the RayJob, and when to look again.

    `reason` and `message` become the Ready condition's (and the kind's own condition's);
    `retry_seconds` None means after the operator's `ROCMTRAIN_RETRY_SECONDS`.
    """

    kind: HoldKind
    reason: str
    message: str
    retry_seconds: float | None = None

    def retry_after(self, default: float) -> float:
        """Seconds until the held job is checked again."""
        return default if self.retry_seconds is None else self.retry_seconds


KUBERAY_NOT_INSTALLED = Hold(
    HoldKind.KUBERAY_MISSING,
    "KubeRayNotInstalled",
    f"KubeRay's RayJob API ({RAYJOB_API_VERSION}) is not installed; install the KubeRay operator",
)


@dataclass(frozen=True)
class Event:
    """A Kubernetes event to post on the job."""

    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Observation:
    """Everything the status of one valid job is computed from."""

    spec: RocmTrainingJobSpec
    generation: int | None
    current: Mapping[str, Any]  # the job's status as last written (wire form)
    rayjob: Mapping[str, Any] | None  # the owned RayJob; None while absent
    now: dt.datetime
    stall_after: float  # seconds without progress before a running job counts as stalled
    hold: Hold | None = None  # why the RayJob is held back; None when nothing holds it


@dataclass(frozen=True)
class _State:
    """Phase plus the Ready condition's reason and message."""

    phase: Phase
    reason: str
    message: str


# ---- RayJob reading ---------------------------------------------------------------


def _rayjob_status(rayjob: Mapping[str, Any]) -> Mapping[str, Any]:
    return rayjob.get("status") or {}


def _count(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def _workers(obs: Observation) -> tuple[int, int]:
    """(desired, ready) worker replicas as KubeRay reports them, the spec's count before that."""
    desired = obs.spec.worker_pods
    if obs.rayjob is None:
        return desired, 0
    cluster = _rayjob_status(obs.rayjob).get("rayClusterStatus") or {}
    reported = cluster.get("desiredWorkerReplicas")
    return (reported if isinstance(reported, int) and reported > 0 else desired), _count(
        cluster.get("readyWorkerReplicas")
    )


def last_rayjob_change(rayjob: Mapping[str, Any]) -> dt.datetime | None:
    """When the RayJob's status last changed: the newest status write in managedFields."""
    times = [
        parse_time(entry.get("time"))
        for entry in rayjob.get("metadata", {}).get("managedFields") or []
        if entry.get("subresource") == "status"
    ]
    known = [t for t in times if t is not None]
    if known:
        return max(known)
    return parse_time(_rayjob_status(rayjob).get("startTime")) or parse_time(
        rayjob.get("metadata", {}).get("creationTimestamp")
    )


# ---- phase -------------------------------------------------------------------------


def _suspended_state(obs: Observation) -> _State:
    queue = obs.spec.scheduling.queue_name
    if queue and not obs.spec.suspend:
        return _State("Queued", "QueuedByKueue", f"waiting for Kueue to admit the workload (queue {queue})")
    return _State("Suspended", "Suspended", "suspended: the Ray cluster is deleted until spec.suspend is false")


def _failed(reason: str, message: str, default: str) -> _State:
    return _State("Failed", reason or "Failed", message or default)


def _rayjob_state(obs: Observation, rayjob: Mapping[str, Any]) -> _State:
    """The phase a present RayJob puts the job in."""
    st = _rayjob_status(rayjob)
    deployment = st.get("jobDeploymentStatus") or ""
    job_status = st.get("jobStatus") or ""
    reason, message = st.get("reason") or "", st.get("message") or ""
    desired, ready = _workers(obs)
    workers = f"{ready}/{desired} workers ready"
    suspend_requested = bool((rayjob.get("spec") or {}).get("suspend"))

    if suspend_requested and deployment in ("", "Initializing", "Waiting", "Suspending", "Suspended"):
        return _suspended_state(obs)
    if deployment in ("Suspending", "Suspended"):
        return _State("Pending", "Resuming", "resuming: waiting for KubeRay to recreate the Ray cluster")
    if deployment == "Retrying" or (deployment == "" and _count(st.get("failed")) > 0):
        return _State("Initializing", "Retrying", f"retrying on a new Ray cluster after a failure ({workers})")
    if deployment in ("Initializing", "Waiting"):
        return _State("Initializing", "Initializing", f"starting the Ray cluster ({workers})")
    if deployment == "Running":
        if job_status in ("RUNNING", "SUCCEEDED", "FAILED", "STOPPED"):
            return _State("Running", "Running", f"Ray job {st.get('jobId', '')} is {job_status.lower()} ({workers})")
        return _State("Initializing", "Submitting", f"the Ray job is submitted and waiting to start ({workers})")
    if deployment == "Complete":
        if job_status == "SUCCEEDED":
            return _State("Succeeded", "Succeeded", message or "the Ray job succeeded")
        return _failed("Stopped" if job_status == "STOPPED" else reason, message, f"the Ray job ended {job_status}")
    if deployment == "Failed":
        return _failed(reason, message, "the RayJob failed")
    if deployment == "ValidationFailed":
        return _failed("ValidationFailed", message, "KubeRay rejected the RayJob")
    if deployment in ("", "Scheduling", "Scheduled"):
        return _State("Pending", "RayJobCreated", "waiting for KubeRay to start the RayJob")
    return _State("Pending", "UnknownState", f"KubeRay reports an unknown deployment status {deployment!r}")


def _state(obs: Observation) -> _State:
    previous = obs.current.get("phase")
    if previous in TERMINAL_PHASES:
        ready = _find(obs.current.get("conditions") or [], READY) or {}
        return _State(previous, ready.get("reason", previous), ready.get("message", ""))
    if obs.rayjob is not None:
        return _rayjob_state(obs, obs.rayjob)
    if obs.hold is not None:
        return _State("Pending", obs.hold.reason, obs.hold.message)
    return _State("Pending", "CreatingRayJob", "creating the RayJob")


# ---- conditions ----------------------------------------------------------------------


def _find(conditions: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def _stall(obs: Observation, phase: str) -> tuple[str, str] | None:
    """(reason, message) when a running job has shown no progress for too long."""
    if phase != "Running":
        return None
    signals = [parse_time(obs.current.get("lastProgressTime"))]
    if obs.rayjob is not None:
        signals.append(last_rayjob_change(obs.rayjob))
    known = [t for t in signals if t is not None]
    if not known:
        return None
    last = max(known)
    if (obs.now - last).total_seconds() > obs.stall_after:
        return "NoProgress", f"no progress since {rfc3339(last)} (limit {int(obs.stall_after)}s)"
    return None


def _alarm(
    current: Sequence[Mapping[str, Any]], kind: str, active: tuple[str, str] | None, resolved: str
) -> tuple[str, str, str] | None:
    """A problem condition: True while `active`; once it has appeared, False with `resolved` after."""
    if active is not None:
        return "True", *active
    if _find(current, kind) is not None:
        return "False", resolved, ""
    return None


def _admitted(obs: Observation, phase: str) -> tuple[str, str, str] | None:
    """Kueue admission: Kueue creates the RayJob suspended and unsuspends it on admission."""
    queue = obs.spec.scheduling.queue_name
    if not queue:
        return None
    if phase in TERMINAL_PHASES:
        previous = _find(obs.current.get("conditions") or [], ADMITTED)
        if previous is not None:
            return previous["status"], previous.get("reason", ""), previous.get("message", "")
    if obs.rayjob is None:
        return "False", "Pending", f"not yet submitted to Kueue queue {queue}"
    if phase == "Queued" or (obs.rayjob.get("spec") or {}).get("suspend"):
        return "False", "QueuedByKueue", f"waiting in Kueue queue {queue}"
    return "True", "Admitted", f"admitted by Kueue queue {queue}"


def _desired_conditions(obs: Observation, state: _State) -> dict[str, tuple[str, str, str]]:
    phase = state.phase
    current = obs.current.get("conditions") or []
    hold = obs.hold if obs.rayjob is None and phase not in TERMINAL_PHASES else None

    def held_by(kind: HoldKind) -> tuple[str, str] | None:
        return (hold.reason, hold.message) if hold is not None and hold.kind is kind else None

    candidates = {
        READY: ("True" if phase == "Running" else "False", state.reason, state.message),
        ADMITTED: _admitted(obs, phase),
        UNSCHEDULABLE: _alarm(current, UNSCHEDULABLE, held_by(HoldKind.UNSCHEDULABLE), "Schedulable"),
        KUBERAY_MISSING: _alarm(current, KUBERAY_MISSING, held_by(HoldKind.KUBERAY_MISSING), "KubeRayInstalled"),
        STALLED: _alarm(current, STALLED, _stall(obs, phase), "Progressing" if phase == "Running" else "NotRunning"),
        SUCCEEDED: ("True", state.reason, state.message) if phase == "Succeeded" else None,
        FAILED: ("True", state.reason, state.message) if phase == "Failed" else None,
    }
    return {kind: value for kind, value in candidates.items() if value is not None}


def merge_conditions(
    current: Sequence[Mapping[str, Any]],
    desired: Mapping[str, tuple[str, str, str]],
    *,
    now: dt.datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The condition list: `desired` (type → status, reason, message) in a fixed order.

    A condition keeps its `lastTransitionTime` while its status stays the same;
    conditions of types this module does not manage are kept as they are.
    """
    stamp = rfc3339(now)
    merged: list[dict[str, Any]] = []
    for kind in MANAGED_CONDITIONS:
        if kind not in desired:
            continue
        status, reason, message = desired[kind]
        before = _find(current, kind)
        since = before.get("lastTransitionTime") if before and before.get("status") == status else None
        merged.append(
            Condition(
                type=kind,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=since or stamp,
                observed_generation=generation,
            ).dump()
        )
    merged.extend(dict(c) for c in current if c.get("type") not in MANAGED_CONDITIONS)
    return merged


# ---- status --------------------------------------------------------------------------


def _restarts(rayjob: Mapping[str, Any] | None, phase: str) -> int:
    """Whole-job retries: KubeRay's failure count, less the final failure."""
    if rayjob is None:
        return 0
    failed = _count(_rayjob_status(rayjob).get("failed"))
    return max(failed - 1, 0) if phase == "Failed" else failed


def compute_status(obs: Observation) -> dict[str, Any]:
    """The operator-owned status fields (wire form) for `obs`."""
    state = _state(obs)
    current = obs.current
    desired, ready = _workers(obs)
    rayjob_status = _rayjob_status(obs.rayjob) if obs.rayjob is not None else {}
    started = state.phase in ("Initializing", "Running") or state.phase in TERMINAL_PHASES
    start_time = current.get("startTime") or (
        rfc3339(parse_time(rayjob_status.get("startTime")) or obs.now) if started and obs.rayjob is not None else None
    )
    completion = current.get("completionTime")
    if state.phase in TERMINAL_PHASES and not completion:
        completion = rfc3339(parse_time(rayjob_status.get("endTime")) or obs.now)
    status = RocmTrainingJobStatus(
        phase=state.phase,
        conditions=merge_conditions(
            current.get("conditions") or [],
            _desired_conditions(obs, state),
            now=obs.now,
            generation=obs.generation,
        ),
        observed_generation=obs.generation,
        ray_job_name=(obs.rayjob or {}).get("metadata", {}).get("name") or current.get("rayJobName"),
        ray_cluster_name=rayjob_status.get("rayClusterName") or None,
        job_id=rayjob_status.get("jobId") or None,
        dashboard_url=rayjob_status.get("dashboardURL") or None,
        workers_desired=desired,
        workers_ready=ready,
        gpus=obs.spec.total_gpus,
        start_time=start_time,
        completion_time=completion if state.phase in TERMINAL_PHASES else None,
        restarts=max(_restarts(obs.rayjob, state.phase), _count(current.get("restarts"))),
    )
    if state.phase in TERMINAL_PHASES and obs.rayjob is None:
        # The RayJob is gone after the end (deleted by KubeRay or by hand): keep what was seen.
        status = status.model_copy(
            update={
                "ray_cluster_name": current.get("rayClusterName"),
                "job_id": current.get("jobId"),
                "dashboard_url": current.get("dashboardUrl"),
                "workers_ready": current.get("workersReady", 0),
            }
        )
    return status.dump()


def invalid_status(
    current: Mapping[str, Any], errors: Sequence[str], *, generation: int | None, now: dt.datetime
) -> dict[str, Any]:
    """The status of a job whose spec the operator refuses: Failed with every field error."""
    message = "invalid spec: " + "; ".join(errors)
    return RocmTrainingJobStatus(
        phase="Failed",
        conditions=merge_conditions(
            current.get("conditions") or [],
            {READY: ("False", "InvalidSpec", message), FAILED: ("True", "InvalidSpec", message)},
            now=now,
            generation=generation,
        ),
        observed_generation=generation,
        completion_time=current.get("completionTime") or rfc3339(now),
    ).dump()


def status_patch(current: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch of `status` turning `current` into `new` (owned fields only); {} when equal."""
    return {key: new.get(key) for key in OWNED_FIELDS if current.get(key) != new.get(key)}


# ---- events ---------------------------------------------------------------------------

_WARNING_PHASES = frozenset({"Failed"})
# Condition types whose turning True deserves its own event: (type, event type).
_NOTABLE = ((UNSCHEDULABLE, "Warning"), (KUBERAY_MISSING, "Warning"), (STALLED, "Warning"), (ADMITTED, "Normal"))


def _turned_true(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], kind: str) -> bool:
    return (_find(new, kind) or {}).get("status") == "True" and (_find(old, kind) or {}).get("status") != "True"


def transition_events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """Events explaining the change from status `old` to `new`: phase changes, alarms, admission, restarts."""
    events: list[Event] = []
    old_conditions = old.get("conditions") or []
    new_conditions = new.get("conditions") or []
    phase = new.get("phase")
    if phase and phase != old.get("phase"):
        ready = _find(new_conditions, READY) or {}
        detail = ready.get("message") or ready.get("reason") or ""
        message = f"{old.get('phase') or 'New'} → {phase}" + (f": {detail}" if detail else "")
        events.append(Event("Warning" if phase in _WARNING_PHASES else "Normal", phase, message))
    for kind, event_type in _NOTABLE:
        if _turned_true(old_conditions, new_conditions, kind):
            cond = _find(new_conditions, kind) or {}
            events.append(Event(event_type, cond.get("reason") or kind, cond.get("message") or kind))
    if _count(new.get("restarts")) > _count(old.get("restarts")):
        events.append(Event("Warning", "Retrying", f"whole-job retry {new['restarts']} on a new Ray cluster"))
    return events
