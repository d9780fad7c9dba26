"""Bounds on what the progress endpoint accepts: body size, body shape, request rate.

Everything here is pure (no I/O): the server reads at most `MAX_BODY_BYTES`,
hands the bytes to `parse_report` (our reports) or `parse_trainer_status` (KEP-2779's),
the contract's parsers (`rocmtrain.api.progress_body`) whose refusals are 400s here,
and asks a `RateLimiter` before writing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rocmtrain.api import progress_body
from rocmtrain.api.contract import PROGRESS_BURST, PROGRESS_RATE_PER_SECOND
from rocmtrain.api.models import ProgressReport
from rocmtrain.api.progress_body import MAX_BODY_BYTES, MAX_KEYS, BodyError
from rocmtrain.progress.errors import ReportError

# Re-exported: the body's bounds are the contract's, which `rocmtrain run`'s loopback endpoint reads with too.
__all__ = ["MAX_BODY_BYTES", "MAX_KEYS", "RateLimiter", "ReportError", "parse_report", "parse_trainer_status"]
# Idle buckets are forgotten once this many jobs are tracked.
MAX_TRACKED_KEYS = 4096


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
