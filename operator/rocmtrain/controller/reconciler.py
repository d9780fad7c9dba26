"""Per-job orchestration: validate, pre-flight, create or update the RayJob, write the status.

The decisions live in pure modules (`validate`, `render`, `preflight`, `status`);
this module sequences them around the few API calls of `rocmtrain.kube`.

All status writes of one job go through one asyncio lock, and the operator keeps
the status it last wrote per job, so that two handlers (the job's own and the
RayJob watch) never write an older view over a newer one, and a transition is
announced by exactly one event.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from rocmtrain import preflight, status
from rocmtrain.api.models import GROUP, KIND, RocmTrainingJob, RocmTrainingJobSpec
from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.kube import JOBS, RAYJOBS, ApiMissing, Kube
from rocmtrain.render import render_rayjob
from rocmtrain.validate import validate_job

logger = logging.getLogger(__name__)

# RayJob spec fields that follow the job after creation, with KubeRay's defaults.
# `suspend` is Kueue's once the job is queued, so it is left alone there.
MUTABLE_RAYJOB_FIELDS = {"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 0, "suspend": False}
# Touching this annotation re-runs the job handler (with kopf's retries), e.g. to recreate a deleted RayJob.
# Not under `rocmtrain.dev/`: kopf keeps its own state there and leaves those keys out of its diffs.
RESYNC_ANNOTATION = f"operator.{GROUP}/resync"
# A RayJob name taken by an object the job does not own (typically the RayJob of a
# deleted job of the same name, about to be garbage-collected): check again soon.
CONFLICT_RETRY_SECONDS = 5
# Jobs reconciled at once. A burst of new jobs then waits here, small, instead of
# holding rendered RayJobs and open requests for all of them (memory, and the API
# server's CPU); 16 keeps the client's connections busy.
ACTIVE_RECONCILES = 16


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


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


def rayjob_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a RayJob the status mapping reads (its rayClusterSpec is left out)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "creationTimestamp": meta.get("creationTimestamp"),
            "ownerReferences": list(meta.get("ownerReferences") or []),
            "managedFields": [
                {"subresource": "status", "time": entry.get("time")}
                for entry in meta.get("managedFields") or []
                if entry.get("subresource") == "status"
            ],
        },
        "spec": {key: spec[key] for key in MUTABLE_RAYJOB_FIELDS if key in spec},
        "status": body.get("status") or {},
    }


def controller_ref(rayjob: Mapping[str, Any]) -> Mapping[str, Any]:
    """The owner reference of the RocmTrainingJob controlling `rayjob` ({} when there is none)."""
    for ref in (rayjob.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND:
            return ref
    return {}


def mutable_patch(rendered: Mapping[str, Any], live: Mapping[str, Any], *, queued: bool) -> dict[str, Any]:
    """The RayJob spec merge patch that carries the job's mutable fields over; {} when in step."""
    patch = {}
    for key, default in MUTABLE_RAYJOB_FIELDS.items():
        if queued and key == "suspend":
            continue
        want = rendered.get(key, default)
        if live.get(key, default) != want:
            patch[key] = want
    return patch


@dataclass
class JobState:
    """What the operator remembers about one job (by uid) between handler runs."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    written: dict[str, Any] | None = None  # owned status fields as last written


class Reconciler:
    """Turns jobs into RayJobs and RayJob states into job statuses."""

    def __init__(self, kube: Kube, config: OperatorConfig) -> None:
        self._kube = kube
        self._config = config
        self._states: dict[str, JobState] = {}
        self._slots = asyncio.Semaphore(ACTIVE_RECONCILES)

    def forget(self, uid: str) -> None:
        """Drop what is remembered about a deleted job."""
        self._states.pop(uid, None)

    def _state(self, uid: str) -> JobState:
        return self._states.setdefault(uid, JobState())

    @staticmethod
    def _current(state: JobState, job: Mapping[str, Any]) -> dict[str, Any]:
        """The job's status as the operator knows it: its own last write over the observed one."""
        return {**(job.get("status") or {}), **(state.written or {})}

    # ---- job side -------------------------------------------------------------------

    async def ensure(self, job: Mapping[str, Any], nodes: Iterable[preflight.NodeInfo]) -> None:
        """Bring the job's RayJob in line with its spec, then write the status.

        Raises kopf.PermanentError for a spec the operator refuses, and
        kopf.TemporaryError while the RayJob is held (KubeRay missing, no node fits).
        """
        async with self._slots:
            await self._ensure(job, nodes)

    async def _ensure(self, job: Mapping[str, Any], nodes: Iterable[preflight.NodeInfo]) -> None:
        meta = job["metadata"]
        valid, errors = validate_job(
            {"apiVersion": job["apiVersion"], "kind": job["kind"], "metadata": dict(meta), "spec": dict(job["spec"])},
            context="cluster",
        )
        state = self._state(meta["uid"])
        async with state.lock:
            current = self._current(state, job)
            if valid is None:
                problems = [str(e) for e in errors]
                new = status.invalid_status(current, problems, generation=meta.get("generation"), now=_now())
                await self._write(job, state, current, new)
                raise kopf.PermanentError("invalid spec: " + "; ".join(problems))
            if current.get("phase") in status.TERMINAL_PHASES:
                rayjob = await self._kube.get(RAYJOBS, meta["namespace"], meta["name"])
                hold = blocked = None
            else:
                rayjob, hold, blocked = await self._apply_rayjob(job, valid, nodes)
            new = status.compute_status(
                status.Observation(
                    spec=valid.spec,
                    generation=meta.get("generation"),
                    current=current,
                    rayjob=rayjob_view(rayjob) if rayjob is not None else None,
                    now=_now(),
                    stall_after=self._config.stall_seconds,
                    unschedulable=hold,
                    blocked=blocked,
                )
            )
            await self._write(job, state, current, new)
        if blocked is not None:
            delay = self._config.retry_seconds if blocked == status.KUBERAY_NOT_INSTALLED else CONFLICT_RETRY_SECONDS
            raise kopf.TemporaryError(blocked.message, delay=delay)
        if hold is not None:
            raise kopf.TemporaryError(hold.message, delay=self._config.retry_seconds)

    async def _apply_rayjob(
        self, job: Mapping[str, Any], valid: RocmTrainingJob, nodes: Iterable[preflight.NodeInfo]
    ) -> tuple[dict[str, Any] | None, status.Hold | None, status.Hold | None]:
        """Create the RayJob or carry the mutable fields over: (RayJob, pre-flight hold, other hold)."""
        meta = job["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        rendered = render_rayjob(valid, options=self._config.render_options)
        rendered["metadata"]["ownerReferences"] = [kopf.build_owner_reference(job)]
        live = None
        hold = preflight.check(valid.spec, nodes)
        if hold is not None:
            live = await self._kube.get(RAYJOBS, namespace, name)
            if live is None:
                return None, hold, None
        if live is None:
            try:
                created = await self._kube.create(RAYJOBS, rendered)
            except ApiMissing:
                return None, None, status.KUBERAY_NOT_INSTALLED
            if created is not None:
                logger.info("created RayJob %s/%s", namespace, name)
                return created, None, None
            live = await self._kube.get(RAYJOBS, namespace, name)
            if live is None:  # deleted between the create and the read: next round creates it
                raise kopf.TemporaryError(f"RayJob {namespace}/{name} vanished; retrying", delay=1)
        if controller_ref(live).get("uid") != meta["uid"]:
            return None, None, status.Hold("RayJobConflict", f"a RayJob named {name} exists and is not this job's")
        patch = mutable_patch(rendered["spec"], live.get("spec") or {}, queued=bool(valid.spec.scheduling.queue_name))
        if patch:
            live = await self._kube.patch(RAYJOBS, namespace, name, {"spec": patch}) or live
            logger.info("updated RayJob %s/%s: %s", namespace, name, sorted(patch))
        return live, None, None

    async def resync(self, job: Mapping[str, Any]) -> None:
        """Have the job handler run again for `job` (it reacts to the resync annotation)."""
        meta = job["metadata"]
        stamp = _now().isoformat()
        await self._kube.patch(
            JOBS, meta["namespace"], meta["name"], {"metadata": {"annotations": {RESYNC_ANNOTATION: stamp}}}
        )

    # ---- RayJob side --------------------------------------------------------------------

    async def refresh(self, job: Mapping[str, Any], rayjob: Mapping[str, Any] | None) -> None:
        """Recompute the job's status from `rayjob` (a RayJob view, None when it is gone) and write it."""
        meta = job["metadata"]
        state = self._state(meta["uid"])
        async with state.lock:
            current = self._current(state, job)
            try:
                spec = RocmTrainingJobSpec.model_validate(job["spec"])
            except ValidationError:
                return  # a spec the job handler refuses; it owns that status
            new = status.compute_status(
                status.Observation(
                    spec=spec,
                    generation=current.get("observedGeneration") or meta.get("generation"),
                    current=current,
                    rayjob=rayjob,
                    now=_now(),
                    stall_after=self._config.stall_seconds,
                )
            )
            await self._write(job, state, current, new)

    async def _write(
        self, job: Mapping[str, Any], state: JobState, current: Mapping[str, Any], new: Mapping[str, Any]
    ) -> None:
        """Patch the owned status fields that changed and post the transition events."""
        patch = status.status_patch(current, new)
        if not patch:
            return
        meta = job["metadata"]
        if await self._kube.patch_status(JOBS, meta["namespace"], meta["name"], patch, uid=meta["uid"]) is None:
            return
        state.written = {key: new.get(key) for key in status.OWNED_FIELDS}
        for event in status.transition_events(current, new):
            await self._kube.post_event(job, type=event.type, reason=event.reason, message=event.message)
