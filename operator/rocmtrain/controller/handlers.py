"""kopf handlers: each one wires an event to the reconciler, nothing more.

- jobs (every event; level-triggered, so kopf keeps no state in them): validate,
  pre-flight, create or update the RayJob, with retries while it is held;
- RayJobs we made (any change, from `RayJobWatch` rather than kopf, which stops on a
  404 when KubeRay's CRD is removed): map their state into the owning job's status
  (only the job's own RayJob: the job controls it and it has the job's RayJob name),
  bring a suspended RayJob (between two runs) in line with the current render before KubeRay makes its
  next Ray cluster (`rocmtrain.render.rayjob_update`), and recreate a RayJob
  deleted behind our back while its job has not finished (nor been refused by its driver's pre-flight,
  whose RayJob the reconciler deletes: `Reconciler.sync`);
- the Ray pods of our jobs (`PodWatch`), the events on them about their volumes (`PodEventWatch`) and
  Kueue's Workloads of our RayJobs (`WorkloadWatch`): recompute the job's status (pods that cannot run,
  Kueue's verdict);
- running jobs: stall detection, by one periodic loop over the job index;
- queued jobs: when each is expected to start (`status.queue`), by another, on the same
  cadence: from the Workloads watched, the jobs' ETAs in the index, and each cycle one read
  of every LocalQueue with waiting Workloads and of their ClusterQueues (none while no job
  is Queued);
- indexes of jobs and Nodes keep lookups off the API server; the job index keeps a bounded view of
  each job (`rocmtrain.status.objects.index_view`), so that a tenant's oversized or refused jobs cost
  little memory (docs/operations/install.md#memory);
- `/healthz` (kopf's liveness endpoint, probe `watches`) fails while a watch keeps
  failing unexpectedly (`supervision`), so that the kubelet restarts the operator.

What the handlers share (configuration, connections, indexes, watches, reconciler,
progress endpoint) is one `runtime.OperatorRuntime`, which the one startup handler
builds and keeps in kopf's memo.

No deletion handler: the RayJob goes with its job through its owner reference and
Kubernetes' garbage collector, so jobs carry no finalizer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from rocmtrain.admission import node_fit
from rocmtrain.api.contract import GROUP, PLURAL, VERSION
from rocmtrain.api.models import Phase
from rocmtrain.api.names import rayjob_name_of
from rocmtrain.controller.informer import Key, View
from rocmtrain.controller.runtime import JobIndex, OperatorRuntime, open_runtime, probe_loop_lag, runtime_of
from rocmtrain.controller.settings import OperatorConfig, configure_kopf
from rocmtrain.kube.client import CLUSTER_QUEUES, LOCAL_QUEUES
from rocmtrain.metrics import prometheus
from rocmtrain.render.rayjob_update import between_runs
from rocmtrain.status import queue_estimate
from rocmtrain.status.objects import controller_ref, index_view, is_jobs_rayjob, job_view, queued
from rocmtrain.status.phase import has_ended, phase_of

JOB = (GROUP, VERSION, PLURAL)

logger = logging.getLogger(__name__)


@kopf.on.startup()  # type: ignore[arg-type]  # kopf also passes its indexes, which its protocols do not name
async def startup(
    settings: kopf.OperatorSettings, memo: kopf.Memo, jobs: kopf.Index, nodes: kopf.Index, **_: Any
) -> None:
    """Read the configuration, configure kopf, build the runtime; start the watches, the stall and queue loops
    and the loop-lag probe."""
    config = OperatorConfig.from_env()
    configure_kopf(settings, namespaced=bool(config.namespaces))
    runtime = await open_runtime(config, jobs, nodes, rayjob_changed=rayjob_changed, rayjob_touched=rayjob_touched)
    memo.runtime = runtime
    runtime.start(watch_stalls, watch_queues, probe_loop_lag)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The in-cluster service account, else $KUBECONFIG (read now, whatever client libraries are installed)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.probe(id="watches")
def watches(memo: kopf.Memo, **_: Any) -> str:
    """`/healthz` fails while a watch keeps failing unexpectedly, so that the kubelet restarts the operator."""
    failing = runtime_of(memo).failing_watches()
    if failing:
        raise kopf.PermanentError(f"watches failing: {', '.join(failing)}")
    return "ok"


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the loops, watches, retries, metrics and progress endpoint, and close the API connections."""
    if memo.get("runtime") is not None:
        await runtime_of(memo).close()


# ---- indexes ------------------------------------------------------------------------


@kopf.index("", "v1", "nodes")
def nodes(body: kopf.Body, **_: Any) -> dict[str, node_fit.NodeInfo] | None:
    """Schedulable nodes with their allocatable GPUs and labels, by name."""
    info = node_fit.node_info(body)
    return {info.name: info} if info is not None else None


@kopf.index(*JOB)  # type: ignore[arg-type]  # a namespaced resource: kopf passes `namespace` as a str
def jobs(body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Jobs by (namespace, name), each a bounded view (`index_view`: no refused or oversized spec), with its GPU
    request for the metrics (which read this index)."""
    return {(namespace, name): index_view(body)}


def _one(index: JobIndex, key: tuple[str, str], uid: str | None = None) -> Mapping[str, Any] | None:
    """The indexed job under `key` (with `uid`, when given)."""
    for value in index.get(key, ()):
        if uid is None or value["metadata"].get("uid") == uid:
            return value
    return None


# ---- jobs ---------------------------------------------------------------------------


@kopf.on.event(*JOB)
async def job_event(type: str, body: kopf.Body, uid: str, memo: kopf.Memo, **_: Any) -> None:
    """Any job event: bring its RayJob in line (when it is not already); drop a deleted job's state."""
    runtime = runtime_of(memo)
    if type == "DELETED":
        runtime.reconciler.forget(uid)
    elif "deletionTimestamp" not in body["metadata"]:
        job = job_view(body)
        runtime.notifier.resume(job)  # notices an earlier operator left Pending (once per job)
        await sync(runtime, job)


async def sync(runtime: OperatorRuntime, job: Mapping[str, Any]) -> None:
    """Reconcile one job; schedule a retry (with the job as the index then holds it) when held or failed."""
    meta = job["metadata"]
    nodes = [info for store in runtime.nodes.values() for info in store]
    try:
        with prometheus.observe("reconcile"):
            delay = await runtime.reconciler.sync(job, nodes)
    except Exception:
        logger.exception("reconciling %s/%s failed; retrying", meta["namespace"], meta["name"])
        delay = runtime.config.retry_seconds
    if delay is None:
        return

    async def again() -> None:
        latest = _one(runtime.jobs, (meta["namespace"], meta["name"]), meta["uid"])
        if latest is not None and "deletionTimestamp" not in latest["metadata"]:
            await sync(runtime, latest)

    runtime.reconciler.retry_later(meta["uid"], delay, again)


async def watch_stalls(runtime: OperatorRuntime) -> None:
    """Re-evaluate every running job periodically, so that `Stalled` turns True when nothing moves.

    One loop over the job index rather than a kopf timer per job: a timer is a task
    with its own state per object, which at a thousand running jobs costs tens of MiB.
    """
    while True:
        await asyncio.sleep(runtime.config.stall_check_seconds)
        running = [
            job for store in list(runtime.jobs.values()) for job in store if phase_of(job["status"]) is Phase.RUNNING
        ]
        for job in running:
            meta = job["metadata"]
            rayjob = runtime.rayjobs.get(meta["namespace"], meta["name"])
            if rayjob is None:  # not seen (yet), or deleted: the RayJob handler deals with that
                continue
            try:
                with prometheus.observe("stall_check"):
                    await runtime.reconciler.refresh(job, rayjob)
            except Exception:
                logger.exception("stall check of %s/%s failed", meta["namespace"], meta["name"])


async def watch_queues(runtime: OperatorRuntime) -> None:
    """Estimate periodically when each queued job will start, as the running jobs' ETAs change."""
    while True:
        await asyncio.sleep(runtime.config.queue_estimate_seconds)
        try:
            with prometheus.observe("queue_estimate"):
                await estimate_queues(runtime)
        except Exception:
            logger.exception("estimating when queued jobs start failed")


async def estimate_queues(runtime: OperatorRuntime) -> None:
    """Write `status.queue` of every Queued job (`rocmtrain.status.queue_estimate`); no read while none is Queued."""
    jobs = [job for store in list(runtime.jobs.values()) for job in store]
    waiting = [
        job for job in jobs if phase_of(job["status"]) is Phase.QUEUED and "deletionTimestamp" not in job["metadata"]
    ]
    if not waiting:
        return
    workloads = list(runtime.workloads.views.values())
    cluster_queue_of = {}
    for namespace, local_queue in sorted(queue_estimate.waiting_local_queues(workloads)):
        local = await runtime.kube.get_readable(LOCAL_QUEUES, namespace, local_queue)
        if cluster_queue := ((local or {}).get("spec") or {}).get("clusterQueue"):
            cluster_queue_of[(namespace, local_queue)] = cluster_queue
    # Every ClusterQueue at once, for the cohorts; without `list` (an older ClusterRole), each one alone.
    listed = await runtime.kube.list_readable(CLUSTER_QUEUES) if cluster_queue_of else []
    found = listed or []
    if listed is None:
        for name in sorted(set(cluster_queue_of.values())):
            if (one := await runtime.kube.get_readable(CLUSTER_QUEUES, None, name)) is not None:
                found.append(one)
    quotas = {quota.cluster_queue: quota for quota in map(queue_estimate.cluster_queue_quota, found)}
    now = dt.datetime.now(dt.UTC)
    estimated = queue_estimate.estimates(
        workloads, cluster_queue_of, quotas, queue_estimate.known_jobs(jobs), now, listed=listed is not None
    )
    for job in waiting:
        meta = job["metadata"]
        await runtime.reconciler.set_queue(job, estimated.get((meta["namespace"], rayjob_name_of(meta["name"]))))


# ---- RayJobs ------------------------------------------------------------------------


async def rayjob_changed(runtime: OperatorRuntime, kind: str, rayjob: View) -> None:
    """Mirror the RayJob's state into its job; recreate it if it was deleted before the job ended."""
    with prometheus.observe("rayjob_event"):
        owner = controller_ref(rayjob)
        job = _one(runtime.jobs, (rayjob["metadata"]["namespace"], owner.get("name", "")), owner.get("uid"))
        if job is None or "deletionTimestamp" in job["metadata"] or not is_jobs_rayjob(job, rayjob):
            return
        if kind != "DELETED":
            await runtime.reconciler.refresh(job, rayjob)
            if between_runs(rayjob, queued=queued(rayjob)) and not has_ended(job["status"]):
                await runtime.reconciler.next_run(job)  # its next run takes the current render
        elif not has_ended(job["status"]):  # a refused job's RayJob goes too, before its status says Failed
            await runtime.kube.post_event(
                job, type="Warning", reason="RayJobDeleted", message="the RayJob was deleted; recreating it"
            )
            runtime.reconciler.invalidate(job["metadata"]["uid"])
            await sync(runtime, job)


async def rayjob_touched(runtime: OperatorRuntime, source: str, key: Key) -> None:
    """Recompute the status of the job owning RayJob `key` (its pods or its Workload, the `source`, changed)."""
    with prometheus.observe(f"{source}_event"):
        rayjob = runtime.rayjobs.get(*key)
        if rayjob is None:  # not seen yet: its own event recomputes the status
            return
        owner = controller_ref(rayjob)
        job = _one(runtime.jobs, (key[0], owner.get("name", "")), owner.get("uid"))
        if job is not None and "deletionTimestamp" not in job["metadata"] and is_jobs_rayjob(job, rayjob):
            await runtime.reconciler.refresh(job, rayjob)
