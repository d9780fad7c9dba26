"""The progress endpoint against the real control plane: who may write, and what is refused.

Real parts: kube-apiserver (TokenRequest, TokenReview, the job's status
subresource), the endpoint over TLS with the operator-managed certificate. Not
real: the RayJob, RayCluster and Ray pods are objects the tests create as the
operator and KubeRay would (no KubeRay controller, no kubelet: the pods never
run), and the operator's copy of `status.rayClusterName` is a status patch made here.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import itertools
import json
import ssl
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from kubernetes_asyncio import config as async_config

from progress.endpoint import (
    OPERATOR_NAMESPACE,
    SMALL_SPEC,
    Client,
    RayHead,
    ServerThread,
    bound_token,
    bound_token_for,
    create_job,
    create_ray_head,
    create_ray_pod,
)
from rocmtrain.api.contract import PROGRESS_BURST, PROGRESS_RATE_PER_SECOND, trainer_status_path
from rocmtrain.api.models import HISTORY_LENGTH, RocmTrainingJobStatus
from rocmtrain.progress import tls
from rocmtrain.progress.limits import MAX_BODY_BYTES
from rocmtrain_testworld.kubecluster import SA_ISSUER, KubeCluster

pytestmark = pytest.mark.cluster

REPORT = {
    "progress": {"epoch": 0.5, "step": 20, "totalSteps": 80, "percent": 25.0, "etaSeconds": 60.0},
    "metrics": {"trainLoss": 0.61, "learningRate": 4e-5, "gpuMemoryPeakBytes": 2048, "gpuMemoryPeakBytesMin": 1024},
}


@pytest.fixture(scope="module")
def namespace(kube: KubeCluster) -> str:
    return kube.new_namespace("progress")


def new_head(kube: KubeCluster, namespace: str, *, record_cluster: bool = True) -> RayHead:
    name = f"job-{uuid.uuid4().hex[:6]}"
    cluster = f"{name}-q7x2k"
    create_job(kube, namespace, name, cluster if record_cluster else None)
    return create_ray_head(kube, namespace, name, cluster)


@pytest.fixture
def head(kube: KubeCluster, namespace: str) -> RayHead:
    return new_head(kube, namespace)


def assert_refused(kube: KubeCluster, head: RayHead, client: Client, body: bytes | dict, token: str | None, code: int):
    before = head.job_object(kube)
    resp = client.post(head.namespace, head.job, body, token)
    assert resp.status == code, resp.body
    assert "error" in json.loads(resp.body)
    after = head.job_object(kube)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], "nothing may be written"
    assert "lastProgressTime" not in after["status"]


def test_tls_secret_and_ca_configmap(kube: KubeCluster, progress_server: ServerThread):
    secret = kube.request("GET", f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/secrets/{tls.SECRET_NAME}")
    assert base64.b64decode(secret["data"]["ca.crt"]) == progress_server.server.ca_crt
    job_ns = kube.new_namespace("ca")
    progress_server.run(progress_server.server.publish_ca(job_ns))
    progress_server.run(progress_server.server.publish_ca(job_ns))  # idempotent
    cm = kube.request("GET", f"/api/v1/namespaces/{job_ns}/configmaps/{tls.CA_CONFIGMAP}")
    assert cm["data"] == {"ca.crt": progress_server.server.ca_crt.decode()}, "the CA certificate only, never a key"


def test_token_of_the_jobs_head_pod_updates_its_status(kube: KubeCluster, client: Client, head: RayHead):
    resp = client.post(head.namespace, head.job, REPORT, bound_token(kube, head))
    assert resp.status == 204, resp.body
    status = head.job_object(kube)["status"]
    assert status["phase"] == "Running", "fields the endpoint does not own are kept"
    assert status["progress"] == REPORT["progress"]
    assert status["metrics"] == REPORT["metrics"]
    assert status["history"] == [{"step": 20, "trainLoss": 0.61}]
    written = dt.datetime.fromisoformat(status["lastProgressTime"].replace("Z", "+00:00"))
    assert abs((dt.datetime.now(dt.UTC) - written).total_seconds()) < 60
    RocmTrainingJobStatus.model_validate(status)
    printed = kube.printed(head.job_path)
    assert (printed["Progress"], printed["Loss"], printed["ETA"]) == (25, 0.61, 60), "kubectl get shows them"


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_an_ended_job_takes_no_report_even_from_its_own_head(
    kube: KubeCluster, client: Client, head: RayHead, phase: str
):
    """A head pod's valid token, after the job ended: its final metrics stay as they ended (issue 20, finding 8)."""
    ended = {"phase": phase, "metrics": {"evalAccuracy": 0.61}}
    kube.request(
        "PATCH", f"{head.job_path}/status", body={"status": ended}, content_type="application/merge-patch+json"
    )
    forged = {**REPORT, "metrics": {"evalAccuracy": 1.0}}
    assert_refused(kube, head, client, forged, bound_token(kube, head), 409)
    assert head.job_object(kube)["status"]["metrics"] == {"evalAccuracy": 0.61}


def test_before_the_cluster_is_recorded_the_owner_chain_decides(kube: KubeCluster, client: Client, namespace: str):
    head = new_head(kube, namespace, record_cluster=False)
    resp = client.post(head.namespace, head.job, REPORT, bound_token(kube, head))
    assert resp.status == 204, resp.body


def test_a_pod_with_forged_labels_is_forbidden(kube: KubeCluster, client: Client, head: RayHead):
    """Every label of the head pod, but not controlled by the job's RayCluster: anyone could make it."""
    forged = create_ray_pod(kube, head, "head", owned=False)
    assert_refused(kube, head, client, REPORT, bound_token_for(kube, head.namespace, forged), 403)


def test_a_worker_pods_token_is_forbidden(kube: KubeCluster, client: Client, head: RayHead):
    """A pod of the job's own Ray cluster, controlled by its RayCluster, that is not the head."""
    worker = create_ray_pod(kube, head, "worker")
    assert_refused(kube, head, client, REPORT, bound_token_for(kube, head.namespace, worker), 403)


def test_token_of_another_jobs_pod_is_forbidden(kube: KubeCluster, client: Client, namespace: str, head: RayHead):
    other = new_head(kube, namespace)
    assert_refused(kube, head, client, REPORT, bound_token(kube, other), 403)


def test_token_from_another_namespace_is_forbidden(kube: KubeCluster, client: Client, head: RayHead):
    elsewhere = new_head(kube, kube.new_namespace("progress-other"))
    assert_refused(kube, head, client, REPORT, bound_token(kube, elsewhere), 403)


def test_token_for_another_audience_is_unauthenticated(kube: KubeCluster, client: Client, head: RayHead):
    assert_refused(kube, head, client, REPORT, bound_token(kube, head, audience=SA_ISSUER), 401)


def test_missing_or_forged_token_is_unauthenticated(kube: KubeCluster, client: Client, head: RayHead):
    assert_refused(kube, head, client, REPORT, None, 401)
    assert_refused(kube, head, client, REPORT, "eyJhbGciOiJub25lIn0.e30.", 401)


def _b64url(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def _signing_key(key_file: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def _resign(token: str, key: ec.EllipticCurvePrivateKey, **claims: Any) -> str:
    """The token with some claims changed, signed (ES256) with `key`."""
    header = token.split(".")[0].encode()
    signing_input = header + b"." + _b64url(json.dumps({**_claims(token), **claims}).encode())
    r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
    return (signing_input + b"." + _b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))).decode()


def test_expired_token_is_unauthenticated(kube: KubeCluster, client: Client, namespace: str):
    """TokenRequest will not issue a token shorter than 600 s, so the expired token is made here.

    It is a real bound token with `exp` moved into the past and signed again with
    the API server's own service-account signing key (the harness's
    --service-account-signing-key-file). The same token re-signed with a future
    `exp` is accepted, so expiry alone is what TokenReview refuses.
    """
    apiserver = kube.processes.get("kube-apiserver")
    if apiserver is None:
        pytest.skip("needs the local control plane's signing key")
    flag = "--service-account-signing-key-file="
    key = _signing_key(Path(next(a for a in apiserver.args if str(a).startswith(flag))[len(flag) :]))
    head = new_head(kube, namespace)
    token = bound_token(kube, head)
    now = int(time.time())
    assert_refused(kube, head, client, REPORT, _resign(token, key, iat=now - 7200, nbf=now - 7200, exp=now - 3600), 401)
    fresh = _resign(token, key, iat=now - 60, nbf=now - 60, exp=now + 600)
    assert client.post(head.namespace, head.job, REPORT, fresh).status == 204


def test_forgeries_spend_the_shared_review_budget_never_that_of_a_pod_that_reported(
    kube: KubeCluster, progress_server: ServerThread, client: Client, namespace: str
):
    """Well-formed tokens with our audience and an unexpired `exp`, each naming a pod that never reported,
    signed with a key that is not the API server's, from four clients at once: each costs a TokenReview until
    the shared budget is spent (429). A head pod that has reported has each new token reviewed meanwhile
    (issue 20, finding 7)."""
    reporter, target = new_head(kube, namespace), new_head(kube, namespace)
    assert client.post(reporter.namespace, reporter.job, REPORT, bound_token(kube, reporter)).status == 204
    rotated = [bound_token(kube, reporter) for _ in range(3)]  # new tokens of the same pod, as the kubelet's
    template, wrong_key = bound_token(kube, target), ec.generate_private_key(ec.SECP256R1())
    identity = _claims(template)["kubernetes.io"]
    codes: list[int] = []
    stop = threading.Event()

    def forge(worker: int) -> None:
        forger = Client(progress_server.config.port, progress_server.server.ca_crt)
        try:
            for i in itertools.count():
                if stop.is_set():
                    return
                pod = {"name": f"forged-{worker}-{i}", "uid": str(uuid.uuid4())}
                forged = _resign(template, wrong_key, **{"kubernetes.io": {**identity, "pod": pod}})
                codes.append(forger.post(target.namespace, target.job, REPORT, forged).status)
        finally:
            forger.close()

    with ThreadPoolExecutor(4) as pool:
        forgers = [pool.submit(forge, worker) for worker in range(4)]
        deadline = time.monotonic() + 60
        while codes.count(429) < 20 and time.monotonic() < deadline and not any(f.done() for f in forgers):
            time.sleep(0.05)
        spent = codes.count(429) >= 20
        answers = [client.post(reporter.namespace, reporter.job, REPORT, token).status for token in rotated]
        busy_then = codes.count(429)
        stop.set()
        for f in forgers:
            f.result()
    assert spent, f"the shared budget is spent: {collections.Counter(codes)}"
    assert answers == [204] * 3, "the reporting pod's new tokens are reviewed through the flood"
    assert codes.count(429) > busy_then, "the flood was still refused for budget after them"
    assert set(codes) <= {401, 429}, "no forgery gets further than authentication"


def test_unknown_job_is_not_found(kube: KubeCluster, client: Client, head: RayHead):
    resp = client.post(head.namespace, "no-such-job", REPORT, bound_token(kube, head))
    assert resp.status == 404


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (json.dumps({**REPORT, "pad": "x" * MAX_BODY_BYTES}).encode(), 413),
        (b'{"progress": {"step": 1}, "metrics": {', 400),
        (b'{"progress": {"step": 1}, "metrics": {"trainLoss": NaN}}', 400),
        (b'{"progress": {"step": 1}, "metrics": {"trainLoss": Infinity}}', 400),
        (b'{"progress": {"step": 1, "percent": 1e400}}', 400),
        (b'{"progress": {"step": 1}, "metrics": {"trainLoss": 0.5, "password": "hunter2"}}', 400),
    ],
    ids=["oversized", "malformed", "nan", "infinity", "overflow", "unknown-field"],
)
def test_bad_bodies_are_refused(kube: KubeCluster, client: Client, head: RayHead, body: bytes, code: int):
    assert_refused(kube, head, client, body, bound_token(kube, head), code)


def test_a_flood_is_rate_limited(kube: KubeCluster, client: Client, head: RayHead):
    token = bound_token(kube, head)
    start = time.monotonic()
    codes = []
    for step in range(1000):
        body = {"progress": {"step": step, "totalSteps": 1000}, "metrics": {"trainLoss": 1.0 + step}}
        codes.append(client.post(head.namespace, head.job, body, token).status)
    elapsed = time.monotonic() - start
    accepted = [step for step, code in enumerate(codes) if code == 204]
    assert set(codes) == {204, 429}
    assert codes.count(429) > 500, f"most of the flood is refused ({elapsed:.1f}s)"
    assert len(accepted) <= PROGRESS_BURST + PROGRESS_RATE_PER_SECOND * elapsed + 1, "writes stay within the rate"
    status = head.job_object(kube)["status"]
    assert [p["step"] for p in status["history"]] == accepted[-HISTORY_LENGTH:], "every write is an accepted report"
    assert status["progress"]["step"] == accepted[-1]


def test_a_rotated_certificate_is_served_and_its_ca_republished(
    kube: KubeCluster, progress_server: ServerThread, head: RayHead
):
    """A new CA and certificate in the Secret (an admin's or cert-manager's rotation) take effect on refresh."""
    server = progress_server.server
    job_ns = kube.new_namespace("ca-rotate")
    progress_server.run(server.publish_ca(job_ns))
    old_ca = server.ca_crt
    rotated = tls.plan_secret(None, progress_server.config.hosts, dt.datetime.now(dt.UTC))
    assert rotated is not None
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": tls.SECRET_NAME, "namespace": OPERATOR_NAMESPACE},
            "data": {k: base64.b64encode(v).decode() for k, v in rotated.items()},
        }
    )
    progress_server.run(server.refresh())
    assert server.ca_crt == rotated["ca.crt"] != old_ca
    cm = kube.request("GET", f"/api/v1/namespaces/{job_ns}/configmaps/{tls.CA_CONFIGMAP}")
    assert cm["data"]["ca.crt"] == rotated["ca.crt"].decode()
    port = progress_server.config.port
    assert Client(port, rotated["ca.crt"]).post(head.namespace, head.job, REPORT, bound_token(kube, head)).status == 204
    with pytest.raises(ssl.SSLCertVerificationError):
        Client(port, old_ca).post(head.namespace, head.job, REPORT, bound_token(kube, head))


def test_a_cert_manager_secret_is_read_never_written(kube: KubeCluster, progress_server: ServerThread):
    """With ROCMTRAIN_PROGRESS_MANAGE_TLS=false (manifests/cert-manager), the Secret is cert-manager's to write."""
    namespace = kube.new_namespace("cert-manager")
    hosts = tls.service_hosts("rocmtrain-progress", namespace)
    admin = progress_server.run(async_config.new_client_from_config(config_file=str(kube.kubeconfig)))
    try:
        _read_only_secret(kube, progress_server, admin, namespace, hosts)
    finally:
        progress_server.run(admin.close())


def _read_only_secret(kube: KubeCluster, loop: ServerThread, admin: Any, namespace: str, hosts: list[str]) -> None:
    with pytest.raises(ValueError, match="does not exist"):  # not issued yet: no self-made certificate
        loop.run(tls.load_serving_secret(admin, namespace, hosts, manage=False))
    issued = tls.plan_secret(None, hosts, dt.datetime.now(dt.UTC))
    assert issued is not None
    assert set(issued) == {"ca.crt", "tls.crt", "tls.key"}  # as a CA Issuer's Secret: never the CA key
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": tls.SECRET_NAME, "namespace": namespace},
        "data": {key: base64.b64encode(value).decode() for key, value in issued.items()},
    }
    version = kube.create(secret)["metadata"]["resourceVersion"]
    material = loop.run(tls.load_serving_secret(admin, namespace, hosts, manage=False))
    assert (material.ca_crt, material.tls_crt, material.tls_key) == (
        issued["ca.crt"],
        issued["tls.crt"],
        issued["tls.key"],
    )
    # The managing path would have rewritten the Secret (for the names it serves); this one left it alone.
    after = kube.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{tls.SECRET_NAME}")
    assert after["metadata"]["resourceVersion"] == version and "ca.key" not in after["data"]


# ---- a job running its own code, reporting in Kubeflow Trainer's protocol (KEP-2779) ----------------------

CODE_SPEC = {"code": {"command": ["python", "/code/train.py"]}, "checkpoint": SMALL_SPEC["checkpoint"]}
KEP = {
    "trainerStatus": {
        "progressPercentage": 25,
        "estimatedRemainingSeconds": 60,
        "metrics": [
            {"name": "loss", "value": "0.61"},
            {"name": "current_step", "value": "20"},
            {"name": "total_steps", "value": "80"},
            {"name": "grad_norm", "value": "1.5"},
        ],
        "lastUpdatedTime": "2026-01-02T03:04:05+00:00",
    }
}


def new_code_job(kube: KubeCluster, namespace: str) -> RayHead:
    name = f"code-{uuid.uuid4().hex[:6]}"
    create_job(kube, namespace, name, f"{name}-q7x2k", CODE_SPEC)
    return create_ray_head(kube, namespace, name, f"{name}-q7x2k")


def post_kep(client: Client, head: RayHead, body: bytes | dict, token: str | None) -> int:
    return client.post(head.namespace, head.job, body, token, path=trainer_status_path(head.namespace, head.job)).status


def test_a_code_jobs_worker_reports_in_kubeflows_protocol_into_the_status(
    kube: KubeCluster, client: Client, namespace: str
):
    """KubeflowCallback reports from Ray Train's rank 0, on a worker pod: its token writes the job's status,
    which `kubectl get` shows; the head's token too, and two pods taking turns are named (NotDataParallel)."""
    head = new_code_job(kube, namespace)
    worker = create_ray_pod(kube, head, "worker")
    worker_token = bound_token_for(kube, head.namespace, worker)
    assert post_kep(client, head, KEP, worker_token) == 204
    status = head.job_object(kube)["status"]
    assert status["progress"] == {"step": 20, "totalSteps": 80, "percent": 25, "etaSeconds": 60}
    assert status["metrics"] == {"trainLoss": 0.61, "custom": [{"name": "grad_norm", "value": 1.5}]}
    RocmTrainingJobStatus.model_validate(status)
    printed = kube.printed(head.job_path)
    assert (printed["Progress"], printed["Loss"], printed["ETA"]) == (25, 0.61, 60)
    head_token = bound_token(kube, head)
    for token in (head_token, worker_token, head_token):
        assert post_kep(client, head, KEP, token) == 204
    status = head.job_object(kube)["status"]
    assert status["reportingPods"] == [head.pod["metadata"]["name"], worker["metadata"]["name"]]
    assert status["reportingTurns"] == 2


def test_the_kubeflow_path_refuses_what_ours_refuses(kube: KubeCluster, client: Client, namespace: str):
    """Wrong pod, another job's token, oversize, NaN, too many metrics, after the end: nothing is written."""
    head = new_code_job(kube, namespace)
    other = new_code_job(kube, namespace)
    worker = create_ray_pod(kube, head, "worker")
    token = bound_token_for(kube, head.namespace, worker)
    not_ray = create_ray_pod(kube, head, "submitter")  # controlled by the RayCluster, but not a Ray node
    unowned = create_ray_pod(kube, head, "worker", owned=False)
    many = {"trainerStatus": {"metrics": [{"name": f"m{i}", "value": "1"} for i in range(33)]}}
    cases = [
        (json.dumps(KEP).encode(), bound_token_for(kube, head.namespace, not_ray), 403),
        (json.dumps(KEP).encode(), bound_token_for(kube, head.namespace, unowned), 403),
        (json.dumps(KEP).encode(), bound_token_for(kube, other.namespace, create_ray_pod(kube, other, "worker")), 403),
        (json.dumps(KEP).encode(), None, 401),
        (json.dumps({**KEP, "pad": "x" * MAX_BODY_BYTES}).encode(), token, 413),
        (b'{"trainerStatus": {"progressPercentage": NaN}}', token, 400),
        (json.dumps({"trainerStatus": {"metrics": [{"name": "loss", "value": "NaN"}]}}).encode(), token, 400),
        (json.dumps(many).encode(), token, 400),
    ]
    before = head.job_object(kube)["metadata"]["resourceVersion"]
    assert [post_kep(client, head, body, who) for body, who, _ in cases] == [code for *_, code in cases]
    assert head.job_object(kube)["metadata"]["resourceVersion"] == before, "nothing written"
    kube.request(
        "PATCH", f"{head.job_path}/status", body={"status": {"phase": "Succeeded"}},
        content_type="application/merge-patch+json",
    )  # fmt: skip
    assert post_kep(client, head, KEP, token) == 409
    assert "progress" not in head.job_object(kube)["status"]


def test_a_built_in_jobs_worker_may_not_report_in_either_protocol(kube: KubeCluster, client: Client, head: RayHead):
    worker = bound_token_for(kube, head.namespace, create_ray_pod(kube, head, "worker"))
    assert post_kep(client, head, KEP, worker) == 403
    assert post_kep(client, head, KEP, bound_token(kube, head)) == 204, "its head may"
