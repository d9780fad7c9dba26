"""Language-model records as tokens: which tokens carry loss, and batches padded or packed.

Each record becomes one sequence that ends with the tokenizer's end-of-sequence token:

- pairs: the prompt (with the tokenizer's special tokens, a BOS for Llama), then the response, then EOS;
- chats: the conversation rendered by the chat template (the job's `model.chatTemplate`, else the
  tokenizer's) with the job's `data.chatTemplateArgs`, tokenised once; each assistant turn (its text and
  end-of-turn mark, `data.causal_lm.chat`) is a response;
- text: the text, then EOS.

`lossOn: response` puts loss on the responses only, `all` on every token. The first token of a
record never carries loss (nothing predicts it), so a packed row's records never predict each
other. `Encoded.response_starts` marks where each record's last response begins: the prompt of a
generation is everything before it, the reference everything after.

A record longer than `maxSeqLength` tokens is cut at the end (`data.truncation: cut`), or dropped where
that cuts a token that carries loss (`drop`); one left with no token that carries loss is dropped either
way. A dropped record keeps its place (the batch plan counts it) as its first token alone, without loss
(`Encoded.fits`). A batch tells the model the count of its tokens that carry loss, at least 1
(`num_items_in_batch`, which transformers divides the batch's summed loss by): a batch with none has loss
0, not 0/0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import torch

from rocmtrain.api.models import RecordShape, Truncation
from rocmtrain_train.data.causal_lm.chat import ChatArgs, Message, encode_chats
from rocmtrain_train.data.causal_lm.records import MESSAGES, PROMPT, RESPONSE, TEXT
from rocmtrain_train.data.tokens import ENCODE_CHUNK, Encoded, Fit

# Label of a token that carries no loss (torch's cross-entropy ignore_index, as transformers uses it).
IGNORE = -100


@dataclass(frozen=True)
class LmFormat:
    """How a job turns its records into sequences."""

    shape: RecordShape
    loss_on: Literal["response", "all"]
    max_length: int
    chat_template: str | None = None  # the job's, replacing the tokenizer's
    chat_template_args: ChatArgs = field(default_factory=dict)  # the job's options of the template
    truncation: Truncation = "cut"


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


def _chats(tokenizer: Any, chats: list[list[Message]], fmt: LmFormat, eos: int) -> list[_Sequence]:
    found = encode_chats(tokenizer, chats, fmt.chat_template, fmt.chat_template_args, eos)
    return [_Sequence(ids, spans, spans[-1][0] if spans else len(ids)) for ids, spans in found]


def _sequences(tokenizer: Any, taken: pa.Table, fmt: LmFormat) -> list[_Sequence]:
    eos = tokenizer.eos_token_id
    if fmt.shape == "pairs":
        return _pairs(tokenizer, taken.column(PROMPT).to_pylist(), taken.column(RESPONSE).to_pylist(), eos)
    if fmt.shape == "chat":
        return _chats(tokenizer, taken.column(MESSAGES).to_pylist(), fmt, eos)
    return _texts(tokenizer, taken.column(TEXT).to_pylist(), eos)


def _fit(mask: np.ndarray, fmt: LmFormat) -> Fit:
    """What `max_length` leaves of a record whose tokens that carry loss are `mask`."""
    kept, lost = mask[: fmt.max_length].any(), mask[fmt.max_length :].any()
    if not kept or (lost and fmt.truncation == "drop"):
        return Fit.DROPPED
    return Fit.CUT if len(mask) > fmt.max_length else Fit.WHOLE


def encode_lm(tokenizer: Any, table: pa.Table, rows: Sequence[int], fmt: LmFormat) -> Encoded:
    """The given rows of a causal-lm table as sequences of at most `max_length` tokens, with the tokens that carry
    loss marked, and what the length left of each (`Fit`): longer ones cut at the end or dropped."""
    taken = table.take(pa.array(rows, type=pa.int64()))
    sequences = _sequences(tokenizer, taken, fmt)
    ids, masks, starts, fits = [], [], [], []
    for seq in sequences:
        mask = np.zeros(len(seq.ids), dtype=np.int8)
        if fmt.loss_on == "all":
            mask[:] = 1
        for a, b in seq.spans:
            mask[a:b] = 1
        mask[0] = 0
        fit = _fit(mask, fmt)
        length = 1 if fit is Fit.DROPPED else fmt.max_length
        ids.append(seq.ids[:length])
        masks.append(mask[:length])
        starts.append(min(seq.response_start, length))
        fits.append(fit)
    return Encoded.from_lists(ids, None, [], masks=masks, response_starts=starts, fits=fits)


def loss_counts(encoded: Encoded) -> np.ndarray:
    """Tokens that carry loss, per record."""
    assert encoded.loss_mask is not None
    return np.add.reduceat(encoded.loss_mask.astype(np.int64), encoded.offsets[:-1]) * (encoded.lengths > 0)


def _labels(encoded: Encoded, row: int) -> np.ndarray:
    assert encoded.loss_mask is not None
    start, end = encoded.offsets[row], encoded.offsets[row + 1]
    return np.where(encoded.loss_mask[start:end] > 0, encoded.ids[start:end], IGNORE)


def _loss_divisor(labels: np.ndarray) -> torch.Tensor:
    """What transformers divides a batch's summed loss by (`num_items_in_batch`): the tokens it predicts that carry
    loss (each label predicted from the token before), at least 1, so that a batch with none has loss 0."""
    return torch.tensor(max(int((labels[:, 1:] != IGNORE).sum()), 1))


def _width(length: int, multiple_of: int) -> int:
    return int(-(-length // multiple_of) * multiple_of)


def collate_lm(
    encoded: Encoded, rows: Sequence[int], pad_id: int, *, multiple_of: int = 1, pin: bool = False
) -> dict[str, torch.Tensor]:
    """Records padded to the batch's longest (rounded up to `multiple_of`); padding carries no loss. The model's
    loss is the mean over the batch's tokens that carry loss (0 where it has none)."""
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
        "num_items_in_batch": _loss_divisor(labels),
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
        "num_items_in_batch": _loss_divisor(labels),
    }
    return {k: v.pin_memory() for k, v in batch.items()} if pin else batch
