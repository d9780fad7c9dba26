"""A token bucket per key: how often a caller may ask, with bursts (pure)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rocmtrain.api.contract import PROGRESS_BURST, PROGRESS_RATE_PER_SECOND

# Idle buckets are forgotten once this many keys are tracked.
MAX_TRACKED_KEYS = 4096


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
