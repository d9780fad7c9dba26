"""Operator benchmark on a real control plane: reconcile throughput, status latency, memory.

1. Throughput at N jobs (default 500), compared with the time the same client takes to
   create the same N rendered RayJobs directly (32 requests in flight). Target: at most 1.5x.
   - backlog: N jobs exist before the operator starts; the time from the operator being
     up until every job has its RayJob and a status: the operator's own throughput.
   - at once: N jobs are created at once while the operator runs; the same end point,
     timed from the first create, so it includes the client creating the N jobs.
   For scale, the "API floor": the same client making every write N reconciled jobs
   take (job, RayJob, status, event) itself, no operator.
2. Latency: a RayJob status change (written as KubeRay writes it) until the job's
   status shows it, seen through a watch, one change at a time. Target: p95 < 1 s.
3. Memory: the operator's RSS (a subprocess, `python -m rocmtrain.controller`) with
   M jobs (default 1,000, the N of each throughput run and more), all Running. Target: < 200 MiB.

4. `--load N`: the operator's RSS and the status latency of other jobs with N jobs of the
   largest size validation accepts (`largest_body`: every env value as long as the 96 KiB
   `ROCMTRAIN_JOB` limit lets it be), side by side with the same latency measured before
   they came ("idle"). Targets: RSS under the Deployment's 384 Mi limit, p95 within 2x of idle.
   Beside them, the operator's event-loop lag (`rocmtrain_event_loop_lag_seconds`, sampled
   every 10 ms in the operator here) in three spans: the idle latency run, the N largest jobs
   created, reconciled and set Running, and the loaded latency run (`lag_between`).

There is no KubeRay controller there: RayJob status is written by this script.

`--world` runs in the test world instead (rocmtrain_testworld/world.py: kube-scheduler, kwok
nodes, the real KubeRay with its defaults, Kueue idle), with eight more kwok nodes of
250 pods each for the bench: N small CPU-only jobs are created at once while the
operator runs, and each is timed, side by side, through
   - the operator: job created -> its RayJob (and its first status);
   - KubeRay (with the scheduler and kwok): RayJob -> RayCluster `ready` (head and
     worker pods scheduled and Ready), and KubeRay's own figure for the same span,
     `kuberay_cluster_provisioned_duration_seconds` (RayCluster created -> provisioned);
   - and until every job's status shows its worker ready (the operator follows the pods).

    python bench/operator_bench.py                       # starts a local control plane
    python bench/operator_bench.py --kubeconfig PATH     # or uses an existing cluster
    python bench/operator_bench.py --world --jobs 500    # the test world, with the real KubeRay
    python bench/operator_bench.py --load 40             # 40 largest jobs beside small ones
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from rocmtrain.api.job_config import job_config_size
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.kube.client import JOBS, RAYJOBS, Kube, Ref
from rocmtrain.render import render_rayjob
from rocmtrain_testworld import nodes, runtime, world
from rocmtrain_testworld.kubecluster import KubeCluster, free_port, running_cluster
from rocmtrain_testworld.large_jobs import job_body, largest_body
from rocmtrain_testworld.nodes import FakeNode

IN_FLIGHT = 32


async def bounded(calls: list[Callable[[], Any]], limit: int = IN_FLIGHT) -> None:
    """Run coroutine factories with at most `limit` in flight."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Any]) -> None:
        async with gate:
            await call()

    await asyncio.gather(*(one(call) for call in calls))


@contextlib.contextmanager
def operator_process(
    kubeconfig: Path, log: Path, settings: Mapping[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The operator as a subprocess (so its RSS is its own), with more `settings`; yields (process, metrics port)."""
    metrics_port, health_port = free_port(), free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "ROCMTRAIN_METRICS_PORT": str(metrics_port),
        "ROCMTRAIN_HEALTH_PORT": str(health_port),
        "ROCMTRAIN_RETRY_SECONDS": "5",
        "ROCMTRAIN_LOOP_LAG_PROBE_MS": "10",  # enough samples of the loop's lag in spans of seconds
        **(settings or {}),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rocmtrain.controller"], env=env, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 60
        while True:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz", timeout=1),
            ):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the operator did not come up; see {log}")
            time.sleep(0.1)
        yield proc, metrics_port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


LOOP_LAG = "rocmtrain_event_loop_lag_seconds"


def loop_lag(metrics_port: int) -> dict[float, float]:
    """The operator's loop-lag histogram as it is now: the count of samples at or below each bound."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == LOOP_LAG]
    return {float(s.labels["le"]): s.value for s in family.samples if s.name == f"{LOOP_LAG}_bucket"}


def lag_between(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """The lag samples taken between two readings: how many, their p50 and p99 (interpolated within a
    bucket, as Prometheus' histogram_quantile does), the share over 10 ms, and the bound all were within."""
    counts = sorted((bound, after[bound] - before.get(bound, 0.0)) for bound in after)
    total = counts[-1][1]

    def quantile(q: float) -> float:
        rank, low, below = q * total, 0.0, 0.0
        for bound, count in counts:
            if count >= rank:
                return low if bound == float("inf") else low + (bound - low) * (rank - below) / (count - below)
            low, below = bound, count
        return low

    within = next(bound for bound, count in counts if count == total)
    return {
        "samples": int(total),
        "p50_seconds": round(quantile(0.5), 4),
        "p99_seconds": round(quantile(0.99), 4),
        "over_10ms_share": round((total - dict(counts)[0.01]) / total, 4),
        "all_within_seconds": within,
    }


def rss_mib(pid: int) -> tuple[float, float]:
    """(current, peak) resident set size of `pid` in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


WATCH_SECONDS = 300


class Watcher:
    """A watch on custom objects of one namespace: the latest of each, and `seen(object)` for every event."""

    def __init__(
        self, kube: Kube, ref: Any, namespace: str, seen: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self._objects = client.CustomObjectsApi(kube.api)
        self._ref, self._namespace = ref, namespace
        self._seen = seen
        self.latest: dict[str, dict[str, Any]] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            stream = watch.Watch().stream(
                self._objects.list_namespaced_custom_object,
                self._ref.group,
                self._ref.version,
                self._namespace,
                self._ref.plural,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=WATCH_SECONDS + 30,  # not the client's deadline for one request, 15 s
            )
            try:
                async for event in stream:
                    obj = event["object"]
                    self.latest[obj["metadata"]["name"]] = obj
                    if self._seen is not None:
                        self._seen(obj)
                    self._changed.set()
            except ApiException as exc:
                if exc.status not in (410, 504):  # an expired or not yet cached resourceVersion: start over
                    raise
                await asyncio.sleep(0.1)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Watcher]:
        self._task = asyncio.create_task(self._run())
        try:
            yield self
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def until(self, check: Callable[[dict[str, dict[str, Any]]], bool], timeout: float) -> float:
        """Wait until `check(latest objects)` holds; return the monotonic time it did. Raise the watch's
        error as soon as it fails (`running`), TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not check(self.latest):
            if self._task is not None and self._task.done():
                self._task.result()
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the operator did not keep up")
            changed = asyncio.ensure_future(self._changed.wait())
            waits = {changed} if self._task is None else {changed, self._task}
            await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
        return time.monotonic()


def phase(obj: dict[str, Any] | None) -> str | None:
    return ((obj or {}).get("status") or {}).get("phase")


async def create_jobs(kube: Kube, namespace: str, names: list[str]) -> float:
    start = time.monotonic()
    await bounded([lambda n=n: kube.create(JOBS, job_body(n, namespace)) for n in names])
    return time.monotonic() - start


async def plain_client(kube: Kube, namespace: str, count: int) -> float:
    """Seconds to create `count` rendered RayJobs directly, with the same client and concurrency."""
    bodies = []
    for i in range(count):
        body = job_body(f"job-{i:04d}", namespace)
        body["metadata"]["uid"] = f"00000000-0000-0000-0000-{i:012d}"
        bodies.append(render_rayjob(RocmTrainingJob.model_validate(body)))
    start = time.monotonic()
    await bounded([lambda b=b: kube.create(RAYJOBS, b) for b in bodies])
    return time.monotonic() - start


async def api_floor(kube: Kube, namespace: str, count: int, *, with_jobs: bool) -> float:
    """Seconds for the same client to make, itself, every write that N reconciled jobs take.

    Per job: create its RayJob, write its status, post its event; with `with_jobs`,
    creating the job is timed too (else the jobs are created first). No operator runs.
    """
    events = client.CoreV1Api(kube.api)
    names = [f"job-{i:04d}" for i in range(count)]
    jobs: dict[str, Any] = {}

    async def create(name: str) -> None:
        jobs[name] = await kube.create(JOBS, job_body(name, namespace))
        if jobs[name] is None:
            raise RuntimeError(f"job {namespace}/{name} exists")

    if not with_jobs:
        await bounded([lambda n=n: create(n) for n in names])

    async def one(name: str) -> None:
        if with_jobs:
            await create(name)
        job = jobs[name]
        uid = job["metadata"]["uid"]
        rayjob = render_rayjob(RocmTrainingJob.model_validate(job))
        rayjob["metadata"]["ownerReferences"] = [
            {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": name, "uid": uid, "controller": True}
        ]
        await kube.create(RAYJOBS, rayjob)
        ready = {"type": "Ready", "status": "False", "reason": "RayJobCreated", "message": "waiting for KubeRay"}
        condition = {**ready, "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}
        status = {"phase": "Pending", "rayJobName": name, "observedGeneration": 1, "conditions": [condition]}
        await kube.patch_status(JOBS, namespace, name, status, uid=uid)
        reference = {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": name, "namespace": namespace}
        event = {
            "metadata": {"generateName": "bench-"},
            "involvedObject": {**reference, "uid": uid},
            "type": "Normal",
            "reason": "Pending",
            "message": "New → Pending",
            "source": {"component": "bench"},
        }
        await events.create_namespaced_event(namespace, event)

    start = time.monotonic()
    await bounded([lambda n=n: one(n) for n in names])
    return time.monotonic() - start


@contextlib.asynccontextmanager
async def reconciled(kube: Kube, namespace: str, names: list[str]) -> AsyncIterator[Callable[[], Any]]:
    """Watch `namespace`; yields an awaitable factory: the time every job of `names` has a status and a RayJob."""
    async with Watcher(kube, JOBS, namespace).running() as jobs, Watcher(kube, RAYJOBS, namespace).running() as rjs:

        async def done() -> float:
            with_status = await jobs.until(lambda seen: all(phase(seen.get(n)) for n in names), timeout=600)
            with_rayjob = await rjs.until(lambda seen: all(n in seen for n in names), timeout=600)
            return max(with_status, with_rayjob)

        yield done


async def throughput(kube: Kube, namespace: str, count: int) -> dict[str, float]:
    """Create `count` jobs at once, the operator running; seconds until each has a status and a RayJob."""
    names = [f"job-{i:04d}" for i in range(count)]
    async with reconciled(kube, namespace, names) as done:
        start = time.monotonic()
        created = await create_jobs(kube, namespace, names)
        finished = await done()
    return {"seconds": finished - start, "create_jobs_seconds": created}


async def latency(kube: Kube, namespace: str, names: list[str]) -> list[float]:
    """Seconds from each RayJob status write to the job showing the new phase (one at a time)."""
    samples = []
    steps = [({"jobDeploymentStatus": "Initializing", "jobStatus": ""}, "Initializing"),
             ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, "Running")]  # fmt: skip
    async with Watcher(kube, JOBS, namespace).running() as jobs:
        await jobs.until(lambda seen: all(n in seen for n in names), timeout=60)
        for name in names:
            uid = await rayjob_uid(kube, namespace, name)
            for status, want in steps:
                start = time.monotonic()
                await kube.patch_status(RAYJOBS, namespace, name, status, uid=uid)
                seen = await jobs.until(lambda s, n=name, w=want: phase(s.get(n)) == w, timeout=30)
                samples.append(seen - start)
    return samples


async def rayjob_uid(kube: Kube, namespace: str, name: str) -> str:
    rayjob = await kube.get(RAYJOBS, namespace, name)
    if rayjob is None:
        raise RuntimeError(f"no RayJob {namespace}/{name}")
    return rayjob["metadata"]["uid"]


async def run_running(kube: Kube, namespace: str, names: list[str]) -> None:
    running = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}

    async def one(name: str) -> None:
        await kube.patch_status(RAYJOBS, namespace, name, running, uid=await rayjob_uid(kube, namespace, name))

    await bounded([lambda n=n: one(n) for n in names])


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def bench(cluster: KubeCluster, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    kube = await Kube.connect(pool_size=IN_FLIGHT)
    try:
        base_ns = cluster.new_namespace("plain")
        plain = await plain_client(kube, base_ns, args.jobs)
        backlog_ns = cluster.new_namespace("backlog")
        backlog_names = [f"job-{i:04d}" for i in range(args.jobs)]
        await create_jobs(kube, backlog_ns, backlog_names)  # no operator running yet
        async with reconciled(kube, backlog_ns, backlog_names) as done:
            with operator_process(cluster.kubeconfig, log) as (proc, _metrics_port):
                start = time.monotonic()  # the operator is up (its startup handlers have run)
                backlog = await done() - start
                ns = cluster.new_namespace("bench")
                result = await throughput(kube, ns, args.jobs)
                sample_names = [f"job-{i:04d}" for i in range(args.latency_samples)]
                lat = await latency(kube, ns, sample_names)
                more = [f"job-{i:04d}" for i in range(args.jobs, args.rss_jobs - args.jobs)]
                if more:
                    await _add_jobs(kube, ns, more)
                await run_running(kube, backlog_ns, backlog_names)
                await run_running(kube, ns, [f"job-{i:04d}" for i in range(args.rss_jobs - args.jobs)])
                await asyncio.sleep(args.settle)
                rss, peak = rss_mib(proc.pid)
        # No operator runs now.
        floor = await api_floor(kube, cluster.new_namespace("floor"), args.jobs, with_jobs=True)
        backlog_floor = await api_floor(kube, cluster.new_namespace("floor"), args.jobs, with_jobs=False)
    finally:
        await kube.close()
    return {
        "jobs": args.jobs,
        "plain_client_seconds": round(plain, 3),
        "backlog_operator_seconds": round(backlog, 3),
        "backlog_ratio": round(backlog / plain, 3),
        "backlog_api_floor_seconds": round(backlog_floor, 3),
        "backlog_floor_ratio": round(backlog_floor / plain, 3),
        "operator_seconds": round(result["seconds"], 3),
        "operator_create_jobs_seconds": round(result["create_jobs_seconds"], 3),
        "throughput_ratio": round(result["seconds"] / plain, 3),
        "api_floor_seconds": round(floor, 3),
        "api_floor_ratio": round(floor / plain, 3),
        "latency_samples": len(lat),
        "latency_p50_seconds": round(statistics.median(lat), 4),
        "latency_p95_seconds": round(percentile(lat, 95), 4),
        "latency_max_seconds": round(max(lat), 4),
        "rss_jobs": args.rss_jobs,
        "rss_mib": round(rss, 1),
        "rss_peak_mib": round(peak, 1),
    }


async def _add_jobs(kube: Kube, namespace: str, names: list[str]) -> None:
    async with Watcher(kube, JOBS, namespace).running() as jobs:
        await create_jobs(kube, namespace, names)
        await jobs.until(lambda seen: all(phase(seen.get(n)) for n in names), timeout=600)


# ---- in the world: the operator beside the real KubeRay ------------------------------------------

RAYCLUSTERS = Ref("ray.io", "v1", "rayclusters")
ORIGIN_LABEL = "ray.io/originated-from-cr-name"  # KubeRay's label on a RayJob's RayCluster: the RayJob's name
BENCH_NODES = tuple(FakeNode(f"bench-{i}", 10 + i, cpu="1000", memory="4Ti", pods=250) for i in range(8))
SMALL = {
    "workers": 1,
    "gpusPerWorker": 0,
    "cpusPerWorker": "100m",
    "memoryPerWorker": "256Mi",
    "sharedMemory": "64Mi",
    "head": {"cpu": "100m", "memory": "256Mi"},
}


def spread(samples: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(samples), 2),
        "p95": round(percentile(samples, 95), 2),
        "max": round(max(samples), 2),
    }


def kuberay_provisioned(metrics_url: str, namespace: str) -> list[float]:
    """KubeRay's own `kuberay_cluster_provisioned_duration_seconds` of the RayClusters in `namespace`."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:  # noqa: S310 (a loopback URL of ours)
        lines = response.read().decode().splitlines()
    prefix, where = "kuberay_cluster_provisioned_duration_seconds{", f'namespace="{namespace}"'
    return [float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix) and where in line]


async def world_bench(cluster: KubeCluster, metrics_url: str, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    """N small jobs at once in the world; each timed through the operator and through KubeRay (module doc)."""
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    kube = await Kube.connect(pool_size=IN_FLIGHT)
    ns = cluster.new_namespace("world", annotations=runtime.namespace_annotations(processes=False))  # kwok pods
    names = [f"job-{i:04d}" for i in range(args.jobs)]
    marks: dict[str, dict[str, float]] = {key: {} for key in ("created", "rayjob", "status", "cluster", "workers")}

    def mark(key: str, name: str | None) -> None:
        if name is not None:
            marks[key].setdefault(name, time.monotonic())

    def on_job(job: dict[str, Any]) -> None:
        status = job.get("status") or {}
        if status.get("phase"):
            mark("status", job["metadata"]["name"])
        if status.get("workersReady") == 1:
            mark("workers", job["metadata"]["name"])

    def on_cluster(raycluster: dict[str, Any]) -> None:
        if (raycluster.get("status") or {}).get("state") == "ready":
            mark("cluster", (raycluster["metadata"].get("labels") or {}).get(ORIGIN_LABEL))

    async def create(name: str) -> None:
        await kube.create(JOBS, job_body(name, ns, SMALL))
        mark("created", name)

    try:
        with operator_process(cluster.kubeconfig, log) as (proc, _metrics_port):
            async with (
                Watcher(kube, JOBS, ns, on_job).running(),
                Watcher(kube, RAYJOBS, ns, lambda rayjob: mark("rayjob", rayjob["metadata"]["name"])).running(),
                Watcher(kube, RAYCLUSTERS, ns, on_cluster).running(),
            ):
                start = time.monotonic()
                await bounded([lambda n=n: create(n) for n in names])
                deadline = start + args.world_timeout
                while min(len(marks["cluster"]), len(marks["workers"])) < len(names):
                    if time.monotonic() > deadline:
                        done = {key: len(marks[key]) for key in ("rayjob", "cluster", "workers")}
                        raise TimeoutError(f"of {len(names)} jobs, after {args.world_timeout} s: {done}")
                    await asyncio.sleep(0.5)
            rss, peak = rss_mib(proc.pid)
    finally:
        await kube.close()
    provisioned = kuberay_provisioned(metrics_url, ns)

    def span(first: str, then: str) -> list[float]:
        return [marks[then][n] - marks[first][n] for n in names]

    return {
        "jobs": args.jobs,
        "world_seconds_all_rayjobs": round(max(marks["rayjob"].values()) - start, 2),
        "world_seconds_all_rayclusters_ready": round(max(marks["cluster"].values()) - start, 2),
        "world_seconds_all_job_statuses_ready": round(max(marks["workers"].values()) - start, 2),
        "operator_job_to_rayjob_seconds": spread(span("created", "rayjob")),
        "operator_job_to_status_seconds": spread(span("created", "status")),
        "kuberay_rayjob_to_raycluster_ready_seconds": spread(span("rayjob", "cluster")),
        "kuberay_own_provisioned_seconds": spread(provisioned) if provisioned else None,
        "kuberay_own_provisioned_clusters": len(provisioned),
        "operator_rss_mib": round(rss, 1),
        "operator_rss_peak_mib": round(peak, 1),
    }


async def load_bench(cluster: KubeCluster, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    """The latency of small jobs before and after `args.load` largest jobs came, and the operator's RSS."""
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    kube = await Kube.connect(pool_size=IN_FLIGHT)
    samples = [f"job-{i:04d}" for i in range(args.latency_samples)]
    big = [f"big-{i:03d}" for i in range(args.load)]
    try:
        idle_ns, load_ns, big_ns = (cluster.new_namespace(what) for what in ("idle", "load", "big"))
        bodies = [largest_body(name, big_ns) for name in big]  # made before any clock starts
        largest = RocmTrainingJob.model_validate(bodies[0])
        with operator_process(cluster.kubeconfig, log) as (proc, metrics_port):
            await throughput(kube, idle_ns, len(samples))
            lags = [loop_lag(metrics_port)]
            idle = await latency(kube, idle_ns, samples)
            lags.append(loop_lag(metrics_port))
            rss_idle, _ = rss_mib(proc.pid)
            async with reconciled(kube, big_ns, big) as done:
                start = time.monotonic()
                await bounded([lambda b=b: kube.create(JOBS, b) for b in bodies])
                big_seconds = await done() - start
            await run_running(kube, big_ns, big)
            lags.append(loop_lag(metrics_port))
            await throughput(kube, load_ns, len(samples))
            lags.append(loop_lag(metrics_port))
            loaded = await latency(kube, load_ns, samples)
            lags.append(loop_lag(metrics_port))
            await asyncio.sleep(args.settle)
            rss, peak = rss_mib(proc.pid)
    finally:
        await kube.close()
    return {
        "largest_jobs": args.load,
        "largest_job_config_bytes": job_config_size(largest),
        "largest_rayjob_bytes": len(json.dumps(render_rayjob(largest)).encode()),
        "largest_jobs_reconciled_seconds": round(big_seconds, 3),
        "latency_samples": len(samples),
        "idle_latency_p95_seconds": round(percentile(idle, 95), 4),
        "loaded_latency_p95_seconds": round(percentile(loaded, 95), 4),
        "latency_p95_ratio": round(percentile(loaded, 95) / percentile(idle, 95), 3),
        "loop_lag_idle": lag_between(lags[0], lags[1]),
        "loop_lag_largest_jobs": lag_between(lags[1], lags[2]),
        "loop_lag_loaded": lag_between(lags[3], lags[4]),
        "rss_idle_mib": round(rss_idle, 1),
        "rss_mib": round(rss, 1),
        "rss_peak_mib": round(peak, 1),
    }


def world_main(args: argparse.Namespace, log: Path) -> dict[str, Any]:
    """Start the world with the bench's nodes, run `world_bench`, stop the world."""
    started = world.start()
    try:
        cluster = started.cluster
        bench_nodes = set(nodes.register_kwok(cluster, BENCH_NODES))
        cluster.wait_for(lambda: bench_nodes <= set(started.schedulable_nodes()), 60, "the bench nodes to be Ready")
        metrics_addr = next(a.split("=", 1)[1] for a in started.kuberay.args if a.startswith("--metrics-addr="))
        return asyncio.run(world_bench(cluster, f"http://{metrics_addr}/metrics", args, log))
    finally:
        started.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=500, help="jobs for the throughput run")
    parser.add_argument("--latency-samples", type=int, default=100, help="jobs driven through two status changes")
    parser.add_argument("--rss-jobs", type=int, default=1000, help="jobs present when RSS is measured")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to let the operator settle before RSS")
    parser.add_argument("--kubeconfig", type=Path, help="an existing cluster (else a local control plane starts)")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--world", action="store_true", help="in the test world, beside the real KubeRay")
    parser.add_argument("--world-timeout", type=float, default=1800, help="seconds for every job of --world")
    parser.add_argument("--load", type=int, default=0, help="largest jobs beside small ones: RSS and latency")
    args = parser.parse_args()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / "rocmtrain-operator-bench.log"  # noqa: S108
    if args.world:
        figures = world_main(args, log)
    elif args.load:
        with running_cluster() as cluster:
            figures = asyncio.run(load_bench(cluster, args, log))
    else:
        if args.rss_jobs < 2 * args.jobs or args.latency_samples > args.jobs:
            parser.error("need --latency-samples <= --jobs and 2 * --jobs <= --rss-jobs")
        if args.kubeconfig:
            os.environ["ROCMTRAIN_TEST_KUBECONFIG"] = str(args.kubeconfig)
        with running_cluster() as cluster:
            figures = asyncio.run(bench(cluster, args, log))
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
