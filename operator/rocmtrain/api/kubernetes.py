"""Kubernetes' own words for the objects the operator reads, as the core API (`k8s.io/api/core/v1`) writes them."""

from __future__ import annotations

from enum import StrEnum


class PodPhase(StrEnum):
    """`status.phase` of a Pod (not a job's `Phase`: another vocabulary that shares some words)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"

    @property
    def has_ended(self) -> bool:
        """Every container of the pod has terminated and none restarts: the pod holds its resources no more."""
        return self in (PodPhase.SUCCEEDED, PodPhase.FAILED)


class AccessMode(StrEnum):
    """An access mode of a PersistentVolumeClaim (`spec.accessModes`, and its volume's in `status.accessModes`)."""

    READ_WRITE_ONCE = "ReadWriteOnce"
    READ_ONLY_MANY = "ReadOnlyMany"
    READ_WRITE_MANY = "ReadWriteMany"
    READ_WRITE_ONCE_POD = "ReadWriteOncePod"
