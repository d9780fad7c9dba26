"""Language-model records (task causal-lm): instruction pairs, chats or plain text, read and checked as columns.

A read table has the columns of its record shape, whatever the job's field names are: `prompt` and
`response` (pairs), `messages` (chats: a list of {role, content}), or `text` (plain text). Every
check runs on the whole column at once, and a refusal names the file, the record (counted from 0 in
its file) and the field.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import DataSpec

PROMPT, RESPONSE, MESSAGES, TEXT = "prompt", "response", "messages", "text"
ROLES = ("system", "user", "assistant", "tool")
ASSISTANT = "assistant"


def lm_fields(data: DataSpec) -> dict[str, str]:
    """Column -> record field, of the fields a causal-lm job reads."""
    shape = data.record_shape
    if shape == "pairs":
        assert data.prompt_field is not None and data.response_field is not None  # the shape says so
        return {PROMPT: data.prompt_field, RESPONSE: data.response_field}
    if shape == "chat":
        assert data.messages_field is not None
        return {MESSAGES: data.messages_field}
    return {TEXT: data.text_field}


def _first(mask: pa.ChunkedArray | pa.Array) -> int | None:
    """The index of the first true value, if any."""
    found = np.flatnonzero(np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool))
    return int(found[0]) if len(found) else None


def _blank(values: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    return pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(values)), 0)


def _text(values: pa.ChunkedArray, field: str, where: str, *, empty_ok: bool = False) -> pa.ChunkedArray:
    if not pa.types.is_string(values.type) and not pa.types.is_large_string(values.type):
        raise ConfigError(f"{where}: field {field!r} holds {values.type}, not text")
    if not empty_ok and (record := _first(_blank(values))) is not None:
        raise ConfigError(f"{where}: record {record}: field {field!r} is empty")
    return values


def _messages(values: pa.ChunkedArray, field: str, where: str) -> pa.ChunkedArray:
    """A chat column: lists of {role, content} with known roles, contents given, and an assistant message."""
    kind = values.type
    item = kind.value_type if pa.types.is_list(kind) or pa.types.is_large_list(kind) else None
    if item is None or not pa.types.is_struct(item) or {"role", "content"} - {f.name for f in item}:
        raise ConfigError(f"{where}: field {field!r} must hold a list of {{role, content}} messages, not {kind}")
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    owner = pc.list_parent_indices(values).to_numpy()
    flat = pc.list_flatten(values)
    roles, contents = flat.field("role"), flat.field("content")
    if (record := _first(pc.equal(pc.list_value_length(values), 0))) is not None:
        raise ConfigError(f"{where}: record {record}: field {field!r} has no messages")
    for name, column in (("role", roles), ("content", contents)):
        if not pa.types.is_string(column.type):
            raise ConfigError(f"{where}: field {field!r}: message {name} holds {column.type}, not text")
        if (at := _first(column.is_null())) is not None:
            raise ConfigError(f"{where}: record {owner[at]}: field {field!r}: a message has no {name}")
    if (at := _first(pc.invert(pc.is_in(roles, pa.array(ROLES))))) is not None:
        raise ConfigError(
            f"{where}: record {owner[at]}: field {field!r}: unknown role {roles[at].as_py()!r} "
            f"(roles: {', '.join(ROLES)})"
        )
    answered = np.zeros(len(values), dtype=bool)
    spoken = pc.and_(pc.equal(roles, ASSISTANT), pc.invert(_blank(contents))).to_numpy(zero_copy_only=False)
    answered[owner[spoken]] = True
    if (record := _first(pa.array(~answered))) is not None:
        raise ConfigError(f"{where}: record {record}: field {field!r} has no assistant message with content")
    return pa.chunked_array([values])


def check_columns(columns: dict[str, pa.ChunkedArray], data: DataSpec, where: str) -> dict[str, pa.ChunkedArray]:
    """The columns of a causal-lm table, checked: text where text belongs, no empty response or text, chats
    of known roles with an assistant's answer."""
    fields = lm_fields(data)
    checked = {}
    for column, values in columns.items():
        if column == MESSAGES:
            checked[column] = _messages(values, fields[column], where)
        else:
            checked[column] = _text(values, fields[column], where, empty_ok=column == PROMPT)
    return checked


def lm_lengths(table: pa.Table) -> np.ndarray:
    """Characters per record: a cheap stand-in for token counts when grouping records by length."""
    if MESSAGES in table.column_names:
        values = table.column(MESSAGES).combine_chunks()
        sizes = pc.utf8_length(pc.list_flatten(values).field("content")).to_numpy(zero_copy_only=False)
        lengths = np.zeros(len(values), dtype=np.int64)
        np.add.at(lengths, pc.list_parent_indices(values).to_numpy(), sizes)
        return lengths
    names = [c for c in (PROMPT, RESPONSE, TEXT) if c in table.column_names]
    return sum(pc.utf8_length(table.column(c)).to_numpy().astype(np.int64) for c in names)
