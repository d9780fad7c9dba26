"""Per-job orchestration: validate, pre-flight, create or update the RayJob, write the status.

The decisions live in pure modules (`rocmtrain.api.validate`, `rocmtrain.render`,
`rocmtrain.admission.node_fit`, `rocmtrain.status`); this module
sequences them around the few API calls of `rocmtrain.kube.client`. A job's spec is read
one way everywhere here: `validate_job` in the cluster context.

Level-triggered: `sync` is called for every observed state of a job and does
nothing once the job's current generation is in line (its RayJob created or
updated, or the spec refused); a job that is held (KubeRay missing, no node fits,
a name conflict, the API server refusing its RayJob) or that met an error is
tried again after a delay. The operator keeps no bookkeeping in the job object:
after a restart, each job is checked once more, and creating its RayJob again
finds the existing one.

A reconcile holds one of `ACTIVE_RECONCILES` slots, for at most the config's
`reconcile_deadline` (every request also has its own deadline), so a hung API
server delays jobs but never keeps a slot.

A job whose training driver refused it at pre-flight (`status.preflightError`, written by the
progress endpoint) is ended at its next event: its status Failed, then its RayJob deleted, before
KubeRay retries the failed Ray job, so that the refusal spends no job retry and its Ray cluster goes.

Every status is computed from everything known about the job: its RayJob, its Ray
pods and Kueue's Workload (the watches' views, handed in as lookups), whichever
of them changed.

Validating and rendering a job run in a thread (`asyncio.to_thread`), so that the
largest job (96 KiB as its driver reads it, a RayJob of about 300 KB) never holds the
event loop that the watches, the progress endpoint and the liveness probe share: the
thread gives the loop its turn at least every 5 ms (Python's switch interval). They are
pure functions of data the loop does not change meanwhile (the index replaces a job's
view, it never edits one).

No work twice: a job's generation is validated once, however often its status is refreshed
(`Reconciler._checked`), and a sync reads the job's RayJob once: the watch's view where it
serves (a status, a deletion), else the API server's whole RayJob (`Reconciler._apply_rayjob`).

All status writes of one job go through one asyncio lock, and the operator keeps
the status it last wrote per job, so that two paths (the job's own and the
watches') never write an older view over a newer one, and a transition is
announced by exactly one event.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rocmtrain.admission import node_fit
from rocmtrain.admission.checkpoint_claim import checkpoint_claim, unshared_claim_warning
from rocmtrain.api.condition_reasons import Reason
from rocmtrain.api.models import Phase, RocmTrainingJob, RocmTrainingJobSpec
from rocmtrain.api.validate import FieldError, validate_job
from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.kube.client import JOBS, NETWORK_POLICIES, RAYJOBS, ApiMissing, Kube, Refused
from rocmtrain.metrics import prometheus
from rocmtrain.render import render_network_policy, render_rayjob
from rocmtrain.render.rayjob_update import (
    APPLIED_REASON,
    DEFERRED_REASON,
    applied_message,
    between_runs,
    deferred_message,
    rayjob_update,
)
from rocmtrain.status import phase
from rocmtrain.status.accounting import Price
from rocmtrain.status.events import transition_events
from rocmtrain.status.gauges import queue_wait
from rocmtrain.status.hold import KUBERAY_NOT_INSTALLED, Hold, HoldKind, refused_create, refused_network_policy
from rocmtrain.status.objects import (
    PARTIAL_SPEC,
    controller_ref,
    is_jobs_rayjob,
    job_document,
    job_view,
    owner_reference,
    queued,
    rayjob_view,
)

logger = logging.getLogger(__name__)

# A RayJob name taken by an object the job does not own (typically the RayJob of a
# deleted job of the same name, about to be garbage-collected): check again soon.
CONFLICT_RETRY_SECONDS = 5
# Jobs reconciled at once. A burst of new jobs then waits here, small, instead of
# holding rendered RayJobs and open requests for all of them (memory, and the API
# server's CPU); 16 keeps the client's connections busy.
ACTIVE_RECONCILES = 16
# Uids of deleted jobs remembered, so that a sync still running when its job goes
# does not bring the job's state back (uids are never reused).
FORGOTTEN_UIDS = 4096


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class JobState:
    """What the operator remembers about one job (by uid) between handler runs."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    written: dict[str, Any] | None = None  # owned status fields as last written
    synced: int | None = None  # the generation whose RayJob is in line with the spec (or that was refused)
    newest: int = 0  # the newest generation of the job seen by a sync: an older view is never acted on
    seen_rayjob: tuple[str, int] = ("", 0)  # (uid, generation) of the newest RayJob spec a status was computed from
    tried: int | None = None  # the generation last tried while a retry is scheduled
    # (generation, its reading, what refuses it) of the generation last checked, until the job ends (`_checked`)
    checked: tuple[int | None, RocmTrainingJob | None, tuple[FieldError, ...]] | None = None
    deferred: tuple[str, ...] = ()  # the RayJob's fixed fields whose render change was announced
    ended: bool = False  # the driver's pre-flight refusal was acted on (`Reconciler.end_refused`)
    claim_checked: int | None = None  # the generation whose checkpoints' claim was read (`_warn_unshared_claim`)
    retry: asyncio.TimerHandle | None = None


class Reconciler:
    """Turns jobs into RayJobs and RayJob states into job statuses."""

    def __init__(
        self,
        kube: Kube,
        config: OperatorConfig,
        known: Callable[[str, str], Mapping[str, Any] | None],
        before_render: Callable[[str], Awaitable[Hold | None]] | None = None,
        pods: Callable[[str, str], Sequence[Mapping[str, Any]]] = lambda namespace, job: (),
        workload: Callable[[Mapping[str, Any]], Mapping[str, Any] | None] = lambda rayjob: None,
        notify: Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]], object] | None = None,
    ) -> None:
        """`known(namespace, name)`: the watched view of a RayJob, if any (saves a read where no update follows);
        `before_render(namespace)`: awaited before a job there is rendered (the progress CA),
        it returns what holds the RayJob back, if anything does;
        `pods(namespace, job)`: the job's Ray pods; `workload(rayjob)`: Kueue's Workload of a RayJob;
        `notify(job, old status, new status)`: queues the job's phase notifications (never waits)."""
        self._kube = kube
        self._config = config
        self._known = known
        self._before_render = before_render
        self._pods = pods
        self._workload = workload
        self._notify = notify
        self._states: dict[str, JobState] = {}
        self._forgotten: OrderedDict[str, None] = OrderedDict()
        self._slots = asyncio.Semaphore(ACTIVE_RECONCILES)
        self._retries: set[asyncio.Task[None]] = set()
        prometheus.JOBS_REMEMBERED.set_function(lambda: len(self._states))

    def forget(self, uid: str) -> None:
        """Drop what is remembered about a deleted job, and its scheduled retry, for good."""
        self._forgotten[uid] = None
        while len(self._forgotten) > FORGOTTEN_UIDS:
            self._forgotten.popitem(last=False)
        state = self._states.pop(uid, None)
        if state is not None and state.retry is not None:
            state.retry.cancel()

    def invalidate(self, uid: str) -> None:
        """Have the next `sync` of the job check its RayJob again (it was deleted behind our back)."""
        self._state(uid).synced = None

    def retry_later(self, uid: str, delay: float, again: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `again()` in `delay` seconds (replacing a retry already scheduled for the job)."""
        if uid in self._forgotten:
            return
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

    async def _checked(
        self, job: Mapping[str, Any], state: JobState
    ) -> tuple[RocmTrainingJob | None, tuple[FieldError, ...]]:
        """The job's one reading, as `rocmtrain validate` reads a cluster job (in a thread: see the module
        docstring), in the operator's default queue where it names none (`Policy.with_defaults`), and what
        refuses it: its field errors, else the operator's allow-lists and limits. Once per
        generation: a spec change makes a new one, the policy is fixed for the process, and the metadata that
        changes within a generation (labels) is read by neither. Kept until the job ends: an ended job is rarely
        read again, and the finished jobs a cluster keeps would hold their readings for good."""
        meta = job["metadata"]
        if state.checked is not None and state.checked[0] == meta.get("generation"):
            return state.checked[1], state.checked[2]
        valid, errors = await asyncio.to_thread(validate_job, await self._document(job), context="cluster")
        policy = self._config.policy
        valid = policy.with_defaults(valid) if valid is not None else None
        refused = tuple(errors if valid is None else policy.check(valid.spec, meta["namespace"]))
        if not phase.has_ended(self._current(state, job)):
            state.checked = (meta.get("generation"), valid, refused)
        return valid, refused

    async def _document(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """The job as validation reads it. The job index's view of an oversized or refused job keeps none of its
        spec (`PARTIAL_SPEC`): the API server's job, then, which must be the same generation."""
        if not job.get(PARTIAL_SPEC):
            return job_document(job)
        meta = job["metadata"]
        live = await self._kube.get(JOBS, meta["namespace"], meta["name"])
        live_meta = (live or {}).get("metadata") or {}
        if live is None or (live_meta.get("uid"), live_meta.get("generation")) != (meta["uid"], meta.get("generation")):
            raise LookupError(f"job {meta['namespace']}/{meta['name']} changed while its spec was read")
        return job_document(job_view(live))

    def _price(self, spec: RocmTrainingJobSpec) -> Price | None:
        pricing = self._config.pricing
        return pricing.price_for(spec) if pricing is not None else None

    def _state(self, uid: str) -> JobState:
        """The job's state; a deleted job's is a throwaway, never stored again."""
        if uid in self._forgotten:
            return JobState()
        return self._states.setdefault(uid, JobState())

    @staticmethod
    def _older(state: JobState, job: Mapping[str, Any]) -> bool:
        """Whether `job` is a view older than the newest generation a sync has seen: acting on it would bring an
        older spec back (a handler that fetched the job from an index before the job changed)."""
        return int(job["metadata"].get("generation") or 0) < state.newest

    @staticmethod
    def _newer_rayjob(state: JobState, rayjob: Mapping[str, Any] | None) -> bool:
        """Whether a status may be computed from `rayjob` (a view, or None when it is gone): not a spec of the RayJob
        older than one a status was computed from (the watch's queue lags the reconciler's own reads); remembered."""
        if rayjob is None:
            return True
        meta = rayjob["metadata"]
        seen = (str(meta.get("uid") or ""), int(meta.get("generation") or 0))
        if seen[0] == state.seen_rayjob[0] and seen[1] < state.seen_rayjob[1]:
            return False
        state.seen_rayjob = seen
        return True

    @staticmethod
    def _current(state: JobState, job: Mapping[str, Any]) -> dict[str, Any]:
        """The job's status as the operator knows it: its own last write over the observed one."""
        return {**(job.get("status") or {}), **(state.written or {})}

    def _observe(
        self,
        job: Mapping[str, Any],
        valid: RocmTrainingJob,
        current: Mapping[str, Any],
        *,
        generation: int | None,
        rayjob: Mapping[str, Any] | None,
        hold: Hold | None = None,
    ) -> phase.Observation:
        """What the job's status is computed from: its RayJob (a view), Ray pods and Kueue Workload, now."""
        meta = job["metadata"]
        return phase.Observation(
            spec=valid.spec,
            generation=generation,
            current=current,
            rayjob=rayjob,
            now=_now(),
            stall_after=self._config.stall_seconds,
            hold=hold,
            price=self._price(valid.spec),
            pods=self._pods(meta["namespace"], meta["name"]),
            workload=self._workload(rayjob) if rayjob is not None else None,
        )

    # ---- job side -------------------------------------------------------------------

    async def sync(self, job: Mapping[str, Any], nodes: Iterable[node_fit.NodeInfo]) -> float | None:
        """Bring the job's RayJob in line with its spec and write the status, unless it already is.

        Returns the seconds after which to try again while the RayJob is held
        (KubeRay missing, no node fits, a name conflict), else None.
        """
        meta = job["metadata"]
        state = self._state(meta["uid"])
        generation = meta.get("generation")
        refused = phase.refusal(job.get("status")) is not None and not state.ended
        if self._older(state, job):
            return None  # a view of the job older than one already synced (from an index, a watch that lags)
        state.newest = generation or 0
        if not refused and (state.synced == generation or (state.retry is not None and state.tried == generation)):
            return None  # in line, or a retry of this very generation is already scheduled
        state.tried = generation
        async with self._slots, asyncio.timeout(self._config.reconcile_deadline):
            with prometheus.RECONCILES_IN_FLIGHT.track_inprogress():
                if refused:
                    await self.end_refused(job)
                    return None
                blocked = await self._before_render(meta["namespace"]) if self._before_render else None
                delay = await self._ensure(job, nodes, state, blocked)
        if delay is None:
            state.synced = generation
        return delay

    async def _ensure(
        self, job: Mapping[str, Any], nodes: Iterable[node_fit.NodeInfo], state: JobState, blocked: Hold | None
    ) -> float | None:
        meta = job["metadata"]
        valid, refused = await self._checked(job, state)
        why = phase.INVALID_SPEC if valid is None else phase.NOT_ALLOWED
        async with state.lock:
            if self._older(state, job):
                return None  # a newer generation's sync started meanwhile: it brings the RayJob in line
            current = self._current(state, job)
            if valid is None or refused:
                if (ended := phase.phase_of(current)) is not None and ended.is_terminal:
                    return None  # it ended as it was: a rule added since does not rewrite how
                problems = [str(e) for e in refused]
                await self._stop(job, await self._read_rayjob(meta["namespace"], meta["name"]))
                price = self._price(valid.spec) if valid is not None else None
                new = phase.invalid_status(
                    current, problems, generation=meta.get("generation"), now=_now(), why=why, price=price
                )
                await self._write(job, state, current, new)
                logger.warning("refused %s/%s: %s", meta["namespace"], meta["name"], "; ".join(problems))
                return None  # nothing to retry: the user changes the spec, or deletes the job
            hold: Hold | None = None
            if phase.has_ended(current):
                rayjob = await self._read_rayjob(meta["namespace"], meta["name"])
            else:
                await self._warn_unshared_claim(job, valid, state)
                rayjob, hold = await self._apply_rayjob(job, valid, nodes, blocked, state, current)
            view = rayjob_view(rayjob) if rayjob is not None else None
            self._newer_rayjob(state, view)
            new = phase.compute_status(
                self._observe(job, valid, current, generation=meta.get("generation"), rayjob=view, hold=hold)
            )
            await self._write(job, state, current, new)
        return None if hold is None else hold.retry_after(self._config.retry_seconds)

    async def end_refused(self, job: Mapping[str, Any]) -> None:
        """End a job its driver refused at pre-flight (`status.preflightError`): its status Failed
        (`rocmtrain.status.phase`), then its RayJob deleted before KubeRay retries the failed Ray job."""
        meta = job["metadata"]
        live = await self._read_rayjob(meta["namespace"], meta["name"])
        await self.refresh(job, rayjob_view(live) if live is not None and is_jobs_rayjob(job, live) else None)
        await self._stop(job, live)
        self._state(meta["uid"]).ended = True

    async def _stop(self, job: Mapping[str, Any], live: Mapping[str, Any] | None) -> None:
        """Delete `live`, the job's RayJob unless it is gone or already going: a job refused after it started (the
        allow-lists tightened, an operator upgrade added a rule, its driver's pre-flight) gives its Ray cluster,
        GPUs and Kueue quota back."""
        if live is None or not is_jobs_rayjob(job, live) or "deletionTimestamp" in live["metadata"]:
            return
        namespace, name = live["metadata"]["namespace"], live["metadata"]["name"]
        if await self._kube.delete(RAYJOBS, namespace, name, uid=live["metadata"]["uid"]):
            logger.warning("deleted RayJob %s/%s: its job is refused", namespace, name)

    async def _read_rayjob(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The RayJob as the watch last saw it, else as the API server has it (a status, a deletion: no update)."""
        return self._known(namespace, name) or await self._kube.get(RAYJOBS, namespace, name)

    async def _apply_rayjob(
        self,
        job: Mapping[str, Any],
        valid: RocmTrainingJob,
        nodes: Iterable[node_fit.NodeInfo],
        blocked: Hold | None,
        state: JobState,
        current: Mapping[str, Any],
    ) -> tuple[Mapping[str, Any] | None, Hold | None]:
        """Create the RayJob or carry the mutable fields over (`rocmtrain.render.rayjob_update`): the RayJob, or
        what holds it back. One read of the RayJob, whole (an update compares the fixed fields, which the watch's
        view leaves out), and everything decided on it; none for a job whose status the operator has not written
        yet, which as a rule has no RayJob: its create finds out."""
        meta = job["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        rendered = await asyncio.to_thread(render_rayjob, valid, options=self._config.render_options)
        rendered["metadata"]["ownerReferences"] = [owner_reference(job)]
        hold = blocked or node_fit.check(valid.spec, nodes)
        if hold is None and self._config.job_network_policies:
            hold = await self._protect(job, valid)
        has_status = phase.phase_of(current) is not None
        live = await self._kube.get(RAYJOBS, namespace, name) if has_status or hold is not None else None
        if live is None and hold is not None:
            return None, hold  # held: the fields are carried over to a RayJob that exists, none is created
        if live is None:
            try:
                created = await self._kube.create(RAYJOBS, rendered)
            except ApiMissing:
                return None, KUBERAY_NOT_INSTALLED
            except Refused as exc:
                logger.warning("RayJob %s/%s refused: %s", namespace, name, exc)
                return None, refused_create(exc.status, exc.message)
            if created is not None:
                logger.info("created RayJob %s/%s", namespace, name)
                return created, None
            live = await self._kube.get(RAYJOBS, namespace, name)  # it exists after all: a sync cut short
            if live is None:  # deleted between the create and the read: the retry creates it
                raise LookupError(f"RayJob {namespace}/{name} vanished while it was created")
        if controller_ref(live).get("uid") != meta["uid"]:
            conflict = f"a RayJob named {name} exists and is not this job's"
            return None, Hold(HoldKind.CONFLICT, Reason.RAYJOB_CONFLICT, conflict, retry_seconds=CONFLICT_RETRY_SECONDS)
        return await self._update_rayjob(job, valid, rendered["spec"], live, state), None

    async def next_run(self, job: Mapping[str, Any]) -> None:
        """Bring the job's RayJob, which the RayJob watch saw between runs (`between_runs`), in line with the
        current render before KubeRay makes its next Ray cluster. The RayJob only: the status follows from the
        RayJob's own events, in their order. Nothing while the job's own sync of this generation is due."""
        meta = job["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        state = self._state(meta["uid"])
        async with self._slots, asyncio.timeout(self._config.reconcile_deadline):
            valid, refused = await self._checked(job, state)
            if valid is None or refused:
                return
            async with state.lock:
                if self._older(state, job) or state.synced != meta.get("generation"):
                    return
                live = await self._kube.get(RAYJOBS, namespace, name)
                if live is None or not is_jobs_rayjob(job, live) or "deletionTimestamp" in live["metadata"]:
                    return
                rendered = await asyncio.to_thread(render_rayjob, valid, options=self._config.render_options)
                await self._update_rayjob(job, valid, rendered["spec"], live, state)

    async def _update_rayjob(
        self,
        job: Mapping[str, Any],
        valid: RocmTrainingJob,
        rendered: Mapping[str, Any],
        live: Mapping[str, Any],
        state: JobState,
    ) -> Mapping[str, Any]:
        """Patch the job's existing RayJob `live` towards the `rendered` spec as `rocmtrain.render.rayjob_update`
        decides, and post its render-change events; the RayJob. A render change is written only onto the version
        read: `Conflict` when the RayJob changed since, and the caller's retry (the sync's, or the RayJob watch's)
        reads it again and decides again."""
        namespace, name = live["metadata"]["namespace"], live["metadata"]["name"]
        kueue = bool(valid.spec.scheduling.queue_name) or queued(live)
        update = rayjob_update(rendered, live.get("spec") or {}, queued=kueue, between=between_runs(live, queued=kueue))
        if update.patch:
            version = live["metadata"]["resourceVersion"] if update.applied else None
            patched = await self._kube.patch(RAYJOBS, namespace, name, {"spec": update.patch}, resource_version=version)
            live = patched or live
            logger.info("updated RayJob %s/%s: %s", namespace, name, sorted(update.patch))
        if update.applied:
            message = applied_message(name, update.applied)
            logger.info("%s/%s %s: %s", namespace, name, APPLIED_REASON, message)
            await self._kube.post_event(job, type="Normal", reason=APPLIED_REASON, message=message)
        elif update.deferred and update.deferred != state.deferred:  # announced once per change
            message = deferred_message(name, update.deferred, queued=kueue)
            logger.info("%s/%s %s: %s", namespace, name, DEFERRED_REASON, message)
            await self._kube.post_event(job, type="Normal", reason=DEFERRED_REASON, message=message)
        state.deferred = update.deferred
        return live

    async def _warn_unshared_claim(self, job: Mapping[str, Any], valid: RocmTrainingJob, state: JobState) -> None:
        """Post a Warning event, once per generation, when the job's checkpoints lie on a PersistentVolumeClaim
        that is not ReadWriteMany (`rocmtrain.admission.checkpoint_claim`); nothing when the claim does not exist
        yet or the operator may not read it."""
        meta, reason = job["metadata"], Reason.CHECKPOINT_CLAIM_NOT_SHARED
        if state.claim_checked == meta.get("generation") or (name := checkpoint_claim(valid)) is None:
            return
        claim = await self._kube.read_claim(meta["namespace"], name)
        state.claim_checked = meta.get("generation")
        if claim is not None and (message := unshared_claim_warning(valid, claim)) is not None:
            logger.warning("%s/%s %s: %s", meta["namespace"], meta["name"], reason, message)
            await self._kube.post_event(job, type="Warning", reason=reason, message=message)

    async def _protect(self, job: Mapping[str, Any], valid: RocmTrainingJob) -> Hold | None:
        """Create the job's NetworkPolicy (kept when it exists) before any of its Ray pods; what holds the job."""
        policy = render_network_policy(valid)
        policy["metadata"]["ownerReferences"] = [owner_reference(job)]
        try:
            await self._kube.create(NETWORK_POLICIES, policy)
        except Refused as exc:
            logger.warning("NetworkPolicy %s/%s refused: %s", valid.metadata.namespace, valid.metadata.name, exc)
            return refused_network_policy(exc.status, exc.message)
        return None

    # ---- RayJob side --------------------------------------------------------------------

    async def refresh(self, job: Mapping[str, Any], rayjob: Mapping[str, Any] | None) -> None:
        """Recompute the job's status from `rayjob` (a RayJob view, None when it is gone) and write it."""
        meta = job["metadata"]
        state = self._state(meta["uid"])
        async with state.lock:
            if self._older(state, job) or not self._newer_rayjob(state, rayjob):
                return  # an older view of the job or its RayJob than one the status was computed from
            current = self._current(state, job)
            valid, refused = await self._checked(job, state)
            if valid is None or refused:
                return  # a spec the job handler refuses; it owns that status (and deletes the RayJob)
            generation = current.get("observedGeneration") or meta.get("generation")
            new = phase.compute_status(self._observe(job, valid, current, generation=generation, rayjob=rayjob))
            await self._write(job, state, current, new)

    async def set_queue(self, job: Mapping[str, Any], queue: Mapping[str, Any] | None) -> None:
        """Write a Queued job's `status.queue` (`rocmtrain.status.queue_estimate`) where it changed; nothing once
        the job left Queued (the status mapping clears it then)."""
        state = self._state(job["metadata"]["uid"])
        async with state.lock:
            current = self._current(state, job)
            if phase.phase_of(current) is not Phase.QUEUED:
                return
            new = {**{key: current.get(key) for key in phase.OWNED_FIELDS}, "queue": queue}
            await self._write(job, state, current, new)

    async def _write(
        self, job: Mapping[str, Any], state: JobState, current: Mapping[str, Any], new: Mapping[str, Any]
    ) -> None:
        """Patch the owned status fields that changed and post the transition events."""
        patch = phase.status_patch(current, new)
        if not patch:
            return
        meta = job["metadata"]
        if await self._kube.patch_status(JOBS, meta["namespace"], meta["name"], patch, uid=meta["uid"]) is None:
            return
        state.written = {key: new.get(key) for key in phase.OWNED_FIELDS}
        if phase.has_ended(new):
            state.checked = None  # its reading is not kept (`_checked`)
        if (waited := queue_wait(current, new, _now())) is not None:
            prometheus.QUEUE_WAIT_SECONDS.observe(waited)
        for event in transition_events(current, new):
            logger.info("%s/%s %s: %s", meta["namespace"], meta["name"], event.reason, event.message)
            await self._kube.post_event(job, type=event.type, reason=event.reason, message=event.message)
        if self._notify is not None:
            self._notify(job, current, {**current, **new})
