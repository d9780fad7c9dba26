"""The endpoint's HTTP behaviour with in-memory parts (no kopf, no cluster).

The authenticator, authoriser and job store are small in-memory stand-ins
here; `test_endpoint_cluster.py` runs the same app with the real ones.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from fakes import merge_patch
from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.contract import PROGRESS_AUDIENCE, progress_path
from rocmtrain.api.errors import Conflict
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.progress import tls
from rocmtrain.progress.auth import Identity
from rocmtrain.progress.limits import MAX_BODY_BYTES
from rocmtrain.progress.server import ProgressServerConfig, make_app
from rocmtrain.render import RenderOptions, render_rayjob
from rocmtrain.serving import errors
from rocmtrain.serving.errors import Forbidden, Gone, Unauthenticated, Unavailable
from rocmtrain.serving.rate import RateLimiter
from rocmtrain.status import notifications
from unit.test_status import CODE, T0, conditions, observe, running_rayjob

NOW = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
POD = Identity(namespace="team-a", service_account="default", pod_name="job1-head", pod_uid="uid-1")
WORKER = Identity(namespace="team-a", service_account="default", pod_name="job1-worker-a1", pod_uid="uid-2")
TOKENS = {"good": POD, "worker": WORKER, "other-ns": Identity("team-b", "default", "x-head", "uid-9")}
URL = "/v1/namespaces/team-a/rocmtrainingjobs/job1/progress"
REPORT = {"progress": {"step": 5, "totalSteps": 50, "percent": 10}, "metrics": {"trainLoss": 1.25}}


class Jobs:
    """Jobs in memory, with resourceVersion preconditions like the API server's."""

    def __init__(self) -> None:
        self.objects = {
            ("team-a", "job1"): {
                "metadata": {"name": "job1", "namespace": "team-a", "uid": "j1", "resourceVersion": "1"},
                "status": {},
            }
        }
        self.patches: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.conflicts = 0
        self.down = False

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((namespace, name))
        return copy.deepcopy(obj)

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        if self.down:
            raise Unavailable("status patch failed with HTTP 500")
        obj = self.objects.get((namespace, name))
        if obj is None:
            raise Gone
        if self.conflicts:
            self.conflicts -= 1
            obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        if patch["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise Conflict
        obj["status"] = merge_patch(obj["status"], patch["status"])
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        self.patches.append(patch)

    async def post_event(self, obj: Any, *, type: str, reason: str, message: str) -> None:
        self.events.append((obj["metadata"]["name"], type, reason))


async def authenticate(token: str) -> Identity:
    if token not in TOKENS:
        raise Unauthenticated("token not accepted")
    return TOKENS[token]


async def authorise(identity: Identity, job: Mapping[str, Any]) -> None:
    if identity.pod_uid not in (POD.pod_uid, WORKER.pod_uid) or job["metadata"]["name"] != "job1":
        raise Forbidden("token's pod is not part of this job's Ray cluster")


@pytest.fixture
def jobs() -> Jobs:
    return Jobs()


@pytest.fixture
async def http(jobs: Jobs) -> AsyncIterator[TestClient]:
    app = make_app(
        authenticate=authenticate, authorise=authorise, jobs=jobs, limiter=RateLimiter(2, 10), now=lambda: NOW
    )
    async with TestClient(TestServer(app)) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_report_updates_status(http: TestClient, jobs: Jobs):
    resp = await http.post(URL, json=REPORT, headers=bearer("good"))
    assert resp.status == 204
    status = jobs.objects["team-a", "job1"]["status"]
    assert status["progress"]["step"] == 5
    assert status["metrics"] == {"trainLoss": 1.25}
    assert status["history"] == [{"step": 5, "trainLoss": 1.25}]
    assert status["lastProgressTime"] == "2025-03-01T00:00:00Z"


async def test_a_recovered_worker_failure_is_an_event_on_the_job(http: TestClient, jobs: Jobs):
    recovered = {**REPORT, "workerFailures": 1, "resumedFromStep": 4}
    for body in (REPORT, recovered, recovered):
        assert (await http.post(URL, json=body, headers=bearer("good"))).status == 204
    assert jobs.objects["team-a", "job1"]["status"]["workerFailures"] == 1
    assert jobs.events == [("job1", "Warning", Reason.WORKER_FAILURE_RECOVERED)]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
async def test_an_ended_job_takes_no_more_reports(http: TestClient, jobs: Jobs, phase: str):
    job = jobs.objects["team-a", "job1"]
    job["status"] = {"phase": phase, "metrics": {"evalAccuracy": 0.61}}
    resp = await http.post(URL, json={**REPORT, "metrics": {"evalAccuracy": 1.0}}, headers=bearer("good"))
    assert resp.status == 409 and "ended" in await resp.text()
    assert job["status"]["metrics"] == {"evalAccuracy": 0.61} and not jobs.patches


async def test_a_job_that_ends_while_its_report_is_written_keeps_what_it_ended_with(http: TestClient, jobs: Jobs):
    """The phase is checked again on the re-read after a conflict: here the write it lost to ended the job."""
    jobs.conflicts = 1
    patch_status = jobs.patch_status

    async def ending(namespace: str, name: str, patch: dict[str, Any]) -> None:
        jobs.objects[namespace, name]["status"]["phase"] = "Succeeded"
        await patch_status(namespace, name, patch)

    jobs.patch_status = ending  # type: ignore[method-assign]
    resp = await http.post(URL, json=REPORT, headers=bearer("good"))
    assert resp.status == 409 and not jobs.patches


async def test_two_pods_of_the_job_that_take_turns_reporting_are_two_rank_zeros(http: TestClient, jobs: Jobs):
    """The pod of each report is its token's; the status mapping then warns (`tests/unit/test_report_checks.py`)."""
    for token in ("good", "worker", "good", "worker"):
        assert (await http.post(URL, json=REPORT, headers=bearer(token))).status == 204
    status = jobs.objects["team-a", "job1"]["status"]
    assert (status["reportingPods"], status["reportingTurns"]) == ([WORKER.pod_name, POD.pod_name], 2)
    said = observe({"phase": "Running", **status}, running_rayjob(T0), spec=CODE)
    assert conditions(said)[ConditionType.NOT_DATA_PARALLEL] == ("True", Reason.TWO_RANK_ZEROS)


async def test_healthz(http: TestClient):
    resp = await http.get("/healthz")
    assert resp.status == 200


@pytest.mark.parametrize(
    ("url", "headers", "body", "status"),
    [
        (URL, {}, REPORT, 401),
        (URL, {"Authorization": "Basic Z29vZA=="}, REPORT, 401),
        (URL, bearer("forged"), REPORT, 401),
        (URL, bearer("other-ns"), REPORT, 403),
        ("/v1/namespaces/team-a/rocmtrainingjobs/job2/progress", bearer("good"), REPORT, 404),
        ("/v1/namespaces/team-a/rocmtrainingjobs/Job_1/progress", bearer("good"), REPORT, 404),
        (URL, bearer("good"), {"progress": {"step": 1}, "metrics": {"trainLoss": "NaN"}}, 400),
        (URL, bearer("good"), {"progress": {"step": 1}, "metrics": {"trainLoss": 1}, "extra": 1}, 400),
    ],
)
async def test_refusals_write_nothing(http: TestClient, jobs: Jobs, url: str, headers: dict, body: dict, status: int):
    resp = await http.post(url, json=body, headers=headers)
    assert resp.status == status
    assert "error" in await resp.json()
    if status == 401:
        assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert jobs.patches == []


@pytest.mark.parametrize(
    ("refusal", "status", "headers"),
    [
        (errors.Unauthenticated("token revoked"), 401, {"WWW-Authenticate": "Bearer"}),
        (errors.Forbidden("not this job's head"), 403, {}),
        (errors.JobNotFound(), 404, {}),
        (errors.TooManyRequests(2.5, "slow down"), 429, {"Retry-After": "3"}),
        (errors.Busy(0.1), 429, {"Retry-After": "1"}),
        (errors.Unavailable("pod lookup failed with HTTP 500"), 503, {"Retry-After": "5"}),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, errors.Refusal) else None,
)
async def test_a_refusal_from_any_part_is_answered_with_its_own_status(
    jobs: Jobs, refusal: errors.Refusal, status: int, headers: dict[str, str]
):
    """One handler answers every refusal: the status its class names, its reason, its headers."""

    async def refusing(identity: Identity, job: Mapping[str, Any]) -> None:
        raise refusal

    app = make_app(authenticate=authenticate, authorise=refusing, jobs=jobs, limiter=RateLimiter(2, 10))
    async with TestClient(TestServer(app)) as client:
        resp = await client.post(URL, json=REPORT, headers=bearer("good"))
        assert (resp.status, await resp.json()) == (status, {"error": str(refusal)})
        assert {name: resp.headers[name] for name in headers} == headers
    assert str(errors.JobNotFound()) == "no such job" and str(errors.Busy(1)) == "busy"
    assert jobs.patches == []


async def test_nan_token_in_json_is_refused(http: TestClient, jobs: Jobs):
    body = b'{"progress": {"step": 1}, "metrics": {"trainLoss": NaN}}'
    resp = await http.post(URL, data=body, headers={**bearer("good"), "Content-Type": "application/json"})
    assert resp.status == 400
    assert jobs.patches == []


async def test_oversized_bodies_are_refused_declared_or_streamed(http: TestClient, jobs: Jobs):
    big = json.dumps({**REPORT, "pad": "x" * MAX_BODY_BYTES}).encode()
    resp = await http.post(URL, data=big, headers=bearer("good"))
    assert resp.status == 413

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY_BYTES // 1024 + 2):
            yield b" " * 1024

    resp = await http.post(URL, data=chunks(), headers=bearer("good"))
    assert resp.request_info.headers.get("Transfer-Encoding") == "chunked"
    assert resp.status == 413
    assert jobs.patches == []


async def test_flood_is_rate_limited(http: TestClient, jobs: Jobs):
    statuses = [(await http.post(URL, json=REPORT, headers=bearer("good"))) for _ in range(30)]
    codes = [r.status for r in statuses]
    assert codes[:10] == [204] * 10
    assert codes.count(204) <= 11, "burst of 10, plus at most one refill during the run"
    limited = [r for r in statuses if r.status == 429]
    assert limited and all(int(r.headers["Retry-After"]) >= 1 for r in limited)
    assert len(jobs.patches) == codes.count(204)


async def test_one_address_is_limited_before_any_token_is_looked_at(jobs: Jobs):
    seen: list[str] = []

    async def counting(token: str) -> Identity:
        seen.append(token)
        return await authenticate(token)

    app = make_app(
        authenticate=counting, authorise=authorise, jobs=jobs, limiter=RateLimiter(100, 100), sources=RateLimiter(1, 3)
    )
    async with TestClient(TestServer(app)) as client:
        answers = [await client.post(URL, json=REPORT, headers=bearer(f"junk-{i}")) for i in range(10)]
        assert [r.status for r in answers] == [401] * 3 + [429] * 7
        assert (await answers[-1].json()) == {"error": "source rate limited"} and len(seen) == 3


async def test_conflicting_writes_are_retried_on_fresh_status(http: TestClient, jobs: Jobs):
    jobs.objects["team-a", "job1"]["status"] = {"phase": "Running", "history": [{"step": 1, "trainLoss": 2.0}]}
    jobs.conflicts = 2
    resp = await http.post(URL, json=REPORT, headers=bearer("good"))
    assert resp.status == 204
    status = jobs.objects["team-a", "job1"]["status"]
    assert status["phase"] == "Running"
    assert [p["step"] for p in status["history"]] == [1, 5]


async def test_api_server_trouble_is_503(http: TestClient, jobs: Jobs):
    jobs.down = True
    resp = await http.post(URL, json=REPORT, headers=bearer("good"))
    assert resp.status == 503
    assert resp.headers["Retry-After"]


async def test_job_deleted_while_writing_is_404(http: TestClient, jobs: Jobs):
    original = jobs.patch_status

    async def delete_then_patch(namespace: str, name: str, patch: dict[str, Any]) -> None:
        jobs.objects.pop((namespace, name))
        await original(namespace, name, patch)

    jobs.patch_status = delete_then_patch  # type: ignore[method-assign]
    resp = await http.post(URL, json=REPORT, headers=bearer("good"))
    assert resp.status == 404


async def test_a_job_that_keeps_changing_is_503(http: TestClient, jobs: Jobs):
    jobs.conflicts = 10
    resp = await http.post(URL, json=REPORT, headers=bearer("good"))
    assert (resp.status, await resp.json(), resp.headers["Retry-After"]) == (503, {"error": "job kept changing"}, "5")
    assert jobs.patches == []


def test_config_from_env():
    assert ProgressServerConfig.from_env({}) is None, "off without the operator namespace"
    assert (
        ProgressServerConfig.from_env({"ROCMTRAIN_OPERATOR_NAMESPACE": "ops", "ROCMTRAIN_PROGRESS_PORT": "0"}) is None
    )
    cfg = ProgressServerConfig.from_env({"ROCMTRAIN_OPERATOR_NAMESPACE": "ops"})
    assert cfg is not None and cfg.port == 8443 and cfg.manage_tls
    assert cfg.base_url == "https://rocmtrain-progress.ops.svc"
    assert "rocmtrain-progress.ops.svc.cluster.local" in cfg.hosts
    local = ProgressServerConfig.from_env(
        {
            "ROCMTRAIN_OPERATOR_NAMESPACE": "ops",
            "ROCMTRAIN_PROGRESS_ADVERTISE_HOST": "operator.example.test",
            "ROCMTRAIN_PROGRESS_ADVERTISE_PORT": "9443",
            "ROCMTRAIN_PROGRESS_MANAGE_TLS": "false",
        }
    )
    assert local is not None and not local.manage_tls
    assert local.base_url == "https://operator.example.test:9443"
    assert local.hosts[-1] == "operator.example.test"
    for bad in ({"ROCMTRAIN_PROGRESS_PORT": "http"}, {"ROCMTRAIN_OPERATOR_NAMESPACE": "Not_A_Namespace"}):
        with pytest.raises(ValueError, match="ROCMTRAIN_"):
            ProgressServerConfig.from_env({"ROCMTRAIN_OPERATOR_NAMESPACE": "ops", **bad})


def test_render_options_point_the_head_pod_at_the_endpoint():
    cfg = ProgressServerConfig(namespace="ops")
    job = RocmTrainingJob.model_validate(
        {
            "metadata": {"name": "job1", "namespace": "team-a"},
            "spec": {"model": {"source": "org/model", "numLabels": 2}, "data": {"train": {"uri": "/data/t.jsonl"}}},
        }
    )
    rayjob = render_rayjob(job, options=cfg.render_options(RenderOptions()))
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in head["containers"][0]["env"]}
    assert env["ROCMTRAIN_PROGRESS_URL"] == "https://rocmtrain-progress.ops.svc" + progress_path("team-a", "job1")
    sources = next(v for v in head["volumes"] if "projected" in v)["projected"]["sources"]
    assert {"audience": PROGRESS_AUDIENCE, "expirationSeconds": 3600, "path": "token"} in [
        s.get("serviceAccountToken") for s in sources
    ]
    assert [s["configMap"]["name"] for s in sources if "configMap" in s] == [tls.CA_CONFIGMAP]


async def test_a_new_best_trial_posts_one_event_and_hands_its_change_to_the_notifications(jobs: Jobs):
    changes: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []
    app = make_app(
        authenticate=authenticate,
        authorise=authorise,
        jobs=jobs,
        limiter=RateLimiter(100, 100),
        now=lambda: NOW,
        notify=lambda job, old, new: changes.append((old, new)),
    )
    tuning = {"metric": "evalLoss", "mode": "min", "trialsTotal": 2, "trialsRunning": 2}
    best = {"bestTrialId": "t_1", "bestMetric": 0.5}
    async with TestClient(TestServer(app)) as client:
        for extra in ({}, best, best, {"bestTrialId": "t_2", "bestMetric": 0.25}):
            body = {"progress": {"step": 0, "totalSteps": 2}, "tuning": {**tuning, **extra}}
            assert (await client.post(URL, json=body, headers=bearer("good"))).status == 204
    assert jobs.events == [("job1", "Normal", Reason.NEW_BEST_TRIAL)] * 2
    assert jobs.objects["team-a", "job1"]["status"]["tuning"]["bestTrialId"] == "t_2"
    found = [notice for old, new in changes for notice in notifications.notices(old, new)]
    assert [(n.event, n.message) for n in found] == [
        ("NewBestTrial", "trial t_1 is the best so far: evalLoss=0.5"),
        ("NewBestTrial", "trial t_2 is the best so far: evalLoss=0.25"),
    ]


async def test_events_from_reports_are_limited_per_job_and_reason(jobs: Jobs):
    """A best trial that changes with every report posts a few events, then one a minute."""
    clock = [0.0]
    app = make_app(
        authenticate=authenticate,
        authorise=authorise,
        jobs=jobs,
        limiter=RateLimiter(100, 100),
        sources=RateLimiter(100, 100),
        events=RateLimiter(1 / 60, 3, clock=lambda: clock[0]),
    )
    tuning = {"metric": "evalLoss", "mode": "min", "trialsTotal": 2, "trialsRunning": 2}
    async with TestClient(TestServer(app)) as client:
        for i in range(20):
            best = {"bestTrialId": f"t_{i % 2}", "bestMetric": 0.5 - i / 100}
            body = {"progress": {"step": i, "totalSteps": 40}, "tuning": {**tuning, **best}}
            assert (await client.post(URL, json=body, headers=bearer("good"))).status == 204
        assert len(jobs.events) == 3
        clock[0] = 60.0
        body = {"progress": {"step": 30, "totalSteps": 40}, "tuning": {**tuning, "bestTrialId": "t_9", "bestMetric": 0}}
        assert (await client.post(URL, json=body, headers=bearer("good"))).status == 204
    assert len(jobs.events) == 4
    assert jobs.objects["team-a", "job1"]["status"]["tuning"]["bestTrialId"] == "t_9", "the status still follows"


# ---- Kubeflow Trainer's protocol (KEP-2779): the same admission and limits, on its own path ----------------

KEP_URL = "/v1/namespaces/team-a/rocmtrainingjobs/job1/trainerstatus"
KEP = {
    "trainerStatus": {
        "progressPercentage": 30,
        "estimatedRemainingSeconds": 70,
        "metrics": [{"name": "loss", "value": "0.7"}, {"name": "current_step", "value": "12"}],
        "lastUpdatedTime": "2025-03-01T00:00:00+00:00",
    }
}


async def test_a_kubeflow_report_updates_the_status_like_ours(http: TestClient, jobs: Jobs):
    resp = await http.post(KEP_URL, json=KEP, headers=bearer("good"))
    assert resp.status == 204
    status = jobs.objects["team-a", "job1"]["status"]
    assert status["progress"] == {"step": 12, "percent": 30, "etaSeconds": 70}
    assert status["metrics"] == {"trainLoss": 0.7} and status["history"] == [{"step": 12, "trainLoss": 0.7}]
    assert status["lastProgressTime"] == "2025-03-01T00:00:00Z"


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({}, json.dumps(KEP).encode(), 401),
        (bearer("forged"), json.dumps(KEP).encode(), 401),
        (bearer("other-ns"), json.dumps(KEP).encode(), 403),
        (bearer("good"), b'{"trainerStatus": {"progressPercentage": NaN}}', 400),
        (bearer("good"), json.dumps({"trainerStatus": {"metrics": [{"name": "loss", "value": "nan"}]}}).encode(), 400),
        (
            bearer("good"),
            json.dumps({"trainerStatus": {"metrics": [{"name": f"m{i}", "value": "1"} for i in range(33)]}}).encode(),
            400,
        ),
        (bearer("good"), json.dumps(REPORT).encode(), 400),
        (bearer("good"), json.dumps({**KEP, "pad": "x" * MAX_BODY_BYTES}).encode(), 413),
    ],
    ids=["no-token", "forged", "other-namespace", "nan", "nan-string", "too-many-metrics", "our-body", "too-large"],
)
async def test_the_kubeflow_path_refuses_what_ours_refuses(
    http: TestClient, jobs: Jobs, headers: dict, body: bytes, status: int
):
    resp = await http.post(KEP_URL, data=body, headers={**headers, "Content-Type": "application/json"})
    assert resp.status == status and "error" in await resp.json()
    assert jobs.patches == []


async def test_an_ended_job_takes_no_kubeflow_report_either(http: TestClient, jobs: Jobs):
    jobs.objects["team-a", "job1"]["status"] = {"phase": "Succeeded"}
    resp = await http.post(KEP_URL, json=KEP, headers=bearer("good"))
    assert resp.status == 409 and not jobs.patches


async def test_both_paths_share_the_jobs_rate(http: TestClient, jobs: Jobs):
    codes = [
        (await http.post(url, json=body, headers=bearer("good"))).status
        for url, body in [(URL, REPORT), (KEP_URL, KEP)] * 8
    ]
    assert codes[:10] == [204] * 10 and codes.count(429) >= 4, codes
