"""A circuit breaker per notification receiver: one that keeps failing is not tried for a while.

After `threshold` failed tries in a row (no answer, or an answer that is tried again), a receiver is
open: its tries fail at once, with no connection, for `cooldown` seconds. Then one try goes through
(the others still fail at once): its success closes the breaker, its failure opens it for another
cool-down. At most `max_receivers` receivers are remembered, the most recently failing ones.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Failing:
    failures: int = 0
    until: float = 0.0  # open before this time (once failures reach the threshold)


class ReceiverBreaker:
    """Which receivers fail fast now (see the module docstring)."""

    def __init__(
        self,
        threshold: int = 5,
        cooldown: float = 60.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_receivers: int = 4096,
    ) -> None:
        self._threshold, self._cooldown, self._clock, self._max = threshold, cooldown, clock, max_receivers
        self._failing: OrderedDict[str, _Failing] = OrderedDict()

    def is_open(self, receiver: str) -> bool:
        """Whether a try to `receiver` fails at once now; False lets one try through after a cool-down."""
        state = self._failing.get(receiver)
        if state is None or state.failures < self._threshold:
            return False
        now = self._clock()
        if now < state.until:
            return True
        state.until = now + self._cooldown  # this try probes; the others wait for its outcome
        return False

    def record(self, receiver: str, ok: bool) -> None:
        """The outcome of a try that reached out to `receiver`."""
        if ok:
            self._failing.pop(receiver, None)
            return
        state = self._failing.pop(receiver, None) or _Failing()
        state.failures += 1
        if state.failures >= self._threshold:
            state.until = self._clock() + self._cooldown
        self._failing[receiver] = state
        while len(self._failing) > self._max:
            self._failing.popitem(last=False)
