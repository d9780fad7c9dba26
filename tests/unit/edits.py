"""Edit a job manifest by field path (`spec.env[0].name`), for table-driven tests."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
Edit = Callable[[dict[str, Any]], None]


def _parts(path: str) -> list[str | int]:
    return [int(index) if index else name for name, index in _PART.findall(path)]


def _parent(doc: Any, parts: list[str | int]) -> Any:
    for part in parts[:-1]:
        doc = doc[part] if isinstance(part, int) else doc.setdefault(part, {})
    return doc


def put(path: str, value: Any) -> Edit:
    """An edit setting the field at `path`, creating missing parent objects."""

    def edit(doc: dict[str, Any]) -> None:
        parts = _parts(path)
        _parent(doc, parts)[parts[-1]] = value

    return edit


def drop(path: str) -> Edit:
    """An edit removing the field at `path`."""

    def edit(doc: dict[str, Any]) -> None:
        parts = _parts(path)
        del _parent(doc, parts)[parts[-1]]

    return edit


def both(*edits: Edit) -> Edit:
    """An edit applying `edits` in order."""

    def edit(doc: dict[str, Any]) -> None:
        for each in edits:
            each(doc)

    return edit
