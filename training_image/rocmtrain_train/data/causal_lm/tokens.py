"""Language-model records as tokens: which tokens carry loss, and batches padded or packed.

Each record becomes one sequence that ends with the tokenizer's end-of-sequence token:

- pairs: the prompt (with the tokenizer's special tokens, a BOS for Llama), then the response, then EOS;
- chats: the conversation rendered by the chat template (the job's `model.chatTemplate`, else the
  tokenizer's), tokenised once; each assistant message, up to the end of its turn, is a response;
- text: the text, then EOS.

`lossOn: response` puts loss on the responses only, `all` on every token. The first token of a
record never carries loss (nothing predicts it), so a packed row's records never predict each
other. `Encoded.response_starts` marks where each record's last response begins: the prompt of a
generation is everything before it, the reference everything after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import torch

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import RecordShape
from rocmtrain_train.data.causal_lm.records import ASSISTANT, MESSAGES, PROMPT, RESPONSE, TEXT
from rocmtrain_train.data.tokens import ENCODE_CHUNK, Encoded

# Label of a token that carries no loss (torch's cross-entropy ignore_index, as transformers uses it).
IGNORE = -100


@dataclass(frozen=True)
class LmFormat:
    """How a job turns its records into sequences."""

    shape: RecordShape
    loss_on: Literal["response", "all"]
    max_length: int
    chat_template: str | None = None  # the job's, replacing the tokenizer's


@dataclass
class _Sequence:
    ids: list[int]
    spans: list[tuple[int, int]]  # token ranges of the responses
    response_start: int


def _end(ids: list[int], eos: int) -> list[int]:
    return ids if ids and ids[-1] == eos else [*ids, eos]


def _pairs(tokenizer: Any, prompts: list[str], responses: list[str], eos: int) -> list[_Sequence]:
    found = []
    for start in range(0, len(prompts), ENCODE_CHUNK):
        asked = tokenizer(prompts[start : start + ENCODE_CHUNK])["input_ids"]
        said = tokenizer(responses[start : start + ENCODE_CHUNK], add_special_tokens=False)["input_ids"]
        for prompt, response in zip(asked, said, strict=True):
            if prompt and prompt[-1] == eos:  # a tokenizer that ends every text with EOS
                prompt = prompt[:-1]
            ids = _end([*prompt, *response], eos)
            found.append(_Sequence(ids, [(len(prompt), len(ids))], len(prompt)))
    return found


def _texts(tokenizer: Any, texts: list[str], eos: int) -> list[_Sequence]:
    found = []
    for start in range(0, len(texts), ENCODE_CHUNK):
        for ids in tokenizer(texts[start : start + ENCODE_CHUNK])["input_ids"]:
            ids = _end(ids, eos)
            found.append(_Sequence(ids, [], len(ids)))
    return found


def render(tokenizer: Any, messages: list[dict[str, str]], template: str | None, **options: Any) -> str:
    """A conversation as the chat template writes it."""
    text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, **options)
    return str(text)


def _chat_spans(
    tokenizer: Any, messages: list[dict[str, str]], template: str | None
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character ranges of its assistant turns.

    A turn runs from the end of the conversation before it, as rendered with the generation prompt, to the
    end of the conversation up to it: the template's own end-of-turn marks belong to the response.
    """
    full = render(tokenizer, messages, template)
    spans = []
    for k, message in enumerate(messages):
        if message["role"] != ASSISTANT:
            continue
        before = render(tokenizer, messages[:k], template, add_generation_prompt=True)
        through = render(tokenizer, messages[: k + 1], template)
        if not (full.startswith(before) and full.startswith(through) and len(before) <= len(through)):
            raise ConfigError(
                "the chat template does not render a conversation as the conversations before it followed by "
                "the next message, so the assistant's turns cannot be told apart; use a template that does"
            )
        spans.append((len(before), len(through)))
    return full, spans


def _chats(tokenizer: Any, chats: list[list[dict[str, str]]], template: str | None, eos: int) -> list[_Sequence]:
    found = []
    for start in range(0, len(chats), ENCODE_CHUNK):
        rendered = [_chat_spans(tokenizer, chat, template) for chat in chats[start : start + ENCODE_CHUNK]]
        out = tokenizer(
            [text for text, _ in rendered], add_special_tokens=False, return_offsets_mapping=True, truncation=False
        )
        for (_, chars), ids, offsets in zip(rendered, out["input_ids"], out["offset_mapping"], strict=True):
            begins = np.asarray([b for b, _ in offsets] or [0], dtype=np.int64)
            spans = [(int(np.searchsorted(begins, a)), int(np.searchsorted(begins, b))) for a, b in chars]
            ends_with_answer = bool(spans) and spans[-1][1] == len(ids)
            ids = _end(list(ids), eos)
            if ends_with_answer:  # the added EOS ends the last answer
                spans[-1] = (spans[-1][0], len(ids))
            found.append(_Sequence(ids, spans, spans[-1][0] if spans else len(ids)))
    return found


def _sequences(tokenizer: Any, taken: pa.Table, fmt: LmFormat) -> list[_Sequence]:
    eos = tokenizer.eos_token_id
    if fmt.shape == "pairs":
        return _pairs(tokenizer, taken.column(PROMPT).to_pylist(), taken.column(RESPONSE).to_pylist(), eos)
    if fmt.shape == "chat":
        return _chats(tokenizer, taken.column(MESSAGES).to_pylist(), fmt.chat_template, eos)
    return _texts(tokenizer, taken.column(TEXT).to_pylist(), eos)


def encode_lm(tokenizer: Any, table: pa.Table, rows: Sequence[int], fmt: LmFormat) -> Encoded:
    """The given rows of a causal-lm table as sequences of at most `max_length` tokens (longer ones are cut at
    the end), with the tokens that carry loss marked."""
    taken = table.take(pa.array(rows, type=pa.int64()))
    sequences = _sequences(tokenizer, taken, fmt)
    ids, masks, starts = [], [], []
    for seq in sequences:
        mask = np.zeros(len(seq.ids), dtype=np.int8)
        if fmt.loss_on == "all":
            mask[:] = 1
        for a, b in seq.spans:
            mask[a:b] = 1
        mask[0] = 0
        ids.append(seq.ids[: fmt.max_length])
        masks.append(mask[: fmt.max_length])
        starts.append(min(seq.response_start, fmt.max_length))
    encoded = Encoded.from_lists(ids, None, [], masks=masks, response_starts=starts)
    return encoded


def loss_counts(encoded: Encoded) -> np.ndarray:
    """Tokens that carry loss, per record."""
    assert encoded.loss_mask is not None
    return np.add.reduceat(encoded.loss_mask.astype(np.int64), encoded.offsets[:-1]) * (encoded.lengths > 0)


def _labels(encoded: Encoded, row: int) -> np.ndarray:
    assert encoded.loss_mask is not None
    start, end = encoded.offsets[row], encoded.offsets[row + 1]
    return np.where(encoded.loss_mask[start:end] > 0, encoded.ids[start:end], IGNORE)


def _width(length: int, multiple_of: int) -> int:
    return int(-(-length // multiple_of) * multiple_of)


def collate_lm(
    encoded: Encoded, rows: Sequence[int], pad_id: int, *, multiple_of: int = 1, pin: bool = False
) -> dict[str, torch.Tensor]:
    """Records padded to the batch's longest (rounded up to `multiple_of`); padding carries no loss."""
    lengths = encoded.lengths[list(rows)]
    width = _width(int(lengths.max()), multiple_of)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    labels = np.full((len(rows), width), IGNORE, dtype=np.int64)
    for i, row in enumerate(rows):
        start, end = encoded.offsets[row], encoded.offsets[row + 1]
        ids[i, : end - start] = encoded.ids[start:end]
        labels[i, : end - start] = _labels(encoded, row)
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    batch = {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(mask),
        "labels": torch.from_numpy(labels),
    }
    return {k: v.pin_memory() for k, v in batch.items()} if pin else batch


def pack(records: Sequence[int], lengths: Sequence[int] | np.ndarray, row_length: int) -> list[list[int]]:
    """Records in as few rows of at most `row_length` tokens as first-fit decreasing finds, balanced: the rows
    of a forward pass are padded to the longest, so equal rows compute on the least padding.

    First-fit decreasing (each record, longest first, into the first row it fits) gives the number of rows
    and leaves the last ones part empty; the same records, longest first, each into the emptiest row it fits
    (of that many rows), fill them evenly. Where that fits them all, the balanced rows are taken."""
    ordered = sorted(records, key=lambda r: (-int(lengths[r]), r))
    fitted = _fill(ordered, lengths, row_length, first_fit=True, rows=0)
    if len(fitted) < 2:
        return fitted
    balanced = _fill(ordered, lengths, row_length, first_fit=False, rows=len(fitted))
    return balanced if len(balanced) == len(fitted) else fitted


def _fill(
    ordered: list[int], lengths: Sequence[int] | np.ndarray, row_length: int, *, first_fit: bool, rows: int
) -> list[list[int]]:
    """`ordered` records into `rows` rows (more where they do not fit): each into the first row with room
    (`first_fit`), else into the emptiest one with room."""
    filled: list[list[int]] = [[] for _ in range(rows)]
    room = [row_length] * rows
    for record in ordered:
        size = int(lengths[record])
        fits = [i for i, left in enumerate(room) if left >= size]
        if not fits:
            filled.append([record])
            room.append(row_length - size)
            continue
        at = fits[0] if first_fit else max(fits, key=lambda i: (room[i], -i))
        filled[at].append(record)
        room[at] -= size
    return filled


def collate_packed(
    encoded: Encoded, rows: Sequence[Sequence[int]], pad_id: int, *, multiple_of: int = 1, pin: bool = False
) -> dict[str, torch.Tensor]:
    """Packed rows: the records of a row back to back, positions restarting at each record, no attention mask.

    Without an attention mask, transformers reads the records' boundaries from the restarting positions and
    lets no token attend across them (`masking_utils.find_packed_sequence_indices`); the padding at a row's
    end is a sequence of its own that nothing attends to."""
    sizes = [int(sum(encoded.lengths[r] for r in row)) for row in rows]
    width = _width(max(sizes), multiple_of)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    labels = np.full((len(rows), width), IGNORE, dtype=np.int64)
    positions = np.tile(np.arange(width, dtype=np.int64), (len(rows), 1))
    for i, row in enumerate(rows):
        at = 0
        for record in row:
            start, end = encoded.offsets[record], encoded.offsets[record + 1]
            n = int(end - start)
            ids[i, at : at + n] = encoded.ids[start:end]
            labels[i, at : at + n] = _labels(encoded, record)
            positions[i, at : at + n] = np.arange(n)
            at += n
        positions[i, at:] = np.arange(width - at)
    batch = {
        "input_ids": torch.from_numpy(ids),
        "position_ids": torch.from_numpy(positions),
        "labels": torch.from_numpy(labels),
    }
    return {k: v.pin_memory() for k, v in batch.items()} if pin else batch
