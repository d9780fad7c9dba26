"""KubeRay's words for a RayJob's state, as KubeRay v1.5.1 writes them (`apis/ray/v1/rayjob_types.go`).

`status.jobDeploymentStatus` is KubeRay's view of the RayJob (its Ray cluster and the
submission), `status.jobStatus` Ray's view of the Ray job. The empty string is each
one's first value, before KubeRay (or Ray) has said anything.
"""

from __future__ import annotations

from enum import StrEnum


class JobDeploymentStatus(StrEnum):
    """`status.jobDeploymentStatus` of a RayJob."""

    NEW = ""
    INITIALIZING = "Initializing"
    RUNNING = "Running"
    COMPLETE = "Complete"
    FAILED = "Failed"
    VALIDATION_FAILED = "ValidationFailed"
    SUSPENDING = "Suspending"
    SUSPENDED = "Suspended"
    RETRYING = "Retrying"
    WAITING = "Waiting"


class JobStatus(StrEnum):
    """`status.jobStatus` of a RayJob: the Ray job's status (STOPPED, SUCCEEDED and FAILED are final)."""

    NEW = ""
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
