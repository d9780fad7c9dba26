"""The informers of RayJobs and Ray pods (`rocmtrain.controller.informer`): a relist's differences, bursts
coalesced per object, failed handlings handed over again; no cluster."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client

from rocmtrain.api.contract import JOB_NAME_LABEL, RAY_CLUSTER_LABEL
from rocmtrain.controller.informer import Informer
from rocmtrain.controller.pod_watch import PodWatch
from rocmtrain.controller.rayjob_watch import RayJobWatch
from rocmtrain.status.objects import (
    rayjob_view,
)
from rocmtrain.status.pods import pod_view


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
