"""The operator's events as the API server stores them: user text escaped and bounded.

A trial id or a data path (a user's string) reaches event messages; `Kube.post_event`
escapes control characters and cuts the message to `EVENT_MESSAGE_LIMIT` before the
real kube-apiserver stores it, so `kubectl describe` never prints a terminal escape.
"""

from __future__ import annotations

import pytest

from rocmtrain.kube.client import Kube
from rocmtrain.status.messages import EVENT_MESSAGE_LIMIT
from rocmtrain_testworld.kubecluster import KubeCluster
from unit.samples import minimal_job

pytestmark = pytest.mark.cluster


async def test_an_event_with_a_users_control_characters_is_stored_escaped_and_bounded(
    kube: KubeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = kube.new_namespace("events")
    manifest = minimal_job()
    manifest["metadata"] = {"name": "escaped", "namespace": namespace}
    job = kube.create(manifest)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    client = await Kube.connect()
    try:
        message = "new best trial t_\x1b[2J\x07evil" + " and more" * 1000
        await client.post_event(job, type="Normal", reason="NewBestTrial", message=message)
    finally:
        await client.close()
    (event,) = kube.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
    stored = event["message"]
    assert stored.startswith("new best trial t_\\x1b[2J\\x07evil and more")
    assert "\x1b" not in stored and "\x07" not in stored
    assert len(stored) <= EVENT_MESSAGE_LIMIT
    assert event["involvedObject"]["uid"] == job["metadata"]["uid"]
