"""Phase notifications from the operator on the lean control plane, to an HTTP receiver on loopback.

Real: the Secret read with the operator's own RBAC (the notifications ClusterRole bound in the job's
namespace), the status writes, the events. Hand-written, as in test_cluster.py: the RayJob's RUNNING
(a running Ray's), after which the job stalls (`STALL_SECONDS`). The operator allows receivers on
loopback, which it refuses by default (ROCMTRAIN_NOTIFY_ALLOWED_CIDRS).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from operator_testkit import OPERATOR_NAMESPACE, OPERATOR_SA, STALL_SECONDS, Api, Operator, wait_until

from rocmtrain.status.notifications import SIGNATURE_HEADER
from rocmtrain_testworld.kubecluster import KubeCluster

pytestmark = pytest.mark.cluster

TOKEN = "T0KEN-in-the-url"
KEY = "s1gning-k3y"


class _Receiver(ThreadingHTTPServer):
    received: list[tuple[str, bytes]]


class _Handler(BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((self.headers[SIGNATURE_HEADER], body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def operator(operator_kubeconfig: Path) -> Iterator[Operator]:
    """The operator of this module, allowing receivers on loopback."""
    running = Operator(operator_kubeconfig, {"ROCMTRAIN_NOTIFY_ALLOWED_CIDRS": "127.0.0.0/8"})
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    server = _Receiver(("127.0.0.1", 0), _Handler)
    server.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_jobs_phase_changes_notify_its_receiver_signed_with_its_secrets_key(
    kube: KubeCluster, api: Api, ns: str, receiver: _Receiver
):
    url = f"http://127.0.0.1:{receiver.server_address[1]}/{TOKEN}"
    kube.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hooks", "namespace": ns},
                "stringData": {"url": url, "key": KEY}})  # fmt: skip
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "rocm-train-operator-notifications", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "rocm-train-operator-notifications"},
            "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NAMESPACE}],
        }
    )  # fmt: skip
    target = {"secretRef": {"name": "hooks", "signingKeyKey": "key"}, "events": ["Running", "Stalled"]}
    api.create_job(ns, "bert", notifications=[target])
    api.fake_kuberay(ns, "bert", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})

    def events() -> list[str]:
        return [json.loads(body)["event"] for _, body in receiver.received]

    wait_until(lambda: events() == ["Running", "Stalled"], timeout=STALL_SECONDS + 8, what="Running, then Stalled")
    for signature, body in receiver.received:
        assert hmac.compare_digest(signature, "sha256=" + hmac.new(KEY.encode(), body, hashlib.sha256).hexdigest())
    document = json.loads(receiver.received[0][1])
    assert document["job"]["name"] == "bert" and document["kubectl"] == f"kubectl -n {ns} describe rocmtrainingjob bert"
    recorded = wait_until(
        lambda: (
            [(e["target"], e["event"], e["state"]) for e in api.status(ns, "bert").get("notifications") or []]
            == [("spec.notifications[0]", "Stalled", "Delivered")]
        ),
        what="the Stalled notice recorded as delivered",
    )
    assert recorded
    written = json.dumps(api.job(ns, "bert")) + json.dumps(api.event_messages(ns, "bert"))
    assert TOKEN not in written and KEY not in written
