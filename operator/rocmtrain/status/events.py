"""The Kubernetes events that explain a change of a job's status (pure).

`transition_events` compares the status before and after one computation: a phase
change, a problem condition turning True (or True for a new reason), admission by
Kueue and its withdrawal (an eviction, in Kueue's words), a whole-job retry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.models import Phase
from rocmtrain.status.condition_merge import Condition, find
from rocmtrain.status.phase import count, phase_of

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    """A Kubernetes event to post on the job."""

    type: EventType
    reason: str
    message: str


# Condition types whose turning True (or changing reason while True) deserves its own event: (type, event type).
_NOTABLE: tuple[tuple[ConditionType, EventType], ...] = (
    (ConditionType.UNSCHEDULABLE, "Warning"),
    (ConditionType.RAY_PODS_UNAVAILABLE, "Warning"),
    (ConditionType.KUBERAY_MISSING, "Warning"),
    (ConditionType.BLOCKED, "Warning"),
    (ConditionType.STALLED, "Warning"),
    (ConditionType.ADMITTED, "Normal"),
)


def _read(conditions: Sequence[Mapping[str, Any]], kind: ConditionType) -> Condition | None:
    return Condition.read(find(conditions, kind))


def _raised(old: Condition | None, new: Condition | None) -> bool:
    """Whether a condition turned True, or is True for another reason than before (a new cause)."""
    return new is not None and new.holds and (old is None or not old.holds or old.reason != new.reason)


def _withdrawn(old: Condition | None, new: Condition | None) -> bool:
    return old is not None and old.holds and new is not None and not new.holds


def transition_events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """Events explaining the change from status `old` to `new`: phase changes, alarms, admission
    and its withdrawal (a Kueue eviction, in Kueue's words), restarts."""
    events: list[Event] = []
    old_conditions = old.get("conditions") or []
    new_conditions = new.get("conditions") or []
    phase, before = phase_of(new), phase_of(old)
    if phase is not None and phase is not before:
        ready = find(new_conditions, ConditionType.READY) or {}
        detail = ready.get("message") or ready.get("reason") or ""
        message = f"{before or 'New'} → {phase}" + (f": {detail}" if detail else "")
        events.append(Event("Warning" if phase is Phase.FAILED else "Normal", phase, message))
    for kind, event_type in _NOTABLE:
        if kind is ConditionType.STALLED and phase is Phase.FAILED:
            continue  # a failure is Stalled too (for kstatus); the phase event tells it
        raised = _read(new_conditions, kind)
        if raised is not None and _raised(_read(old_conditions, kind), raised):
            events.append(Event(event_type, raised.reason or kind, raised.message or kind))
    admitted = _read(new_conditions, ConditionType.ADMITTED)
    if admitted is not None and _withdrawn(_read(old_conditions, ConditionType.ADMITTED), admitted):
        events.append(Event("Warning", admitted.reason or Reason.EVICTED, admitted.message or ConditionType.ADMITTED))
    if count(new.get("restarts")) > count(old.get("restarts")):
        events.append(Event("Warning", Reason.RETRYING, f"whole-job retry {new['restarts']} on a new Ray cluster"))
    return events
