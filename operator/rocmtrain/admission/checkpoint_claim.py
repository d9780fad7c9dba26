"""Whether every Ray pod may mount the claim that holds a job's checkpoints (pure).

Validation (`rocmtrain.api.validate`) takes a checkpoint path on a PersistentVolumeClaim mount, but cannot see
the claim: the operator reads it (`rocmtrain.controller.reconciler`) and warns when its volume is not
`ReadWriteMany`. Every job has at least two Ray pods that use the checkpoints, the head (whose driver reads what
Ray Train reports) and a worker, and the scheduler may place them on different nodes: a `ReadWriteOnce` volume is
mounted on one node only, a `ReadWriteOncePod` one by one pod, a `ReadOnlyMany` one by none for writing. A warning,
not a refusal: pods that land on one node share a `ReadWriteOnce` volume, and some drivers share more than the
modes they declare.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rocmtrain.api.kubernetes import AccessMode
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.api.validate import volume_holding

_MEANS = {
    AccessMode.READ_WRITE_ONCE: "mounted read-write on one node at a time",
    AccessMode.READ_WRITE_ONCE_POD: "mounted by one pod at a time",
    AccessMode.READ_ONLY_MANY: "read-only",
}


def checkpoint_claim(job: RocmTrainingJob) -> str | None:
    """The name of the PersistentVolumeClaim whose mount holds the job's checkpoint path, or None (object storage,
    another volume kind)."""
    path = job.spec.checkpoint.storage_path
    if path is None or not path.startswith("/") or (holding := volume_holding(job, path)) is None:
        return None
    claim = holding[1].persistent_volume_claim
    return claim.claim_name if claim is not None else None


def access_modes(claim: Mapping[str, Any]) -> tuple[str, ...]:
    """The claim's access modes: its bound volume's (`status.accessModes`), else those it asks for (`spec`)."""
    status, spec = claim.get("status") or {}, claim.get("spec") or {}
    return tuple(status.get("accessModes") or spec.get("accessModes") or ())


def unshared_claim_warning(job: RocmTrainingJob, claim: Mapping[str, Any]) -> str | None:
    """The warning for a job whose checkpoints lie on `claim` (the PersistentVolumeClaim, as the API server has
    it), or None when its volume is ReadWriteMany (or its modes are unknown)."""
    modes = access_modes(claim)
    if not modes or AccessMode.READ_WRITE_MANY in modes:
        return None
    name = (claim.get("metadata") or {}).get("name", "")
    means = "; ".join(f"{mode}: {_MEANS[AccessMode(mode)]}" for mode in modes if mode in _MEANS)
    workers = job.spec.worker_pods
    return (
        f"checkpoints at {job.spec.checkpoint.storage_path} lie on PersistentVolumeClaim {name}, "
        f"access modes {', '.join(modes)}, not ReadWriteMany{f' ({means})' if means else ''}: "
        f"this job's {workers + 1} Ray pods "
        f"(the head and {workers} worker{'s' if workers > 1 else ''}) may run on several nodes, and those that "
        "cannot mount it do not start, or do not see the same checkpoints. Put the checkpoints on a ReadWriteMany "
        "claim (NFS, CephFS, a shared file system's CSI driver) or in object storage (s3://bucket/path)"
    )
