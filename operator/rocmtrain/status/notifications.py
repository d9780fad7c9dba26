"""Phase notifications: which status change notifies which target, with what body and signature (pure).

A job's `spec.notifications` (else the operator's default target) names HTTP(S) receivers and the
events each one wants. `notices` reads the events out of two statuses (before and after one write):
a phase change into Queued, Running, Succeeded or Failed, `Stalled` turning True on a job that has
not failed, a new best trial. `payload` is the JSON document sent for one of them, `signature` its
HMAC-SHA256 under the target's signing key. `retry_delay` is the delivery plan: which answers are
tried again, and after how long.

Nothing here holds a URL or a key: the targets name where those are (a Secret's keys), and the
delivery shell (`rocmtrain.controller.notifier`) reads them only to send.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rocmtrain.api.condition_reasons import ConditionType
from rocmtrain.api.models import MAX_NOTIFICATIONS, NOTIFY_EVENTS, DeliveryFailure, DeliveryState, NotifyEvent, Phase
from rocmtrain.api.models.status import NotificationState
from rocmtrain.api.timestamps import rfc3339
from rocmtrain.status.condition_merge import Condition, find
from rocmtrain.status.messages import EVENT_MESSAGE_LIMIT, bounded
from rocmtrain.status.phase import phase_of

SIGNATURE_HEADER = "X-Rocmtrain-Signature"
DELIVERY_HEADER = "X-Rocmtrain-Delivery"
# The message of a notice, cut to this (as an event's); its reason, to this.
MESSAGE_LIMIT = EVENT_MESSAGE_LIMIT
REASON_LIMIT = 128
# Metrics a body carries: the first of the status' numbers, at most this many.
MAX_METRICS = 16
# Delivery: tries of one notice (the first included), and the back-off between them.
MAX_ATTEMPTS = 8
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 60.0
# Answers tried again besides 5xx: a receiver's timeout and its throttling.
_RETRIED_4XX = frozenset({408, 429})


@dataclass(frozen=True)
class Target:
    """Where one receiver's URL and signing key are, and which events it wants.

    `secret` is a Secret in the job's namespace; None for the operator's default target, whose URL and
    key the operator's configuration holds."""

    label: str  # how logs, events and status name the target (never its URL)
    events: frozenset[str]
    secret: str | None = None
    url_key: str = "url"
    signing_key_key: str | None = None


@dataclass(frozen=True)
class Notice:
    """One event of one job, as its receivers are told."""

    event: NotifyEvent
    reason: str
    message: str


def targets(spec: Mapping[str, Any], default: Target | None) -> list[Target]:
    """The targets of a job (its spec as the API server holds it): its own, else the operator's default."""
    own = [
        Target(
            label=f"spec.notifications[{index}]",
            events=frozenset(item.get("events") or NOTIFY_EVENTS),
            secret=item["secretRef"]["name"],
            url_key=item["secretRef"].get("urlKey") or "url",
            signing_key_key=item["secretRef"].get("signingKeyKey"),
        )
        for index, item in enumerate(spec.get("notifications") or [])
    ]
    return own or ([default] if default is not None else [])


def _condition(status: Mapping[str, Any], kind: ConditionType) -> Condition | None:
    return Condition.read(find(status.get("conditions") or [], kind))


def _phase_notice(phase: NotifyEvent, status: Mapping[str, Any]) -> Notice:
    ready = _condition(status, ConditionType.READY)
    return Notice(
        phase, (ready.reason if ready else None) or phase, (ready.message if ready else None) or f"the job is {phase}"
    )


def _stalled_notice(status: Mapping[str, Any]) -> Notice:
    stalled = _condition(status, ConditionType.STALLED)
    return Notice(
        "Stalled",
        (stalled.reason if stalled else None) or "Stalled",
        (stalled.message if stalled else None) or "the job makes no progress",
    )


def _best_trial_notice(status: Mapping[str, Any]) -> Notice:
    tuning = status.get("tuning") or {}
    message = f"trial {tuning.get('bestTrialId')} is the best so far: {tuning.get('metric')}={tuning.get('bestMetric')}"
    return Notice("NewBestTrial", "NewBestTrial", message)


def _phase_event(phase: Phase | None) -> NotifyEvent | None:
    """The event a change into `phase` notifies: the phases that are events (Queued, Running, Succeeded, Failed)."""
    return next((event for event in NOTIFY_EVENTS if event == phase), None)


def notices(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Notice]:
    """The notices the change from status `old` to `new` brings."""
    found: list[Notice] = []
    phase = phase_of(new)
    if (event := _phase_event(phase)) is not None and phase is not phase_of(old):
        found.append(_phase_notice(event, new))
    stalled, was = _condition(new, ConditionType.STALLED), _condition(old, ConditionType.STALLED)
    if phase is not Phase.FAILED and stalled is not None and stalled.holds and (was is None or not was.holds):
        found.append(_stalled_notice(new))
    best = (new.get("tuning") or {}).get("bestTrialId")
    if best is not None and best != (old.get("tuning") or {}).get("bestTrialId"):
        found.append(_best_trial_notice(new))
    return found


def recorded(
    entries: Sequence[Mapping[str, Any]],
    target: Target,
    notice: Notice,
    delivery: str,
    state: DeliveryState,
    now: dt.datetime,
    failure: DeliveryFailure | None = None,
) -> list[dict[str, Any]]:
    """`status.notifications` with the entry of `target` replaced: its last notice, that notice's state, and
    why it was not delivered (Failed or Dropped)."""
    entry = NotificationState(
        target=target.label,
        event=notice.event,
        reason=bounded(notice.reason, REASON_LIMIT),
        delivery_id=delivery,
        state=state,
        failure=failure,
        time=rfc3339(now),
    ).dump()
    kept = [dict(e) for e in entries if e.get("target") != target.label]
    return sorted([*kept, entry], key=lambda e: str(e.get("target")))[: MAX_NOTIFICATIONS + 1]


def pending(
    spec: Mapping[str, Any], status: Mapping[str, Any], default: Target | None
) -> list[tuple[Target, Notice, str]]:
    """The notices `status.notifications` holds as Pending (an operator that stopped before it delivered them),
    each with its target and delivery id, rebuilt from the job's status now; none for a target the job no
    longer has."""
    by_label = {target.label: target for target in targets(spec, default)}
    rebuild = {"Stalled": _stalled_notice, "NewBestTrial": _best_trial_notice}
    found = []
    for entry in status.get("notifications") or []:
        target, event = by_label.get(entry.get("target")), entry.get("event")
        if entry.get("state") != DeliveryState.PENDING or target is None or event not in NOTIFY_EVENTS:
            continue
        notice = rebuild[event](status) if event in rebuild else _phase_notice(event, status)
        found.append(
            (target, Notice(notice.event, entry.get("reason") or notice.reason, notice.message), entry["deliveryId"])
        )
    return found


def _metrics(status: Mapping[str, Any]) -> dict[str, float]:
    numbers = {
        key: value
        for key, value in (status.get("metrics") or {}).items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
    return dict(list(numbers.items())[:MAX_METRICS])


def payload(job: Mapping[str, Any], notice: Notice, status: Mapping[str, Any], now: dt.datetime) -> dict[str, Any]:
    """The JSON body for `notice` of `job` (whose status is now `status`): its identity, phase, reason,
    message (cut), key metrics, a `kubectl` hint, and a Slack-compatible `text`."""
    meta = job["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    message = bounded(notice.message, MESSAGE_LIMIT)
    body: dict[str, Any] = {
        "event": notice.event,
        "job": {"namespace": namespace, "name": name, "uid": meta.get("uid")},
        "phase": status.get("phase"),
        "reason": bounded(notice.reason, REASON_LIMIT),
        "message": message,
        "metrics": _metrics(status),
        "kubectl": f"kubectl -n {namespace} describe rocmtrainingjob {name}",
        "time": rfc3339(now),
        "text": f"RocmTrainingJob {namespace}/{name}: {notice.event} ({notice.reason}): {message}",
    }
    tuning = status.get("tuning") or {}
    if notice.event == "NewBestTrial":
        body["bestTrial"] = {key: tuning.get(key) for key in ("bestTrialId", "metric", "bestMetric")}
    return body


def encode(body: Mapping[str, Any]) -> bytes:
    """The bytes sent (and signed): compact JSON, keys sorted."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def signature(data: bytes, key: bytes) -> str:
    """The `X-Rocmtrain-Signature` header's value: `sha256=` and the HMAC-SHA256 of the body, in hex."""
    return "sha256=" + hmac.new(key, data, hashlib.sha256).hexdigest()


def delivery_id(job: Mapping[str, Any], notice: Notice, status: Mapping[str, Any]) -> str:
    """The same for every try of one notice (a receiver drops repeats by it): job uid, event, and when the
    change happened (the condition's transition time, else the best trial's id)."""
    if notice.event == "NewBestTrial":
        when = (status.get("tuning") or {}).get("bestTrialId")
    else:
        when = (find(status.get("conditions") or [], ConditionType.READY) or {}).get("lastTransitionTime") or ""
    seed = f"{job['metadata'].get('uid')}/{notice.event}/{when}"
    return hashlib.sha256(seed.encode()).hexdigest()[:32]


def retry_delay(attempt: int, status: int | None) -> float | None:
    """Seconds before try `attempt + 1` after try `attempt` (from 1) got HTTP `status` (None: no answer:
    refused, reset, timed out); None when it is not tried again: a 2xx/3xx, a 4xx other than 408 and 429,
    or the last of `MAX_ATTEMPTS` tries. The back-off doubles from `FIRST_RETRY_SECONDS` up to
    `MAX_RETRY_SECONDS`."""
    if status is not None and (status < 400 or (status < 500 and status not in _RETRIED_4XX)):
        return None
    if attempt >= MAX_ATTEMPTS:
        return None
    return min(MAX_RETRY_SECONDS, FIRST_RETRY_SECONDS * 2.0 ** (attempt - 1))


# What a job's owner is told of a notice that was not delivered: a class, never a probe's detail.
_FAILURES = {
    DeliveryFailure.NOT_DELIVERED: "the receiver did not take it",
    DeliveryFailure.ADDRESS_REFUSED: "the receiver's address is not one the operator may reach",
    DeliveryFailure.SECRET_UNUSABLE: "its Secret cannot be used",
    DeliveryFailure.SEND_ERROR: "the operator could not send it",
    DeliveryFailure.QUEUE_FULL: "the namespace's share of the notification queue is full",
    DeliveryFailure.RATE_LIMITED: "the job notifies more often than its rate",
}


def undelivered(notice: Notice, target: Target, failure: DeliveryFailure, detail: str | None = None) -> str:
    """The Warning event's message of a notice not delivered: its class, and `detail` only where it is the
    owner's own (which Secret or key cannot be used)."""
    dropped = failure in (DeliveryFailure.QUEUE_FULL, DeliveryFailure.RATE_LIMITED)
    return (
        f"{notice.event} notification to {target.label} {'dropped' if dropped else 'not delivered'} ({failure}): "
        f"{detail or _FAILURES[failure]}"
    )


def wanted(target: Target, found: Sequence[Notice]) -> list[Notice]:
    """The notices `target` asked for."""
    return [notice for notice in found if notice.event in target.events]
