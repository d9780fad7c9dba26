"""The serving certificate and its CA rotate while a job reports: no report is lost.

Real parts: kube-apiserver (the TLS Secret, the CA ConfigMap, TokenReview, the job's
status), the endpoint with its refresher, and the training image's `HttpSink`
reporting over verified TLS with the CA bundle file it reads for every send. Not
real: the kubelet, which refreshes a pod's mounted ConfigMap within about a minute;
a thread here copies the ConfigMap into the file every second instead, and the
overlap is 6 s instead of an hour (twice what a loaded machine needs here). The Ray
objects are made as in `endpoint.py`.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import threading
import uuid
from pathlib import Path

import pytest

from progress.endpoint import ServerThread, bound_token, create_job, create_ray_head
from rocmtrain.api.models import ProgressReport
from rocmtrain.progress import tls
from rocmtrain.progress.server import ProgressServerConfig
from rocmtrain_testworld.kubecluster import KubeCluster, free_port
from rocmtrain_train.reporting.operator_sink import HttpSink

pytestmark = pytest.mark.cluster

OVERLAP = 6.0
REPORTS = 28
INTERVAL = 0.5


def _kubelet(kube: KubeCluster, namespace: str, file: Path, stop: threading.Event) -> None:
    """Copy the CA ConfigMap into the mounted file, as the kubelet refreshes a projected volume: atomically (the
    kubelet swaps a symlink to a new folder), so a reader never sees a file half written."""
    while not stop.wait(1.0):
        configmap = kube.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{tls.CA_CONFIGMAP}")
        written = file.with_name(f".{file.name}.new")
        written.write_text(configmap["data"][tls.CA_KEY])
        written.replace(file)


def test_a_rotation_while_a_job_reports_loses_no_report(
    kube: KubeCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    tls_namespace, job_namespace = kube.new_namespace("tls"), kube.new_namespace("rotate")
    port = free_port()
    cfg = ProgressServerConfig(
        namespace=tls_namespace,
        host="127.0.0.1",
        port=port,
        advertise_host="localhost",
        advertise_port=port,
        ca_overlap_seconds=OVERLAP,
    )
    # A certificate 29 days from its end: the endpoint starts its successor at once.
    now = dt.datetime.now(dt.UTC)
    old = tls.plan_secret(None, cfg.hosts, now - tls.SERVING_LIFETIME + tls.SERVING_RENEW_BEFORE - dt.timedelta(days=1))
    assert old is not None
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": tls.SECRET_NAME, "namespace": tls_namespace},
            "data": {key: base64.b64encode(value).decode() for key, value in old.items()},
        }
    )
    name = f"job-{uuid.uuid4().hex[:6]}"
    create_job(kube, job_namespace, name, f"{name}-r0t8x")
    head = create_ray_head(kube, job_namespace, name, f"{name}-r0t8x")
    ca_file, token_file = tmp_path / "ca.crt", tmp_path / "token"
    ca_file.write_bytes(old["ca.crt"])  # what the pod mounted before the rotation began
    token_file.write_text(bound_token(kube, head))

    server = ServerThread(cfg, kube.kubeconfig)
    stop = threading.Event()
    kubelet = threading.Thread(target=_kubelet, args=(kube, job_namespace, ca_file, stop), daemon=True)
    sink = None
    try:
        server.run(server.server.publish_ca(job_namespace))
        assert server.server.ca_crt.startswith(old["ca.crt"]) and server.server.ca_crt != old["ca.crt"], "overlap"
        kubelet.start()
        sink = HttpSink(server.url(job_namespace, name), ca_file, token_file, min_interval=0.2)
        caplog.set_level(logging.INFO, logger="rocmtrain_train.reporting.operator_sink")
        for step in range(1, REPORTS + 1):
            sink.emit(ProgressReport.model_validate({"progress": {"step": step}, "metrics": {"trainLoss": 1.0}}))
            stop.wait(INTERVAL)
        sink.close()
        rotated = server.server.ca_crt
    finally:
        stop.set()
        server.stop()
    assert old["ca.crt"] not in rotated, "the successor is served and its CA alone is trusted now"
    secret = kube.request("GET", f"/api/v1/namespaces/{tls_namespace}/secrets/{tls.SECRET_NAME}")["data"]
    assert base64.b64decode(secret["tls.crt"]) != old["tls.crt"] and "next.crt" not in secret
    assert sink is not None and (sink.sent, sink.dropped) == (REPORTS, 0)
    assert not [r for r in caplog.records if "unavailable" in r.getMessage()], "no send failed, not even once"
    history = head.job_object(kube)["status"]["history"]
    assert [point["step"] for point in history] == list(range(1, REPORTS + 1))
