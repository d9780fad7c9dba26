"""Kueue's words on a Workload (v1beta2): the condition types it writes in `status.conditions`.

`QuotaReserved` and `Admitted` tell admission, `Evicted` (with `Preempted`) that Kueue
took the quota back and why, `Requeued` that the Workload waits again, `PodsReady`
that its pods started, `Finished` that it ended. Kueue's labels and Workload API are
in `rocmtrain.api.contract`.
"""

from __future__ import annotations

from enum import StrEnum


class WorkloadCondition(StrEnum):
    """A condition type of a Kueue Workload."""

    QUOTA_RESERVED = "QuotaReserved"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    REQUEUED = "Requeued"
    PODS_READY = "PodsReady"
    FINISHED = "Finished"
