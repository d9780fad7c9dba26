"""Language-model records and batches, with the example's real tiny Llama and tokenizer (no Ray).

Loss masking, the token-weighted loss of a global batch, packing without attention across records, and
the refusals of bad records: each is checked against the model's own forward pass or a hand computation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForCausalLM

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import DataSource, DataSpec, ModelSpec
from rocmtrain_train.data.causal_lm.tokens import (
    IGNORE,
    LmFormat,
    collate_lm,
    collate_packed,
    encode_lm,
    loss_counts,
    pack,
)
from rocmtrain_train.data.records import read_table, text_lengths
from rocmtrain_train.data.tokens import Fit
from rocmtrain_train.loop.step_loop import loss_weight

LM = ModelSpec(source="/m", task="causal-lm")
PAIRS = DataSpec(train=DataSource(uri="/unused"), promptField="q", responseField="a")
CHATS = DataSpec(train=DataSource(uri="/unused"), messagesField="chat")
TEXT = DataSpec(train=DataSource(uri="/unused"), textField="body")
QUESTIONS = [
    ("question : what colour is the zorb ? answer :", "red"),
    ("question : where does the quill live ? answer :", "cave"),
    ("question : the mimbo eats what ? answer :", "fish"),
    ("question : name the colour of a tarsk . answer :", "blue"),
]


def pair_table(rows=QUESTIONS) -> pa.Table:
    return pa.table({"prompt": [q for q, _ in rows], "response": [a for _, a in rows]})


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


# --- sequences and their loss masks ------------------------------------------------------------


def test_a_pair_is_prompt_then_response_then_eos_with_loss_on_the_response(tokenizer):
    encoded = encode_lm(tokenizer, pair_table(), [0], LmFormat("pairs", "response", 64))
    ids = encoded.ids.tolist()
    words = tokenizer.convert_ids_to_tokens(ids)
    assert words[0] == "<s>" and words[-2:] == ["red", "</s>"]
    assert encoded.loss_mask.tolist() == [0] * (len(ids) - 2) + [1, 1]  # the response and its EOS
    assert encoded.response_starts.tolist() == [len(ids) - 2]
    all_tokens = encode_lm(tokenizer, pair_table(), [0], LmFormat("pairs", "all", 64))
    assert all_tokens.loss_mask.tolist() == [0] + [1] * (len(ids) - 1)  # the first token: nothing predicts it


def test_a_chat_carries_loss_on_each_assistant_turn_through_its_end_of_turn(tokenizer):
    chat = [
        {"role": "system", "content": "answer with one word ."},
        {"role": "user", "content": "what colour is the zorb ?"},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": "where does the quill live ?"},
        {"role": "assistant", "content": "cave"},
    ]
    encoded = encode_lm(tokenizer, pa.table({"messages": [chat]}), [0], LmFormat("chat", "response", 64))
    words = tokenizer.convert_ids_to_tokens(encoded.ids.tolist())
    learned = [w for w, m in zip(words, encoded.loss_mask, strict=True) if m]
    assert learned == ["red", "</s>", "cave", "</s>"]
    assert words[-1] == "</s>"  # every sequence ends with EOS
    prompt = words[: encoded.response_starts[0]]
    assert prompt[-1] == "<|assistant|>" and prompt.count("<|assistant|>") == 2  # the last answer's prompt


def test_plain_text_learns_every_token_and_ends_with_eos(tokenizer):
    encoded = encode_lm(tokenizer, pa.table({"text": ["the zorb eats fish"]}), [0], LmFormat("text", "all", 64))
    words = tokenizer.convert_ids_to_tokens(encoded.ids.tolist())
    assert words == ["<s>", "the", "zorb", "eats", "fish", "</s>"]
    assert loss_counts(encoded).tolist() == [5]


def test_long_records_are_cut_at_the_end_and_those_left_with_nothing_to_learn_are_dropped(tokenizer):
    """Record 0 is 13 tokens (its prompt 11, then `red </s>`), record 2 is 12."""
    cut = encode_lm(tokenizer, pair_table(), [0, 2], LmFormat("pairs", "response", 12))
    assert cut.lengths.tolist() == [12, 12] and cut.fits.tolist() == [Fit.CUT, Fit.WHOLE]
    assert loss_counts(cut).tolist() == [1, 2]  # the cut response keeps `red`, not its EOS
    dropped = encode_lm(tokenizer, pair_table(), [0, 2], LmFormat("pairs", "response", 12, truncation="drop"))
    assert dropped.fits.tolist() == [Fit.DROPPED, Fit.WHOLE] and loss_counts(dropped).tolist() == [0, 2]
    for truncation in ("cut", "drop"):  # the prompts alone fill 8 tokens: nothing left to learn
        encoded = encode_lm(tokenizer, pair_table(), [0, 2], LmFormat("pairs", "response", 8, truncation=truncation))
        assert encoded.fits.tolist() == [Fit.DROPPED, Fit.DROPPED]
        assert encoded.lengths.tolist() == [1, 1] and loss_counts(encoded).tolist() == [0, 0]  # the first token alone
        assert tokenizer.convert_ids_to_tokens(encoded.ids.tolist()) == ["<s>", "<s>"]


# --- the loss -------------------------------------------------------------------------------


def test_the_loss_is_the_mean_over_response_tokens_as_computed_by_hand(tokenizer, model):
    encoded = encode_lm(tokenizer, pair_table(), [0, 1, 2, 3], LmFormat("pairs", "response", 64))
    batch = collate_lm(encoded, [0, 1, 2, 3], tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = model(**batch).loss
    terms = []
    for row in range(4):
        start = int(encoded.offsets[row])
        for t in np.flatnonzero(encoded.loss_mask[start : encoded.offsets[row + 1]]):
            terms.append(
                torch.nn.functional.cross_entropy(logits[row, t - 1], torch.tensor(int(encoded.ids[start + t])))
            )
    assert len(terms) == int(loss_counts(encoded).sum()) == 8
    torch.testing.assert_close(loss, torch.stack(terms).mean())

    other = dict(batch, labels=batch["labels"].clone())
    prompt = other["labels"] == IGNORE
    prompt &= batch["attention_mask"].bool()
    other["labels"][prompt] = 7  # the prompt tokens' labels, were they learned: ignored with lossOn response
    with torch.no_grad():
        assert not torch.equal(model(**other).loss, loss)  # they would change the loss
    response_only = dict(batch, labels=batch["labels"].masked_fill(prompt, IGNORE))
    with torch.no_grad():
        torch.testing.assert_close(model(**response_only).loss, loss)


def gradients(model, batches, weights) -> dict[str, torch.Tensor]:
    model.zero_grad()
    for batch, weight in zip(batches, weights, strict=True):
        (model(**batch).loss * weight).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_micro_batches_weigh_in_by_their_tokens_so_the_step_is_the_mean_over_the_whole_batch(tokenizer, tiny_lm):
    """A step of two micro-batches with 3 and 5 response tokens trains exactly what one batch of all of them does
    (one rank); a mean of the two micro-batches' means would not."""
    model = AutoModelForCausalLM.from_pretrained(tiny_lm)
    rows = [("question : what colour is the zorb ? answer :", "red"), ("q :", "cave fish forest swamp")]
    encoded = encode_lm(tokenizer, pair_table(rows), [0, 1], LmFormat("pairs", "response", 64))
    counts = loss_counts(encoded).tolist()
    assert counts == [2, 5]
    whole = gradients(model, [collate_lm(encoded, [0, 1], tokenizer.pad_token_id)], [1.0])
    parts = [collate_lm(encoded, [r], tokenizer.pad_token_id) for r in (0, 1)]
    weighted = gradients(model, parts, [loss_weight(n, sum(counts), world_size=1) for n in counts])
    means = gradients(model, parts, [0.5, 0.5])
    for name, grad in whole.items():
        torch.testing.assert_close(weighted[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert any(not torch.allclose(means[n], g, rtol=1e-3) for n, g in whole.items())


# --- packing ----------------------------------------------------------------------------------


def test_packing_takes_as_few_rows_as_first_fit_decreasing_and_balances_them():
    # First-fit decreasing packs these 20 tokens into rows of 8, 8 and 4: padded to 8, a forward pass computes on 24.
    rows = pack([0, 1, 2, 3, 4], [5, 3, 4, 2, 6], 8)
    assert rows == [[4], [0, 3], [2, 1]]
    assert [sum([5, 3, 4, 2, 6][r] for r in row) for row in rows] == [6, 7, 7]  # padded to 7: 21
    # Where balancing cannot place every record in that many rows (6 + 3 and 4 + 4 leave no room for the last 3),
    # the first-fit rows stand.
    assert pack([0, 1, 2, 3, 4], [6, 4, 4, 3, 3], 10) == [[0, 1], [2, 3, 4]]
    assert pack([0, 1], [3, 2], 8) == [[0, 1]]


def test_packed_records_equal_unpacked_ones_and_never_attend_to_each_other(tokenizer, model):
    encoded = encode_lm(tokenizer, pair_table(), [0, 1, 2, 3], LmFormat("pairs", "response", 64))
    rows = pack([0, 1, 2, 3], encoded.lengths, 64)
    assert len(rows) == 1 and sorted(rows[0]) == [0, 1, 2, 3]  # one row of four records
    packed = collate_packed(encoded, rows, tokenizer.pad_token_id, multiple_of=8)
    assert "attention_mask" not in packed
    with torch.no_grad():
        packed_logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits[0]
        at = 0
        for record in rows[0]:
            alone = collate_lm(encoded, [record], tokenizer.pad_token_id)
            n = int(encoded.lengths[record])
            logits = model(input_ids=alone["input_ids"], attention_mask=alone["attention_mask"]).logits[0]
            torch.testing.assert_close(packed_logits[at : at + n], logits[:n], rtol=1e-4, atol=1e-5)
            at += n
        unpacked = collate_lm(encoded, [0, 1, 2, 3], tokenizer.pad_token_id)
        torch.testing.assert_close(model(**packed).loss, model(**unpacked).loss, rtol=1e-4, atol=1e-5)

        n = int(encoded.lengths[rows[0][0]])
        spoiled = packed["input_ids"].clone()
        spoiled[0, :n] = torch.randint(8, len(tokenizer), (n,))  # another first record
        others = model(input_ids=spoiled, position_ids=packed["position_ids"]).logits[0]
        torch.testing.assert_close(others[n:], packed_logits[n:], rtol=1e-4, atol=1e-5)


# --- reading records ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "rows", "message"),
    [
        (PAIRS, [{"q": "hi"}], "no field 'a'"),
        (PAIRS, [{"q": "hi", "a": "x"}, {"q": "hi", "a": "  "}], "record 1: field 'a' is empty"),
        (PAIRS, [{"q": "hi", "a": 3}], "field 'a' holds int64, not text"),
        (CHATS, [{"chat": "hello"}], "must hold a list of {role, content} messages"),
        (CHATS, [{"chat": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}], "unknown role"),
        (CHATS, [{"chat": [{"role": "user", "content": "hi"}]}], "record 0: field 'chat' has no assistant message"),
        (CHATS, [{"chat": [{"role": "user", "content": "a"}, {"role": "assistant"}]}], "a message has no content"),
        (
            CHATS,
            [{"chat": [{"role": "assistant", "content": "x"}]}, {"chat": []}],
            "record 1: field 'chat' has no messages",
        ),
        (TEXT, [{"body": "x"}, {"body": ""}], "record 1: field 'body' is empty"),
    ],
)
def test_bad_records_are_refused_with_their_file_record_and_field(tmp_path, data, rows, message):
    uri = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(ConfigError, match=message) as info:
        read_table(DataSource(uri=uri), data, LM, None)
    assert uri in str(info.value)


def test_record_lengths_add_up_every_part_of_a_record(tmp_path):
    chats = [
        [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "de"}],
        [{"role": "assistant", "content": "f"}],
    ]
    uri = write_jsonl(tmp_path / "chats.jsonl", [{"chat": c} for c in chats])
    assert text_lengths(read_table(DataSource(uri=uri), CHATS, LM, None)).tolist() == [5, 1]
    uri = write_jsonl(tmp_path / "pairs.jsonl", [{"q": "ab", "a": "cde"}])
    assert text_lengths(read_table(DataSource(uri=uri), PAIRS, LM, None)).tolist() == [5]
