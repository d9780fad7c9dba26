"""Why a progress report is not written, as one family of exceptions, and API-server trouble as one of them.

Every refusal is a `Refusal` that carries its HTTP answer (as httpx's exceptions carry
theirs): the status as a class attribute, the short reason the client reads in the
body, and the headers that go with it. The server turns any of them into its
response in one place. A `Refusal` is an `InputError` (`rocmtrain.api.errors`); the 404s
are `NotFound`s and the 503s `ApiError`s too.

    Refusal
    ├── ReportError      400  the body is not a ProgressReport (`limits`)
    ├── Unauthenticated  401  no, a bad, or someone else's token
    ├── Forbidden        403  a valid token, but not for this job
    ├── JobNotFound      404  no such job
    │   └── Gone              the job went while its report was written
    ├── BodyTimeout      408  the body came too slowly
    ├── Ended            409  the job has ended: its status takes no more reports
    ├── TooLarge         413  the body is over the limit
    ├── TooManyRequests  429  over a rate (Retry-After)
    │   └── Busy              the endpoint's TokenReview budget is spent
    └── Unavailable      503  the API server did not answer, or the job kept changing (Retry-After)

A status patch onto a job that changed since it was read raises `Conflict`; the endpoint
reads the job again, and answers `Unavailable` once its tries are spent.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Mapping
from http import HTTPStatus
from typing import ClassVar, TypeVar

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from rocmtrain.api.errors import ApiError, InputError, NotFound

T = TypeVar("T")


class Refusal(InputError):
    """A request the endpoint does not carry out, with the HTTP answer its client gets."""

    status: ClassVar[HTTPStatus]
    reason: ClassVar[str] = ""  # the answer's reason when none is given
    headers: ClassVar[Mapping[str, str]] = {}

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason or self.reason)

    def answer_headers(self) -> dict[str, str]:
        """The headers of the answer."""
        return dict(self.headers)


class ReportError(Refusal):
    """The body is not a well-formed, finite, schema-valid ProgressReport (400)."""

    status = HTTPStatus.BAD_REQUEST


class Unauthenticated(Refusal):
    """The token is missing, malformed, expired, revoked, or for another audience (401)."""

    status = HTTPStatus.UNAUTHORIZED
    headers: ClassVar[Mapping[str, str]] = {"WWW-Authenticate": "Bearer"}


class Forbidden(Refusal):
    """The token is valid, but its pod may not report for this job (403)."""

    status = HTTPStatus.FORBIDDEN


class JobNotFound(Refusal, NotFound):
    """No such job (404)."""

    status = HTTPStatus.NOT_FOUND
    reason = "no such job"


class Gone(JobNotFound):
    """The job no longer exists (it went while its report was written)."""


class BodyTimeout(Refusal):
    """The body did not arrive in time (408)."""

    status = HTTPStatus.REQUEST_TIMEOUT
    reason = "body too slow"


class Ended(Refusal):
    """The job has ended (Succeeded or Failed): its status takes no more reports (409)."""

    status = HTTPStatus.CONFLICT
    reason = "job has ended"


class TooLarge(Refusal):
    """The body is over the endpoint's limit (413)."""

    status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE
    reason = "body too large"


class TooManyRequests(Refusal):
    """Over a rate; the client should retry after `retry_after` s (429)."""

    status = HTTPStatus.TOO_MANY_REQUESTS
    reason = "rate limited"

    def __init__(self, retry_after: float, reason: str | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after

    def answer_headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


class Busy(TooManyRequests):
    """The endpoint's budget for this request is spent; the client should retry after `retry_after` s (429)."""

    reason = "busy"


class Unavailable(Refusal, ApiError):
    """The API server could not answer, or the job kept changing; the client should retry (503)."""

    status = HTTPStatus.SERVICE_UNAVAILABLE
    headers: ClassVar[Mapping[str, str]] = {"Retry-After": "5"}


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
