"""Bounds on what the progress endpoint accepts: body size, body shape, request rate.

Everything here is pure (no I/O): the server reads at most `MAX_BODY_BYTES`,
hands the bytes to `parse_report`, and asks a `RateLimiter` before writing.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from rocmtrain.api.contract import PROGRESS_BURST, PROGRESS_RATE_PER_SECOND
from rocmtrain.api.models import ProgressReport
from rocmtrain.progress.errors import ReportError

MAX_BODY_BYTES = 16 * 1024
# ProgressReport has 3 + 5 + 18 fields; anything beyond this many keys is not one.
MAX_KEYS = 64
# Idle buckets are forgotten once this many jobs are tracked.
MAX_TRACKED_KEYS = 4096


def _reject_constant(token: str) -> float:
    raise ReportError(f"non-finite number {token} is not allowed")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ReportError("number out of range")
    return value


def parse_report(body: bytes) -> ProgressReport:
    """Decode and validate one report; raise ReportError with a short reason."""
    if len(body) > MAX_BODY_BYTES:
        raise ReportError(f"body larger than {MAX_BODY_BYTES} bytes")
    keys = 0

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        nonlocal keys
        keys += len(items)
        if keys > MAX_KEYS:
            raise ReportError(f"more than {MAX_KEYS} fields")
        out = dict(items)
        if len(out) != len(items):
            raise ReportError("duplicate field")
        return out

    try:
        data = json.loads(
            body.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=pairs
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ReportError("body is not valid JSON") from exc
    if not isinstance(data, dict):
        raise ReportError("body must be a JSON object")
    try:
        return ProgressReport.model_validate(data, strict=True)
    except ValidationError as exc:
        raise ReportError(f"invalid fields: {', '.join(sorted({_where(e) for e in exc.errors()})[:8])}") from None


def _where(error: ErrorDetails) -> str:
    """Where a validation error is, naming only schema fields (never a client-chosen key)."""
    loc = [str(part) for part in error["loc"]]
    if error["type"] == "extra_forbidden":
        loc[-1:] = ["(unknown field)"]
    return ".".join(loc) or "body"


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class RateLimiter:
    """A token bucket per key: `rate` requests per second on average, bursts of `burst`."""

    def __init__(
        self,
        rate: float = PROGRESS_RATE_PER_SECOND,
        burst: int = PROGRESS_BURST,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = MAX_TRACKED_KEYS,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: dict[str, _Bucket] = {}

    def acquire(self, key: str) -> float:
        """Take one token for `key`: 0.0 when allowed, else the seconds until one is free."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            self._forget_idle(now)
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.stamp) * self.rate)
        bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate

    def _forget_idle(self, now: float) -> None:
        """Drop buckets that have refilled completely (they behave like new ones)."""
        if len(self._buckets) < self._max_keys:
            return
        full = self.burst / self.rate
        for key in [k for k, b in self._buckets.items() if now - b.stamp >= full]:
            del self._buckets[key]
        if len(self._buckets) >= self._max_keys:
            # Everyone is active: evict the longest-idle bucket rather than grow without bound.
            del self._buckets[min(self._buckets, key=lambda k: self._buckets[k].stamp)]
