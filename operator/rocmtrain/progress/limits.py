"""Bounds on what the progress endpoint accepts: body size, body shape, request rate.

Everything here is pure (no I/O): the server reads at most `MAX_BODY_BYTES`,
hands the bytes to `parse_report` (our reports) or `parse_trainer_status` (KEP-2779's),
the contract's parsers (`rocmtrain.api.progress_body`) whose refusals are 400s here,
and asks a `rocmtrain.serving.rate.RateLimiter` before writing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rocmtrain.api import progress_body
from rocmtrain.api.models import ProgressReport
from rocmtrain.api.progress_body import MAX_BODY_BYTES, MAX_KEYS, BodyError
from rocmtrain.serving.errors import ReportError

# Re-exported: the body's bounds are the contract's, which `rocmtrain run`'s loopback endpoint reads with too.
__all__ = ["MAX_BODY_BYTES", "MAX_KEYS", "ReportError", "parse_report", "parse_trainer_status"]


@contextlib.contextmanager
def _refused_as_400() -> Iterator[None]:
    try:
        yield
    except BodyError as exc:
        raise ReportError(str(exc)) from None


def parse_report(body: bytes) -> ProgressReport:
    """Decode and validate one of our reports; raise ReportError with a short reason."""
    with _refused_as_400():
        return progress_body.parse_report(body)


def parse_trainer_status(body: bytes) -> ProgressReport:
    """Decode, validate and map one KEP-2779 report; raise ReportError with a short reason."""
    with _refused_as_400():
        return progress_body.parse_trainer_status(body)
