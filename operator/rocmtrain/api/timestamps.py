"""Timestamps as the Kubernetes API writes them (RFC 3339: UTC, second precision, `Z`), both ways."""

from __future__ import annotations

import datetime as dt


def rfc3339(moment: dt.datetime) -> str:
    """Kubernetes' timestamp form: UTC, second precision, `Z` suffix."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object) -> dt.datetime | None:
    """An RFC 3339 timestamp as an aware datetime; None for anything else."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
