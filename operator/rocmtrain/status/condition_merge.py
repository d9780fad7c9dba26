"""A job's conditions as typed values, and their merge into the status' condition list (pure).

Conditions follow Kubernetes API conventions: a condition's `lastTransitionTime`
moves only when its status changes. The operator decides each condition as a
`Condition` (its type, whether it holds, reason and message); `merge_conditions`
writes them in the order of `ConditionType` and keeps conditions of other types
(written by someone else) as they are.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rocmtrain.api import models
from rocmtrain.api.condition_reasons import ConditionType
from rocmtrain.api.timestamps import rfc3339
from rocmtrain.status.messages import CONDITION_MESSAGE_LIMIT, bounded

MANAGED_CONDITIONS = frozenset(ConditionType)


@dataclass(frozen=True)
class Condition:
    """One condition the operator sets: True while `holds`, with its reason and message."""

    type: ConditionType
    holds: bool
    reason: str
    message: str = ""

    @property
    def status(self) -> Literal["True", "False"]:
        """The condition's status as written."""
        return "True" if self.holds else "False"

    @classmethod
    def read(cls, wire: Mapping[str, Any] | None) -> Condition | None:
        """The condition written as `wire` (one entry of `status.conditions`); None for one of another type."""
        if wire is None or wire.get("type") not in MANAGED_CONDITIONS:
            return None
        return cls(
            ConditionType(wire["type"]),
            wire.get("status") == "True",
            wire.get("reason") or "",
            wire.get("message") or "",
        )

    def wire(self, *, since: str, generation: int | None) -> dict[str, Any]:
        """The condition as written, its status last changed at `since`, computed from spec `generation`; its
        message bounded (`rocmtrain.status.messages`)."""
        return models.Condition(
            type=self.type,
            status=self.status,
            reason=self.reason,
            message=bounded(self.message, CONDITION_MESSAGE_LIMIT),
            last_transition_time=since,
            observed_generation=generation,
        ).dump()


def find(conditions: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    """The condition of type `kind` in a condition list (wire form), None when absent."""
    return next((c for c in conditions if c.get("type") == kind), None)


def merge_conditions(
    current: Sequence[Mapping[str, Any]],
    desired: Iterable[Condition],
    *,
    now: dt.datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The condition list: `desired` (one per type) in the order of `ConditionType`, then foreign ones.

    A condition keeps its `lastTransitionTime` while its status stays the same.
    """
    stamp = rfc3339(now)
    by_type = {condition.type: condition for condition in desired}
    merged: list[dict[str, Any]] = []
    for kind in ConditionType:
        condition = by_type.get(kind)
        if condition is None:
            continue
        before = find(current, kind)
        since = before.get("lastTransitionTime") if before and before.get("status") == condition.status else None
        merged.append(condition.wire(since=since or stamp, generation=generation))
    merged.extend(dict(c) for c in current if c.get("type") not in MANAGED_CONDITIONS)
    return merged
