"""Map what the operator observes onto a RocmTrainingJob's status (pure).

Inputs are plain data: the job, the owned RayJob as KubeRay last wrote it (or
None), the Ray pods of the job (`rocmtrain.pod_health`), Kueue's Workload of a
queued job (`rocmtrain.kueue_workload`), why the operator holds the RayJob back (a
`Hold`: pre-flight, KubeRay missing, a name conflict, the API server refusing the
RayJob), and the time. The output is the part of `status` the operator owns
(everything but the progress fields the training driver reports) plus the events
that explain each transition. Conditions follow Kubernetes API conventions: a
condition's `lastTransitionTime` moves only when its status changes.

Two conditions say why GPUs are not in use, and never at once: `Unschedulable`
(pre-flight) when no node could ever hold the workers, so no RayJob is made;
`RayPodsUnavailable` when the Ray pods exist but cannot run now (the scheduler finds
no room, an image cannot be pulled, a container crashes or fails), quoting the
scheduler or the kubelet.

The conditions also speak kstatus (the status library of Flux and kpt): `Ready` is True
when the job is where its spec asks it to be (Running, Succeeded, or Suspended by
`spec.suspend`), so kstatus reads it as Current; `Stalled` is True when a running job
shows no progress or the job failed, which kstatus reads as Failed; `observedGeneration`
tells a spec change not yet acted on. GPU-seconds and cost are counted by
`rocmtrain.accounting`.

KubeRay (v1.5.1) writes `status.jobDeploymentStatus` (``""`` = New,
Initializing, Running, Complete, Failed, ValidationFailed, Suspending,
Suspended, Retrying, Waiting, Scheduling, Scheduled) and `status.jobStatus`
(``""``, PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED), with `reason`
(SubmissionFailed, DeadlineExceeded, AppFailed, ValidationFailed,
JobDeploymentStatusTransitionGracePeriodExceeded) and `message` on failures.
When the Ray job failed, that message is Ray's (the entrypoint's exit code and
the tail of the driver's log); the driver's own one-line error, found there by
`DRIVER_ERROR_PREFIX`, goes first in the job's Failed condition.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rocmtrain import accounting, kueue_workload, pod_health
from rocmtrain.api.contract import DRIVER_ERROR_PREFIX, GPU_RESOURCE, KUEUE_QUEUE_LABEL, RAYJOB_API_VERSION
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
    "gpuSeconds",
    "gpusHeld",
    "accountedUntil",
    "cost",
)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# Phases in which the job is where its spec asks it to be: Ready is True.
READY_PHASES = frozenset({"Running", "Succeeded", "Suspended"})
# Phases in which the Ray cluster's ready workers hold their GPUs (see `rocmtrain.accounting`).
HOLDING_PHASES = frozenset({"Initializing", "Running"})

# Condition types, in the order they are listed.
READY = "Ready"
ADMITTED = "Admitted"
UNSCHEDULABLE = "Unschedulable"
RAY_PODS_UNAVAILABLE = "RayPodsUnavailable"
KUBERAY_MISSING = "KubeRayMissing"
BLOCKED = "Blocked"
STALLED = "Stalled"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
MANAGED_CONDITIONS = (
    READY,
    ADMITTED,
    UNSCHEDULABLE,
    RAY_PODS_UNAVAILABLE,
    KUBERAY_MISSING,
    BLOCKED,
    STALLED,
    SUCCEEDED,
    FAILED,
)
# How much of the API server's own message a condition or event quotes.
QUOTE_LIMIT = 1024
# The Ready reason of a queued job Kueue has not admitted (and has not evicted).
QUEUED_BY_KUEUE = "QueuedByKueue"


class HoldKind(enum.Enum):
    """What holds a RayJob back; all but CONFLICT also raise the condition of their name."""

    UNSCHEDULABLE = UNSCHEDULABLE  # pre-flight: no node can ever run the workers
    KUBERAY_MISSING = KUBERAY_MISSING  # the RayJob API is not served
    # Something outside the spec refuses the RayJob: the API server's admission (a
    # quota, a policy, a webhook) or a name the operator must not take over.
    BLOCKED = BLOCKED
    CONFLICT = "Conflict"  # the RayJob's name is taken by an object the job does not own (transient)


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


def quote(message: str, limit: int = QUOTE_LIMIT) -> str:
    """Another system's message, cut to `limit` characters for a condition or an event."""
    return message if len(message) <= limit else message[: limit - 1] + "…"


def refused_create(status: int, message: str) -> Hold:
    """The hold of a RayJob whose create the API server refused (HTTP `status`, its `message`)."""
    reason = "RayJobForbidden" if status == 403 else "RayJobInvalid"
    return Hold(HoldKind.BLOCKED, reason, quote(f"the API server refused the RayJob: {message}"))


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
    price: accounting.Price | None = None  # the price of the job's GPU-hours, when the operator has one
    pods: Sequence[Mapping[str, Any]] = ()  # the job's Ray pods (`pod_health.pod_view`), of any Ray cluster
    workload: Mapping[str, Any] | None = None  # Kueue's Workload of the RayJob (`kueue_workload.workload_view`)


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


def _ray_pods(obs: Observation) -> pod_health.RayPods | None:
    """What the pods of the RayJob's current Ray cluster show; None before any is seen."""
    if obs.rayjob is None:
        return None
    cluster = _rayjob_status(obs.rayjob).get("rayClusterName")
    return pod_health.assess(obs.pods, cluster) if cluster else None


def _workers(obs: Observation) -> tuple[int, int]:
    """(desired, ready) workers: ready ones as the pods show them, else as KubeRay last reported.

    The pods come first: KubeRay copies its cluster's counts into the RayJob only while it
    polls the Ray dashboard, so the RayJob's count can lag behind the pods. Desired counts
    every worker pod, those of a search's concurrent trials included.
    """
    desired = obs.spec.worker_pods
    if obs.rayjob is None:
        return desired, 0
    cluster = _rayjob_status(obs.rayjob).get("rayClusterStatus") or {}
    reported = cluster.get("desiredWorkerReplicas")
    pods = _ray_pods(obs)
    ready = pods.ready_workers if pods is not None else _count(cluster.get("readyWorkerReplicas"))
    return (reported if isinstance(reported, int) and reported > 0 else desired), ready


# ---- Kueue ---------------------------------------------------------------------------


def _queue(obs: Observation) -> str | None:
    """The Kueue LocalQueue of the job: its own, or the one Kueue gave its RayJob (a namespace's default)."""
    labels = ((obs.rayjob or {}).get("metadata") or {}).get("labels") or {}
    return obs.spec.scheduling.queue_name or labels.get(KUEUE_QUEUE_LABEL)


def _kueue(obs: Observation) -> kueue_workload.Admission | None:
    return kueue_workload.admission(obs.workload) if obs.workload is not None else None


def _waiting(obs: Observation, queue: str) -> tuple[str, str]:
    """(reason, message) of a queued job Kueue holds: evicted (Kueue's reason) or waiting, in Kueue's words."""
    kueue = _kueue(obs)
    waiting = kueue.waiting if kueue is not None else None
    if kueue is not None and kueue.evicted is not None:
        reason, message = kueue.evicted
        detail = f"; waiting in Kueue queue {queue}" + (f": {waiting}" if waiting and waiting != message else "")
        return reason, f"{message or reason}{detail}"
    if waiting:
        return QUEUED_BY_KUEUE, f"waiting in Kueue queue {queue}: {waiting}"
    return QUEUED_BY_KUEUE, f"waiting for Kueue to admit the workload (queue {queue})"


def _admitted_message(obs: Observation, queue: str) -> str:
    kueue = _kueue(obs)
    if kueue is None or not kueue.admitted:
        return f"admitted by Kueue queue {queue}"
    where = [f"ClusterQueue {kueue.cluster_queue}"] if kueue.cluster_queue else []
    if kueue.flavors:
        where.append(f"{GPU_RESOURCE} flavor {', '.join(kueue.flavors)}")
    return f"admitted by Kueue queue {queue}" + (f" ({', '.join(where)})" if where else "")


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
    queue = _queue(obs)
    if queue and not obs.spec.suspend:
        return _State("Queued", *_waiting(obs, queue))
    return _State("Suspended", "Suspended", "suspended: the Ray cluster is deleted until spec.suspend is false")


def driver_error_first(message: str) -> str:
    """Ray's message with the driver's last `DRIVER_ERROR_PREFIX` line put first (unchanged without one)."""
    found = [line for line in message.splitlines() if DRIVER_ERROR_PREFIX in line]
    if not found:
        return message
    error = found[-1].split(DRIVER_ERROR_PREFIX, 1)[1].strip()
    return f"{error}\n{message}"


def _failed(reason: str, message: str, default: str) -> _State:
    return _State("Failed", reason or "Failed", driver_error_first(message) or default)


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
        if _queue(obs):  # Kueue unsuspended it: admitted
            return _State("Pending", "Admitted", "admitted by Kueue; waiting for KubeRay to start the Ray cluster")
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


def _failure(state: _State) -> tuple[str, str] | None:
    """(reason, message) of a failed job: kstatus reads `Stalled=True` as Failed."""
    return (state.reason, state.message) if state.phase == "Failed" else None


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
    """Kueue admission: the RayJob is made suspended; Kueue unsuspends it on admission, suspends it on eviction.

    Kueue's Workload, when seen, has the last word and the words: why it waits, which
    flavor it got, why it was evicted; without it (Kueue not installed, or not yet
    seen) the RayJob's `suspend` tells admission.
    """
    queue = _queue(obs)
    if not queue:
        return None
    if phase in TERMINAL_PHASES:
        previous = _find(obs.current.get("conditions") or [], ADMITTED)
        if previous is not None:
            return previous["status"], previous.get("reason", ""), previous.get("message", "")
    if obs.rayjob is None:
        return "False", "Pending", f"not yet submitted to Kueue queue {queue}"
    kueue = _kueue(obs)
    held = phase == "Queued" or (obs.rayjob.get("spec") or {}).get("suspend")
    if held or (kueue is not None and not kueue.admitted):
        return "False", *_waiting(obs, queue)
    return "True", "Admitted", _admitted_message(obs, queue)


def _desired_conditions(obs: Observation, state: _State) -> dict[str, tuple[str, str, str]]:
    phase = state.phase
    current = obs.current.get("conditions") or []
    hold = obs.hold if obs.rayjob is None and phase not in TERMINAL_PHASES else None

    def held_by(kind: HoldKind) -> tuple[str, str] | None:
        return (hold.reason, hold.message) if hold is not None and hold.kind is kind else None

    starting = phase in ("Initializing", "Running")
    pods = _ray_pods(obs) if starting else None
    problem = pods.problem if pods is not None else None
    candidates = {
        READY: ("True" if phase in READY_PHASES else "False", state.reason, state.message),
        ADMITTED: _admitted(obs, phase),
        UNSCHEDULABLE: _alarm(current, UNSCHEDULABLE, held_by(HoldKind.UNSCHEDULABLE), "Schedulable"),
        RAY_PODS_UNAVAILABLE: _alarm(
            current,
            RAY_PODS_UNAVAILABLE,
            (problem.reason, problem.message) if problem is not None else None,
            "RayPodsAvailable" if starting else "NoRayPods",
        ),
        KUBERAY_MISSING: _alarm(current, KUBERAY_MISSING, held_by(HoldKind.KUBERAY_MISSING), "KubeRayInstalled"),
        BLOCKED: _alarm(current, BLOCKED, held_by(HoldKind.BLOCKED), "Unblocked"),
        STALLED: _alarm(
            current,
            STALLED,
            _stall(obs, phase) or _failure(state),
            "Progressing" if phase == "Running" else "NotRunning",
        ),
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
    held = ready * obs.spec.resources.gpus_per_worker if state.phase in HOLDING_PHASES and obs.rayjob is not None else 0
    # An ended job is counted up to its end, however late the operator sees it.
    until = min(obs.now, parse_time(completion) or obs.now) if state.phase in TERMINAL_PHASES else obs.now
    usage = accounting.account(current, held, until, obs.price)
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
        gpu_seconds=usage["gpuSeconds"],
        gpus_held=usage["gpusHeld"],
        accounted_until=usage["accountedUntil"],
        cost=usage["cost"],
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


# Why the operator refuses a job's spec: `rocmtrain.api.validate`, or the operator's allow-lists.
INVALID_SPEC = ("InvalidSpec", "invalid spec")
NOT_ALLOWED = ("NotAllowed", "not allowed by the operator's settings")


def invalid_status(
    current: Mapping[str, Any],
    errors: Sequence[str],
    *,
    generation: int | None,
    now: dt.datetime,
    why: tuple[str, str] = INVALID_SPEC,
) -> dict[str, Any]:
    """The status of a job whose spec the operator refuses (`why`: reason, prefix): Failed with every error."""
    reason, prefix = why
    message = f"{prefix}: " + "; ".join(errors)
    refused = (reason, message)
    return RocmTrainingJobStatus(
        phase="Failed",
        conditions=merge_conditions(
            current.get("conditions") or [],
            {READY: ("False", *refused), STALLED: ("True", *refused), FAILED: ("True", *refused)},
            now=now,
            generation=generation,
        ),
        observed_generation=generation,
        completion_time=current.get("completionTime") or rfc3339(now),
        gpu_seconds=current.get("gpuSeconds"),
        cost=current.get("cost"),
    ).dump()


def status_patch(current: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch of `status` turning `current` into `new` (owned fields only); {} when equal."""
    return {key: new.get(key) for key in OWNED_FIELDS if current.get(key) != new.get(key)}


# ---- events ---------------------------------------------------------------------------

_WARNING_PHASES = frozenset({"Failed"})
# Condition types whose turning True (or changing reason while True) deserves its own event: (type, event type).
_NOTABLE = (
    (UNSCHEDULABLE, "Warning"),
    (RAY_PODS_UNAVAILABLE, "Warning"),
    (KUBERAY_MISSING, "Warning"),
    (BLOCKED, "Warning"),
    (STALLED, "Warning"),
    (ADMITTED, "Normal"),
)


def _raised(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], kind: str) -> bool:
    """Whether condition `kind` turned True, or is True for another reason than before (a new cause)."""
    now, before = _find(new, kind) or {}, _find(old, kind) or {}
    return now.get("status") == "True" and (before.get("status") != "True" or before.get("reason") != now.get("reason"))


def _withdrawn(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], kind: str) -> bool:
    return (_find(old, kind) or {}).get("status") == "True" and (_find(new, kind) or {}).get("status") == "False"


def transition_events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """Events explaining the change from status `old` to `new`: phase changes, alarms, admission
    and its withdrawal (a Kueue eviction, in Kueue's words), restarts."""
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
        if kind == STALLED and phase == "Failed":
            continue  # a failure is Stalled too (for kstatus); the phase event tells it
        if _raised(old_conditions, new_conditions, kind):
            cond = _find(new_conditions, kind) or {}
            events.append(Event(event_type, cond.get("reason") or kind, cond.get("message") or kind))
    if _withdrawn(old_conditions, new_conditions, ADMITTED):
        cond = _find(new_conditions, ADMITTED) or {}
        events.append(Event("Warning", cond.get("reason") or "Evicted", cond.get("message") or ADMITTED))
    if _count(new.get("restarts")) > _count(old.get("restarts")):
        events.append(Event("Warning", "Retrying", f"whole-job retry {new['restarts']} on a new Ray cluster"))
    return events
