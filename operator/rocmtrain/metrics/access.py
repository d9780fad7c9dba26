"""Who may read `/metrics`: kube-rbac-proxy's check (controller-runtime's `WithAuthenticationAndAuthorization`).

A scrape carries a bearer token: Prometheus sends its ServiceAccount's. The API server
says whose it is (a TokenReview for its own audiences, so a progress token, made for
`rocmtrain.dev/progress`, is no key here), then whether that user may `get` the
non-resource URL `/metrics` (a SubjectAccessReview): RBAC's `nonResourceURLs:
["/metrics"]`, which the `rocm-train-operator-metrics-reader` ClusterRole grants, as do
the Prometheus roles of kube-prometheus and kube-prometheus-stack. No token, or one the
API server does not accept, is 401; a user without the right is 403.

The answers are cached under a hash of the token: a scrape allowed for a minute, a 401
for a minute and a 403 for 30 s (so a new binding soon takes effect), refusals apart from
the allowed (a flood of refused tokens never pushes Prometheus' out). A token not in the
cache costs two reviews, sent within a budget per source address and a smaller one for
all: beyond them the scrape is 429 before anything is sent, so no client can make the
operator flood the API server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio import client

from rocmtrain.serving.errors import Forbidden, Refusal, TooManyRequests, Unauthenticated
from rocmtrain.serving.rate import RateLimiter
from rocmtrain.serving.reviews import (
    ReviewBudget,
    TtlCache,
    bearer_token,
    subject_access_review,
    token_key,
    token_review,
)

METRICS_PATH = "/metrics"
ALLOWED_SECONDS = 60.0
UNAUTHENTICATED_SECONDS = 60.0
FORBIDDEN_SECONDS = 30.0
ALLOWED_ENTRIES = 256
REFUSED_ENTRIES = 1024
# Reviews for tokens not in the cache: each source address a few, then one every 5 s (a scraper's
# token needs one a minute), and all of them together 2 a second, at most 2 at once.
SOURCE_REVIEW_RATE_PER_SECOND = 0.2
SOURCE_REVIEW_BURST = 5
REVIEW_RATE_PER_SECOND = 2.0
REVIEW_BURST = 10
REVIEWS_AT_ONCE = 2


def access_review_spec(token_status: Mapping[str, Any], path: str = METRICS_PATH) -> dict[str, Any]:
    """The SubjectAccessReview spec asking whether the user a TokenReview `status` names may `get` `path`.

    Raise Unauthenticated when the review did not authenticate the token.
    """
    user = token_status.get("user") or {}
    if not token_status.get("authenticated") or not user.get("username"):
        raise Unauthenticated("token not accepted")
    spec: dict[str, Any] = {"user": user["username"], "nonResourceAttributes": {"path": path, "verb": "get"}}
    for key in ("uid", "groups", "extra"):
        if user.get(key):
            spec[key] = user[key]
    return spec


def require_allowed(access_status: Mapping[str, Any], user: str, path: str = METRICS_PATH) -> None:
    """Return when a SubjectAccessReview `status` allows; raise Forbidden otherwise (denied, or no opinion)."""
    if access_status.get("allowed") is not True:
        raise Forbidden(f"{user} may not get {path}")


class MetricsAccess:
    """Decide a scrape from its `Authorization` header and source address (see the module docstring)."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        clock: Callable[[], float] = time.monotonic,
        reviews: RateLimiter | None = None,
    ) -> None:
        self._api = api
        self._clock = clock
        self._allowed: TtlCache[bytes, bool] = TtlCache(ALLOWED_SECONDS, ALLOWED_ENTRIES, clock)
        self._refused: TtlCache[bytes, Refusal] = TtlCache(UNAUTHENTICATED_SECONDS, REFUSED_ENTRIES, clock)
        self._sources = RateLimiter(SOURCE_REVIEW_RATE_PER_SECOND, SOURCE_REVIEW_BURST, clock=clock)
        self._budget = ReviewBudget(
            reviews or RateLimiter(REVIEW_RATE_PER_SECOND, REVIEW_BURST, clock=clock), REVIEWS_AT_ONCE
        )

    async def __call__(self, authorization: str, source: str) -> None:
        """Return when the scrape may read the metrics; raise Unauthenticated, Forbidden, TooManyRequests
        (Busy when the common budget is spent) or Unavailable (the API server did not answer)."""
        token = bearer_token(authorization)
        if token is None:
            raise Unauthenticated("bearer token required")
        key = token_key(token)
        if self._allowed.get(key):
            return
        if (refused := self._refused.get(key)) is not None:
            raise refused
        if (wait := self._sources.acquire(source)) > 0:
            raise TooManyRequests(wait, "too many new tokens from this address")
        async with self._budget.spend():
            try:
                spec = access_review_spec(await token_review(self._api, token))
                require_allowed(await subject_access_review(self._api, spec), spec["user"])
            except Unauthenticated as exc:
                self._refused.put(key, exc)
                raise
            except Forbidden as exc:
                self._refused.put(key, exc, until=self._clock() + FORBIDDEN_SECONDS)
                raise
        self._allowed.put(key, True)
