"""Bounds on the text the operator writes into a job's status and events (pure).

Other systems' words (Ray's failure message with the driver's logs, the API server's refusal) and users'
(a trial id, a data path) reach conditions and events. `bounded` makes any of them safe to write: control
characters escaped, at most `limit` characters, so that a status write never fails on its size.
"""

from __future__ import annotations

import unicodedata

# A condition's message in status (the model allows 32,768; a status stays small enough to read).
CONDITION_MESSAGE_LIMIT = 4096
# An event's message: the API server refuses longer ones.
EVENT_MESSAGE_LIMIT = 1024
# Another system's message quoted inside one of ours (a hold's reason).
QUOTE_LIMIT = 1024

_KEPT = frozenset("\n\t")
_CUT = "…"


def _escaped(text: str) -> str:
    return "".join(
        c if c in _KEPT or unicodedata.category(c) != "Cc" else c.encode("unicode_escape").decode() for c in text
    )


def bounded(text: str, limit: int) -> str:
    """`text` with its control characters but newline and tab escaped (`\\x1b`), cut to at most `limit`
    characters, its end marked `…` where cut."""
    escaped = _escaped(text[:limit])  # escaping lengthens: cut before (bounding the work) and after
    if len(text) <= limit and len(escaped) <= limit:
        return escaped
    return escaped[: limit - len(_CUT)] + _CUT
