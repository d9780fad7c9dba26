"""Who may read /metrics: the decisions (pure), their caches and review budgets, and the HTTP answers.

The reviews here are answered by a local stand-in for the API server's TokenReview and
SubjectAccessReview APIs (it records what it is asked); the real kube-apiserver and RBAC
decide in tests/progress/test_operator_wiring.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kubernetes_asyncio import client

from fakes import Clock, api_answering
from rocmtrain.metrics import access as metrics_access
from rocmtrain.metrics.access import (
    FORBIDDEN_SECONDS,
    SOURCE_REVIEW_BURST,
    UNAUTHENTICATED_SECONDS,
    MetricsAccess,
    access_review_spec,
    require_allowed,
)
from rocmtrain.metrics.server import metrics_app
from rocmtrain.serving.errors import Busy, Forbidden, TooManyRequests, Unauthenticated, Unavailable
from rocmtrain.serving.rate import RateLimiter
from rocmtrain.serving.reviews import MAX_TOKEN_BYTES

PROMETHEUS = {
    "username": "system:serviceaccount:monitoring:prometheus",
    "uid": "5d0c",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:monitoring", "system:authenticated"],
    "extra": {"authentication.kubernetes.io/credential-id": ["JTI=7f1e"]},
}
READER = "reader-token"


def test_the_user_a_token_names_is_asked_about_get_on_metrics_with_all_it_is():
    spec = access_review_spec({"authenticated": True, "user": PROMETHEUS, "audiences": ["https://kubernetes"]})
    assert spec == {
        "user": PROMETHEUS["username"],
        "uid": PROMETHEUS["uid"],
        "groups": PROMETHEUS["groups"],
        "extra": PROMETHEUS["extra"],
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }


@pytest.mark.parametrize(
    "status",
    [
        {},
        {"authenticated": False, "error": "token expired"},
        {"authenticated": True},
        {"authenticated": True, "user": {}},
    ],
)
def test_a_token_the_api_server_does_not_vouch_for_is_unauthenticated(status: dict):
    with pytest.raises(Unauthenticated):
        access_review_spec(status)


@pytest.mark.parametrize(
    "status",
    [
        {},
        {"allowed": False},
        {"allowed": False, "denied": True},
        {"allowed": False, "evaluationError": "x"},
        {"allowed": "true"},
    ],
)
def test_only_an_explicit_allow_lets_a_scrape_in(status: dict):
    require_allowed({"allowed": True}, "someone")
    with pytest.raises(Forbidden, match="someone may not get /metrics"):
        require_allowed(status, "someone")


@contextlib.asynccontextmanager
async def review_api(asked: list[tuple[str, str]], *, fail: int | None = None) -> AsyncIterator[client.ApiClient]:
    """An API client whose reviews a local server answers, recording each (kind, token or user).

    Tokens "<name>-token" are accepted as user "<name>"; only "reader" may get /metrics.
    `fail`: answer every review with this HTTP status instead.
    """

    async def token_review(request: web.Request) -> web.Response:
        token = (await request.json())["spec"]["token"]
        asked.append(("TokenReview", token))
        if fail:
            return web.json_response({"kind": "Status", "code": fail}, status=fail)
        name, _, suffix = token.partition("-")
        status = {"authenticated": True, "user": {"username": name}} if suffix == "token" else {"authenticated": False}
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        return web.json_response({**review, "status": status})

    async def access_review(request: web.Request) -> web.Response:
        spec = (await request.json())["spec"]
        asked.append(("SubjectAccessReview", spec["user"]))
        assert spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        status = {"allowed": spec["user"] == "reader"}
        return web.json_response(
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec, "status": status}
        )

    posts = {
        "/apis/authentication.k8s.io/v1/tokenreviews": token_review,
        "/apis/authorization.k8s.io/v1/subjectaccessreviews": access_review,
    }
    async with api_answering(posts) as api:
        yield api


@pytest.mark.parametrize(
    "header",
    ["", "Basic cmVhZGVyOnB3", "Bearer", "Bearer ", "Bearer " + "x" * (MAX_TOKEN_BYTES + 1), "Bearer tök-token"],
)
async def test_no_bearer_token_is_unauthenticated_without_any_review(header: str):
    asked: list[tuple[str, str]] = []
    async with review_api(asked) as api:
        with pytest.raises(Unauthenticated):
            await MetricsAccess(api)(header, "10.0.0.1")
    assert asked == []


async def test_answers_are_cached_refusals_apart_and_a_denial_only_briefly(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(metrics_access, "REFUSED_ENTRIES", 4)  # so that a few refusals fill their cache
    asked: list[tuple[str, str]] = []
    clock = Clock(0.0)
    async with review_api(asked) as api:
        access = MetricsAccess(api, clock=clock, reviews=RateLimiter(1e6, 10**6))
        await access(f"Bearer {READER}", "10.0.0.1")
        await access(f"bearer {READER}", "10.0.0.1")
        assert asked == [("TokenReview", READER), ("SubjectAccessReview", "reader")], "one review each, then cached"
        for _ in range(2):
            with pytest.raises(Forbidden):
                await access("Bearer nobody-token", "10.0.0.2")
            with pytest.raises(Unauthenticated):
                await access("Bearer forged", "10.0.0.3")
        assert asked[2:] == [
            ("TokenReview", "nobody-token"),
            ("SubjectAccessReview", "nobody"),
            ("TokenReview", "forged"),
        ]
        for i in range(10):  # more refusals than their cache holds, from as many addresses
            with pytest.raises(Unauthenticated):
                await access(f"Bearer forged-{i}", f"10.0.1.{i}")
        del asked[:]
        await access(f"Bearer {READER}", "10.0.0.1")
        assert asked == [], "the allowed token was never pushed out"
        clock.now += FORBIDDEN_SECONDS
        with pytest.raises(Forbidden):
            await access("Bearer nobody-token", "10.0.0.2")
        assert asked == [("TokenReview", "nobody-token"), ("SubjectAccessReview", "nobody")], "a denial is kept 30 s"
        assert FORBIDDEN_SECONDS < UNAUTHENTICATED_SECONDS


async def test_new_tokens_are_reviewed_within_a_budget_per_address_and_one_for_all():
    asked: list[tuple[str, str]] = []
    clock = Clock(0.0)
    async with review_api(asked) as api:
        access = MetricsAccess(api, clock=clock, reviews=RateLimiter(1.0, SOURCE_REVIEW_BURST + 2, clock=clock))
        for i in range(SOURCE_REVIEW_BURST):
            with pytest.raises(Unauthenticated):
                await access(f"Bearer forged-{i}", "10.0.0.66")
        with pytest.raises(TooManyRequests) as over:
            await access("Bearer forged-more", "10.0.0.66")
        assert not isinstance(over.value, Busy), "that address's own budget, not the common one"
        await access(f"Bearer {READER}", "10.0.0.1")  # Prometheus, from its own address, is still reviewed
        with pytest.raises(Forbidden):
            await access("Bearer nobody-token", "10.0.0.2")
        with pytest.raises(Busy):  # the common budget is spent now, whatever the address
            await access("Bearer other-token", "10.0.0.3")
        assert len([kind for kind, _ in asked if kind == "TokenReview"]) == SOURCE_REVIEW_BURST + 2


async def test_a_review_the_api_server_does_not_answer_is_unavailable_and_not_cached():
    asked: list[tuple[str, str]] = []
    async with review_api(asked, fail=500) as api:
        access = MetricsAccess(api)
        for _ in range(2):
            with pytest.raises(Unavailable):
                await access(f"Bearer {READER}", "10.0.0.1")
    assert len(asked) == 2, "asked again: the API server's trouble says nothing of the token"


@pytest.mark.parametrize(
    ("refusal", "status", "header"),
    [
        (Unauthenticated("bearer token required"), 401, ("WWW-Authenticate", "Bearer")),
        (Forbidden("nobody may not get /metrics"), 403, None),
        (Busy(2.5), 429, ("Retry-After", "3")),
        (Unavailable("TokenReview failed with HTTP 500"), 503, ("Retry-After", "5")),
    ],
)
async def test_a_refused_scrape_gets_its_answer_and_no_metrics(refusal, status: int, header):
    async def refuse(authorization: str, source: str) -> None:
        raise refusal

    async with TestClient(TestServer(metrics_app(refuse))) as scraper:
        response = await scraper.get("/metrics")
        text = await response.text()
    assert response.status == status and text == f"{refusal}\n"
    assert "rocmtrain_" not in text
    if header is not None:
        assert response.headers[header[0]] == header[1]


async def test_an_allowed_scrape_gets_the_metrics_and_access_sees_its_header_and_address():
    seen: list[tuple[str, str]] = []

    async def allow(authorization: str, source: str) -> None:
        seen.append((authorization, source))

    async with TestClient(TestServer(metrics_app(allow))) as scraper:
        response = await scraper.get("/metrics", headers={"Authorization": f"Bearer {READER}"})
        text = await response.text()
    assert response.status == 200 and "# TYPE rocmtrain_jobs gauge" in text
    assert seen == [(f"Bearer {READER}", "127.0.0.1")]
