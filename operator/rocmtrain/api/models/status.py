"""The status the operator writes, and the progress report the training driver pushes to it."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints

from rocmtrain.api.models.base import ApiModel
from rocmtrain.api.models.metrics import HISTORY_LENGTH, HistoryPoint, Metrics
from rocmtrain.api.models.notifications import MAX_NOTIFICATIONS, DeliveryFailure, DeliveryState, NotifyEvent
from rocmtrain.api.models.tuning import TuningMetric
from rocmtrain.api.patterns import CURRENCY, DELIVERY_ID, DNS_SUBDOMAIN, HCA_NAME, NOTIFICATION_TARGET, RCCL_NETWORK
from rocmtrain.api.report_checks import REPORTING_PODS_KEPT


class Phase(enum.StrEnum):
    """A job's lifecycle phase (`status.phase`), with the groupings every reader uses (as KubeRay's `JobStatus`)."""

    PENDING = "Pending"
    QUEUED = "Queued"
    INITIALIZING = "Initializing"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"

    @classmethod
    def of(cls, value: object) -> Phase | None:
        """`value` (a status' wire form) as a phase; None for none, or one this operator does not know."""
        return cls(value) if isinstance(value, str) and value in cls._value2member_map_ else None

    @property
    def is_terminal(self) -> bool:
        """The job has ended and never runs again."""
        return self in (Phase.SUCCEEDED, Phase.FAILED)

    @property
    def is_ready(self) -> bool:
        """The job is where its spec asks it to be: its Ready condition is True."""
        return self in (Phase.RUNNING, Phase.SUCCEEDED, Phase.SUSPENDED)

    @property
    def holds_gpus(self) -> bool:
        """The Ray cluster's ready workers hold their GPUs (`rocmtrain.status.accounting`)."""
        return self in (Phase.INITIALIZING, Phase.RUNNING)

    @property
    def is_waiting(self) -> bool:
        """The job waits to start: for its RayJob, or in Kueue's queue."""
        return self in (Phase.PENDING, Phase.QUEUED)

    @property
    def is_active(self) -> bool:
        """The job counts against the pool: it has not ended and is not suspended."""
        return not self.is_terminal and self is not Phase.SUSPENDED


class Condition(ApiModel):
    """A condition, following Kubernetes API conventions."""

    type: str = Field(max_length=316, description="Condition type, for example Ready or Admitted.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", max_length=1024, description="CamelCase reason for the last transition.")
    message: str = Field(default="", max_length=32768, description="Human-readable detail.")
    last_transition_time: str | None = Field(default=None, description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The spec generation this condition was computed from."
    )


class Progress(ApiModel):
    """Training progress."""

    model_config = ConfigDict(allow_inf_nan=False)

    epoch: float | None = Field(default=None, ge=0, le=1e6, description="Current epoch (fractional).")
    step: int | None = Field(default=None, ge=0, le=10**12, description="Optimiser steps done.")
    total_steps: int | None = Field(default=None, ge=0, le=10**12, description="Optimiser steps in the whole run.")
    percent: float | None = Field(default=None, ge=0, le=100, description="Share of steps done, in percent.")
    eta_seconds: float | None = Field(default=None, ge=0, le=1e9, description="Estimated seconds until training ends.")


WORKER_FAILURES = (
    "Worker failures Ray Train recovered from in the current run, each by restarting the workers "
    "from the last checkpoint."
)


class TrialConfig(ApiModel):
    """The hyper-parameters one trial trains with (those the search space varies)."""

    model_config = ConfigDict(allow_inf_nan=False)

    learning_rate: float | None = Field(default=None, gt=0, le=1, description="Peak learning rate.")
    batch_size_per_worker: int | None = Field(default=None, ge=1, le=4096, description="Micro-batch size per rank.")
    warmup_ratio: float | None = Field(default=None, ge=0, le=0.5, description="Warmup share of the steps.")
    weight_decay: float | None = Field(default=None, ge=0, le=1, description="AdamW weight decay.")
    epochs: int | None = Field(default=None, ge=1, le=1000, description="Epochs.")
    adapter_rank: int | None = Field(default=None, ge=1, le=1024, description="LoRA rank.")


TrialState = Literal["Pending", "Running", "Succeeded", "Stopped", "Failed"]


class Trial(ApiModel):
    """One trial of a search."""

    model_config = ConfigDict(allow_inf_nan=False)

    id: str = Field(max_length=64, description="Ray Tune's trial id.")
    state: TrialState = Field(
        description="Pending, Running, Succeeded (ran to its end), Stopped (stopped early by the scheduler) or Failed."
    )
    config: TrialConfig = Field(default_factory=TrialConfig, description="Its hyper-parameters.")
    metric: float | None = Field(default=None, ge=-1e12, le=1e12, description="Its latest value of the metric.")
    iterations: int = Field(default=0, ge=0, le=10**9, description="Evaluations it reported.")


# Rows of `status.tuning.trials` (the progress channel carries at most 16 KiB).
TRIAL_TABLE_LENGTH = 20


class TuningStatus(ApiModel):
    """Where a hyper-parameter search stands."""

    model_config = ConfigDict(allow_inf_nan=False)

    metric: TuningMetric = Field(description="The metric that ranks the trials.")
    mode: Literal["max", "min"] = Field(description="Whether it is best high or low.")
    trials_total: int = Field(ge=0, le=1000, description="Trials the search runs in all.")
    trials_done: int = Field(default=0, ge=0, le=1000, description="Trials that ended (succeeded, stopped, failed).")
    trials_running: int = Field(default=0, ge=0, le=1000, description="Trials running.")
    trials_pending: int = Field(default=0, ge=0, le=1000, description="Trials not started yet.")
    best_trial_id: str | None = Field(default=None, max_length=64, description="The best trial so far.")
    best_metric: float | None = Field(default=None, ge=-1e12, le=1e12, description="Its metric.")
    best_config: TrialConfig | None = Field(default=None, description="Its hyper-parameters.")
    best_checkpoint: str | None = Field(
        default=None, max_length=1024, description="Its latest checkpoint, or its exported model once done."
    )
    trials: list[Trial] = Field(
        default_factory=list,
        max_length=TRIAL_TABLE_LENGTH,
        description=f"The trials: running ones first, then the best; at most {TRIAL_TABLE_LENGTH}.",
    )


RCCL_DEVICES_LIMIT = 16


class NetworkTransport(ApiModel):
    """The network RCCL chose between nodes, as rank 0's RCCL log tells at its first collective."""

    transport: str = Field(
        pattern=RCCL_NETWORK,
        description="RCCL's network: IB (InfiniBand or RoCE verbs, RDMA), Socket (TCP), or a net plugin's name.",
    )
    devices: list[Annotated[str, StringConstraints(pattern=HCA_NAME, max_length=68)]] = Field(
        default_factory=list,
        max_length=RCCL_DEVICES_LIMIT,
        description="The HCA ports (mlx5_0:1) or interfaces (eth0) it uses, as RCCL names them (IB and Socket).",
    )
    link: Literal["InfiniBand", "RoCE", "mixed"] | None = Field(
        default=None, description="The link layer of IB's devices: InfiniBand, RoCE (Ethernet), or mixed."
    )

    @property
    def summary(self) -> str:
        """One line: `IB over mlx5_0:1, mlx5_1:1 (RoCE)`."""
        over = f" over {', '.join(self.devices)}" if self.devices else ""
        return f"{self.transport}{over}" + (f" ({self.link})" if self.link else "")


# Characters of the driver's pre-flight refusal, in a report and in the status.
PREFLIGHT_ERROR_LIMIT = 2048
PREFLIGHT_ERROR = (
    "Why the training driver's pre-flight refused the job (an object store it cannot reach or write, in the "
    "store's own words): the job failed at once (reason PreflightFailed) and spent no retry."
)


class ProgressReport(ApiModel):
    """What the training driver pushes to the operator's progress endpoint."""

    progress: Progress = Field(description="Training progress.")
    metrics: Metrics = Field(default_factory=Metrics, description="Aggregated metrics.")
    final: bool = Field(default=False, description="True on the last report of a run.")
    worker_failures: int | None = Field(default=None, ge=1, le=10_000, description=WORKER_FAILURES)
    resumed_from_step: int | None = Field(
        default=None, ge=0, le=10**12, description="Step of the checkpoint the workers of this run last resumed from."
    )
    tuning: TuningStatus | None = Field(default=None, description="The search, for a job with spec.tuning.")
    network: NetworkTransport | None = Field(
        default=None, description="The network RCCL chose between nodes (GPU jobs, where its log tells)."
    )
    preflight_error: str | None = Field(
        default=None,
        max_length=PREFLIGHT_ERROR_LIMIT,
        description="The driver's pre-flight refusal, on the last report of a run that never started.",
    )


class NotificationState(ApiModel):
    """The last notice of one receiver of the job, and whether it got there."""

    target: Annotated[str, StringConstraints(pattern=NOTIFICATION_TARGET, max_length=32)] = Field(
        description="The receiver: spec.notifications[i], or default (the operator's)."
    )
    event: NotifyEvent = Field(description="The event notified.")
    reason: str = Field(max_length=128, description="The event's reason, as the notice told it.")
    delivery_id: str = Field(pattern=DELIVERY_ID, description="The X-Rocmtrain-Delivery header of every try.")
    state: DeliveryState = Field(
        description="Pending (sent again after an operator restart), Delivered, Failed (given up), or Dropped "
        "(never queued: its namespace's share of the queue was full, or its job over its rate)."
    )
    failure: DeliveryFailure | None = Field(
        default=None,
        description="Why a Failed or Dropped notice was not delivered: NotDelivered (no answer, or not a 2xx), "
        "AddressRefused (the receiver's address is not one the operator may reach: docs/operations/security.md), "
        "SecretUnusable, SendError, QueueFull or RateLimited. The operator's log has the detail.",
    )
    time: str = Field(max_length=40, description="When the state was last written (RFC 3339).")


class Cost(ApiModel):
    """What a job's GPU-seconds cost at the operator's prices."""

    model_config = ConfigDict(allow_inf_nan=False)

    amount: float = Field(ge=0, le=1e15, description="Cost of gpuSeconds so far.")
    currency: str = Field(pattern=CURRENCY, description="ISO 4217 currency code (ROCMTRAIN_COST_CURRENCY).")


QUEUE_BASIS_LIMIT = 256


class QueueEstimate(ApiModel):
    """When a job that Kueue holds in its queue is expected to start (`rocmtrain.status.queue_estimate`)."""

    position: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Its place among the workloads waiting in its ClusterQueue, in Kueue's order (priority, then "
        "creation): 1 is next.",
    )
    expected_start_time: str | None = Field(
        default=None,
        max_length=32,
        description="When it is expected to start (RFC 3339); absent when unknown (basis says why).",
    )
    basis: str = Field(
        max_length=QUEUE_BASIS_LIMIT,
        description="What the estimate rests on (running jobs' ETAs, jobs ahead, the quota), or why it is unknown.",
    )


class RocmTrainingJobStatus(ApiModel):
    """The observed state, written by the operator."""

    phase: Phase | None = Field(default=None, description="Lifecycle phase of the job.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=32,
        description="Current conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, ge=0, description="Last spec generation acted on.")
    ray_job_name: str | None = Field(default=None, description="Name of the owned RayJob.")
    ray_cluster_name: str | None = Field(default=None, description="Name of the Ray cluster KubeRay created.")
    job_id: str | None = Field(default=None, description="Ray job submission id.")
    dashboard_url: str | None = Field(default=None, description="Ray dashboard address inside the cluster.")
    workers_desired: int | None = Field(default=None, ge=0, description="Worker pods the job asks for.")
    workers_ready: int | None = Field(default=None, ge=0, description="Worker pods ready.")
    gpus: int | None = Field(
        default=None,
        ge=0,
        description="AMD GPUs the job requests in total; GPU partitions where spec.resources.gpu names a partition "
        "(then gpusHeld, gpuSeconds and cost count partitions too).",
    )
    start_time: str | None = Field(default=None, description="When the Ray job started (RFC 3339).")
    completion_time: str | None = Field(default=None, description="When the Ray job ended (RFC 3339).")
    restarts: int | None = Field(default=None, ge=0, description="Whole-job retries so far.")
    worker_failures: int | None = Field(default=None, ge=0, description=WORKER_FAILURES)
    backward_steps: int | None = Field(
        default=None,
        ge=1,
        le=10**9,
        description="Progress reports whose step was below the report's before them, with no restart between: "
        "more than one process reports as rank 0 (NotDataParallel).",
    )
    reporting_pods: list[Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN, max_length=253)]] = Field(
        default_factory=list,
        max_length=REPORTING_PODS_KEPT,
        description=f"The pods whose progress reports arrived in this run, the latest first (at most "
        f"{REPORTING_PODS_KEPT}; only the last one's after a report that counts a new worker failure).",
    )
    reporting_turns: int | None = Field(
        default=None,
        ge=1,
        le=10**9,
        description="Progress reports from a pod of reportingPods that was not the last report's, with no restart "
        "between: more than one pod reports as rank 0 (NotDataParallel).",
    )
    gpu_seconds: float | None = Field(
        default=None,
        ge=0,
        le=1e15,
        allow_inf_nan=False,
        description="AMD GPU-seconds held so far: ready Ray workers × GPUs per worker, summed over time.",
    )
    gpus_held: int | None = Field(
        default=None, ge=0, description="AMD GPUs the job's ready Ray workers hold, as last observed."
    )
    accounted_until: str | None = Field(
        default=None, description="Until when gpuSeconds and cost are counted (RFC 3339)."
    )
    cost: Cost | None = Field(
        default=None, description="What gpuSeconds cost at the operator's price per GPU-hour (ROCMTRAIN_GPU_PRICES)."
    )
    progress: Progress | None = Field(default=None, description="Training progress.")
    metrics: Metrics | None = Field(default=None, description="Latest training metrics.")
    history: list[HistoryPoint] = Field(
        default_factory=list,
        max_length=HISTORY_LENGTH,
        description=f"The last {HISTORY_LENGTH} reported points, for plotting the loss curve.",
    )
    last_progress_time: str | None = Field(default=None, description="When progress was last reported (RFC 3339).")
    tuning: TuningStatus | None = Field(default=None, description="The hyper-parameter search (spec.tuning).")
    queue: QueueEstimate | None = Field(
        default=None,
        description="While Queued: its place in its Kueue ClusterQueue and when it is expected to start, from the "
        "running jobs' ETAs; cleared on admission.",
    )
    notifications: list[NotificationState] = Field(
        default_factory=list,
        max_length=MAX_NOTIFICATIONS + 1,
        description="The last notice of each receiver (spec.notifications, or the operator's default) and its state.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["target"]},
    )
    network: NetworkTransport | None = Field(
        default=None,
        description="The network RCCL chose between the workers, as the job's progress reports tell it from rank "
        "0's RCCL log (GPU jobs, where it tells): Socket where spec.resources.network names RDMA means RDMA is not "
        "in use.",
    )
    preflight_error: str | None = Field(default=None, max_length=PREFLIGHT_ERROR_LIMIT, description=PREFLIGHT_ERROR)
