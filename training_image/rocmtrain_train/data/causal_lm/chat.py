"""Chats as tokens: which tokens are the assistant's turns, and how a chat's record ends.

A chat is rendered by its template (the job's `model.chatTemplate`, else the tokenizer's) with the job's
`data.chatTemplateArgs`, and tokenised. An assistant turn is the message's text and the template's end-of-turn
mark after it, found by the first rule that applies:

1. generation marks: a template that marks the assistant's text with `{% generation %}` is taken at its word
   (transformers' assistant mask);
2. markers: the chat is rendered again with the text of each assistant message between markers that no template
   writes. Where the markers, taken out, leave the chat as first rendered, they show where each message's text
   lies. A turn starts at its text (where the template rewrote the text's start, as Qwen3 moves reasoning out of
   it: where the generation prompt ends) and ends with what the template writes after the message when the
   message ends the chat. Scaffolding that the template writes before the text, such as Qwen3's empty
   `<think>\\n\\n</think>\\n\\n`, is not the message's and carries no loss; templates that render past turns
   otherwise than the last (Qwen3 drops their reasoning) are read as they render;
3. prefixes: each chat up to an assistant message, rendered with the generation prompt and then with the
   message, is a prefix of the whole; the turn lies between the two.

Where none applies, the chat is refused. Whitespace tokens that end a turn (the template's separator after its
end mark) carry no loss, and none trails a record. A record ends with EOS: the template's own where the chat
ends with it (ChatML with `<|im_end|>` as EOS gets no second one), else one appended, which carries loss where
the last turn ends the record.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models.chat_template_args import Scalar
from rocmtrain_train.data.causal_lm.records import ASSISTANT
from rocmtrain_train.data.tokens import ENCODE_CHUNK

# How chats become tokens: cached tokens of chats (`loop.rank_shard`) made otherwise are not reused.
CHAT_TURNS = 2
Message = dict[str, Any]
Span = tuple[int, int]
ChatArgs = Mapping[str, Scalar]

# How transformers tells a template with an assistant mask (`render_jinja_template`).
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
# Characters of Unicode's private use area, around a number: no template writes them.
_MARKER = re.compile("\ue000([0-9]+)\ue001")
NOT_FOUND = (
    "the chat template renders a chat whose assistant turns cannot be found: it has no {% generation %} marks, "
    "does not write an assistant message's text as given, and does not render the chat up to an assistant "
    "message as the start of the whole; set spec.model.chatTemplate to a template that does one of these"
)
UNMARKED = (
    "the chat template's {% generation %} marks leave every token of a chat unmarked: put them around the "
    "assistant's text and end-of-turn mark"
)


def render(tokenizer: Any, messages: list[Message], template: str | None, args: ChatArgs, **options: Any) -> str:
    """A conversation as the chat template writes it, with the job's options."""
    text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, **args, **options)
    return str(text)


@dataclass(frozen=True)
class _Chat:
    """A conversation and how it is rendered."""

    tokenizer: Any
    messages: list[Message]
    template: str | None
    args: ChatArgs

    def render(self, messages: list[Message], **options: Any) -> str:
        return render(self.tokenizer, messages, self.template, self.args, **options)

    def prompt(self, k: int) -> str:
        """The conversation before message `k`, with the generation prompt."""
        return self.render(self.messages[:k], add_generation_prompt=True) if k else ""

    @property
    def answers(self) -> list[int]:
        return [k for k, message in enumerate(self.messages) if message["role"] == ASSISTANT]


def _marker(number: int) -> str:
    return f"\ue000{number}\ue001"


def _wrapped(text: str, number: int) -> str:
    """`text` with its non-blank part between markers `number` and `number + 1`; the whitespace around it stays
    outside, where a template may strip it."""
    core = text.strip()
    lead = text[: len(text) - len(text.lstrip())]
    return f"{lead}{_marker(number)}{core}{_marker(number + 1)}{text[len(lead) + len(core) :]}"


def _marked(messages: list[Message], which: set[int]) -> tuple[list[Message], list[int]]:
    """`messages` with each text field of the messages `which` between markers 2j and 2j + 1; the message of
    each pair j."""
    owners: list[int] = []
    marked = []
    for k, message in enumerate(messages):
        if k in which:
            message = dict(message)
            for name, value in list(message.items()):
                if name != "role" and isinstance(value, str):
                    message[name] = _wrapped(value, 2 * len(owners))
                    owners.append(k)
        marked.append(message)
    return marked, owners


def _unmarked(text: str) -> tuple[str, dict[int, list[int]]]:
    """`text` without its markers, and where in that each marker stood."""
    pieces: list[str] = []
    places: dict[int, list[int]] = defaultdict(list)
    at = length = 0
    for found in _MARKER.finditer(text):
        pieces.append(text[at : found.start()])
        length += found.start() - at
        places[int(found.group(1))].append(length)
        at = found.end()
    pieces.append(text[at:])
    return "".join(pieces), places


def _common(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b`."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _after(chat: _Chat, k: int) -> str | None:
    """What the template writes after the text of message `k` where that message ends the chat."""
    marked, _ = _marked(chat.messages[: k + 1], {k})
    text, places = _unmarked(chat.render(marked))
    ends = [at[0] for number, at in places.items() if number % 2 and at]
    return text[max(ends) :] if ends else None


def _by_markers(chat: _Chat, full: str) -> list[Span] | None:
    """The character ranges of the assistant turns, found by markers; None where the markers do not show them."""
    marked, owners = _marked(chat.messages, set(chat.answers))
    text, places = _unmarked(chat.render(marked))
    if text != full or any(len(at) > 1 for at in places.values()):
        return None
    spans: list[Span] = []
    for k in chat.answers:
        pairs = [2 * j for j, owner in enumerate(owners) if owner == k]
        starts = [places[n][0] for n in pairs if places.get(n)]
        ends = [places[n + 1][0] for n in pairs if places.get(n + 1)]
        after = _after(chat, k) if ends else None
        if after is None:
            return None
        end = max(ends)
        start = min(starts) if starts else _common(chat.prompt(k), full)
        if not (spans[-1][1] if spans else 0) <= start <= end:
            return None
        spans.append((start, end + _common(after, full[end:])))
    return spans


def _by_prefixes(chat: _Chat, full: str) -> list[Span] | None:
    """The character ranges of the assistant turns, where each chat up to one renders as the start of the whole."""
    spans = []
    for k in chat.answers:
        before = chat.prompt(k)
        through = chat.render(chat.messages[: k + 1])
        if not (full.startswith(before) and full.startswith(through) and len(before) <= len(through)):
            return None
        spans.append((len(before), len(through)))
    return spans


def _turns(chat: _Chat) -> tuple[str, list[Span]]:
    """The rendered chat and the character ranges of its assistant turns."""
    full = chat.render(chat.messages)
    spans = _by_markers(chat, full)
    if spans is None:
        spans = _by_prefixes(chat, full)
    if spans is None:
        raise ConfigError(NOT_FOUND)
    return full, spans


def _token_spans(offsets: list[tuple[int, int]], chars: list[Span]) -> list[Span]:
    """Character ranges as token ranges: from the token that holds a range's first character to the last token
    that begins inside it."""
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    return [
        (int(np.searchsorted(bounds[:, 1], a, side="right")), int(np.searchsorted(bounds[:, 0], b))) for a, b in chars
    ]


def _located(tokenizer: Any, chats: list[_Chat]) -> list[tuple[list[int], list[Span]]]:
    found = []
    for start in range(0, len(chats), ENCODE_CHUNK):
        turns = [_turns(chat) for chat in chats[start : start + ENCODE_CHUNK]]
        out = tokenizer(
            [text for text, _ in turns], add_special_tokens=False, return_offsets_mapping=True, truncation=False
        )
        for (_, chars), ids, offsets in zip(turns, out["input_ids"], out["offset_mapping"], strict=True):
            found.append((list(ids), _token_spans(offsets, chars)))
    return found


def _runs(mask: list[int]) -> list[Span]:
    """The ranges of consecutive ones in `mask`."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], np.asarray(mask, dtype=np.int8), [0]))))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _masked(
    tokenizer: Any, chats: list[list[Message]], template: str | None, args: ChatArgs
) -> list[tuple[list[int], list[Span]]]:
    found = []
    for start in range(0, len(chats), ENCODE_CHUNK):
        out = tokenizer.apply_chat_template(
            chats[start : start + ENCODE_CHUNK],
            chat_template=template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            **args,
        )
        for ids, mask in zip(out["input_ids"], out["assistant_masks"], strict=True):
            if not any(mask):
                raise ConfigError(UNMARKED)
            found.append((list(ids), _runs(mask)))
    return found


def _ended(ids: list[int], spans: list[Span], eos: int, blank: Callable[[int], bool]) -> tuple[list[int], list[Span]]:
    """The record as it ends: turns without the whitespace tokens that end them, no whitespace after the last
    turn, then EOS (the chat's own, else one appended, learned where the last turn ends the record)."""
    turns = []
    for a, b in spans:
        while b > a and blank(ids[b - 1]):
            b -= 1
        if b > a:
            turns.append((a, b))
    end = len(ids)
    while end > (turns[-1][1] if turns else 0) and blank(ids[end - 1]):
        end -= 1
    ids = ids[:end]
    if not ids or ids[-1] != eos:
        ids.append(eos)
        if turns and turns[-1][1] == end:
            turns[-1] = (turns[-1][0], end + 1)
    return ids, turns


def encode_chats(
    tokenizer: Any, chats: list[list[Message]], template: str | None, args: ChatArgs, eos: int
) -> list[tuple[list[int], list[Span]]]:
    """Each chat's tokens, ending with EOS, and the token ranges of its assistant turns."""
    if _GENERATION.search(tokenizer.get_chat_template(template)):
        tokenized = _masked(tokenizer, chats, template, args)
    else:
        tokenized = _located(tokenizer, [_Chat(tokenizer, chat, template, args) for chat in chats])

    @functools.cache
    def blank(token: int) -> bool:
        return not tokenizer.decode([token]).strip()

    return [_ended(ids, spans, eos, blank) for ids, spans in tokenized]
