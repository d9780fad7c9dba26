"""Pure helpers on the objects the operator handles, shared by the reconciler and the watches.

- `job_view` and `rayjob_view`: the parts of a job and of a RayJob the operator reads (a job event's,
  the watch's cache) and the status mapping reads;
- `index_view`: what the job index keeps of a job, bounded (`INDEX_SPEC_LIMIT`): the spec only while the
  operator may still need it (`whole_spec`);
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

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.contract import KIND, KUEUE_QUEUE_LABEL
from rocmtrain.api.job_config import JOB_CONFIG_LIMIT
from rocmtrain.api.models import Phase, ResourcesSpec, TuningSpec
from rocmtrain.api.names import rayjob_name_of
from rocmtrain.render.rayjob import MUTABLE_RAYJOB_DEFAULTS
from rocmtrain.status.condition_merge import find

# The largest spec the job index keeps whole (bytes of compact JSON): what validation lets a job be as its
# driver reads it. A larger one is refused for its size; the API server stores up to about 1.5 MB of it.
INDEX_SPEC_LIMIT = JOB_CONFIG_LIMIT
# What the index keeps of a spec it does not keep whole: what the metrics (`gauges.gpu_kind`) and the
# notifier (the job's receivers) read, each bounded by the CRD to a few KiB.
SUMMARY_FIELDS = ("resources", "notifications")
# Marks an index view whose spec holds only `SUMMARY_FIELDS`: a reader that needs the whole spec reads the job.
PARTIAL_SPEC = "partialSpec"
REFUSED_REASONS = frozenset({Reason.INVALID_SPEC, Reason.NOT_ALLOWED})


def job_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a job object the operator reads: what a job event hands the reconciler (the index keeps less:
    `index_view`)."""
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


def index_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the job index keeps of a job: its `job_view` with its GPU request (`gpus`, for the metrics), and
    its spec whole only when `whole_spec`; otherwise only `SUMMARY_FIELDS` of it, marked `PARTIAL_SPEC`."""
    view = job_view(body)
    view["gpus"] = requested_gpus(view)
    if not whole_spec(view):
        view["spec"] = {key: view["spec"][key] for key in SUMMARY_FIELDS if key in view["spec"]}
        view[PARTIAL_SPEC] = True
    return view


def whole_spec(view: Mapping[str, Any]) -> bool:
    """Whether the job index keeps a job's whole spec: not when its status refuses this generation (invalid,
    or not allowed: nothing reads the spec again until it changes), nor when it is larger than any spec
    validation accepts (`INDEX_SPEC_LIMIT`)."""
    status, generation = view["status"], view["metadata"].get("generation")
    ready = find(status.get("conditions") or [], ConditionType.READY) or {}
    refused = (
        Phase.of(status.get("phase")) is Phase.FAILED
        and status.get("observedGeneration") == generation
        and ready.get("reason") in REFUSED_REASONS
    )
    return (
        not refused
        and len(json.dumps(view["spec"], separators=(",", ":"), ensure_ascii=False).encode()) <= INDEX_SPEC_LIMIT
    )


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
