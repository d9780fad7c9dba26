"""Pure helpers on the objects the operator handles, shared by the reconciler and the watches.

- `job_view` and `rayjob_view`: the parts of a job and of a RayJob kept in memory
  (the kopf job index, the watch's cache) and read by the status mapping;
- `job_document`: a job view as `rocmtrain.api.validate.validate_job` takes it;
- `requested_gpus`: the AMD GPUs a job view asks for (the metrics' gauge);
- `owner_reference` and `controller_ref`: the reference that makes a job the controller
  of its RayJob (garbage collection deletes the RayJob with the job), and reading it back;
- `is_jobs_rayjob`: whether a RayJob is the one whose state a job's status follows;
- `queued`: whether Kueue manages a RayJob (what the operator may change in one that exists is
  `rocmtrain.render.rayjob_update`'s).

No I/O and no kopf: plain mappings in, plain mappings out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from rocmtrain.api.contract import KIND, KUEUE_QUEUE_LABEL
from rocmtrain.api.models import ResourcesSpec, TuningSpec
from rocmtrain.api.names import rayjob_name_of
from rocmtrain.render.rayjob import MUTABLE_RAYJOB_DEFAULTS


def job_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a job object the operator keeps in memory (its index)."""
    meta = body.get("metadata") or {}
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {
            key: meta[key]
            for key in ("name", "namespace", "uid", "generation", "labels", "deletionTimestamp")
            if key in meta
        },
        "spec": body.get("spec") or {},
        "status": body.get("status") or {},
    }


def job_document(job: Mapping[str, Any]) -> dict[str, Any]:
    """The job as validation reads it: apiVersion, kind, metadata and spec (no status)."""
    return {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "metadata": dict(job["metadata"]),
        "spec": job["spec"],
    }


def requested_gpus(job: Mapping[str, Any]) -> int:
    """The AMD GPUs a job asks for, concurrent trials included; 0 for resources that are not valid."""
    spec = job["spec"]
    try:
        gpus = ResourcesSpec.model_validate(spec.get("resources") or {}).total_gpus
        tuning = TuningSpec.model_validate(spec["tuning"]) if spec.get("tuning") else None
    except ValidationError:
        return 0
    return gpus * (tuning.max_concurrent_trials if tuning is not None else 1)


def rayjob_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a RayJob the status mapping reads (its rayClusterSpec is left out)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    labels = meta.get("labels") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "generation": meta.get("generation"),  # its spec's version: an older view is never written over a newer
            # Kueue's queue label: set by the renderer, or by Kueue itself (a namespace's default LocalQueue).
            "labels": {KUEUE_QUEUE_LABEL: labels[KUEUE_QUEUE_LABEL]} if KUEUE_QUEUE_LABEL in labels else {},
            "creationTimestamp": meta.get("creationTimestamp"),
            # A RayJob being deleted (KubeRay's finalizer still runs) is going away: never deleted again.
            **({"deletionTimestamp": meta["deletionTimestamp"]} if meta.get("deletionTimestamp") else {}),
            "ownerReferences": list(meta.get("ownerReferences") or []),
            "managedFields": [
                {"subresource": "status", "time": entry.get("time")}
                for entry in meta.get("managedFields") or []
                if entry.get("subresource") == "status"
            ],
        },
        "spec": {key: spec[key] for key in MUTABLE_RAYJOB_DEFAULTS if key in spec},
        "status": body.get("status") or {},
    }


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    """The owner reference that makes `job` the controller of an object (as kopf.build_owner_reference)."""
    meta = job.get("metadata") or {}
    ref = {
        "controller": True,
        "blockOwnerDeletion": True,
        "apiVersion": job.get("apiVersion"),
        "kind": job.get("kind"),
        "name": meta.get("name"),
        "uid": meta.get("uid"),
    }
    return {key: value for key, value in ref.items() if value is not None}


def controller_ref(rayjob: Mapping[str, Any]) -> Mapping[str, Any]:
    """The owner reference of the RocmTrainingJob controlling `rayjob` ({} when there is none)."""
    refs: list[Mapping[str, Any]] = (rayjob.get("metadata") or {}).get("ownerReferences") or []
    return next((ref for ref in refs if ref.get("controller") and ref.get("kind") == KIND), {})


def is_jobs_rayjob(job: Mapping[str, Any], rayjob: Mapping[str, Any]) -> bool:
    """Whether `rayjob` is `job`'s own: the job controls it and it bears the job's RayJob name.

    A RayJob that merely names the job as controller (anyone who may create RayJobs can
    write that reference) under another name does not drive the job's status.
    """
    meta, rayjob_meta = job.get("metadata") or {}, rayjob.get("metadata") or {}
    return (
        controller_ref(rayjob).get("uid") == meta.get("uid")
        and rayjob_meta.get("namespace") == meta.get("namespace")
        and rayjob_meta.get("name") == rayjob_name_of(meta.get("name", ""))
    )


def queued(rayjob: Mapping[str, Any]) -> bool:
    """Whether Kueue manages the RayJob (it carries a queue label, ours or the one Kueue's webhook set)."""
    return KUEUE_QUEUE_LABEL in ((rayjob.get("metadata") or {}).get("labels") or {})
