"""kopf handlers: each one wires an event to the reconciler, nothing more.

- jobs (every event; level-triggered, so kopf keeps no state in them): validate,
  pre-flight, create or update the RayJob, with retries while it is held;
- RayJobs we made (any change, from `RayJobWatch` rather than kopf, which stops on a
  404 when KubeRay's CRD is removed): map their state into the owning job's status
  (only the job's own RayJob: the job controls it and it has the job's RayJob name),
  and recreate a RayJob deleted behind our back while its job has not finished;
- the Ray pods of our jobs (`PodWatch`) and Kueue's Workloads of our RayJobs
  (`WorkloadWatch`): recompute the job's status (pods that cannot run, Kueue's verdict);
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

from rocmtrain import node_fit, prometheus
from rocmtrain.api.conditions import Reason
from rocmtrain.api.contract import GROUP, MANAGED_SELECTOR, PLURAL, VERSION
from rocmtrain.api.names import rayjob_name_of
from rocmtrain.controller.pod_watch import PodWatch
from rocmtrain.controller.rayjob_watch import RayJobWatch
from rocmtrain.controller.reconciler import Reconciler
from rocmtrain.controller.settings import OperatorConfig, configure_kopf
from rocmtrain.controller.workload_watch import WorkloadWatch, rayjob_key
from rocmtrain.kube import Kube, new_api_client
from rocmtrain.progress.server import start_progress_server
from rocmtrain.progress.tls import ConfigMapTaken
from rocmtrain.status.objects import controller_ref, is_jobs_rayjob, job_view, requested_gpus
from rocmtrain.status.phase import TERMINAL_PHASES, Hold, HoldKind
from rocmtrain.status.pods import job_key

JOB = (GROUP, VERSION, PLURAL)
# The informers (RayJobs, Ray pods, Kueue Workloads) that share the watch client, and its
# connections beyond their long requests (a list or watch being replaced, say).
WATCHES = 3
WATCH_SPARE_CONNECTIONS = 4

logger = logging.getLogger(__name__)


@kopf.on.startup()  # type: ignore[arg-type]  # kopf also passes its indexes, which its protocols do not name
async def startup(
    settings: kopf.OperatorSettings, memo: kopf.Memo, jobs: kopf.Index, nodes: kopf.Index, **_: Any
) -> None:
    """Read the configuration, configure kopf, connect, serve metrics, watch RayJobs, pods, Workloads and stalls."""
    memo.config = config = OperatorConfig.from_env()
    configure_kopf(settings, namespaced=bool(config.namespaces))
    memo.kube = await Kube.connect(timeout=config.api_timeout_seconds)
    memo.metrics = await prometheus.serve(config.metrics_port, config.metrics_host) if config.metrics_port else None
    prometheus.JOBS.source = lambda: (job for store in list(jobs.values()) for job in store)
    prometheus.JOBS.max_jobs = config.metrics_max_jobs

    async def handle(kind: str, rayjob: dict[str, Any]) -> None:
        await rayjob_changed(kind, rayjob, memo, jobs, nodes)

    async def refresh(source: str, key: tuple[str, str] | None) -> None:
        if key is not None:
            with prometheus.observe(f"{source}_event"):
                await refresh_rayjob(*key, memo, jobs)

    # The watches' own connections (one long request per watch and namespace), so that
    # they never take the reconciler's.
    memo.watch_api = await new_api_client(
        WATCHES * (len(config.namespaces) or 1) + WATCH_SPARE_CONNECTIONS, config.api_timeout_seconds
    )
    memo.rayjobs = RayJobWatch(
        memo.watch_api,
        handle,
        label_selector=MANAGED_SELECTOR,
        namespaces=config.namespaces,
        missing_retry_seconds=config.retry_seconds,
    )
    memo.pods = PodWatch(
        memo.watch_api,
        lambda _, pod: refresh("pod", rayjob_of(job_key(pod))),
        namespaces=config.namespaces,
        retry_seconds=config.retry_seconds,
    )
    memo.workloads = WorkloadWatch(
        memo.watch_api,
        lambda _, workload: refresh("workload", rayjob_key(workload)),
        namespaces=config.namespaces,
        retry_seconds=config.retry_seconds,
    )
    memo.reconciler = Reconciler(
        memo.kube,
        config,
        known=memo.rayjobs.get,
        before_render=lambda namespace: publish_progress_ca(memo, namespace),
        pods=memo.pods.of_job,
        workload=memo.workloads.of_rayjob,
    )
    for watch in (memo.rayjobs, memo.pods, memo.workloads):
        watch.start()
    memo.stall_watch = asyncio.create_task(watch_stalls(memo, jobs), name="stall watch")


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The in-cluster service account, else $KUBECONFIG (read now, whatever client libraries are installed)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the watches, the retries and the metrics, and close the API connection."""
    for watch in ("rayjobs", "pods", "workloads"):
        if memo.get(watch) is not None:
            await memo[watch].stop()
    if memo.get("reconciler") is not None:
        await memo.reconciler.stop()
    if memo.get("stall_watch") is not None:
        memo.stall_watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await memo.stall_watch
    prometheus.JOBS.source = tuple
    if memo.get("metrics") is not None:
        await memo.metrics.cleanup()
    if memo.get("watch_api") is not None:
        await memo.watch_api.close()
    if memo.get("kube") is not None:
        await memo.kube.close()


# ---- indexes ------------------------------------------------------------------------


@kopf.index("", "v1", "nodes")
def nodes(body: kopf.Body, **_: Any) -> dict[str, node_fit.NodeInfo] | None:
    """Schedulable nodes with their allocatable GPUs and labels, by name."""
    info = node_fit.node_info(body)
    return {info.name: info} if info is not None else None


@kopf.index(*JOB)  # type: ignore[arg-type]  # a namespaced resource: kopf passes `namespace` as a str
def jobs(body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Jobs by (namespace, name), with their GPU request for the metrics (which read this index)."""
    view = job_view(body)
    view["gpus"] = requested_gpus(view)
    return {(namespace, name): view}


def _node_list(index: kopf.Index) -> list[node_fit.NodeInfo]:
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
        with prometheus.observe("reconcile"):
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
                with prometheus.observe("stall_check"):
                    await memo.reconciler.refresh(job, rayjob)
            except Exception:
                logger.exception("stall check of %s/%s failed", meta["namespace"], meta["name"])


# ---- RayJobs ------------------------------------------------------------------------


async def rayjob_changed(
    kind: str, rayjob: dict[str, Any], memo: kopf.Memo, jobs: kopf.Index, nodes: kopf.Index
) -> None:
    """Mirror the RayJob's state into its job; recreate it if it was deleted before the job ended."""
    with prometheus.observe("rayjob_event"):
        owner = controller_ref(rayjob)
        job = _one(jobs, (rayjob["metadata"]["namespace"], owner.get("name", "")), owner.get("uid"))
        if job is None or "deletionTimestamp" in job["metadata"] or not is_jobs_rayjob(job, rayjob):
            return
        if kind != "DELETED":
            await memo.reconciler.refresh(job, rayjob)
        elif job["status"].get("phase") not in TERMINAL_PHASES:
            await memo.kube.post_event(
                job, type="Warning", reason="RayJobDeleted", message="the RayJob was deleted; recreating it"
            )
            memo.reconciler.invalidate(job["metadata"]["uid"])
            await sync(memo, job, jobs, nodes)


def rayjob_of(job: tuple[str, str] | None) -> tuple[str, str] | None:
    """(namespace, RayJob name) of the job `(namespace, name)`."""
    return (job[0], rayjob_name_of(job[1])) if job is not None else None


async def refresh_rayjob(namespace: str, name: str, memo: kopf.Memo, jobs: kopf.Index) -> None:
    """Recompute the status of the job owning RayJob `namespace/name` (its pods or its Workload changed)."""
    rayjob = memo.rayjobs.get(namespace, name)
    if rayjob is None:  # not seen yet: its own event recomputes the status
        return
    owner = controller_ref(rayjob)
    job = _one(jobs, (namespace, owner.get("name", "")), owner.get("uid"))
    if job is not None and "deletionTimestamp" not in job["metadata"] and is_jobs_rayjob(job, rayjob):
        await memo.reconciler.refresh(job, rayjob)


# ---- progress endpoint: training drivers push ProgressReports (rocmtrain.progress) ------------


@kopf.on.startup()
async def progress_endpoint(memo: kopf.Memo, **_: Any) -> None:
    """Serve the progress endpoint, when configured (after `startup`: it reads its config).

    The endpoint talks to the API server through a small client of its own, so a flood
    of reports never takes the connections that reconciles and the watches use.
    """
    cfg = memo.config.progress
    memo.progress = await start_progress_server(cfg) if cfg is not None else None


@kopf.on.cleanup()
async def stop_progress_endpoint(memo: kopf.Memo, **_: Any) -> None:
    """Stop serving progress."""
    if memo.get("progress") is not None:
        await memo.progress.stop()


async def publish_progress_ca(memo: kopf.Memo, namespace: str) -> Hold | None:
    """Put the endpoint's CA into a job's namespace before its RayJob is rendered (the head pod mounts it).

    A ConfigMap of that name that is not the operator's is left alone, and holds the job.
    """
    if memo.get("progress") is None:
        return None
    try:
        await memo.progress.publish_ca(namespace, memo.kube.api)
    except ConfigMapTaken as exc:
        return Hold(HoldKind.BLOCKED, Reason.PROGRESS_CA_CONFLICT, str(exc))
    return None
