"""Screening tokens, reading TokenReview answers and matching pods to jobs (pure, no cluster)."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable

import pytest

from fakes import api_answering
from rocmtrain.api.contract import JOB_NAME_LABEL, PROGRESS_AUDIENCE, RAY_CLUSTER_LABEL
from rocmtrain.progress.auth import (
    POD_NAME_EXTRA,
    POD_UID_EXTRA,
    RAY_NODE_TYPE_LABEL,
    Identity,
    identity_from_review,
    ray_pod_of_job,
    token_claims,
)
from rocmtrain.serving.errors import Forbidden, Unauthenticated
from rocmtrain.serving.reviews import MAX_TOKEN_BYTES, TtlCache

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
BOUND = {
    "authenticated": True,
    "audiences": [PROGRESS_AUDIENCE],
    "user": {
        "username": "system:serviceaccount:team-a:ray-head",
        "extra": {POD_NAME_EXTRA: ["job1-abcde-head-x1y2z"], POD_UID_EXTRA: ["0f1e"]},
    },
}


def test_bound_service_account_token_names_its_pod():
    assert identity_from_review(BOUND, PROGRESS_AUDIENCE) == Identity(
        "team-a", "ray-head", "job1-abcde-head-x1y2z", "0f1e"
    )


@pytest.mark.parametrize(
    "status",
    [
        {},
        {**BOUND, "authenticated": False},
        {**BOUND, "audiences": ["https://kubernetes.default.svc.cluster.local"]},
        {**BOUND, "audiences": None},
    ],
)
def test_rejected_or_other_audience_is_unauthenticated(status: dict):
    with pytest.raises(Unauthenticated):
        identity_from_review(status, PROGRESS_AUDIENCE)


@pytest.mark.parametrize(
    "user",
    [
        {"username": "alice", "extra": BOUND["user"]["extra"]},
        {"username": "system:serviceaccount:team-a", "extra": BOUND["user"]["extra"]},
        {"username": "system:serviceaccount:team-a:ray-head"},
        {"username": "system:serviceaccount:team-a:ray-head", "extra": {POD_NAME_EXTRA: ["p"]}},
        {
            "username": "system:serviceaccount:team-a:ray-head",
            "extra": {POD_NAME_EXTRA: ["p", "q"], POD_UID_EXTRA: ["u"]},
        },
    ],
    ids=["user", "malformed-sa", "unbound", "no-uid", "two-pods"],
)
def test_tokens_not_bound_to_exactly_one_pod_are_forbidden(user: dict):
    with pytest.raises(Forbidden):
        identity_from_review({**BOUND, "user": user}, PROGRESS_AUDIENCE)


def _jwt(claims: object, header: bytes = b'{"alg":"RS256"}') -> str:
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    return f"{b64(header)}.{b64(json.dumps(claims).encode())}.{b64(b'signature')}"


NOW = 1_800_000_000.0
CLAIMS = {"aud": [PROGRESS_AUDIENCE], "exp": NOW + 600, "sub": "system:serviceaccount:team-a:ray-head"}


def test_well_formed_tokens_for_our_audience_go_to_tokenreview():
    assert token_claims(_jwt(CLAIMS), PROGRESS_AUDIENCE, NOW) == CLAIMS
    assert token_claims(_jwt({**CLAIMS, "aud": PROGRESS_AUDIENCE}), PROGRESS_AUDIENCE, NOW)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "junk",
        "a.b",
        "a.b.c.d",
        "a b.c.d",
        _jwt(CLAIMS) + "=",
        "x" * 10 + "." + "y" * (MAX_TOKEN_BYTES) + ".z",
        "e30.!!!.e30",
        "e30.bm90IGpzb24.e30",
        _jwt(["a", "list"]),
        _jwt({**CLAIMS, "aud": ["https://kubernetes.default.svc"]}),
        _jwt({**CLAIMS, "aud": None}),
        _jwt({key: value for key, value in CLAIMS.items() if key != "exp"}),
        _jwt({**CLAIMS, "exp": NOW}),
        _jwt({**CLAIMS, "exp": "tomorrow"}),
    ],
    ids=[
        "empty", "word", "two-parts", "four-parts", "space", "padding", "too-long", "bad-base64", "not-json",
        "not-object", "other-audience", "no-audience", "no-expiry", "expired", "expiry-text",
    ],
)  # fmt: skip
def test_junk_is_refused_before_any_tokenreview(token: str):
    with pytest.raises(Unauthenticated):
        token_claims(token, PROGRESS_AUDIENCE, NOW)


JOB = {
    "metadata": {"name": "job1", "namespace": "team-a", "uid": "job-uid"},
    "status": {"rayJobName": "job1", "rayClusterName": "job1-abcde"},
}
RAYJOB = {
    "metadata": {
        "name": "job1",
        "uid": "rayjob-uid",
        "ownerReferences": [{"kind": "RocmTrainingJob", "name": "job1", "uid": "job-uid", "controller": True}],
    }
}
RAYCLUSTER = {
    "metadata": {
        "name": "job1-abcde",
        "uid": "cluster-uid",
        "ownerReferences": [{"kind": "RayJob", "name": "job1", "uid": "rayjob-uid", "controller": True}],
    }
}
HEAD = {
    "metadata": {
        "name": "job1-abcde-head-x1y2z",
        "uid": "pod-uid",
        "labels": {RAY_CLUSTER_LABEL: "job1-abcde", RAY_NODE_TYPE_LABEL: "head", JOB_NAME_LABEL: "job1"},
        "ownerReferences": [{"kind": "RayCluster", "name": "job1-abcde", "uid": "cluster-uid", "controller": True}],
    }
}


def _with(obj: dict, **meta: object) -> dict:
    return {**obj, "metadata": {**obj["metadata"], **meta}}


def test_the_jobs_head_pod_may_report():
    assert ray_pod_of_job(HEAD, RAYCLUSTER, RAYJOB, JOB) is None
    unnamed = {**JOB, "status": {}}  # before the operator has copied the names into the status
    assert ray_pod_of_job(HEAD, RAYCLUSTER, RAYJOB, unnamed) is None


FORGED_LABELS = _with(HEAD, ownerReferences=[])
WORKER = _with(HEAD, labels={**HEAD["metadata"]["labels"], RAY_NODE_TYPE_LABEL: "worker"})
OTHER_CLUSTER_LABEL = _with(HEAD, labels={**HEAD["metadata"]["labels"], RAY_CLUSTER_LABEL: "x"})


@pytest.mark.parametrize(
    ("pod", "raycluster", "rayjob", "job", "words"),
    [
        (FORGED_LABELS, RAYCLUSTER, RAYJOB, JOB, "not controlled by the job's RayCluster"),
        (WORKER, RAYCLUSTER, RAYJOB, JOB, "not a Ray head"),
        (_with(HEAD, labels={RAY_CLUSTER_LABEL: "job1-abcde"}), RAYCLUSTER, RAYJOB, JOB, "not a Ray head"),
        (
            _with(HEAD, ownerReferences=[{**HEAD["metadata"]["ownerReferences"][0], "controller": False}]),
            RAYCLUSTER, RAYJOB, JOB, "not controlled",
        ),
        (OTHER_CLUSTER_LABEL, RAYCLUSTER, RAYJOB, JOB, "not controlled"),
        (HEAD, _with(RAYCLUSTER, uid="other"), RAYJOB, JOB, "not controlled"),
        (HEAD, RAYCLUSTER, RAYJOB, {**JOB, "status": {"rayClusterName": "job1-zzzzz"}}, "another Ray cluster"),
        (HEAD, _with(RAYCLUSTER, ownerReferences=[]), RAYJOB, JOB, "not the job's RayJob's"),
        (HEAD, RAYCLUSTER, _with(RAYJOB, name="impostor"), JOB, "not the job's RayJob's"),
        (HEAD, RAYCLUSTER, _with(RAYJOB, uid="other"), JOB, "not the job's RayJob's"),
        (HEAD, RAYCLUSTER, RAYJOB, _with(JOB, uid="another-job"), "not this job's"),
    ],
    ids=[
        "forged-labels", "worker", "no-node-type", "owner-not-controller", "other-cluster-label", "cluster-replaced",
        "job-names-another-cluster", "cluster-not-from-a-rayjob", "rayjob-named-otherwise", "rayjob-replaced",
        "rayjob-of-another-job",
    ],
)  # fmt: skip
def test_only_the_head_of_the_jobs_own_ray_cluster_may_report(pod, raycluster, rayjob, job, words: str):
    why = ray_pod_of_job(pod, raycluster, rayjob, job)
    assert why is not None and words in why


CODE_JOB = {**JOB, "spec": {"code": {"command": ["python", "/code/train.py"]}}}


def test_a_job_running_its_own_code_takes_reports_from_its_workers_too():
    """Ray Train's rank 0, where transformers' KubeflowCallback reports from, runs on a worker pod."""
    assert ray_pod_of_job(WORKER, RAYCLUSTER, RAYJOB, CODE_JOB) is None
    assert ray_pod_of_job(HEAD, RAYCLUSTER, RAYJOB, CODE_JOB) is None
    no_node_type = _with(HEAD, labels={RAY_CLUSTER_LABEL: "job1-abcde"})  # the submitter, or any pod at all
    assert "not a Ray pod of the job" in (ray_pod_of_job(no_node_type, RAYCLUSTER, RAYJOB, CODE_JOB) or "")
    forged_worker = _with(WORKER, ownerReferences=[])
    assert "not controlled" in (ray_pod_of_job(forged_worker, RAYCLUSTER, RAYJOB, CODE_JOB) or "")
    assert ray_pod_of_job(WORKER, RAYCLUSTER, RAYJOB, _with(CODE_JOB, uid="x")) == "the RayJob is not this job's"


def test_ttl_cache_expires_and_stays_bounded():
    now = [0.0]
    cache: TtlCache[str, int] = TtlCache(ttl=10, size=2, clock=lambda: now[0])
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.get("b") is None, "least recently used goes first"
    assert cache.get("a") == 1
    now[0] = 10.0
    assert cache.get("a") is None and cache.get("c") is None


def test_ttl_cache_never_keeps_an_entry_past_its_own_end():
    now = [0.0]
    cache: TtlCache[str, int] = TtlCache(ttl=60, size=2, clock=lambda: now[0])
    cache.put("token", 1, until=5.0)
    now[0] = 5.0
    assert cache.get("token") is None


@pytest.mark.parametrize("code", [404, 409, 500])
async def test_any_tokenreview_failure_is_unavailable_never_a_crash(code: int):
    """404 (the API not served) or 409 from TokenReview is the API server's trouble: 503, not a 500 and a traceback."""
    from aiohttp import web

    from rocmtrain.progress.auth import TokenReviewAuthenticator
    from rocmtrain.serving.errors import Unavailable

    async def answer(_: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "code": code}, status=code)

    async with api_answering({TOKEN_REVIEWS: answer}) as api:
        authenticate = TokenReviewAuthenticator(api, wall_clock=lambda: NOW)
        with pytest.raises(Unavailable):
            await authenticate(_jwt(CLAIMS))


@contextlib.asynccontextmanager
async def _token_reviews(accepted: Callable[[str], bool], reviewed: list[str]):
    """An API client whose TokenReviews a local server answers: `accepted(token)` decides, `reviewed` lists them."""
    from aiohttp import web

    async def review(request: web.Request) -> web.Response:
        token = (await request.json())["spec"]["token"]
        reviewed.append(token)
        status = BOUND if accepted(token) else {"authenticated": False}
        return web.json_response(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": ""}, "status": status}
        )

    async with api_answering({TOKEN_REVIEWS: review}) as api:
        yield api


def _token_paths() -> dict[str, float]:
    """The metrics of the path each token took so far: reviewed, or unreviewed from the cache, by shape, by budget."""
    from rocmtrain.metrics.prometheus import REGISTRY

    unreviewed = "rocmtrain_progress_tokens_unreviewed_total"
    paths = {why: REGISTRY.get_sample_value(unreviewed, {"why": why}) or 0.0 for why in ("cache", "shape", "budget")}
    return {**paths, "review": REGISTRY.get_sample_value("rocmtrain_progress_token_reviews_total") or 0.0}


async def test_reviews_are_cached_refusals_apart_and_kept_within_their_budget():
    """Accepted and refused answers are cached apart (refusals never push out an accepted token), and
    TokenReviews beyond the budget are refused as Busy before they are sent; the metrics count each path."""
    from rocmtrain.progress.auth import CACHE_ENTRIES, TokenReviewAuthenticator
    from rocmtrain.serving.errors import Busy
    from rocmtrain.serving.rate import RateLimiter

    before = _token_paths()
    reviewed: list[str] = []
    good = _jwt({**CLAIMS, "sub": "good"})
    async with _token_reviews(lambda token: token == good, reviewed) as api:
        generous = TokenReviewAuthenticator(api, wall_clock=lambda: NOW, reviews=RateLimiter(1e6, 10**6))
        assert await generous(good) == await generous(good) and reviewed == [good]
        refused = [_jwt({**CLAIMS, "sub": f"forged-{i}"}) for i in range(CACHE_ENTRIES + 100)]
        for token in refused:
            with pytest.raises(Unauthenticated):
                await generous(token)
        with pytest.raises(Unauthenticated):
            await generous(refused[-1])  # cached refusal: no review
        with pytest.raises(Unauthenticated):
            await generous("junk")  # no review at all
        assert await generous(good) and len(reviewed) == 1 + len(refused), "the accepted token is still cached"
        reviewed.clear()
        clock = [0.0]
        tight = TokenReviewAuthenticator(
            api, wall_clock=lambda: NOW, reviews=RateLimiter(1.0, 3, clock=lambda: clock[0])
        )
        outcomes = []
        for i in range(10):
            try:
                await tight(_jwt({**CLAIMS, "sub": f"flood-{i}"}))
            except (Busy, Unauthenticated) as exc:
                outcomes.append(type(exc).__name__)
        assert outcomes == ["Unauthenticated"] * 3 + ["Busy"] * 7 and len(reviewed) == 3
    paths = {path: count - before[path] for path, count in _token_paths().items()}
    assert paths == {"cache": 3, "shape": 1, "budget": 7, "review": 1 + len(refused) + 3}


async def test_forgeries_never_take_the_reviews_of_a_pod_that_reported():
    """Forged tokens spend the shared budget of pods without an accepted token; the driver whose token was
    accepted still has its next token (rotated by the kubelet) reviewed. Forgeries that name no pod, or a pod
    that has not reported, stay in the shared budget."""
    from rocmtrain.progress.auth import TokenReviewAuthenticator, claimed_pod_uid
    from rocmtrain.serving.errors import Busy
    from rocmtrain.serving.rate import RateLimiter

    reviewed: list[str] = []
    clock = [0.0]

    def of_pod(uid: str, sub: str) -> str:
        return _jwt({**CLAIMS, "sub": sub, "kubernetes.io": {"namespace": "team-a", "pod": {"name": "p", "uid": uid}}})

    # The driver's pod is the one the review names (BOUND's pod uid).
    first, rotated = of_pod("0f1e", "driver-1"), of_pod("0f1e", "driver-2")
    assert claimed_pod_uid(json.loads(base64.urlsafe_b64decode(first.split(".")[1] + "=="))) == "0f1e"
    async with _token_reviews(lambda token: token in (first, rotated), reviewed) as api:
        authenticate = TokenReviewAuthenticator(
            api, clock=lambda: clock[0], wall_clock=lambda: NOW, reviews=RateLimiter(1.0, 3, clock=lambda: clock[0])
        )
        assert await authenticate(first)  # its first report: from the shared budget
        outcomes = []
        for i in range(20):
            forged = of_pod(f"guess-{i}", f"forged-{i}") if i % 2 else _jwt({**CLAIMS, "sub": f"forged-{i}"})
            try:
                await authenticate(forged)
            except (Busy, Unauthenticated) as exc:
                outcomes.append(type(exc).__name__)
        assert outcomes == ["Unauthenticated"] * 2 + ["Busy"] * 18, "the shared budget is spent"
        assert await authenticate(rotated), "the driver's next token is still reviewed"
        assert len(reviewed) == 4


async def test_forgeries_claiming_a_reporting_pod_spend_its_few_own_reviews_then_the_shared_budget():
    """Whoever knows a reporting pod's uid gets no more reviews than `KNOWN_POD_REVIEW_BURST` out of the
    shared budget by claiming it; then the claims share the budget, and refill at the pod's own rate."""
    from rocmtrain.progress.auth import (
        KNOWN_POD_REVIEW_BURST,
        KNOWN_POD_REVIEW_RATE_PER_SECOND,
        TokenReviewAuthenticator,
    )
    from rocmtrain.serving.errors import Busy
    from rocmtrain.serving.rate import RateLimiter

    reviewed: list[str] = []
    clock = [0.0]

    def claiming_the_driver(sub: str) -> str:
        pod = {"name": "p", "uid": "0f1e"}
        return _jwt({**CLAIMS, "sub": sub, "kubernetes.io": {"namespace": "team-a", "pod": pod}})

    driver = claiming_the_driver("driver-1")
    async with _token_reviews(lambda token: token == driver, reviewed) as api:
        authenticate = TokenReviewAuthenticator(
            api, clock=lambda: clock[0], wall_clock=lambda: NOW, reviews=RateLimiter(1.0, 3, clock=lambda: clock[0])
        )
        assert await authenticate(driver)  # one of the shared 3

        async def outcomes(count: int, start: int) -> list[str]:
            seen = []
            for i in range(start, start + count):
                try:
                    await authenticate(claiming_the_driver(f"forged-{i}"))
                except (Busy, Unauthenticated) as exc:
                    seen.append(type(exc).__name__)
            return seen

        own, shared = KNOWN_POD_REVIEW_BURST, 2
        assert await outcomes(own + shared + 3, 0) == ["Unauthenticated"] * (own + shared) + ["Busy"] * 3
        assert len(reviewed) == 1 + own + shared
        clock[0] += 1 / KNOWN_POD_REVIEW_RATE_PER_SECOND  # one of the pod's own again (and 3 of the shared, refilled)
        assert await outcomes(5, 100) == ["Unauthenticated"] * 4 + ["Busy"]
