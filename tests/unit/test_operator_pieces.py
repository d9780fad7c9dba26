"""Operator pieces without a cluster: configuration, RayJob field carry-over, views, metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
import types

import aiohttp
import pytest
from kubernetes_asyncio import client
from prometheus_client import generate_latest

from rocmtrain import prometheus
from rocmtrain.api.contract import JOB_NAME_LABEL, RAY_CLUSTER_LABEL
from rocmtrain.api.models import MUTABLE_FIELDS, RocmTrainingJob
from rocmtrain.api.timestamps import rfc3339
from rocmtrain.controller.handlers import estimate_queues
from rocmtrain.controller.informer import Informer
from rocmtrain.controller.pod_watch import PodWatch
from rocmtrain.controller.rayjob_watch import RayJobWatch
from rocmtrain.controller.reconciler import Reconciler
from rocmtrain.controller.settings import ConfigError, OperatorConfig
from rocmtrain.kube import TimedApiClient
from rocmtrain.policy import Policy
from rocmtrain.render.rayjob import MUTABLE_RAYJOB_DEFAULTS, mutable_rayjob_fields
from rocmtrain.status.kueue import workload_view
from rocmtrain.status.objects import (
    controller_ref,
    is_jobs_rayjob,
    job_view,
    rayjob_view,
    requested_gpus,
)
from rocmtrain.status.pods import pod_view
from rocmtrain.status.rayjob_update import mutable_patch
from unit.samples import full_job


def test_config_defaults_and_overrides():
    default = OperatorConfig.from_env({})
    assert (default.namespaces, default.metrics_port, default.health_port) == ((), 8080, 8081)
    assert default.stall_seconds == 900 and default.stall_check_seconds == 60
    assert default.queue_estimate_seconds == 15
    assert OperatorConfig.from_env({"ROCMTRAIN_QUEUE_ESTIMATE_SECONDS": "2"}).queue_estimate_seconds == 2
    # Plain HTTP without authentication: loopback only, unless the Deployment says otherwise.
    assert default.liveness_endpoint == "http://127.0.0.1:8081/healthz" and default.metrics_host == "127.0.0.1"
    assert not default.metrics_secure, "no progress endpoint, no certificate: plain HTTP on loopback"
    assert default.policy == Policy() and default.api_timeout_seconds == 15
    assert default.job_network_policies
    assert not OperatorConfig.from_env({"ROCMTRAIN_JOB_NETWORK_POLICIES": "false"}).job_network_policies
    custom = OperatorConfig.from_env(
        {"ROCMTRAIN_NAMESPACES": "team-a, team-b", "ROCMTRAIN_STALL_SECONDS": "8", "ROCMTRAIN_HEALTH_PORT": "0"}
    )
    assert custom.namespaces == ("team-a", "team-b")
    assert custom.stall_check_seconds == 2 and custom.liveness_endpoint is None
    assert default.pricing is None and default.metrics_max_jobs == 500
    priced = OperatorConfig.from_env({"ROCMTRAIN_GPU_PRICES": "default=2.5", "ROCMTRAIN_COST_CURRENCY": "EUR"})
    assert priced.pricing is not None and (priced.pricing.default, priced.pricing.currency) == (2.5, "EUR")
    pod = OperatorConfig.from_env(
        {
            "ROCMTRAIN_OPERATOR_NAMESPACE": "rocm-train-system",
            "ROCMTRAIN_METRICS_HOST": "0.0.0.0",  # noqa: S104 - what a Deployment sets
            "ROCMTRAIN_HEALTH_HOST": "::",
            "ROCMTRAIN_API_TIMEOUT_SECONDS": "5",
            "ROCMTRAIN_ALLOWED_IMAGES": "ghcr.io/acme/, registry.local:5000/ml",
            "ROCMTRAIN_ALLOWED_PRIORITY_CLASSES": "training",
            "ROCMTRAIN_ALLOWED_KUEUE_PRIORITY_CLASSES": "low,high",
        }
    )
    assert pod.metrics_host == "0.0.0.0" and pod.metrics_secure  # noqa: S104 - HTTPS, scrapes authenticated
    assert pod.liveness_endpoint == "http://[::]:8081/healthz"
    assert pod.api_timeout_seconds == 5 and pod.reconcile_deadline == 20
    allowed = Policy(("ghcr.io/acme/", "registry.local:5000/ml"), ("training",), ("low", "high"))
    assert pod.policy == dataclasses.replace(allowed, protected_namespaces=("kube-system", "rocm-train-system"))
    assert default.render_options.submitter_retries == 2
    # The progress endpoint (TLS, authenticated) listens on every address unless told where.
    progress = {"ROCMTRAIN_OPERATOR_NAMESPACE": "rocm-train-system"}
    assert OperatorConfig.from_env(progress).progress.host == "0.0.0.0"  # noqa: S104
    assert OperatorConfig.from_env({**progress, "ROCMTRAIN_PROGRESS_HOST": "10.0.0.7"}).progress.host == "10.0.0.7"
    with pytest.raises(ValueError, match="ROCMTRAIN_PROGRESS_HOST must be an IP address"):
        OperatorConfig.from_env({**progress, "ROCMTRAIN_PROGRESS_HOST": "all"})
    assert OperatorConfig.from_env({"ROCMTRAIN_SUBMITTER_RETRIES": "0"}).render_options.submitter_retries == 0
    # The operator's own namespace is protected beside kube-system, unless the admin says otherwise.
    assert OperatorConfig.from_env(progress).policy.protected_namespaces == ("kube-system", "rocm-train-system")
    assert OperatorConfig.from_env({"ROCMTRAIN_PROTECTED_NAMESPACES": "-"}).policy.protected_namespaces == ()
    limits = {
        "ROCMTRAIN_PROTECTED_NAMESPACES": "infra",
        "ROCMTRAIN_MAX_WORKER_PODS": "8",
        "ROCMTRAIN_MAX_JOB_GPUS": "64",
    }
    assert OperatorConfig.from_env(limits).policy == Policy(
        max_worker_pods=8, max_gpus=64, protected_namespaces=("infra",)
    )


def test_metrics_are_https_where_the_progress_endpoint_runs_and_plain_http_only_on_loopback():
    cluster = {"ROCMTRAIN_OPERATOR_NAMESPACE": "ops", "ROCMTRAIN_METRICS_HOST": "0.0.0.0"}  # noqa: S104
    assert OperatorConfig.from_env(cluster).metrics_secure
    local = {
        "ROCMTRAIN_OPERATOR_NAMESPACE": "ops",
        "ROCMTRAIN_METRICS_SECURE": "false",
        "ROCMTRAIN_METRICS_HOST": "::1",
    }
    assert not OperatorConfig.from_env(local).metrics_secure
    off = OperatorConfig.from_env({"ROCMTRAIN_METRICS_PORT": "0", "ROCMTRAIN_METRICS_HOST": "0.0.0.0"})  # noqa: S104
    assert off.metrics_port == 0 and not off.metrics_secure, "nothing served, nothing to refuse"


@pytest.mark.parametrize(
    "env",
    [
        {"ROCMTRAIN_NAMESPACES": "Team_A"},
        {"ROCMTRAIN_METRICS_PORT": "70000"},
        {"ROCMTRAIN_STALL_SECONDS": "0"},
        {"ROCMTRAIN_QUEUE_ESTIMATE_SECONDS": "0"},
        {"ROCMTRAIN_RETRY_SECONDS": "soon"},
        {"ROCMTRAIN_METRICS_MAX_JOBS": "-1"},
        {"ROCMTRAIN_GPU_PRICES": "AMD_Instinct_MI300X_OAM=cheap"},
        {"ROCMTRAIN_GPU_PRICES": "default=2", "ROCMTRAIN_COST_CURRENCY": "euro"},
        {"ROCMTRAIN_METRICS_HOST": "all"},
        {"ROCMTRAIN_METRICS_SECURE": "yes"},
        # Plain HTTP off loopback (by default without the progress endpoint, or asked for), and HTTPS without
        # the progress endpoint's certificate.
        {"ROCMTRAIN_METRICS_HOST": "0.0.0.0"},  # noqa: S104
        {
            "ROCMTRAIN_METRICS_HOST": "10.0.0.7",
            "ROCMTRAIN_OPERATOR_NAMESPACE": "ops",
            "ROCMTRAIN_METRICS_SECURE": "false",
        },
        {"ROCMTRAIN_METRICS_SECURE": "true"},
        {"ROCMTRAIN_METRICS_SECURE": "true", "ROCMTRAIN_OPERATOR_NAMESPACE": "ops", "ROCMTRAIN_PROGRESS_PORT": "0"},
        {"ROCMTRAIN_API_TIMEOUT_SECONDS": "0"},
        {"ROCMTRAIN_ALLOWED_IMAGES": "ghcr.io/acme evil"},
        {"ROCMTRAIN_ALLOWED_PRIORITY_CLASSES": "Training"},
        {"ROCMTRAIN_SUBMITTER_RETRIES": "21"},
        {"ROCMTRAIN_MAX_WORKER_PODS": "0"},
        {"ROCMTRAIN_MAX_JOB_GPUS": "many"},
        {"ROCMTRAIN_PROTECTED_NAMESPACES": "Kube_System"},
        {"ROCMTRAIN_JOB_NETWORK_POLICIES": "off"},
    ],
)
def test_config_refuses_bad_values(env):
    with pytest.raises(ConfigError):
        OperatorConfig.from_env(env)


def test_mutable_patch_carries_only_suspend_and_lifecycle():
    rendered = {"suspend": True, "shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 60, "entrypoint": "x"}
    live = {"suspend": False, "shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 0, "entrypoint": "y"}
    assert mutable_patch(rendered, live, queued=False) == {"suspend": True, "ttlSecondsAfterFinished": 60}
    # Kueue owns `suspend` of a queued RayJob.
    assert mutable_patch(rendered, live, queued=True) == {"ttlSecondsAfterFinished": 60}
    # KubeRay's defaults (ttl 0) count as equal to an unset field: no patch loop.
    defaulted = {"shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 0}
    assert mutable_patch({"shutdownAfterJobFinishes": True}, defaulted, queued=False) == {}


def test_the_rayjob_fields_that_follow_the_job_are_those_of_its_mutable_fields():
    """Every RayJob field `mutable_patch` carries over comes from `MUTABLE_FIELDS`, and has KubeRay's default."""
    manifest = full_job()
    assert set(MUTABLE_FIELDS) == {"suspend", "lifecycle"}
    job = RocmTrainingJob.model_validate(manifest)
    assert set(mutable_rayjob_fields(job)) == set(MUTABLE_RAYJOB_DEFAULTS)  # the full job sets a TTL
    changed = RocmTrainingJob.model_validate(
        {**manifest, "spec": {**manifest["spec"], "suspend": True, "lifecycle": {"shutdownAfterJobFinishes": True}}}
    )
    assert mutable_patch(mutable_rayjob_fields(changed), mutable_rayjob_fields(job), queued=False) == {
        "suspend": True,
        "ttlSecondsAfterFinished": 0,
    }


def test_requested_gpus_is_the_spec_s_total_even_for_partly_defaulted_resources():
    job = job_view({"spec": {"resources": {"gpusPerWorker": 4}}})  # workers defaults to 1, as the API server sets
    assert requested_gpus(job) == 4
    assert requested_gpus(job_view(full_job())) == 6
    assert requested_gpus(job_view({"spec": {"resources": {"workers": "many"}}})) == 0


def test_rayjob_view_keeps_status_and_status_write_times_only():
    body = {
        "metadata": {
            "name": "j",
            "namespace": "ns",
            "uid": "u",
            "ownerReferences": [{"kind": "RocmTrainingJob", "name": "j", "uid": "owner", "controller": True}],
            "managedFields": [
                {
                    "manager": "kuberay-operator",
                    "subresource": "status",
                    "time": "2026-01-01T00:00:00Z",
                    "fieldsV1": {},
                },
                {"manager": "rocm-train-operator", "time": "2025-01-01T00:00:00Z", "fieldsV1": {}},
            ],
        },
        "spec": {"suspend": True, "rayClusterSpec": {"huge": "templates"}},
        "status": {"jobDeploymentStatus": "Running"},
    }
    view = rayjob_view(body)
    assert view["spec"] == {"suspend": True}
    assert view["metadata"]["managedFields"] == [{"subresource": "status", "time": "2026-01-01T00:00:00Z"}]
    assert view["status"] == {"jobDeploymentStatus": "Running"}
    assert controller_ref(view)["uid"] == "owner"
    assert controller_ref({"metadata": {"ownerReferences": [{"kind": "Other", "controller": True}]}}) == {}


def _view(name: str, phase: str | None, gpus: int) -> dict:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"resources": {"workers": 1, "gpusPerWorker": gpus}},
        "status": {"phase": phase} if phase else {},
        "gpus": gpus,
    }


def test_jobs_collector_counts_phases_and_gpus_of_unfinished_jobs():
    views = [_view("a", "Running", 16), _view("b", "Running", 8), _view("c", "Succeeded", 8), _view("d", None, 4)]
    prometheus.JOBS.source = lambda: views
    try:
        text = generate_latest(prometheus.REGISTRY).decode()
    finally:
        prometheus.JOBS.source = tuple
    assert 'rocmtrain_jobs{phase="Running"} 2.0' in text
    assert 'rocmtrain_jobs{phase="Succeeded"} 1.0' in text
    assert 'rocmtrain_jobs{phase="Unknown"} 1.0' in text
    assert 'rocmtrain_gpus_requested{phase="Running"} 24.0' in text
    assert 'rocmtrain_gpus_requested{phase="Succeeded"}' not in text
    assert 'rocmtrain_job_phase{job_name="c",namespace="ns",phase="Succeeded"} 1.0' in text
    assert 'rocmtrain_job_gpus{job_name="a",namespace="ns"} 16.0' in text
    assert "rocmtrain_job_series_dropped 0.0" in text


async def test_a_scrape_reads_the_job_index_on_the_loop_and_collects_in_a_thread():
    """The index is iterated where the event loop runs (it alone changes it), the series are built elsewhere."""
    import threading

    from prometheus_client.registry import Collector

    loop_thread, read_in, collected_in = threading.current_thread(), [], []

    def source() -> list[dict]:
        read_in.append(threading.current_thread())
        return [_view("a", "Running", 16)]

    class Where(Collector):
        def collect(self):
            collected_in.append(threading.current_thread())
            return iter(())

    where = Where()
    prometheus.REGISTRY.register(where)
    prometheus.JOBS.source = source
    try:
        text = (await prometheus.exposition()).decode()
    finally:
        prometheus.JOBS.source = tuple
        prometheus.REGISTRY.unregister(where)
    assert 'rocmtrain_job_gpus{job_name="a",namespace="ns"} 16.0' in text
    assert read_in == [loop_thread] and collected_in and loop_thread not in collected_in


def test_observe_counts_unexpected_errors_only():
    class Waiting(Exception):
        pass

    def errors() -> float:
        return prometheus.REGISTRY.get_sample_value("rocmtrain_reconcile_errors_total", {"handler": "unit"}) or 0.0

    before = errors()
    with pytest.raises(Waiting), prometheus.observe("unit", expected=(Waiting,)):
        raise Waiting
    with pytest.raises(RuntimeError), prometheus.observe("unit", expected=(Waiting,)):
        raise RuntimeError
    assert errors() == before + 1


def _rayjob(namespace: str, name: str, state: str) -> dict:
    return {"metadata": {"namespace": namespace, "name": name, "uid": name}, "status": {"jobDeploymentStatus": state}}


def test_rayjob_watch_relist_reports_differences_and_coalesces_per_object():
    """A relist (after a 410 or KubeRay's return) yields only what changed; a burst on one RayJob is handled once."""
    seen: list[tuple[str, str, str | None]] = []

    async def handle(kind: str, view: dict) -> None:
        seen.append((kind, view["metadata"]["name"], view["status"].get("jobDeploymentStatus")))
        await asyncio.sleep(0)

    async def scenario() -> None:
        api = client.ApiClient(client.Configuration())
        watch = RayJobWatch(api, handle, label_selector="x=y")
        watch._replace("a", [rayjob_view(_rayjob("a", "one", "Running")), rayjob_view(_rayjob("a", "two", "Running"))])
        watch._replace("b", [rayjob_view(_rayjob("b", "three", "Running"))])
        await asyncio.sleep(0.05)
        seen.clear()
        # Relist of namespace "a": "one" unchanged, "two" gone, "four" new; namespace "b" untouched.
        watch._replace("a", [rayjob_view(_rayjob("a", "one", "Running")), rayjob_view(_rayjob("a", "four", "New"))])
        await asyncio.sleep(0)  # the handler takes "four"'s ADDED
        for state in ("Initializing", "Running", "Complete"):  # a burst on "four" while its ADDED is handled
            watch._apply("MODIFIED", rayjob_view(_rayjob("a", "four", state)))
        await asyncio.sleep(0.05)
        assert sorted(watch.views) == [("a", "four"), ("a", "one"), ("b", "three")]
        assert watch.get("a", "four")["status"]["jobDeploymentStatus"] == "Complete"
        await watch.stop()
        await api.close()

    asyncio.run(scenario())
    assert ("DELETED", "two", "Running") in seen
    assert [s for s in seen if s[1] == "four"] == [("ADDED", "four", "New"), ("MODIFIED", "four", "Complete")]
    assert not [s for s in seen if s[1] in ("one", "three")]


def _ray_pod(namespace: str, job: str, name: str, phase: str) -> dict:
    labels = {JOB_NAME_LABEL: job, RAY_CLUSTER_LABEL: f"{job}-abcde"}
    return {"metadata": {"namespace": namespace, "name": name, "labels": labels}, "status": {"phase": phase}}


async def _until_idle(watch: Informer) -> None:
    for _ in range(200):
        await asyncio.sleep(0.01)
        if not watch._workers:
            return


@pytest.mark.parametrize("kind", ["RayJobs", "Ray pods"])
def test_a_failed_handling_is_handed_over_again_until_it_goes_through(monkeypatch: pytest.MonkeyPatch, kind: str):
    """A status write that failed (the API server down) is not lost: the change is handled again (every watch)."""
    monkeypatch.setattr("rocmtrain.controller.informer.ERROR_BACKOFF_SECONDS", 0.01)
    attempts: list[str] = []

    async def handle(_: str, view: dict) -> None:
        attempts.append(view["metadata"]["name"])
        if len(attempts) < 3:
            raise ConnectionError("status write failed")

    async def scenario() -> None:
        api = client.ApiClient(client.Configuration())
        if kind == "RayJobs":
            watch: Informer = RayJobWatch(api, handle, label_selector="x=y")
            watch._apply("MODIFIED", rayjob_view(_rayjob("a", "one", "Running")))
        else:
            watch = PodWatch(api, handle)
            watch._apply("MODIFIED", pod_view(_ray_pod("a", "bert", "bert-abcde-head-x1y2z", "Pending")))
        await _until_idle(watch)
        await watch.stop()
        await api.close()

    asyncio.run(scenario())
    assert len(attempts) == 3 and len(set(attempts)) == 1


def test_a_newer_change_replaces_a_failed_one_awaiting_its_retry(monkeypatch: pytest.MonkeyPatch):
    """The retry hands over the group's latest change: a stale view is never written after a newer one."""
    monkeypatch.setattr("rocmtrain.controller.informer.ERROR_BACKOFF_SECONDS", 0.2)
    attempts: list[tuple[str, str]] = []

    async def handle(_: str, view: dict) -> None:
        attempts.append((view["metadata"]["name"], view["phase"]))
        if len(attempts) == 1:
            raise ConnectionError("status write failed")

    async def scenario() -> None:
        api = client.ApiClient(client.Configuration())
        watch = PodWatch(api, handle)
        watch._apply("ADDED", pod_view(_ray_pod("a", "bert", "bert-abcde-head-x1y2z", "Pending")))
        await asyncio.sleep(0.05)  # failed, backing off
        watch._apply("ADDED", pod_view(_ray_pod("a", "bert", "bert-abcde-gpu-worker-q1w2e", "Running")))
        await _until_idle(watch)
        assert len(watch.of_job("a", "bert")) == 2, "one group: the job's pods"
        await watch.stop()
        await api.close()

    asyncio.run(scenario())
    assert attempts == [("bert-abcde-head-x1y2z", "Pending"), ("bert-abcde-gpu-worker-q1w2e", "Running")]


def test_only_the_rayjob_of_the_jobs_name_drives_its_status():
    job = {"metadata": {"name": "bert", "namespace": "a", "uid": "u1"}}
    own = _rayjob("a", "bert", "Running")
    own["metadata"]["ownerReferences"] = [{"kind": "RocmTrainingJob", "name": "bert", "uid": "u1", "controller": True}]
    assert is_jobs_rayjob(job, own)
    impostor = {**own, "metadata": {**own["metadata"], "name": "impostor"}}
    assert not is_jobs_rayjob(job, impostor), "a controller reference anyone may write is not enough"
    elsewhere = {**own, "metadata": {**own["metadata"], "namespace": "b"}}
    assert not is_jobs_rayjob(job, elsewhere)
    other_uid = {**job, "metadata": {**job["metadata"], "uid": "u2"}}
    assert not is_jobs_rayjob(other_uid, own), "a new job of the same name"


def test_every_request_of_the_operators_clients_has_a_deadline():
    """kubernetes_asyncio sends requests without one: an API server that never answers would hold the caller."""

    async def scenario() -> float:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(30)  # accepts the connection, reads nothing, answers nothing

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
        api = TimedApiClient(configuration, aiohttp.ClientTimeout(total=0.5))
        start = asyncio.get_running_loop().time()
        try:
            with pytest.raises(TimeoutError):
                await client.CoreV1Api(api).list_namespace()
            return asyncio.get_running_loop().time() - start
        finally:
            await api.close()
            server.close()

    assert asyncio.run(scenario()) < 5


async def test_the_loop_lag_probe_sees_how_long_other_work_held_the_loop():
    from types import SimpleNamespace

    from rocmtrain.controller.runtime import probe_loop_lag

    interval = 0.1
    runtime = SimpleNamespace(config=OperatorConfig.from_env({"ROCMTRAIN_LOOP_LAG_PROBE_MS": "100"}))

    def lags(le: str = "+Inf") -> float:
        return prometheus.REGISTRY.get_sample_value("rocmtrain_event_loop_lag_seconds_bucket", {"le": le}) or 0.0

    before = {le: lags(le) for le in ("0.05", "0.25", "+Inf")}
    probe = asyncio.create_task(probe_loop_lag(runtime))  # type: ignore[arg-type] - it reads the config alone
    try:
        await asyncio.sleep(1.5 * interval)  # it samples once, and its next timer is due soon
        time.sleep(2 * interval)  # holding the loop is the point
        await asyncio.sleep(0.01)
    finally:
        probe.cancel()
    seen = {le: lags(le) - before[le] for le in before}
    assert seen["+Inf"] >= 2 and seen["0.05"] <= seen["+Inf"] - 1, "one sample saw the loop held for over 50 ms"
    assert seen["0.25"] == seen["+Inf"], "and none saw longer than it was held"


class _QueueKube:
    """The reads and status writes the queue loop makes, answered from memory."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, str | None, str]] = []
        self.listable = True
        self.patches: list[tuple[str, dict]] = []
        self.objects = {
            ("localqueues", "ml", "lq"): {"spec": {"clusterQueue": "team-a"}},
            ("clusterqueues", None, "team-a"): {
                "metadata": {"name": "team-a"},
                "spec": {
                    "resourceGroups": [{"flavors": [{"resources": [{"name": "amd.com/gpu", "nominalQuota": 8}]}]}]
                },
                "status": {"flavorsReservation": [{"resources": [{"name": "amd.com/gpu", "total": 8}]}]},
            },
        }

    async def get_readable(self, ref, namespace, name):
        self.reads.append((ref.plural, namespace, name))
        return self.objects.get((ref.plural, namespace, name))

    async def list_readable(self, ref):
        self.reads.append((ref.plural, None, "*"))
        if not self.listable:
            return None
        return [obj for (plural, _, _), obj in self.objects.items() if plural == ref.plural]

    async def patch_status(self, ref, namespace, name, status, *, uid):
        self.patches.append((name, status))
        return {"status": status}

    async def post_event(self, *args, **kwargs):
        raise AssertionError("an estimate is no transition")


def _indexed_job(name: str, phase: str, **status) -> dict:
    meta = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "generation": 1}
    return {
        "apiVersion": "rocmtrain.dev/v1alpha1",
        "kind": "RocmTrainingJob",
        "metadata": meta,
        "spec": {},
        "status": {"phase": phase, **status},
    }


def _workload(owner: str, gpus: int, admitted: bool) -> dict:
    pod_set = {"count": 1, "template": {"spec": {"containers": [{"resources": {"limits": {"amd.com/gpu": gpus}}}]}}}
    status = {"admission": {"clusterQueue": "team-a"}, "conditions": [{"type": "Admitted", "status": "True"}]}
    return workload_view(
        {
            "metadata": {
                "namespace": "ml",
                "name": f"w-{owner}",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": owner, "uid": owner}],
            },
            "spec": {"queueName": "lq", "podSets": [pod_set]},
            "status": status if admitted else {},
        }
    )


def _queue_runtime(kube: _QueueKube, jobs: list[dict], workloads: list[dict]) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        jobs={("ml", j["metadata"]["name"]): [j] for j in jobs},
        workloads=types.SimpleNamespace(
            views={(w["metadata"]["namespace"], w["metadata"]["name"]): w for w in workloads}
        ),
        kube=kube,
        reconciler=Reconciler(kube, OperatorConfig.from_env({}), known=lambda namespace, name: None),
    )


def test_the_queue_loop_writes_each_queued_jobs_estimate_from_the_watched_workloads_and_etas():
    reported = dt.datetime.now(dt.UTC).replace(microsecond=0)
    last, soon = rfc3339(reported), rfc3339(reported + dt.timedelta(minutes=10))
    running = _indexed_job("a", "Running", progress={"etaSeconds": 600}, lastProgressTime=last)
    other = _indexed_job("b", "Running")  # no ETA reported yet
    queued = _indexed_job("c", "Queued")
    kube = _QueueKube()
    workloads = [_workload("a", 4, True), _workload("b", 4, True), _workload("c", 4, False)]

    async def scenario() -> None:
        runtime = _queue_runtime(kube, [running, other, queued], workloads)
        await estimate_queues(runtime)
        await estimate_queues(runtime)  # nothing changed: nothing written again
        queued["status"]["phase"] = "Pending"  # admitted meanwhile: the loop reads nothing
        await estimate_queues(runtime)

    asyncio.run(scenario())
    assert kube.reads == [("localqueues", "ml", "lq"), ("clusterqueues", None, "*")] * 2
    assert kube.patches == [
        (
            "c",
            {
                "queue": {
                    "position": 1,
                    "expectedStartTime": soon,
                    "basis": "1 running job's ETA, 0 jobs ahead, ClusterQueue team-a's quota of 8 GPUs",
                }
            },
        )
    ]


def test_the_queue_loop_lists_the_cluster_queues_for_what_the_cohort_lends():
    kube = _QueueKube()
    kube.objects[("clusterqueues", None, "team-a")]["spec"]["cohortName"] = "research"
    kube.objects[("clusterqueues", None, "team-b")] = {
        "metadata": {"name": "team-b"},
        "spec": {
            "cohortName": "research",
            "resourceGroups": [{"flavors": [{"resources": [{"name": "amd.com/gpu", "nominalQuota": 8}]}]}],
        },
        "status": {"flavorsReservation": []},
    }
    queued = _indexed_job("c", "Queued")
    runtime = _queue_runtime(kube, [queued], [_workload("a", 8, True), _workload("c", 4, False)])
    asyncio.run(estimate_queues(runtime))
    assert kube.patches[-1][1]["queue"]["basis"] == (
        "GPUs free now, 0 jobs ahead, ClusterQueue team-a's quota of 8 GPUs, "
        "borrowing without limit from cohort research: team-b lends 8"
    )
    # An older ClusterRole (get, no list): team-a read alone, and what its cohort lends is not known.
    kube.listable, kube.reads = False, []
    asyncio.run(estimate_queues(runtime))
    assert kube.reads == [("localqueues", "ml", "lq"), ("clusterqueues", None, "*"), ("clusterqueues", None, "team-a")]
    assert kube.patches[-1][1]["queue"] == {
        "position": 1,
        "basis": "unknown: the ClusterQueues of cohort research cannot be listed",
    }
