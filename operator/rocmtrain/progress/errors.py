"""Why a progress report is not written, and API-server trouble as one exception."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

T = TypeVar("T")


class Unauthenticated(Exception):
    """The token is missing, malformed, expired, revoked, or for another audience (401)."""


class Forbidden(Exception):
    """The token is valid, but its pod may not report for this job (403)."""


class Unavailable(Exception):
    """The API server could not answer; the client should retry (503)."""


class Busy(Exception):
    """The endpoint's budget for this request is spent; the client should retry after `retry_after` s (429)."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"busy; retry in {retry_after:.1f}s")
        self.retry_after = retry_after


class Conflict(Exception):
    """The job changed since it was read (resourceVersion precondition failed)."""


class Gone(Exception):
    """The job no longer exists."""


async def checked(what: str, call: Awaitable[T], passing: tuple[int, ...] = (404, 409)) -> T:
    """Await an API call: the `passing` statuses stay ApiException for the caller; any other failure
    (another status, a broken connection, a timeout) is Unavailable."""
    try:
        return await call
    except ApiException as exc:
        if exc.status in passing:
            raise
        raise Unavailable(f"{what} failed with HTTP {exc.status}") from None
    except (OSError, aiohttp.ClientError) as exc:  # TimeoutError is an OSError
        raise Unavailable(f"{what} failed: {type(exc).__name__}") from None
