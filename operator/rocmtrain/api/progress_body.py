"""Reading the body of a progress report: bounded, finite JSON of the protocol's schema (pure).

Both progress endpoints read bodies with these, so both refuse alike: the operator's
(`rocmtrain.progress.server`, through `rocmtrain.progress.limits`) and the loopback one of
`rocmtrain run` (`rocmtrain_train.reporting.local_endpoint`). Two protocols, one result:
`parse_report` reads our own `ProgressReport`, `parse_trainer_status` Kubeflow Trainer's KEP-2779
body, mapped onto a `ProgressReport` (`rocmtrain.api.trainer_status`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from rocmtrain.api.errors import InputError
from rocmtrain.api.models import ProgressReport
from rocmtrain.api.trainer_status import TrainerStatusError, TrainerStatusReport, to_progress_report

MAX_BODY_BYTES: Final = 16 * 1024
# JSON object keys in one body, all objects together: a search's full trial table (20 trials of 5 fields
# and 5 hyper-parameters) and 32 custom metrics besides the other fields stay far below it.
MAX_KEYS: Final = 512

M = TypeVar("M", bound=BaseModel)


class BodyError(InputError, ValueError):  # a ValueError too: `decode` catches the decoder's
    """A body that is not a report; the message names schema fields only, never a value or a client's key."""


def _reject_constant(token: str) -> float:
    raise BodyError(f"non-finite number {token} is not allowed")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise BodyError("number out of range")
    return value


def decode(body: bytes) -> dict[str, Any]:
    """The JSON object of a body: at most MAX_BODY_BYTES and MAX_KEYS, finite numbers, no duplicate keys."""
    if len(body) > MAX_BODY_BYTES:
        raise BodyError(f"body larger than {MAX_BODY_BYTES} bytes")
    keys = 0

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        nonlocal keys
        keys += len(items)
        if keys > MAX_KEYS:
            raise BodyError(f"more than {MAX_KEYS} fields")
        out = dict(items)
        if len(out) != len(items):
            raise BodyError("duplicate field")
        return out

    try:
        data = json.loads(
            body.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=pairs
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, BodyError):
            raise
        raise BodyError("body is not valid JSON") from exc
    if not isinstance(data, dict):
        raise BodyError("body must be a JSON object")
    return data


def _where(error: ErrorDetails) -> str:
    """Where a validation error is, naming only schema fields (never a client-chosen key)."""
    loc = [str(part) for part in error["loc"]]
    if error["type"] == "extra_forbidden":
        loc[-1:] = ["(unknown field)"]
    return ".".join(loc) or "body"


def _validated(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        raise BodyError(f"invalid fields: {', '.join(sorted({_where(e) for e in exc.errors()})[:8])}") from None


def parse_report(body: bytes) -> ProgressReport:
    """Our own report (`ProgressReport`); BodyError with a short reason."""
    return _validated(ProgressReport, decode(body))


def parse_trainer_status(body: bytes) -> ProgressReport:
    """A KEP-2779 report (`{"trainerStatus": ...}`) as the ProgressReport it says; BodyError with a short reason."""
    try:
        return to_progress_report(_validated(TrainerStatusReport, decode(body)))
    except TrainerStatusError as exc:
        raise BodyError(str(exc)) from None
