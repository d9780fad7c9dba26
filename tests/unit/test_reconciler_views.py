"""The reconciler never acts on a view of a job older than one it has synced (`Reconciler._older`), and does no
work twice: one validation per generation of a job, one read of its RayJob per sync.

The RayJob watch's handlers take the job from kopf's index, which may still hold the previous generation
while the job's own event brings the new one: a sync (a deleted RayJob made again) or a next run's render
(`Reconciler.next_run`) of that older view would write its spec back onto the RayJob (here, suspend a job
its user has just resumed, or render its older spec). The API server is a small stand-in that keeps one
RayJob and applies merge patches as the real one does (and counts its reads, the RayJob watch's views among
them); nothing else is faked.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from fakes import merge_patch
from rocmtrain.api.condition_reasons import Reason
from rocmtrain.controller import reconciler as reconciler_module
from rocmtrain.controller.reconciler import Reconciler
from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.kube.client import JOBS
from rocmtrain.status.hold import Hold, HoldKind
from rocmtrain.status.objects import PARTIAL_SPEC, index_view, rayjob_view
from unit.samples import minimal_job


class _OneRayJob:
    """The API server of one namespace, for the calls a sync makes: RayJobs kept, everything else accepted."""

    def __init__(self) -> None:
        self.rayjob: dict[str, Any] | None = None
        self.reads = 0
        self.spec_patches: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []

    async def create(self, ref: Any, body: dict[str, Any]) -> dict[str, Any] | None:
        if body["kind"] != "RayJob" or self.rayjob is not None:
            return None  # a NetworkPolicy, or a RayJob that exists (409)
        self.rayjob = {**copy.deepcopy(body), "status": {}}
        self.rayjob["metadata"].update(resourceVersion="1", uid="rayjob-uid", generation=1)
        return copy.deepcopy(self.rayjob)

    async def get(self, ref: Any, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return copy.deepcopy(self.rayjob)

    def watched(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The RayJob watch's view of the RayJob (`Reconciler`'s `known`): a read too, when it finds one."""
        if self.rayjob is None:
            return None
        self.reads += 1
        return rayjob_view(self.rayjob)

    async def patch(
        self, ref: Any, namespace: str, name: str, patch: dict[str, Any], *, resource_version: str | None = None
    ) -> dict[str, Any]:
        assert self.rayjob is not None
        assert resource_version in (None, self.rayjob["metadata"]["resourceVersion"])
        self.spec_patches.append(patch["spec"])
        self.rayjob = merge_patch(self.rayjob, patch)
        meta = self.rayjob["metadata"]
        meta.update(generation=meta["generation"] + 1, resourceVersion=str(int(meta["resourceVersion"]) + 1))
        return copy.deepcopy(self.rayjob)

    async def patch_status(self, ref: Any, namespace: str, name: str, status: dict[str, Any], **_: Any) -> dict:
        self.statuses.append(status)
        return {}

    async def post_event(self, *args: Any, **kwargs: Any) -> None:
        return None


def _job(generation: int, *, suspend: bool) -> dict[str, Any]:
    job = minimal_job()
    job["metadata"].update(namespace="ml", uid="job-uid", generation=generation)
    job["spec"].update(suspend=suspend, resources={"gpusPerWorker": 0})  # on CPUs: no node to fit
    job["status"] = {}
    return job


def _reconciler(kube: _OneRayJob, *, watched: bool = False, hold: Hold | None = None) -> Reconciler:
    """`watched`: the RayJob watch has seen the RayJob as it is; `hold`: what holds every job back."""

    async def before_render(namespace: str) -> Hold | None:
        return hold

    config = OperatorConfig.from_env({"ROCMTRAIN_JOB_NETWORK_POLICIES": "false"})
    known = kube.watched if watched else lambda namespace, name: None
    return Reconciler(kube, config, known=known, before_render=before_render)  # type: ignore[arg-type]


def test_an_older_view_of_a_job_never_brings_its_spec_back() -> None:
    async def scenario() -> _OneRayJob:
        kube = _OneRayJob()
        reconciler = _reconciler(kube)
        await reconciler.sync(_job(1, suspend=True), [])
        await reconciler.sync(_job(2, suspend=False), [])  # the user resumes it
        reconciler.invalidate("job-uid")  # as the RayJob handler does before it makes a deleted RayJob again
        await reconciler.sync(_job(1, suspend=True), [])  # the index's view, one generation behind
        return kube

    kube = asyncio.run(scenario())
    assert kube.rayjob is not None and kube.rayjob["spec"]["suspend"] is False
    assert kube.spec_patches == [{"suspend": False}]


def test_a_suspended_rayjob_takes_the_current_render_from_its_jobs_synced_generation_only() -> None:
    async def scenario() -> _OneRayJob:
        kube = _OneRayJob()
        reconciler = _reconciler(kube)
        await reconciler.sync(_job(1, suspend=False), [])
        await reconciler.sync(_job(2, suspend=True), [])
        assert kube.rayjob is not None
        kube.rayjob["spec"]["entrypoint"] = "python -m an_older_driver"  # as an older operator version wrote it
        kube.rayjob["status"] = {"jobDeploymentStatus": "Suspended"}
        await reconciler.next_run(_job(1, suspend=False))  # an older view: nothing
        assert len(kube.spec_patches) == 1
        await reconciler.next_run(_job(2, suspend=True))
        return kube

    kube = asyncio.run(scenario())
    assert kube.spec_patches[0] == {"suspend": True}
    assert set(kube.spec_patches[1]) == {"entrypoint"}  # the suspended RayJob's cluster and command only
    assert kube.rayjob is not None and kube.rayjob["spec"]["entrypoint"] != "python -m an_older_driver"


def test_a_status_is_never_computed_from_an_older_spec_of_the_rayjob() -> None:
    """The RayJob watch hands its events in order, but the job's own sync reads the RayJob afresh: a suspended
    RayJob's event handled after the resume was written must not make the job Suspended again."""

    async def scenario() -> _OneRayJob:
        kube = _OneRayJob()
        reconciler = _reconciler(kube)
        await reconciler.sync(_job(1, suspend=True), [])
        assert kube.rayjob is not None
        kube.rayjob["status"] = {"jobDeploymentStatus": "Suspended"}
        suspended = rayjob_view(kube.rayjob)  # the watch's event, not handled yet
        await reconciler.sync(_job(2, suspend=False), [])  # the resume: the RayJob's spec changes
        kube.statuses.clear()
        await reconciler.refresh(_job(2, suspend=False), suspended)
        assert kube.statuses == []
        await reconciler.refresh(_job(2, suspend=False), rayjob_view(kube.rayjob))  # its next event: in step
        return kube

    kube = asyncio.run(scenario())
    assert all(status.get("phase") != "Suspended" for status in kube.statuses)


def test_a_generation_is_validated_once_however_often_its_status_is_refreshed(monkeypatch: pytest.MonkeyPatch) -> None:
    validated: list[int] = []

    def counted(obj: dict[str, Any], **kwargs: Any) -> Any:
        validated.append(obj["metadata"]["generation"])
        return real(obj, **kwargs)

    real = reconciler_module.validate_job
    monkeypatch.setattr(reconciler_module, "validate_job", counted)

    async def scenario() -> None:
        kube = _OneRayJob()
        reconciler = _reconciler(kube)
        await reconciler.sync(_job(1, suspend=False), [])
        assert kube.rayjob is not None
        for deployment in ("Initializing", "Running", "Running"):  # the RayJob's events, the stall loop
            kube.rayjob["status"] = {"jobDeploymentStatus": deployment}
            await reconciler.refresh(_job(1, suspend=False), rayjob_view(kube.rayjob))
        assert validated == [1]
        await reconciler.sync(_job(2, suspend=True), [])  # the user suspends it
        await reconciler.refresh(_job(2, suspend=True), rayjob_view(kube.rayjob))
        assert validated == [1, 2]
        kube.rayjob["status"] = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
        await reconciler.refresh(_job(2, suspend=True), rayjob_view(kube.rayjob))
        assert kube.statuses[-1]["phase"] == "Succeeded"
        assert reconciler._states["job-uid"].checked is None  # an ended job's reading is not kept

    asyncio.run(scenario())


@pytest.mark.parametrize("held", [False, True], ids=["updated", "held"])
def test_a_sync_reads_the_jobs_rayjob_once(held: bool) -> None:
    """The watch's view leaves the RayJob's fixed fields out: a sync that updates the RayJob reads the API server's
    RayJob alone, and decides everything on it."""

    def written(job: dict[str, Any], kube: _OneRayJob) -> dict[str, Any]:
        """`job` with the status the operator wrote."""
        job["status"] = {key: value for status in kube.statuses for key, value in status.items()}
        return job

    async def scenario() -> None:
        kube = _OneRayJob()
        await _reconciler(kube).sync(_job(1, suspend=False), [])
        assert kube.rayjob is not None and kube.reads == 0  # made without a read
        kube.rayjob["status"] = {"jobDeploymentStatus": "Running"}
        reconciler = _reconciler(kube, watched=True, hold=Hold(HoldKind.BLOCKED, "Held", "held") if held else None)
        await reconciler.sync(written(_job(1, suspend=False), kube), [])  # after a restart: checked once more
        assert kube.reads == 1
        await reconciler.sync(written(_job(2, suspend=True), kube), [])  # the user suspends it
        assert kube.reads == 2
        assert kube.spec_patches == [{"suspend": True}]  # a held job's RayJob takes its mutable fields too

    asyncio.run(scenario())


class _WithJob(_OneRayJob):
    """`_OneRayJob` that also holds the job itself, as the API server stores it."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__()
        self.job = job
        self.job_reads = 0

    async def get(self, ref: Any, namespace: str, name: str) -> dict[str, Any] | None:
        if ref is JOBS:
            self.job_reads += 1
            return copy.deepcopy(self.job)
        return await super().get(ref, namespace, name)


def test_a_job_the_index_keeps_without_its_spec_is_read_from_the_api_server_when_validated() -> None:
    """An oversized job's index view (`index_view`) holds none of its spec: a sync from it (a retry) reads the
    whole job, of the same generation, and refuses it for its size; a newer generation is left to its own event."""
    job = _job(3, suspend=False)
    job["spec"]["env"] = [{"name": f"V{i}", "value": "x" * 4096} for i in range(30)]
    view = index_view(job)
    assert view[PARTIAL_SPEC] is True and "env" not in view["spec"]

    async def scenario() -> _WithJob:
        kube = _WithJob(job)
        await _reconciler(kube).sync(view, [])
        kube.job = {**job, "metadata": {**job["metadata"], "generation": 4}}
        with pytest.raises(LookupError, match="changed while its spec was read"):
            await _reconciler(kube).sync(view, [])
        return kube

    kube = asyncio.run(scenario())
    assert kube.job_reads == 2 and kube.rayjob is None
    assert kube.statuses[0]["phase"] == "Failed" and "ROCMTRAIN_JOB" in kube.statuses[0]["conditions"][0]["message"]


class _WithClaim(_OneRayJob):
    """`_OneRayJob` with one ReadWriteOnce PersistentVolumeClaim, `runs`; its reads and the events are kept."""

    def __init__(self) -> None:
        super().__init__()
        self.claim_reads: list[str] = []
        self.events: list[tuple[str, str]] = []

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.claim_reads.append(name)
        return {"metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteOnce"]}} if name == "runs" else None

    async def post_event(self, job: Any, *, type: str, reason: str, message: str) -> None:
        self.events.append((type, reason))


def test_a_checkpoint_claim_is_read_and_warned_about_once_per_generation() -> None:
    """A held job is synced again and again: its claim is read once per generation, and a claim that does not
    exist (or that the operator may not read) gives no warning."""

    def on_claim(generation: int, claim: str) -> dict[str, Any]:
        job = _job(generation, suspend=False)
        job["spec"].update(
            volumes=[{"name": "runs", "persistentVolumeClaim": {"claimName": claim}}],
            volumeMounts=[{"name": "runs", "mountPath": "/runs"}],
            checkpoint={"storagePath": "/runs/minimal"},
        )
        return job

    async def scenario() -> _WithClaim:
        kube = _WithClaim()
        reconciler = _reconciler(kube, hold=Hold(HoldKind.BLOCKED, "Held", "held"))
        for generation, claim in ((1, "runs"), (1, "runs"), (2, "runs"), (3, "missing"), (3, "missing")):
            await reconciler.sync(on_claim(generation, claim), [])
        return kube

    kube = asyncio.run(scenario())
    assert kube.claim_reads == ["runs", "runs", "missing"]
    warned = [event for event in kube.events if event[1] == Reason.CHECKPOINT_CLAIM_NOT_SHARED]
    assert warned == [("Warning", Reason.CHECKPOINT_CLAIM_NOT_SHARED)] * 2
