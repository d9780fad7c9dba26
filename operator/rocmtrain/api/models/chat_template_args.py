"""spec.data.chatTemplateArgs: options a chat template reads, such as Qwen3's `enable_thinking`.

The trainer passes them to transformers' `apply_chat_template`, which hands them to the template as variables:
names of its own parameters, or of what it already hands the template, would clash, so they are refused.

A value is text, as the API server can check no other map of scalars (a structural schema has no union of
types, and CEL cannot read a value of no type): text that is a JSON boolean, number or quoted string (`false`,
`3`, `0.5`, `"true"`) reaches the template as that value, any other text as itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, StringConstraints

from rocmtrain.api.patterns import TEMPLATE_VARIABLE, TEXT

CHAT_TEMPLATE_ARGS = 16
ARG_LENGTH = 1024
RESERVED_ARGS = (
    "add_generation_prompt",
    "chat_template",
    "continue_final_message",
    "conversation",
    "conversations",
    "documents",
    "max_length",
    "messages",
    "padding",
    "return_assistant_tokens_mask",
    "return_dict",
    "return_tensors",
    "sanitize_control_tokens",
    "tokenize",
    "tokenizer_kwargs",
    "tools",
    "truncation",
)
ARGS_FOR_CHATS = "chatTemplateArgs is for chat records (messagesField)"
ARGS_RESERVED = "chatTemplateArgs may not set what apply_chat_template sets itself: " + ", ".join(RESERVED_ARGS)
RESERVED_RULE = "!has(self.chatTemplateArgs) || !self.chatTemplateArgs.exists(k, k in [{}])".format(
    ", ".join(f"'{name}'" for name in RESERVED_ARGS)
)

ARG_TEXT = 'a chatTemplateArgs value is text: quote it, as in enable_thinking: "false"'
Scalar = bool | int | float | str


def _text(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError(ARG_TEXT)
    return value


ChatTemplateArgs = dict[
    Annotated[str, StringConstraints(pattern=TEMPLATE_VARIABLE)],
    Annotated[str, StringConstraints(pattern=TEXT, max_length=ARG_LENGTH), BeforeValidator(_text)],
]


def reserved_args(args: Mapping[str, str]) -> list[str]:
    """The names among `args` that apply_chat_template sets itself."""
    return [name for name in args if name in RESERVED_ARGS]


def _value(text: str) -> Scalar:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, bool | int | float | str) else text


def template_args(args: Mapping[str, str] | None) -> dict[str, Scalar]:
    """The options as the template reads them: JSON booleans, numbers and quoted strings as such, other text as
    itself."""
    return {name: _value(text) for name, text in (args or {}).items()}
