"""Small stand-ins shared by the pure tests: the API server's merge patch, and a clock set by hand."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7396 JSON merge patch, as the API server applies it (`null` deletes a key)."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = merge_patch(out.get(key) or {}, value)
        else:
            out[key] = value
    return out


class Clock:
    """A monotonic clock that moves only when a test sets `now`."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
