"""The base of every API model, and the helpers that write their CEL rules."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


def _cel(rule: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"rule": rule, "message": message, **extra}


def _cel_with_model_and_data(rule: str, message: str, **extra: Any) -> dict[str, Any]:
    """A rule reading spec.model and spec.data, checked only where both are given (a job with code may lack them).

    CEL fails on a missing key, and `||` absorbs that error only when another operand is true: the guards do.
    """
    return _cel(f"!has(self.model) || !has(self.data) || ({rule})", message, **extra)


class ApiModel(BaseModel):
    """Base for API objects: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    def dump(self) -> dict[str, Any]:
        """Return the wire form: camelCase keys, unset optionals omitted."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
