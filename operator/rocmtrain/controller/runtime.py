"""What the operator's handlers share: one typed object, built once at startup, closed on cleanup.

`open_runtime` builds it in order, with nothing running yet but the notifier's senders
(`rocmtrain.controller.notifier`): the API connection, the notifier, the progress endpoint,
the metrics server (which serves the endpoint's certificate), the watches' own API client,
the watches (RayJobs, Ray pods and the events on them about their volumes, Kueue Workloads) and the reconciler;
`OperatorRuntime.start` then starts the watches and the operator's loops;
`OperatorRuntime.close` stops and closes everything in the reverse order (as does a build
that fails half-way). kopf's memo holds it as its one attribute `runtime` (`runtime_of`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from rocmtrain.admission.node_fit import NodeInfo
from rocmtrain.api.condition_reasons import Reason
from rocmtrain.api.contract import MANAGED_SELECTOR
from rocmtrain.api.names import rayjob_name_of
from rocmtrain.controller.event_watch import PodEventWatch
from rocmtrain.controller.informer import Informer, Key, View
from rocmtrain.controller.notifier import Notifier, api_server_addresses
from rocmtrain.controller.pod_watch import PodWatch
from rocmtrain.controller.rayjob_watch import RayJobWatch
from rocmtrain.controller.reconciler import Reconciler
from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.controller.workload_watch import WorkloadWatch, rayjob_key
from rocmtrain.kube.client import JOBS, Kube, new_api_client
from rocmtrain.metrics import prometheus
from rocmtrain.metrics import server as metrics_server
from rocmtrain.metrics.access import MetricsAccess
from rocmtrain.progress.server import ProgressServer, start_progress_server
from rocmtrain.progress.tls import ConfigMapTaken
from rocmtrain.status.hold import Hold, HoldKind
from rocmtrain.status.pods import VOLUME_EVENT_REASONS, job_key

# The informers that share the watch client, and its connections beyond their long
# requests (a list or watch being replaced, say).
WATCHES = 3 + len(VOLUME_EVENT_REASONS)
WATCH_SPARE_CONNECTIONS = 4

JobIndex = kopf.Index[tuple[str, str], dict[str, Any]]  # kopf's live index of jobs (`handlers.jobs`)
NodeIndex = kopf.Index[str, NodeInfo]  # kopf's live index of schedulable nodes (`handlers.nodes`)
# rayjob_changed(runtime, kind, RayJob view): a RayJob changed.
RayJobHandler = Callable[["OperatorRuntime", str, View], Awaitable[None]]
# rayjob_touched(runtime, source, (namespace, RayJob name)): what a RayJob's status reads changed ("pod", "workload").
TouchHandler = Callable[["OperatorRuntime", str, Key], Awaitable[None]]
Loop = Callable[["OperatorRuntime"], Coroutine[Any, Any, None]]


@dataclass
class OperatorRuntime:
    """The operator's configuration, connections, indexes, watches and reconciler (see the module docstring)."""

    config: OperatorConfig
    kube: Kube
    jobs: JobIndex
    nodes: NodeIndex
    rayjobs: RayJobWatch
    pods: PodWatch
    workloads: WorkloadWatch
    volume_events: tuple[PodEventWatch, ...]
    reconciler: Reconciler
    notifier: Notifier
    progress: ProgressServer | None
    _resources: contextlib.AsyncExitStack = field(repr=False)

    @property
    def watches(self) -> tuple[Informer, ...]:
        return self.rayjobs, self.pods, self.workloads, *self.volume_events

    def start(self, *loops: Loop) -> None:
        """Start the watches, and each of `loops` as a task of its own (cancelled by `close`)."""
        for watch in self.watches:
            watch.start()
        for loop in loops:
            task = asyncio.create_task(loop(self), name=loop.__name__)
            self._resources.push_async_callback(_cancel, task)

    def failing_watches(self) -> list[str]:
        """The watches that keep failing unexpectedly (`supervision`): the operator is not healthy."""
        return [watch.what for watch in self.watches if not watch.healthy()]

    async def close(self) -> None:
        """Stop the loops, the watches and the reconciler's retries; stop serving; close the connections."""
        await self._resources.aclose()


async def open_runtime(
    config: OperatorConfig,
    jobs: JobIndex,
    nodes: NodeIndex,
    *,
    rayjob_changed: RayJobHandler,
    rayjob_touched: TouchHandler,
) -> OperatorRuntime:
    """Connect, serve metrics and progress, and build the watches and the reconciler; start nothing yet."""
    runtime: OperatorRuntime  # bound below, before `start` lets any watch call these

    async def on_rayjob(kind: str, rayjob: View) -> None:
        await rayjob_changed(runtime, kind, rayjob)

    async def on_pod(_: str, pod: View) -> None:
        if (job := job_key(pod)) is not None:
            await rayjob_touched(runtime, "pod", (job[0], rayjob_name_of(job[1])))

    async def on_volume_event(_: str, event: View) -> None:
        namespace, pod = event["metadata"]["namespace"], event["pod"]["name"]
        if (job := runtime.pods.job_of_pod(namespace, pod)) is not None:
            await rayjob_touched(runtime, "pod", (job[0], rayjob_name_of(job[1])))

    async def on_workload(_: str, workload: View) -> None:
        await rayjob_touched(runtime, "workload", rayjob_key(workload))

    resources = contextlib.AsyncExitStack()
    try:
        kube = await Kube.connect(timeout=config.api_timeout_seconds)
        resources.push_async_callback(kube.close)
        notifier = Notifier(
            kube.read_secret,
            config.notification,
            warn=functools.partial(notice_failed, kube),
            record=functools.partial(record_notifications, kube),
            rules=config.receivers.with_api_server(await api_server_addresses()),
        )
        notifier.start()
        resources.push_async_callback(notifier.stop)
        # The endpoint talks to the API server through a small client of its own, so a flood
        # of reports never takes the connections that reconciles and the watches use.
        progress = None
        if config.progress is not None:
            progress = await start_progress_server(config.progress, notify=notifier.notify)
        if progress is not None:
            resources.push_async_callback(progress.stop)
        if config.metrics_port:
            resources.push_async_callback(await serve_metrics(config, progress))
        prometheus.JOBS.source = lambda: (job for store in list(jobs.values()) for job in store)
        prometheus.JOBS.max_jobs = config.metrics_max_jobs
        resources.callback(_stop_job_metrics)
        # The watches' own connections (one long request per watch and namespace), so that
        # they never take the reconciler's.
        watch_api = await new_api_client(
            WATCHES * (len(config.namespaces) or 1) + WATCH_SPARE_CONNECTIONS, config.api_timeout_seconds
        )
        resources.push_async_callback(watch_api.close)
        namespaces, retry, restart = config.namespaces, config.retry_seconds, config.watch_restart
        rayjobs = RayJobWatch(
            watch_api,
            on_rayjob,
            label_selector=MANAGED_SELECTOR,
            namespaces=namespaces,
            missing_retry_seconds=retry,
            restart=restart,
        )
        volume_events = tuple(
            PodEventWatch(
                watch_api, on_volume_event, reason, namespaces=namespaces, retry_seconds=retry, restart=restart
            )
            for reason in VOLUME_EVENT_REASONS
        )
        pods = PodWatch(
            watch_api, on_pod, namespaces=namespaces, retry_seconds=retry, restart=restart, volume_events=volume_events
        )
        workloads = WorkloadWatch(watch_api, on_workload, namespaces=namespaces, retry_seconds=retry, restart=restart)
        reconciler = Reconciler(
            kube,
            config,
            known=rayjobs.get,
            before_render=functools.partial(publish_progress_ca, progress, kube) if progress is not None else None,
            pods=pods.of_job,
            workload=workloads.of_rayjob,
            notify=notifier.notify,
        )
        resources.push_async_callback(reconciler.stop)
        for watch in (rayjobs, pods, workloads, *volume_events):  # stopped before the reconciler: no retry after
            resources.push_async_callback(watch.stop)
    except BaseException:
        await resources.aclose()
        raise
    runtime = OperatorRuntime(
        config, kube, jobs, nodes, rayjobs, pods, workloads, volume_events, reconciler, notifier, progress, resources
    )
    return runtime


async def serve_metrics(config: OperatorConfig, progress: ProgressServer | None) -> metrics_server.Stop:
    """Serve `/metrics`: over HTTPS with the progress endpoint's certificate, each scrape reviewed on its
    API client (`config.metrics_secure`), else plain HTTP (on loopback); what stops it."""
    secure = None
    if config.metrics_secure:
        assert progress is not None, "the configuration asks for the progress endpoint with secure metrics"
        secure = metrics_server.Secure(progress.ssl_context, MetricsAccess(progress.api))
    return await metrics_server.serve(config.metrics_host, config.metrics_port, secure)


async def probe_loop_lag(runtime: OperatorRuntime) -> None:
    """Observe how late the event loop wakes this coroutine, every `loop_lag_probe_ms`: how long what ran
    on the loop meanwhile (reconciles, watch events, scrapes, progress reports) held it. A stall longer
    than the interval is always seen, a shorter one as often as it holds the loop; every 100 ms (the
    default) costs about 0.2% of a core, every 10 ms about 1%."""
    loop, interval = asyncio.get_running_loop(), runtime.config.loop_lag_probe_ms / 1000
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        prometheus.LOOP_LAG_SECONDS.observe(max(0.0, loop.time() - due))


def runtime_of(memo: kopf.Memo) -> OperatorRuntime:
    """The runtime the startup handler keeps in kopf's memo."""
    runtime: OperatorRuntime = memo["runtime"]
    return runtime


async def publish_progress_ca(progress: ProgressServer, kube: Kube, namespace: str) -> Hold | None:
    """Put the endpoint's CA into a job's namespace before its RayJob is rendered (the head pod mounts it).

    A ConfigMap of that name that is not the operator's is left alone, and holds the job.
    """
    try:
        await progress.publish_ca(namespace, kube.api)
    except ConfigMapTaken as exc:
        return Hold(HoldKind.BLOCKED, Reason.PROGRESS_CA_CONFLICT, str(exc))
    return None


async def notice_failed(kube: Kube, job: Mapping[str, Any], message: str) -> None:
    """Tell a job's owner that a notification of it was given up or dropped (a Warning event on the job)."""
    await kube.post_event(job, type="Warning", reason=Reason.NOTIFICATION_FAILED, message=message)


async def record_notifications(kube: Kube, job: Mapping[str, Any], entries: list[dict[str, Any]]) -> None:
    """Write a job's `status.notifications` (the notifier's record of each receiver's last notice)."""
    meta = job["metadata"]
    await kube.patch_status(JOBS, meta["namespace"], meta["name"], {"notifications": entries}, uid=meta["uid"])


def _stop_job_metrics() -> None:
    prometheus.JOBS.source = tuple


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
