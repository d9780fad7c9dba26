"""spec.notifications: the HTTP receivers of a job's phase changes."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from rocmtrain.api.models.base import ApiModel
from rocmtrain.api.types import ConfigKey, DnsSubdomain

NotifyEvent = Literal["Queued", "Running", "Succeeded", "Failed", "Stalled", "NewBestTrial"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = ("Queued", "Running", "Succeeded", "Failed", "Stalled", "NewBestTrial")
# Receivers one job may notify.
MAX_NOTIFICATIONS = 4


class DeliveryState(StrEnum):
    """How far a receiver's last notice got (`status.notifications[].state`; `rocmtrain.controller.notifier`)."""

    PENDING = "Pending"  # not yet delivered: sent again after an operator restart
    DELIVERED = "Delivered"
    FAILED = "Failed"  # given up
    DROPPED = "Dropped"  # never queued: its namespace's share of the queue was full, or its job over its rate


class DeliveryFailure(StrEnum):
    """Why a notice was not delivered, as its job's owner is told (`status.notifications[].failure`): a class,
    never a probe's detail (which answer, or none, came from where); the operator's log keeps the detail."""

    NOT_DELIVERED = "NotDelivered"  # the receiver did not take it: no answer, or not a 2xx, or failing lately
    ADDRESS_REFUSED = "AddressRefused"  # the receiver's address is not one the operator may reach
    SECRET_UNUSABLE = "SecretUnusable"  # noqa: S105 (a reason, not a secret): the Secret, its URL or key unusable
    SEND_ERROR = "SendError"  # the operator could not send it (a URL it cannot encode, or its own error)
    QUEUE_FULL = "QueueFull"  # dropped: the namespace's share of the notification queue was full
    RATE_LIMITED = "RateLimited"  # dropped: the job notified more often than its rate


class NotificationSecretRef(ApiModel):
    """The Secret in the job's namespace that holds a receiver's URL (and signing key)."""

    name: DnsSubdomain = Field(description="Secret name (the operator needs `get` on it: docs/guides/observing.md).")
    url_key: ConfigKey = Field(default="url", description="Key holding the receiver's http(s) URL.")
    signing_key_key: ConfigKey | None = Field(
        default=None,
        description="Key holding the HMAC-SHA256 signing key; when set, each body is signed (X-Rocmtrain-Signature).",
    )


class Notification(ApiModel):
    """An HTTP receiver told about the job's phase changes (a JSON POST, Slack-compatible `text`)."""

    secret_ref: NotificationSecretRef = Field(description="Where the receiver's URL and signing key are.")
    events: list[NotifyEvent] | None = Field(
        default=None,
        min_length=1,
        max_length=len(NOTIFY_EVENTS),
        description="Events that notify it; all when unset.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
