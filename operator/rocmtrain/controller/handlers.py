"""kopf handlers: each one wires an event to the reconciler, nothing more.

- jobs (create, resume, spec update): validate, pre-flight, create or update the RayJob;
- RayJobs we made (any change, from `RayJobWatch` rather than kopf, which stops on a
  404 when KubeRay's CRD is removed): map their state into the owning job's status,
  and have a RayJob deleted behind our back recreated while its job has not finished
  (a `operator.rocmtrain.dev/resync` annotation on the job re-runs the job handler);
- running jobs: stall detection, by one periodic loop over the job index;
- indexes of jobs and Nodes keep lookups off the API server.

No deletion handler: the RayJob goes with its job through its owner reference and
Kubernetes' garbage collector, so jobs carry no finalizer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from rocmtrain import metrics, preflight
from rocmtrain.api.models import GROUP, PLURAL, VERSION
from rocmtrain.controller.rayjob_watch import RayJobWatch
from rocmtrain.controller.reconciler import RESYNC_ANNOTATION, Reconciler, controller_ref, job_view
from rocmtrain.controller.settings import MANAGED_SELECTOR, OperatorConfig, configure_kopf
from rocmtrain.kube import Kube
from rocmtrain.progress.server import start_progress_server
from rocmtrain.status import TERMINAL_PHASES

JOB = (GROUP, VERSION, PLURAL)
# kopf's retry signals are the operator waiting on purpose, not reconcile errors.
EXPECTED = (kopf.TemporaryError, kopf.PermanentError)

logger = logging.getLogger(__name__)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, jobs: kopf.Index, **_: Any) -> None:
    """Read the configuration, configure kopf, connect, serve metrics, watch RayJobs and stalls."""
    memo.config = config = OperatorConfig.from_env()
    configure_kopf(settings)
    memo.kube = await Kube.connect()
    memo.reconciler = Reconciler(memo.kube, config)
    memo.metrics = await metrics.serve(config.metrics_port) if config.metrics_port else None
    metrics.JOBS.source = lambda: (
        (job["status"].get("phase"), job["gpus"]) for store in list(jobs.values()) for job in store
    )

    async def handle(kind: str, rayjob: dict[str, Any]) -> None:
        await rayjob_changed(kind, rayjob, memo, jobs)

    memo.rayjobs = RayJobWatch(
        memo.kube.api,
        handle,
        label_selector=MANAGED_SELECTOR,
        namespaces=config.namespaces,
        missing_retry_seconds=config.retry_seconds,
    )
    memo.rayjobs.start()
    memo.stall_watch = asyncio.create_task(watch_stalls(memo, jobs), name="stall watch")


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The in-cluster service account, else $KUBECONFIG (read now, whatever client libraries are installed)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the watches and the metrics, and close the API connection."""
    if memo.get("rayjobs") is not None:
        await memo.rayjobs.stop()
    if memo.get("stall_watch") is not None:
        memo.stall_watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await memo.stall_watch
    metrics.JOBS.source = tuple
    if memo.get("metrics") is not None:
        await memo.metrics.cleanup()
    if memo.get("kube") is not None:
        await memo.kube.close()


# ---- indexes ------------------------------------------------------------------------


@kopf.index("", "v1", "nodes")
def nodes(body: kopf.Body, **_: Any) -> dict[str, preflight.NodeInfo] | None:
    """Schedulable nodes with their allocatable GPUs and labels, by name."""
    info = preflight.node_info(body)
    return {info.name: info} if info is not None else None


@kopf.index(*JOB)
def jobs(body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Jobs by (namespace, name), with their GPU request for the metrics."""
    view = job_view(body)
    resources = view["spec"].get("resources") or {}
    view["gpus"] = int(resources.get("workers", 0)) * int(resources.get("gpusPerWorker", 0))
    return {(namespace, name): view}


def _node_list(index: kopf.Index) -> list[preflight.NodeInfo]:
    return [info for store in index.values() for info in store]


def _one(index: kopf.Index, key: tuple[str, str], uid: str | None = None) -> Mapping[str, Any] | None:
    """The indexed object under `key` (with `uid`, when given)."""
    for value in index.get(key, ()):
        if uid is None or value["metadata"].get("uid") == uid:
            return value
    return None


# ---- jobs ---------------------------------------------------------------------------


@kopf.on.resume(*JOB)
@kopf.on.create(*JOB)
@kopf.on.update(*JOB, field="spec")
@kopf.on.update(*JOB, field=("metadata", "annotations", RESYNC_ANNOTATION))
async def reconcile(body: kopf.Body, memo: kopf.Memo, nodes: kopf.Index, **_: Any) -> None:
    """Create the RayJob, or carry suspend/lifecycle changes over to it; then write the status."""
    with metrics.observe("reconcile", expected=EXPECTED):
        await publish_progress_ca(memo, body["metadata"]["namespace"])
        await memo.reconciler.ensure(body, _node_list(nodes))


def _deleted(type: str, **_: Any) -> bool:
    return type == "DELETED"


@kopf.on.event(*JOB, when=_deleted)
def forget(uid: str, memo: kopf.Memo, **_: Any) -> None:
    """Drop what is remembered about a deleted job."""
    memo.reconciler.forget(uid)


async def watch_stalls(memo: kopf.Memo, jobs: kopf.Index) -> None:
    """Re-evaluate every running job periodically, so that `Stalled` turns True when nothing moves.

    One loop over the job index rather than a kopf timer per job: a timer is a task
    with its own state per object, which at a thousand running jobs costs tens of MiB.
    """
    while True:
        await asyncio.sleep(memo.config.stall_check_seconds)
        running = [job for store in list(jobs.values()) for job in store if job["status"].get("phase") == "Running"]
        for job in running:
            meta = job["metadata"]
            rayjob = memo.rayjobs.get(meta["namespace"], meta["name"])
            if rayjob is None:  # not seen (yet), or deleted: the RayJob handler deals with that
                continue
            try:
                with metrics.observe("stall_check"):
                    await memo.reconciler.refresh(job, rayjob)
            except Exception:
                logger.exception("stall check of %s/%s failed", meta["namespace"], meta["name"])


# ---- RayJobs ------------------------------------------------------------------------


async def rayjob_changed(kind: str, rayjob: dict[str, Any], memo: kopf.Memo, jobs: kopf.Index) -> None:
    """Mirror the RayJob's state into its job; recreate it if it was deleted before the job ended."""
    with metrics.observe("rayjob_event", expected=EXPECTED):
        owner = controller_ref(rayjob)
        job = _one(jobs, (rayjob["metadata"]["namespace"], owner.get("name", "")), owner.get("uid"))
        if job is None or "deletionTimestamp" in job["metadata"]:
            return
        if kind != "DELETED":
            await memo.reconciler.refresh(job, rayjob)
        elif job["status"].get("phase") not in TERMINAL_PHASES:
            await memo.kube.post_event(
                job, type="Warning", reason="RayJobDeleted", message="the RayJob was deleted; recreating it"
            )
            await memo.reconciler.resync(job)  # `reconcile` runs again, with kopf's retries


# ---- progress endpoint: training drivers push ProgressReports (rocmtrain.progress) ------------


@kopf.on.startup()
async def progress_endpoint(memo: kopf.Memo, **_: Any) -> None:
    """Serve the progress endpoint, when configured (after `startup`: it shares its config and API client)."""
    cfg = memo.config.progress
    memo.progress = await start_progress_server(cfg, memo.kube.api) if cfg is not None else None


@kopf.on.cleanup()
async def stop_progress_endpoint(memo: kopf.Memo, **_: Any) -> None:
    """Stop serving progress."""
    if memo.get("progress") is not None:
        await memo.progress.stop()


async def publish_progress_ca(memo: kopf.Memo, namespace: str) -> None:
    """Put the endpoint's CA into a job's namespace before its RayJob is rendered (the head pod mounts it)."""
    if memo.get("progress") is not None:
        await memo.progress.publish_ca(namespace)
