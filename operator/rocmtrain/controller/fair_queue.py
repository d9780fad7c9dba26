"""A queue shared fairly by keys (the notifier's namespaces): no key's backlog holds another's items.

Each key has its own line, bounded (`per_key`), within a bound on all (`total`); `take` hands out the
keys' items round-robin and skips a key that already has `per_key_active` items taken and not `done`
(or set aside to `wait`), so a key whose items hang (a receiver that never answers) holds at most that
many takers. An item counts against its key's bound from `offer` to `done`, while it is taken, and
while it waits for another try (`wait`, then `again`) too.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    """Per-key lines taken round-robin, bounded per key and in all (see the module docstring)."""

    def __init__(self, *, total: int, per_key: int, per_key_active: int) -> None:
        self._total, self._per_key, self._per_key_active = total, per_key, per_key_active
        self._lines: OrderedDict[str, deque[T]] = OrderedDict()  # keys in turn order; only keys with items
        self._held: dict[str, int] = {}  # per key: offered and not done
        self._active: dict[str, int] = {}  # per key: taken and not done or put back
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        """Items offered and not done."""
        return sum(self._held.values())

    def held(self, key: str) -> int:
        """Items of `key` offered and not done."""
        return self._held.get(key, 0)

    def offer(self, key: str, item: T) -> bool:
        """Queue `item` for `key`; False (not queued) when its key's share or the whole queue is full."""
        if self.held(key) >= self._per_key or len(self) >= self._total:
            return False
        self._held[key] = self.held(key) + 1
        self._line(key, item)
        return True

    def wait(self, key: str) -> None:
        """A taken item waits for another try: its taker is free, its slot in its key's bound kept."""
        self._active[key] -= 1
        self._changed.set()

    def again(self, key: str, item: T) -> None:
        """Queue an item that waited (`wait`) for its next try."""
        self._line(key, item)

    def done(self, key: str) -> None:
        """A taken item is finished: its key's slot and taker are free."""
        self._active[key] -= 1
        self._held[key] -= 1
        if not self._held[key]:
            del self._held[key], self._active[key]
        self._changed.set()

    def _line(self, key: str, item: T) -> None:
        self._lines.setdefault(key, deque()).append(item)
        self._changed.set()

    def _next(self) -> tuple[str, T] | None:
        for key in list(self._lines):
            if self._active.get(key, 0) >= self._per_key_active:
                continue
            line = self._lines.pop(key)  # its turn is over: it goes to the end, if it has more
            item = line.popleft()
            if line:
                self._lines[key] = line
            self._active[key] = self._active.get(key, 0) + 1
            return key, item
        return None

    async def take(self) -> tuple[str, T]:
        """The next item, round-robin over the keys below their `per_key_active`; waits for one."""
        while (found := self._next()) is None:
            self._changed.clear()
            await self._changed.wait()
        return found
