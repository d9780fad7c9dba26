"""Map what the operator observes onto a RocmTrainingJob's status (pure).

Inputs are plain data: the job, the owned RayJob as KubeRay last wrote it (or
None), the Ray pods of the job (`rocmtrain.status.pods`), Kueue's Workload of a
queued job (`rocmtrain.status.workload`), why the operator holds the RayJob back (a
`Hold`: pre-flight, KubeRay missing, a name conflict, the API server refusing the
RayJob), and the time. The output is the part of `status` the operator owns
(everything but the progress fields the training driver reports) plus the events
that explain each transition (`rocmtrain.status.events`). Conditions are typed
values (`rocmtrain.status.condition_merge`); their types and reasons are named in
`rocmtrain.api.condition_reasons`.

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
`rocmtrain.status.accounting`.

KubeRay (v1.5.1) writes `status.jobDeploymentStatus` and `status.jobStatus`
(`rocmtrain.api.kuberay`), with `reason`
(SubmissionFailed, DeadlineExceeded, AppFailed, ValidationFailed,
JobDeploymentStatusTransitionGracePeriodExceeded) and `message` on failures.
When the Ray job failed, that message is Ray's (the entrypoint's exit code and
the tail of the driver's log, in colour); the job's Failed condition says it as a person
reads it (`failure_message`): the driver's own one-line error, found there by
`DRIVER_ERROR_PREFIX`, or, for a job's own code (spec.code), which prints no such line,
its last error and the user's frames of its traceback (`rocmtrain.api.tracebacks`); then
the exit code. The log itself stays with the driver's pod.

An ended job shows no running progress: its `Stalled` condition is the `Failed` one again
(kstatus reads nothing else as Failed) or False (`NotRunning`), and its progress keeps how far
it got, without an ETA (`ended_progress`; the endpoint takes no report once the job ended).

The training driver's pre-flight may refuse a job on the cluster (an object store it cannot
reach or write): it says why in its last progress report, which the endpoint writes as
`status.preflightError`. That refusal is final and beats whatever KubeRay says: the job is
Failed with reason `PreflightFailed` and the driver's words (`refusal`, `has_ended`); KubeRay's
retry of the failed Ray job, if it began one, ends with it and counts as no restart.

A job's own code need not report progress. Its `ProgressReported` condition says
whether it has (and, while it runs, why no loss arrives: `rocmtrain.api.report_checks`); stall
detection follows its reports once it has sent one, and waits until then. `NotDataParallel` warns
once the reports took turns between pods (`status.reportingTurns`) or their step went backwards
(`status.backwardSteps`): more than one rank 0 reports.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.contract import DRIVER_ERROR_PREFIX, KUEUE_QUEUE_LABEL
from rocmtrain.api.kuberay import JobDeploymentStatus, JobStatus
from rocmtrain.api.models import Phase, RocmTrainingJobSpec, RocmTrainingJobStatus
from rocmtrain.api.report_checks import (
    BACKWARD_STEPS_TO_WARN,
    TURNS_TO_WARN,
    missing_loss,
    not_data_parallel,
    two_rank_zeros,
)
from rocmtrain.api.timestamps import parse_time, rfc3339
from rocmtrain.api.tracebacks import last_failure, plain
from rocmtrain.status.accounting import Price, account
from rocmtrain.status.condition_merge import Condition, find, merge_conditions
from rocmtrain.status.hold import Hold, HoldKind
from rocmtrain.status.pods import PodProblem, RayPods, assess, creation_failure
from rocmtrain.status.workload import Admission, admission

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
    "queue",
)


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
    price: Price | None = None  # the price of the job's GPU-hours, when the operator has one
    pods: Sequence[Mapping[str, Any]] = ()  # the job's Ray pods (`rocmtrain.status.pods.pod_view`), of any Ray cluster
    workload: Mapping[str, Any] | None = None  # the RayJob's Kueue Workload (`rocmtrain.status.workload.workload_view`)


@dataclass(frozen=True)
class _State:
    """Phase plus the Ready condition's reason and message."""

    phase: Phase
    reason: str
    message: str


# ---- RayJob reading ---------------------------------------------------------------


def _rayjob_status(rayjob: Mapping[str, Any]) -> Mapping[str, Any]:
    return rayjob.get("status") or {}


def count(value: object) -> int:
    """A count as written in a status (a non-negative integer); 0 for anything else."""
    return value if isinstance(value, int) and value >= 0 else 0


def _ray_pods(obs: Observation) -> RayPods | None:
    """What the pods of the RayJob's current Ray cluster show; None before any is seen."""
    if obs.rayjob is None:
        return None
    cluster = _rayjob_status(obs.rayjob).get("rayClusterName")
    return assess(obs.pods, cluster) if cluster else None


def _pod_problem(obs: Observation) -> PodProblem | None:
    """Why Ray pods cannot run: one KubeRay cannot create first (there is no pod to show it), then the pods'."""
    if obs.rayjob is None:
        return None
    pods = _ray_pods(obs)
    cluster = _rayjob_status(obs.rayjob).get("rayClusterStatus") or {}
    if failed := creation_failure(cluster, pods, _desired_workers(obs)):
        return failed
    return pods.problem if pods is not None else None


def _desired_workers(obs: Observation) -> int:
    """Every worker pod the job wants, those of a search's concurrent trials included: KubeRay's count
    once it reported one, else the spec's."""
    reported = None
    if obs.rayjob is not None:
        reported = (_rayjob_status(obs.rayjob).get("rayClusterStatus") or {}).get("desiredWorkerReplicas")
    return reported if isinstance(reported, int) and reported > 0 else obs.spec.worker_pods


def _workers(obs: Observation) -> tuple[int, int]:
    """(desired, ready) workers: ready ones as the pods show them, else as KubeRay last reported.

    The pods come first: KubeRay copies its cluster's counts into the RayJob only while it
    polls the Ray dashboard, so the RayJob's count can lag behind the pods.
    """
    desired = _desired_workers(obs)
    if obs.rayjob is None:
        return desired, 0
    cluster = _rayjob_status(obs.rayjob).get("rayClusterStatus") or {}
    pods = _ray_pods(obs)
    ready = pods.ready_workers if pods is not None else count(cluster.get("readyWorkerReplicas"))
    # Never more than the job asks for: GPUs held, and so cost, follow this count.
    return desired, min(ready, desired)


# ---- Kueue ---------------------------------------------------------------------------


def _queue(obs: Observation) -> str | None:
    """The Kueue LocalQueue of the job: its own, or the one Kueue gave its RayJob (a namespace's default)."""
    labels = ((obs.rayjob or {}).get("metadata") or {}).get("labels") or {}
    return obs.spec.scheduling.queue_name or labels.get(KUEUE_QUEUE_LABEL)


def _kueue(obs: Observation) -> Admission | None:
    return admission(obs.workload) if obs.workload is not None else None


def _waiting(obs: Observation, queue: str) -> tuple[str, str]:
    """(reason, message) of a queued job Kueue holds: evicted (Kueue's reason) or waiting, in Kueue's words."""
    kueue = _kueue(obs)
    waiting = kueue.waiting if kueue is not None else None
    if kueue is not None and kueue.evicted is not None:
        reason, message = kueue.evicted
        detail = f"; waiting in Kueue queue {queue}" + (f": {waiting}" if waiting and waiting != message else "")
        return reason, f"{message or reason}{detail}"
    if waiting:
        return Reason.QUEUED_BY_KUEUE, f"waiting in Kueue queue {queue}: {waiting}"
    return Reason.QUEUED_BY_KUEUE, f"waiting for Kueue to admit the workload (queue {queue})"


def _admitted_message(obs: Observation, queue: str) -> str:
    kueue = _kueue(obs)
    if kueue is None or not kueue.admitted:
        return f"admitted by Kueue queue {queue}"
    where = [f"ClusterQueue {kueue.cluster_queue}"] if kueue.cluster_queue else []
    if kueue.flavors:
        where.append(f"{obs.spec.resources.gpu_resource} flavor {', '.join(kueue.flavors)}")
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
    if queue := _queue(obs):  # Kueue holds it: a Kueue job's spec.suspend is refused at admission
        return _State(Phase.QUEUED, *_waiting(obs, queue))
    return _State(
        Phase.SUSPENDED, Reason.SUSPENDED, "suspended: the Ray cluster is deleted until spec.suspend is false"
    )


# How Ray's job supervisor starts the message of an entrypoint that exited non-zero; its logs' tail follows.
_ENTRYPOINT_FAILED: Final = re.compile(r"Job entrypoint command failed with exit code (-?\d+)")


def failure_message(message: str) -> str:
    """KubeRay's message of a failed Ray job as a person reads it, without terminal escapes: where it quotes
    the driver's log, the driver's own error (its last `DRIVER_ERROR_PREFIX` line), else the log's last
    error line and the user's frames (`rocmtrain.api.tracebacks`), then the entrypoint's exit code; any
    other message whole."""
    text = plain(message)
    found = [line for line in text.splitlines() if DRIVER_ERROR_PREFIX in line]
    header, _, logs = text.partition("\n")
    exited = _ENTRYPOINT_FAILED.match(header)
    if found:
        why = found[-1].split(DRIVER_ERROR_PREFIX, 1)[1].strip()
    elif exited is not None and (failure := last_failure(logs)) is not None:
        why = failure.text()
    else:
        return text
    return why if exited is None else f"{why}\n(the Ray job's entrypoint exited with code {exited[1]})"


def _failed(reason: str, message: str, default: str) -> _State:
    return _State(Phase.FAILED, reason or Reason.FAILED, failure_message(message) or default)


# Deployment states in which a RayJob asked to suspend is (being) suspended.
_SUSPENDABLE = frozenset(
    {
        JobDeploymentStatus.NEW,
        JobDeploymentStatus.INITIALIZING,
        JobDeploymentStatus.WAITING,
        JobDeploymentStatus.SUSPENDING,
        JobDeploymentStatus.SUSPENDED,
    }
)


_Known = TypeVar("_Known", JobDeploymentStatus, JobStatus)


def _known(kind: type[_Known], value: str | None) -> _Known | None:
    """`value` (absent: the empty string) as a member of `kind`; None for one it lacks (a status KubeRay v1.5.1
    does not write, a phase this operator does not know)."""
    try:
        return kind(value or "")
    except ValueError:
        return None


def _running_state(job_status: JobStatus | None, job_id: str, workers: str) -> _State:
    """The phase of a RayJob whose deployment is Running, by the Ray job's status."""
    match job_status:
        case JobStatus.RUNNING | JobStatus.SUCCEEDED | JobStatus.FAILED | JobStatus.STOPPED:
            return _State(Phase.RUNNING, Reason.RUNNING, f"Ray job {job_id} is {job_status.lower()} ({workers})")
        case JobStatus.NEW | JobStatus.PENDING | None:
            return _State(
                Phase.INITIALIZING, Reason.SUBMITTING, f"the Ray job is submitted and waiting to start ({workers})"
            )


def _rayjob_state(obs: Observation, rayjob: Mapping[str, Any]) -> _State:
    """The phase a present RayJob puts the job in."""
    st = _rayjob_status(rayjob)
    deployment = _known(JobDeploymentStatus, st.get("jobDeploymentStatus"))
    job_status = _known(JobStatus, st.get("jobStatus"))
    reason, message = st.get("reason") or "", st.get("message") or ""
    desired, ready = _workers(obs)
    workers = f"{ready}/{desired} workers ready"
    suspend_requested = bool((rayjob.get("spec") or {}).get("suspend"))

    if suspend_requested and deployment in _SUSPENDABLE:
        return _suspended_state(obs)
    if deployment is JobDeploymentStatus.NEW and count(st.get("failed")) > 0:
        deployment = JobDeploymentStatus.RETRYING  # between two attempts KubeRay passes through New
    match deployment:
        case JobDeploymentStatus.SUSPENDING | JobDeploymentStatus.SUSPENDED:
            if _queue(obs):  # Kueue unsuspended it: admitted
                return _State(
                    Phase.PENDING, Reason.ADMITTED, "admitted by Kueue; waiting for KubeRay to start the Ray cluster"
                )
            return _State(Phase.PENDING, Reason.RESUMING, "resuming: waiting for KubeRay to recreate the Ray cluster")
        case JobDeploymentStatus.RETRYING:
            return _State(
                Phase.INITIALIZING, Reason.RETRYING, f"retrying on a new Ray cluster after a failure ({workers})"
            )
        case JobDeploymentStatus.INITIALIZING | JobDeploymentStatus.WAITING:
            return _State(Phase.INITIALIZING, Reason.INITIALIZING, f"starting the Ray cluster ({workers})")
        case JobDeploymentStatus.RUNNING:
            return _running_state(job_status, st.get("jobId", ""), workers)
        case JobDeploymentStatus.COMPLETE:
            if job_status is JobStatus.SUCCEEDED:
                return _State(Phase.SUCCEEDED, Reason.SUCCEEDED, message or "the Ray job succeeded")
            ended = Reason.STOPPED if job_status is JobStatus.STOPPED else reason
            return _failed(ended, message, f"the Ray job ended {st.get('jobStatus') or ''}")
        case JobDeploymentStatus.FAILED:
            return _failed(reason, message, "the RayJob failed")
        case JobDeploymentStatus.VALIDATION_FAILED:
            return _failed(Reason.VALIDATION_FAILED, message, "KubeRay rejected the RayJob")
        case JobDeploymentStatus.NEW:
            return _State(Phase.PENDING, Reason.RAYJOB_CREATED, "waiting for KubeRay to start the RayJob")
        case None:
            unknown = st.get("jobDeploymentStatus")
            return _State(
                Phase.PENDING, Reason.UNKNOWN_STATE, f"KubeRay reports an unknown deployment status {unknown!r}"
            )


# ---- a status as written -------------------------------------------------------------


def phase_of(status: Mapping[str, Any] | None) -> Phase | None:
    """The phase of a status as written (wire form); None when it has none, or one this operator does not know."""
    return Phase.of((status or {}).get("phase"))


def refusal(status: Mapping[str, Any] | None) -> str | None:
    """The driver's pre-flight refusal written in a job's status (`status.preflightError`), if any."""
    error = (status or {}).get("preflightError")
    return error if isinstance(error, str) and error else None


def has_ended(status: Mapping[str, Any] | None) -> bool:
    """Whether a job has ended: its phase is terminal, or its driver refused it (it is about to be Failed)."""
    phase = phase_of(status)
    return (phase is not None and phase.is_terminal) or refusal(status) is not None


def _state(obs: Observation) -> _State:
    previous = phase_of(obs.current)
    if previous is not None and previous.is_terminal:
        ready = find(obs.current.get("conditions") or [], ConditionType.READY) or {}
        return _State(previous, ready.get("reason", previous), ready.get("message", ""))
    if (refused := refusal(obs.current)) is not None:
        return _State(Phase.FAILED, Reason.PREFLIGHT_FAILED, refused)
    if obs.rayjob is not None:
        return _rayjob_state(obs, obs.rayjob)
    if obs.hold is not None:
        return _State(Phase.PENDING, obs.hold.reason, obs.hold.message)
    return _State(Phase.PENDING, Reason.CREATING_RAYJOB, "creating the RayJob")


# ---- conditions ----------------------------------------------------------------------


def _stall(obs: Observation, phase: Phase) -> tuple[str, str] | None:
    """(reason, message) when a running job has shown no progress for too long.

    The built-in driver reports from its start, and the RayJob's changes count too; a job's own code
    may never report, so its reports alone count, once it has sent one.
    """
    if phase is not Phase.RUNNING:
        return None
    reported = parse_time(obs.current.get("lastProgressTime"))
    if obs.spec.code is not None:
        signals, what = [reported], "no progress report from your code"
    else:
        signals, what = [reported, last_rayjob_change(obs.rayjob) if obs.rayjob is not None else None], "no progress"
    known = [t for t in signals if t is not None]
    if not known:
        return None
    last = max(known)
    if (obs.now - last).total_seconds() > obs.stall_after:
        return Reason.NO_PROGRESS, f"{what} since {rfc3339(last)} (limit {int(obs.stall_after)}s)"
    return None


NO_REPORT_YET = "your code has reported no progress yet; stall detection starts with its first report"
NO_REPORT = (
    "your code reported no progress: status.progress and status.metrics stay empty "
    "(see docs/guides/own-code.md#reporting-progress)"
)


def _progress_reported(obs: Observation, phase: Phase) -> Condition | None:
    """Of a job running its own code, once it runs: whether the code has reported progress (it need not)."""
    if obs.spec.code is None or not (phase is Phase.RUNNING or phase.is_terminal):
        return None
    kind = ConditionType.PROGRESS_REPORTED
    if obs.current.get("lastProgressTime"):
        progress, metrics = obs.current.get("progress") or {}, obs.current.get("metrics") or {}
        no_loss = missing_loss(progress.get("step"), progress.get("totalSteps"), metrics.get("trainLoss") is not None)
        if no_loss is not None and phase is Phase.RUNNING:
            return Condition(kind, True, Reason.NO_LOSS_REPORTED, f"your code reports progress, but {no_loss}")
        limit = f"it counts as stalled after {int(obs.stall_after)}s without a report"
        return Condition(kind, True, Reason.PROGRESS_REPORTED, f"your code reports progress; {limit}")
    return Condition(kind, False, Reason.NO_PROGRESS_REPORTED, NO_REPORT_YET if phase is Phase.RUNNING else NO_REPORT)


def _not_data_parallel(obs: Observation) -> Condition | None:
    """A warning, once the reports took `TURNS_TO_WARN` turns between pods (`status.reportingTurns`, which names
    them), else once their step went backwards `BACKWARD_STEPS_TO_WARN` times (`status.backwardSteps`)."""
    kind, current = ConditionType.NOT_DATA_PARALLEL, obs.current
    if (turns := count(current.get("reportingTurns"))) >= TURNS_TO_WARN:
        pods = [pod for pod in current.get("reportingPods") or [] if isinstance(pod, str)]
        return Condition(kind, True, Reason.TWO_RANK_ZEROS, two_rank_zeros(pods, turns))
    if (times := count(current.get("backwardSteps"))) >= BACKWARD_STEPS_TO_WARN:
        return Condition(kind, True, Reason.STEP_WENT_BACKWARDS, not_data_parallel(times))
    return None


def _failure(state: _State) -> tuple[str, str] | None:
    """(reason, message) of a failed job: kstatus reads `Stalled=True` as Failed."""
    return (state.reason, state.message) if state.phase is Phase.FAILED else None


def _alarm(
    current: Sequence[Mapping[str, Any]], kind: ConditionType, active: tuple[str, str] | None, resolved: Reason
) -> Condition | None:
    """A problem condition: True while `active` (reason, message); once it has appeared, False with `resolved` after."""
    if active is not None:
        return Condition(kind, True, *active)
    if find(current, kind) is not None:
        return Condition(kind, False, resolved)
    return None


def _admitted(obs: Observation, phase: Phase) -> Condition | None:
    """Kueue admission: the RayJob is made suspended; Kueue unsuspends it on admission, suspends it on eviction.

    Kueue's Workload, when seen, has the last word and the words: why it waits, which
    flavor it got, why it was evicted; without it (Kueue not installed, or not yet
    seen) the RayJob's `suspend` tells admission.
    """
    queue = _queue(obs)
    if not queue:
        return None
    kind = ConditionType.ADMITTED
    if phase.is_terminal:
        previous = Condition.read(find(obs.current.get("conditions") or [], kind))
        if previous is not None:
            return previous
    if obs.rayjob is None:
        return Condition(kind, False, Reason.PENDING, f"not yet submitted to Kueue queue {queue}")
    kueue = _kueue(obs)
    held = phase is Phase.QUEUED or (obs.rayjob.get("spec") or {}).get("suspend")
    if held or (kueue is not None and not kueue.admitted):
        return Condition(kind, False, *_waiting(obs, queue))
    return Condition(kind, True, Reason.ADMITTED, _admitted_message(obs, queue))


def _desired_conditions(obs: Observation, state: _State) -> list[Condition]:
    phase = state.phase
    current = obs.current.get("conditions") or []
    hold = obs.hold if obs.rayjob is None and not phase.is_terminal else None

    def held_by(kind: HoldKind) -> tuple[str, str] | None:
        return (hold.reason, hold.message) if hold is not None and hold.kind is kind else None

    starting = phase.holds_gpus
    problem = _pod_problem(obs) if starting else None
    candidates = [
        Condition(ConditionType.READY, phase.is_ready, state.reason, state.message),
        _admitted(obs, phase),
        _alarm(current, ConditionType.UNSCHEDULABLE, held_by(HoldKind.UNSCHEDULABLE), Reason.SCHEDULABLE),
        _alarm(
            current,
            ConditionType.RAY_PODS_UNAVAILABLE,
            (problem.reason, problem.message) if problem is not None else None,
            Reason.RAY_PODS_AVAILABLE if starting else Reason.NO_RAY_PODS,
        ),
        _alarm(current, ConditionType.KUBERAY_MISSING, held_by(HoldKind.KUBERAY_MISSING), Reason.KUBERAY_INSTALLED),
        _alarm(current, ConditionType.BLOCKED, held_by(HoldKind.BLOCKED), Reason.UNBLOCKED),
        _progress_reported(obs, phase),
        _not_data_parallel(obs),
        _alarm(
            current,
            ConditionType.STALLED,
            _stall(obs, phase) or _failure(state),
            Reason.PROGRESSING if phase is Phase.RUNNING else Reason.NOT_RUNNING,
        ),
        Condition(ConditionType.SUCCEEDED, True, state.reason, state.message) if phase is Phase.SUCCEEDED else None,
        Condition(ConditionType.FAILED, True, state.reason, state.message) if phase is Phase.FAILED else None,
    ]
    return [condition for condition in candidates if condition is not None]


# ---- status --------------------------------------------------------------------------


def _restarts(rayjob: Mapping[str, Any] | None, phase: Phase) -> int:
    """Whole-job retries: KubeRay's failure count, less the final failure (of a refused job too, whose retry
    KubeRay may have begun before the operator deleted the RayJob)."""
    if rayjob is None:
        return 0
    failed = count(_rayjob_status(rayjob).get("failed"))
    return max(failed - 1, 0) if phase is Phase.FAILED else failed


def ended_progress(status: Mapping[str, Any]) -> dict[str, Any] | None:
    """The progress an ended job keeps: how far it got, its ETA taken off (a merge patch's null); None when it
    has no ETA. The endpoint owns the field, and takes no report once the job ended: its last ETA would stay."""
    progress = status.get("progress")
    if not isinstance(progress, Mapping) or progress.get("etaSeconds") is None:
        return None
    return {**progress, "etaSeconds": None}


def _ended(status: dict[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """`status` (an ended job's, wire form) with its progress ended too, where it still has an ETA."""
    if (progress := ended_progress(current)) is not None:
        status["progress"] = progress
    return status


def compute_status(obs: Observation) -> dict[str, Any]:
    """The operator-owned status fields (wire form) for `obs`; of an ended job, also its `ended_progress`."""
    state = _state(obs)
    current = obs.current
    desired, ready = _workers(obs)
    rayjob_status = _rayjob_status(obs.rayjob) if obs.rayjob is not None else {}
    started = state.phase.holds_gpus or state.phase.is_terminal
    start_time = current.get("startTime") or (
        rfc3339(parse_time(rayjob_status.get("startTime")) or obs.now) if started and obs.rayjob is not None else None
    )
    completion = current.get("completionTime")
    if state.phase.is_terminal and not completion:
        completion = rfc3339(parse_time(rayjob_status.get("endTime")) or obs.now)
    held = ready * obs.spec.resources.gpus_per_worker if state.phase.holds_gpus and obs.rayjob is not None else 0
    # An ended job is counted up to its end, however late the operator sees it.
    until = min(obs.now, parse_time(completion) or obs.now) if state.phase.is_terminal else obs.now
    usage = account(current, held, until, obs.price)
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
        completion_time=completion if state.phase.is_terminal else None,
        restarts=max(_restarts(obs.rayjob, state.phase), count(current.get("restarts"))),
        gpu_seconds=usage.gpu_seconds,
        gpus_held=usage.gpus_held,
        accounted_until=usage.accounted_until,
        cost=usage.cost,
        # The queue loop estimates it (`rocmtrain.status.queue_estimate`); kept while Queued, cleared after.
        queue=current.get("queue") if state.phase is Phase.QUEUED else None,
    )
    if state.phase.is_terminal and obs.rayjob is None:
        # The RayJob is gone after the end (deleted by KubeRay or by hand): keep what was seen.
        status = status.model_copy(
            update={
                "ray_cluster_name": current.get("rayClusterName"),
                "job_id": current.get("jobId"),
                "dashboard_url": current.get("dashboardUrl"),
                "workers_ready": current.get("workersReady", 0),
            }
        )
    return _ended(status.dump(), current) if state.phase.is_terminal else status.dump()


# Why the operator refuses a job's spec: `rocmtrain.api.validate`, or the operator's allow-lists.
INVALID_SPEC = (Reason.INVALID_SPEC, "invalid spec")
NOT_ALLOWED = (Reason.NOT_ALLOWED, "not allowed by the operator's settings")


def invalid_status(
    current: Mapping[str, Any],
    errors: Sequence[str],
    *,
    generation: int | None,
    now: dt.datetime,
    why: tuple[str, str] = INVALID_SPEC,
    price: Price | None = None,
) -> dict[str, Any]:
    """The status of a job whose spec the operator refuses (`why`: reason, prefix): Failed with every error.

    A job refused after it started holds no GPU from now on (its RayJob is deleted); the GPUs it held
    are counted up to now, at `price`.
    """
    reason, prefix = why
    message = f"{prefix}: " + "; ".join(errors)
    usage = account(current, 0, now, price) if current.get("accountedUntil") else None
    status = RocmTrainingJobStatus(
        phase=Phase.FAILED,
        conditions=merge_conditions(
            current.get("conditions") or [],
            [
                Condition(ConditionType.READY, False, reason, message),
                Condition(ConditionType.STALLED, True, reason, message),
                Condition(ConditionType.FAILED, True, reason, message),
            ],
            now=now,
            generation=generation,
        ),
        observed_generation=generation,
        completion_time=current.get("completionTime") or rfc3339(now),
        gpu_seconds=usage.gpu_seconds if usage else current.get("gpuSeconds"),
        gpus_held=usage.gpus_held if usage else None,
        accounted_until=usage.accounted_until if usage else None,
        cost=usage.cost if usage else current.get("cost"),
    ).dump()
    return _ended(status, current)


def status_patch(current: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch of `status` turning `current` into `new` (owned fields only, and an ended job's
    progress where `new` has it); {} when equal."""
    keys = (*OWNED_FIELDS, "progress") if "progress" in new else OWNED_FIELDS
    return {key: new.get(key) for key in keys if current.get(key) != new.get(key)}
