"""The conditions of a RocmTrainingJob's status: their types, and every reason the operator writes.

The operator (`rocmtrain.status`) writes these and the tests read them by the same
names. Other systems' reasons pass through as they come and are not listed here:
KubeRay's failure reasons (`AppFailed`, `DeadlineExceeded`, ...), Kueue's eviction
reasons (`Preempted`, `PodsReadyTimeout`, ...). Events take their reasons from here
too, or the phase they announce.
"""

from __future__ import annotations

from enum import StrEnum


class ConditionType(StrEnum):
    """A condition type the operator manages, in the order the status lists them."""

    READY = "Ready"
    ADMITTED = "Admitted"
    UNSCHEDULABLE = "Unschedulable"
    RAY_PODS_UNAVAILABLE = "RayPodsUnavailable"
    KUBERAY_MISSING = "KubeRayMissing"
    BLOCKED = "Blocked"
    PROGRESS_REPORTED = "ProgressReported"
    NOT_DATA_PARALLEL = "NotDataParallel"
    STALLED = "Stalled"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Reason(StrEnum):
    """A reason of a condition or an event, set by the operator."""

    # Ready, while the job starts, runs or waits.
    CREATING_RAYJOB = "CreatingRayJob"
    RAYJOB_CREATED = "RayJobCreated"
    SUBMITTING = "Submitting"
    INITIALIZING = "Initializing"
    RUNNING = "Running"
    RETRYING = "Retrying"
    SUSPENDED = "Suspended"
    RESUMING = "Resuming"
    UNKNOWN_STATE = "UnknownState"
    # The end of a job (Ready, Succeeded, Failed, Stalled).
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STOPPED = "Stopped"
    VALIDATION_FAILED = "ValidationFailed"
    PREFLIGHT_FAILED = "PreflightFailed"  # the training driver's pre-flight refused the job (status.preflightError)
    INVALID_SPEC = "InvalidSpec"
    NOT_ALLOWED = "NotAllowed"
    # Kueue (Admitted, and Ready while queued).
    PENDING = "Pending"
    QUEUED_BY_KUEUE = "QueuedByKueue"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    # Holds: what keeps the RayJob from being made.
    GPU_MODEL_UNAVAILABLE = "GPUModelUnavailable"
    INSUFFICIENT_GPUS = "InsufficientGPUs"
    KUBERAY_NOT_INSTALLED = "KubeRayNotInstalled"
    RAYJOB_FORBIDDEN = "RayJobForbidden"
    RAYJOB_INVALID = "RayJobInvalid"
    RAYJOB_CONFLICT = "RayJobConflict"
    NETWORK_POLICY_REFUSED = "NetworkPolicyRefused"
    PROGRESS_CA_CONFLICT = "ProgressCAConflict"
    # RayPodsUnavailable: why the Ray pods cannot run.
    POD_CREATION_FAILED = "PodCreationFailed"
    UNSCHEDULABLE = "Unschedulable"
    FAILED_ATTACH_VOLUME = "FailedAttachVolume"
    FAILED_MOUNT = "FailedMount"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
    CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
    CONTAINER_FAILED = "ContainerFailed"
    # Stalled.
    NO_PROGRESS = "NoProgress"
    # ProgressReported, of a job running its own code (spec.code).
    NO_PROGRESS_REPORTED = "NoProgressReported"
    PROGRESS_REPORTED = "ProgressReported"
    NO_LOSS_REPORTED = "NoLossReported"  # True: progress, but no loss past 1% of the steps
    # NotDataParallel: the reports' step went backwards, or two pods took turns reporting (rocmtrain.api.report_checks).
    STEP_WENT_BACKWARDS = "StepWentBackwards"
    TWO_RANK_ZEROS = "TwoRankZeros"
    # A problem condition once it is over (status False).
    SCHEDULABLE = "Schedulable"
    RAY_PODS_AVAILABLE = "RayPodsAvailable"
    NO_RAY_PODS = "NoRayPods"
    KUBERAY_INSTALLED = "KubeRayInstalled"
    UNBLOCKED = "Unblocked"
    PROGRESSING = "Progressing"
    NOT_RUNNING = "NotRunning"
    # Events only, from the training driver's reports.
    WORKER_FAILURE_RECOVERED = "WorkerFailureRecovered"
    NEW_BEST_TRIAL = "NewBestTrial"
    RDMA_NOT_USED = "RDMANotUsed"
    # Events only, from the reconciler: the checkpoints' claim is not ReadWriteMany (admission.checkpoint_claim).
    CHECKPOINT_CLAIM_NOT_SHARED = "CheckpointClaimNotShared"
    # Events only, from the notifier: a phase notification given up (rocmtrain.controller.notifier).
    NOTIFICATION_FAILED = "NotificationFailed"
