"""Asking the API server about a bearer token, within bounds: what the operator's two servers share.

The progress endpoint and `/metrics` both take a bearer token and ask the API server
about it: who it is (TokenReview) and, for `/metrics`, what that user may do
(SubjectAccessReview). Both keep the answers in `TtlCache`s (small LRU maps whose
entries expire) under `token_key`, a hash of the token (tokens themselves are never
stored or logged), and send reviews within a `ReviewBudget`: a token bucket and a few
at once, beyond which a request is refused as `Busy` (429) before anything is sent.
A review the API server does not answer is `Unavailable` (503).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Generic, TypeVar

from kubernetes_asyncio import client

from rocmtrain.serving.errors import Busy, checked
from rocmtrain.serving.rate import RateLimiter

# Projected service-account tokens are JWTs of about 1 KiB.
MAX_TOKEN_BYTES = 8 * 1024
# How long a review may wait for one of the budget's slots before it is refused as Busy.
REVIEW_QUEUE_SECONDS = 1.0

K = TypeVar("K")
V = TypeVar("V")


def bearer_token(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None for anything else, or a token over 8 KiB."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_BYTES or not token.isascii():
        return None
    return token


def token_key(token: str) -> bytes:
    """What a token's answers are cached under: its SHA-256."""
    return hashlib.sha256(token.encode()).digest()


class TtlCache(Generic[K, V]):
    """A small LRU map whose entries expire after `ttl` seconds (or at the time given to `put`)."""

    def __init__(self, ttl: float, size: int, clock: Callable[[], float]) -> None:
        self._ttl, self._size, self._clock = ttl, size, clock
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The live value for `key`, or None."""
        item = self._items.get(key)
        if item is None or item[0] <= self._clock():
            self._items.pop(key, None)
            return None
        self._items.move_to_end(key)
        return item[1]

    def put(self, key: K, value: V, until: float | None = None) -> None:
        """Store `value` for `ttl` seconds (at most until `until`), evicting the least recently used when full."""
        expiry = self._clock() + self._ttl
        self._items[key] = (expiry if until is None else min(expiry, until), value)
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)


class ReviewBudget:
    """The reviews a server may send: as many as `rate` (one bucket for all) allows, at most `at_once` at a time."""

    def __init__(self, rate: RateLimiter, at_once: int) -> None:
        self._rate = rate
        self._at_once = asyncio.Semaphore(at_once)

    @contextlib.asynccontextmanager
    async def spend(self) -> AsyncIterator[None]:
        """Hold one review's place; raise Busy when the rate is spent or no slot frees within a second."""
        if (wait := self._rate.acquire("")) > 0:
            raise Busy(wait)
        try:
            await asyncio.wait_for(self._at_once.acquire(), REVIEW_QUEUE_SECONDS)
        except TimeoutError:
            raise Busy(REVIEW_QUEUE_SECONDS) from None
        try:
            yield
        finally:
            self._at_once.release()


async def token_review(api: client.ApiClient, token: str, audiences: Sequence[str] = ()) -> dict[str, Any]:
    """The `status` of a TokenReview of `token` for `audiences` (none: the API server's own)."""
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = list(audiences)
    body: Any = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
    review = await checked("TokenReview", client.AuthenticationV1Api(api).create_token_review(body), passing=())
    status: dict[str, Any] = api.sanitize_for_serialization(review).get("status") or {}
    return status


async def subject_access_review(api: client.ApiClient, spec: dict[str, Any]) -> dict[str, Any]:
    """The `status` of a SubjectAccessReview of `spec` (user, groups, and the attributes asked about)."""
    body: Any = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
    call = client.AuthorizationV1Api(api).create_subject_access_review(body)
    review = await checked("SubjectAccessReview", call, passing=())
    status: dict[str, Any] = api.sanitize_for_serialization(review).get("status") or {}
    return status
