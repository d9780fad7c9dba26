"""Operator pieces without a cluster: configuration, RayJob field carry-over, views, metrics."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client
from prometheus_client import generate_latest

from rocmtrain import metrics
from rocmtrain.api.models import MUTABLE_FIELDS, RocmTrainingJob
from rocmtrain.controller.rayjob_watch import RayJobWatch
from rocmtrain.controller.settings import ConfigError, OperatorConfig
from rocmtrain.objects import controller_ref, job_view, mutable_patch, rayjob_view, requested_gpus
from rocmtrain.render.rayjob import MUTABLE_RAYJOB_DEFAULTS, mutable_rayjob_fields
from unit.samples import full_job


def test_config_defaults_and_overrides():
    default = OperatorConfig.from_env({})
    assert (default.namespaces, default.metrics_port, default.health_port) == ((), 8080, 8081)
    assert default.stall_seconds == 900 and default.stall_check_seconds == 60
    assert default.liveness_endpoint == "http://0.0.0.0:8081/healthz"
    custom = OperatorConfig.from_env(
        {"ROCMTRAIN_NAMESPACES": "team-a, team-b", "ROCMTRAIN_STALL_SECONDS": "8", "ROCMTRAIN_HEALTH_PORT": "0"}
    )
    assert custom.namespaces == ("team-a", "team-b")
    assert custom.stall_check_seconds == 2 and custom.liveness_endpoint is None
    assert default.render_options.submitter_retries == 2
    assert OperatorConfig.from_env({"ROCMTRAIN_SUBMITTER_RETRIES": "0"}).render_options.submitter_retries == 0


@pytest.mark.parametrize(
    "env",
    [
        {"ROCMTRAIN_NAMESPACES": "Team_A"},
        {"ROCMTRAIN_METRICS_PORT": "70000"},
        {"ROCMTRAIN_STALL_SECONDS": "0"},
        {"ROCMTRAIN_RETRY_SECONDS": "soon"},
        {"ROCMTRAIN_SUBMITTER_RETRIES": "21"},
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


def test_jobs_collector_counts_phases_and_gpus_of_unfinished_jobs():
    metrics.JOBS.source = lambda: [("Running", 16), ("Running", 8), ("Succeeded", 8), (None, 4)]
    try:
        text = generate_latest(metrics.REGISTRY).decode()
    finally:
        metrics.JOBS.source = tuple
    assert 'rocmtrain_jobs{phase="Running"} 2.0' in text
    assert 'rocmtrain_jobs{phase="Succeeded"} 1.0' in text
    assert 'rocmtrain_jobs{phase="Unknown"} 1.0' in text
    assert 'rocmtrain_gpus_requested{phase="Running"} 24.0' in text
    assert 'rocmtrain_gpus_requested{phase="Succeeded"}' not in text


def test_observe_counts_unexpected_errors_only():
    class Waiting(Exception):
        pass

    def errors() -> float:
        return metrics.REGISTRY.get_sample_value("rocmtrain_reconcile_errors_total", {"handler": "unit"}) or 0.0

    before = errors()
    with pytest.raises(Waiting), metrics.observe("unit", expected=(Waiting,)):
        raise Waiting
    with pytest.raises(RuntimeError), metrics.observe("unit", expected=(Waiting,)):
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
