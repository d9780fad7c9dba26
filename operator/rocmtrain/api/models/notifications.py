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
