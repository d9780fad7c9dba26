"""Per-job orchestration: validate, pre-flight, create or update the RayJob, write the status.

The decisions live in pure modules (`validate`, `render`, `preflight`, `status`);
this module sequences them around the few API calls of `rocmtrain.kube`.

Level-triggered: `sync` is called for every observed state of a job and does
nothing once the job's current generation is in line (its RayJob created or
updated, or the spec refused); a job that is held (KubeRay missing, no node fits,
a name conflict) or that met an error is tried again after a delay. The
operator keeps no bookkeeping in the job object: after a restart, each job is
checked once more, and creating its RayJob again finds the existing one.

All status writes of one job go through one asyncio lock, and the operator keeps
the status it last wrote per job, so that two paths (the job's own and the
RayJob watch) never write an older view over a newer one, and a transition is
announced by exactly one event.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from rocmtrain import preflight, status
from rocmtrain.api.models import KIND, RocmTrainingJob, RocmTrainingJobSpec
from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.kube import JOBS, RAYJOBS, ApiMissing, Kube
from rocmtrain.render import render_rayjob
from rocmtrain.validate import validate_job

logger = logging.getLogger(__name__)

# RayJob spec fields that follow the job after creation, with KubeRay's defaults.
# `suspend` is Kueue's once the job is queued, so it is left alone there.
MUTABLE_RAYJOB_FIELDS = {"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 0, "suspend": False}
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
    synced: int | None = None  # the generation whose RayJob is in line with the spec (or that was refused)
    tried: int | None = None  # the generation last tried while a retry is scheduled
    retry: asyncio.TimerHandle | None = None


class Reconciler:
    """Turns jobs into RayJobs and RayJob states into job statuses."""

    def __init__(
        self,
        kube: Kube,
        config: OperatorConfig,
        known: Callable[[str, str], Mapping[str, Any] | None],
        before_render: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """`known(namespace, name)`: the watched view of a RayJob, if any (saves a read);
        `before_render(namespace)`: awaited before a job there is rendered (the progress CA)."""
        self._kube = kube
        self._config = config
        self._known = known
        self._before_render = before_render
        self._states: dict[str, JobState] = {}
        self._slots = asyncio.Semaphore(ACTIVE_RECONCILES)
        self._retries: set[asyncio.Task[None]] = set()

    def forget(self, uid: str) -> None:
        """Drop what is remembered about a deleted job, and its scheduled retry."""
        state = self._states.pop(uid, None)
        if state is not None and state.retry is not None:
            state.retry.cancel()

    def invalidate(self, uid: str) -> None:
        """Have the next `sync` of the job check its RayJob again (it was deleted behind our back)."""
        self._state(uid).synced = None

    def retry_later(self, uid: str, delay: float, again: Callable[[], Awaitable[None]]) -> None:
        """Run `again()` in `delay` seconds (replacing a retry already scheduled for the job)."""
        state = self._state(uid)
        if state.retry is not None:
            state.retry.cancel()

        def fire() -> None:
            state.retry = None
            task = asyncio.create_task(again(), name=f"retry {uid}")
            self._retries.add(task)
            task.add_done_callback(self._retries.discard)

        state.retry = asyncio.get_running_loop().call_later(delay, fire)

    async def stop(self) -> None:
        """Cancel the scheduled retries and those running."""
        for state in self._states.values():
            if state.retry is not None:
                state.retry.cancel()
        for task in list(self._retries):
            task.cancel()
        await asyncio.gather(*self._retries, return_exceptions=True)

    def _state(self, uid: str) -> JobState:
        return self._states.setdefault(uid, JobState())

    @staticmethod
    def _current(state: JobState, job: Mapping[str, Any]) -> dict[str, Any]:
        """The job's status as the operator knows it: its own last write over the observed one."""
        return {**(job.get("status") or {}), **(state.written or {})}

    # ---- job side -------------------------------------------------------------------

    async def sync(self, job: Mapping[str, Any], nodes: Iterable[preflight.NodeInfo]) -> float | None:
        """Bring the job's RayJob in line with its spec and write the status, unless it already is.

        Returns the seconds after which to try again while the RayJob is held
        (KubeRay missing, no node fits, a name conflict), else None.
        """
        meta = job["metadata"]
        state = self._state(meta["uid"])
        generation = meta.get("generation")
        if state.synced == generation or (state.retry is not None and state.tried == generation):
            return None  # in line, or a retry of this very generation is already scheduled
        state.tried = generation
        async with self._slots:
            if self._before_render is not None:
                await self._before_render(meta["namespace"])
            delay = await self._ensure(job, nodes, state)
        if delay is None:
            state.synced = generation
        return delay

    async def _ensure(
        self, job: Mapping[str, Any], nodes: Iterable[preflight.NodeInfo], state: JobState
    ) -> float | None:
        meta = job["metadata"]
        valid, errors = validate_job(
            {"apiVersion": job["apiVersion"], "kind": job["kind"], "metadata": dict(meta), "spec": dict(job["spec"])},
            context="cluster",
        )
        async with state.lock:
            current = self._current(state, job)
            if valid is None:
                problems = [str(e) for e in errors]
                new = status.invalid_status(current, problems, generation=meta.get("generation"), now=_now())
                await self._write(job, state, current, new)
                logger.warning("refused %s/%s: %s", meta["namespace"], meta["name"], "; ".join(problems))
                return None  # nothing to retry: the user changes the spec, or deletes the job
            if current.get("phase") in status.TERMINAL_PHASES:
                rayjob = await self._read_rayjob(meta["namespace"], meta["name"])
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
            return self._config.retry_seconds if blocked == status.KUBERAY_NOT_INSTALLED else CONFLICT_RETRY_SECONDS
        if hold is not None:
            return self._config.retry_seconds
        return None

    async def _read_rayjob(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The RayJob as the watch last saw it, else as the API server has it."""
        return self._known(namespace, name) or await self._kube.get(RAYJOBS, namespace, name)

    async def _apply_rayjob(
        self, job: Mapping[str, Any], valid: RocmTrainingJob, nodes: Iterable[preflight.NodeInfo]
    ) -> tuple[Mapping[str, Any] | None, status.Hold | None, status.Hold | None]:
        """Create the RayJob or carry the mutable fields over: (RayJob, pre-flight hold, other hold)."""
        meta = job["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        rendered = render_rayjob(valid, options=self._config.render_options)
        rendered["metadata"]["ownerReferences"] = [kopf.build_owner_reference(job)]
        hold = preflight.check(valid.spec, nodes)
        if hold is None:
            live = self._known(namespace, name)  # not seen yet: the create below finds out
        else:  # held: carry the fields over to a RayJob that already exists, create none
            live = await self._read_rayjob(namespace, name)
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
            if live is None:  # deleted between the create and the read: the retry creates it
                raise LookupError(f"RayJob {namespace}/{name} vanished while it was created")
        if controller_ref(live).get("uid") != meta["uid"]:
            return None, None, status.Hold("RayJobConflict", f"a RayJob named {name} exists and is not this job's")
        patch = mutable_patch(rendered["spec"], live.get("spec") or {}, queued=bool(valid.spec.scheduling.queue_name))
        if patch:
            live = await self._kube.patch(RAYJOBS, namespace, name, {"spec": patch}) or live
            logger.info("updated RayJob %s/%s: %s", namespace, name, sorted(patch))
        return live, None, None

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
            logger.info("%s/%s %s: %s", meta["namespace"], meta["name"], event.reason, event.message)
            await self._kube.post_event(job, type=event.type, reason=event.reason, message=event.message)
