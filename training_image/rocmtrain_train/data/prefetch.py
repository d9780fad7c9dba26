"""Batches made ahead of the step loop on a background thread, in pinned memory on GPUs.

While the device works on one step, the thread pads the next micro-batches (and pins them, so the
copy to the GPU runs asynchronously). The loop only waits where the thread has fallen behind: that
wait is the run's data wait.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

Item = TypeVar("Item")
Batch = TypeVar("Batch")

_DONE = object()


class Prefetcher(Generic[Item, Batch]):
    """Applies `make` to each item on a thread, at most `depth` batches ahead; iterate to take them in order."""

    def __init__(self, make: Callable[[Item], Batch], items: Iterable[Item], depth: int = 2) -> None:
        self._make = make
        self._items = items
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rocmtrain-prefetch", daemon=True)
        self._thread.start()

    def _put(self, value: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._items:
                if not self._put(self._make(item)):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)
            return
        self._put(_DONE)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            value = self._queue.get()
            if value is _DONE:
                return
            if isinstance(value, BaseException):
                raise value
            yield value  # type: ignore[misc]  # anything else the queue holds is a Batch

    def close(self) -> None:
        """Stop the thread (also when the consumer stopped early)."""
        self._stop.set()
        self._thread.join()
