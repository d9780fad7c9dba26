"""kopf handlers: each one wires an event to the reconciler, nothing more.

- jobs (every event; level-triggered, so kopf keeps no state in them): validate,
  pre-flight, create or update the RayJob, with retries while it is held;
- RayJobs we made (any change, from `RayJobWatch` rather than kopf, which stops on a
  404 when KubeRay's CRD is removed): map their state into the owning job's status,
  and recreate a RayJob deleted behind our back while its job has not finished;
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
from rocmtrain.api.contract import GROUP, MANAGED_SELECTOR, PLURAL, VERSION
from rocmtrain.controller.rayjob_watch import RayJobWatch
from rocmtrain.controller.reconciler import Reconciler
from rocmtrain.controller.settings import OperatorConfig, configure_kopf
from rocmtrain.kube import Kube
from rocmtrain.objects import controller_ref, job_view, requested_gpus
from rocmtrain.progress.server import start_progress_server
from rocmtrain.status import TERMINAL_PHASES

JOB = (GROUP, VERSION, PLURAL)

logger = logging.getLogger(__name__)


@kopf.on.startup()  # type: ignore[arg-type]  # kopf also passes its indexes, which its protocols do not name
async def startup(
    settings: kopf.OperatorSettings, memo: kopf.Memo, jobs: kopf.Index, nodes: kopf.Index, **_: Any
) -> None:
    """Read the configuration, configure kopf, connect, serve metrics, watch RayJobs and stalls."""
    memo.config = config = OperatorConfig.from_env()
    configure_kopf(settings)
    memo.kube = await Kube.connect()
    memo.metrics = await metrics.serve(config.metrics_port, config.bind_address) if config.metrics_port else None
    metrics.JOBS.source = lambda: (
        (job["status"].get("phase"), job["gpus"]) for store in list(jobs.values()) for job in store
    )

    async def handle(kind: str, rayjob: dict[str, Any]) -> None:
        await rayjob_changed(kind, rayjob, memo, jobs, nodes)

    memo.rayjobs = RayJobWatch(
        memo.kube.api,
        handle,
        label_selector=MANAGED_SELECTOR,
        namespaces=config.namespaces,
        missing_retry_seconds=config.retry_seconds,
    )
    memo.reconciler = Reconciler(
        memo.kube, config, known=memo.rayjobs.get, before_render=lambda namespace: publish_progress_ca(memo, namespace)
    )
    memo.rayjobs.start()
    memo.stall_watch = asyncio.create_task(watch_stalls(memo, jobs), name="stall watch")


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The in-cluster service account, else $KUBECONFIG (read now, whatever client libraries are installed)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the watches, the retries and the metrics, and close the API connection."""
    if memo.get("rayjobs") is not None:
        await memo.rayjobs.stop()
    if memo.get("reconciler") is not None:
        await memo.reconciler.stop()
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


@kopf.index(*JOB)  # type: ignore[arg-type]  # a namespaced resource: kopf passes `namespace` as a str
def jobs(body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Jobs by (namespace, name), with their GPU request for the metrics."""
    view = job_view(body)
    view["gpus"] = requested_gpus(view)
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


@kopf.on.event(*JOB)  # type: ignore[arg-type]  # kopf also passes its indexes, which its protocols do not name
async def job_event(
    type: str, body: kopf.Body, uid: str, memo: kopf.Memo, jobs: kopf.Index, nodes: kopf.Index, **_: Any
) -> None:
    """Any job event: bring its RayJob in line (when it is not already); drop a deleted job's state."""
    if type == "DELETED":
        memo.reconciler.forget(uid)
    elif "deletionTimestamp" not in body["metadata"]:
        await sync(memo, job_view(body), jobs, nodes)


async def sync(memo: kopf.Memo, job: Mapping[str, Any], jobs: kopf.Index, nodes: kopf.Index) -> None:
    """Reconcile one job; schedule a retry (with the job as the index then holds it) when held or failed."""
    meta = job["metadata"]
    try:
        with metrics.observe("reconcile"):
            delay = await memo.reconciler.sync(job, _node_list(nodes))
    except Exception:
        logger.exception("reconciling %s/%s failed; retrying", meta["namespace"], meta["name"])
        delay = memo.config.retry_seconds
    if delay is None:
        return

    async def again() -> None:
        latest = _one(jobs, (meta["namespace"], meta["name"]), meta["uid"])
        if latest is not None and "deletionTimestamp" not in latest["metadata"]:
            await sync(memo, latest, jobs, nodes)

    memo.reconciler.retry_later(meta["uid"], delay, again)


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


async def rayjob_changed(
    kind: str, rayjob: dict[str, Any], memo: kopf.Memo, jobs: kopf.Index, nodes: kopf.Index
) -> None:
    """Mirror the RayJob's state into its job; recreate it if it was deleted before the job ended."""
    with metrics.observe("rayjob_event"):
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
            memo.reconciler.invalidate(job["metadata"]["uid"])
            await sync(memo, job, jobs, nodes)


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
