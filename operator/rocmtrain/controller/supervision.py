"""When a failed watch starts again, and when it counts as broken: the informers' restart and health policy.

A watch loop that meets an unexpected exception (a bug, say a `KeyError` in a view
function) starts again after a capped exponential back-off with jitter. Its failures
are one run while each comes less than `RestartPolicy.recovery` seconds after the
loop started again; a loop that has run that long without one has recovered. A loop
whose run of failures has lasted longer than `RestartPolicy.unhealthy_after` seconds
(`ROCMTRAIN_WATCH_FAILING_SECONDS`) is broken: the operator's `/healthz` fails, so
that the kubelet restarts the pod rather than leave every job's status frozen.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_DOUBLINGS = 32  # beyond this the cap holds anyway; keeps 2**n a small number


def capped_backoff(failures: int, first: float, cap: float) -> float:
    """Seconds to wait after `failures` failures in a row (1: the first): `first`, doubling, at most `cap`."""
    return min(cap, first * 2 ** min(max(failures, 1) - 1, MAX_DOUBLINGS))


@dataclass(frozen=True)
class RestartPolicy:
    """How soon a failed watch starts again, when it has recovered, and how long it may keep failing."""

    first_delay: float = 1.0
    max_delay: float = 30.0
    recovery: float = 60.0
    unhealthy_after: float = 300.0

    def delay(self, failures: int, jitter: float) -> float:
        """The wait before restart number `failures`: the capped back-off, its upper half scaled by `jitter` (0-1)."""
        ceiling = capped_backoff(failures, self.first_delay, self.max_delay)
        return ceiling / 2 * (1.0 + jitter)


DEFAULT_RESTART = RestartPolicy()


class Supervision:
    """One watch loop's current run of unexpected failures (see the module docstring)."""

    def __init__(
        self,
        policy: RestartPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._jitter = jitter
        self.failures = 0
        self.failing_since: float | None = None
        self._resumes_at = 0.0  # when the loop starts again after its last failure

    def failed(self) -> float:
        """Record a failure; the seconds to wait before starting again."""
        now = self._clock()
        if self._recovered(now):
            self.failures, self.failing_since = 0, now
        self.failures += 1
        delay = self.policy.delay(self.failures, self._jitter())
        self._resumes_at = now + delay
        return delay

    def _recovered(self, now: float) -> bool:
        return self.failing_since is None or now - self._resumes_at >= self.policy.recovery

    def healthy(self) -> bool:
        """False while the loop's run of failures has lasted longer than the policy allows."""
        now, since = self._clock(), self.failing_since
        return since is None or self._recovered(now) or now - since <= self.policy.unhealthy_after
