"""Records longer than maxSeqLength (no Ray): cut or dropped as `data.truncation` says, counted per file over every
rank, and never a NaN loss, with the language-model example's tiny Llama.

The issue's case: 120 pairs and 8 whose prompt alone fills maxSeqLength 64 (with 3 more whose response is cut at
64, which `drop` drops too). Hugging Face's mean loss of a batch without a token that carries loss is 0/0 = NaN;
the collated batches tell the model the count to divide by, so such a batch adds 0 to every sum.
"""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rocmtrain.api.errors import ConfigError
from rocmtrain_train.data.causal_lm.tokens import IGNORE, LmFormat, collate_lm, collate_packed, encode_lm
from rocmtrain_train.data.tokens import Encoded, Fit
from rocmtrain_train.evaluation.batches import eval_batches
from rocmtrain_train.evaluation.causal_lm import evaluate_lm
from rocmtrain_train.loop.rank_shard import Tokenizing, file_truncations, load_eval_data, load_train_data, local_fits
from rocmtrain_train.loop.step_loop import loss_weight
from rocmtrain_train.model.pretrained import CACHE_ENV
from rocmtrain_train.tasks import task_for
from train.jobs import job, settings
from train.test_lm_data import QUESTIONS, gradients, pair_table, write_jsonl

# Of several lengths: the records the batch plan repeats for a second rank land on either rank.
SHORT = [(q.replace("question :", "question :" + " the" * (i % 11)), a) for i, (q, a) in enumerate(QUESTIONS * 30)]
# A prompt of 70 tokens: alone it fills maxSeqLength 64.
OVER_LONG = [("question : " + "the zorb " * 32 + "? answer :", "red")] * 8
# A prompt of 60 tokens: 4 of its response's 7 tokens (6 words and EOS) fit in 64.
CUT_RESPONSE = [("question : " + "the zorb " * 27 + "? answer :", "fish cave swamp forest blue red")] * 3
CASE = SHORT + OVER_LONG + CUT_RESPONSE
ALL = list(range(len(CASE)))
CPU = torch.device("cpu")


def lm_job(tiny_lm: Path, truncation: str, data: dict | None = None):
    spec = {
        "model": {"task": "causal-lm", "numLabels": None, "maxSeqLength": 64},
        "data": {"promptField": "prompt", "responseField": "response", "truncation": truncation, **(data or {})},
    }
    return job(f"long-{truncation}", spec, model=tiny_lm)


def rows_where(encoded: Encoded, fit: Fit) -> list[int]:
    assert encoded.fits is not None
    return np.flatnonzero(encoded.fits == fit).tolist()


@pytest.mark.parametrize(("truncation", "cut", "dropped"), [("cut", 3, 8), ("drop", 0, 11)])
def test_over_long_records_are_dropped_and_counted_and_never_trained(tokenizer, tiny_lm, truncation, cut, dropped):
    task = task_for(lm_job(tiny_lm, truncation).spec)
    encoded = task.encode(tokenizer, pair_table(CASE), ALL, "train.jsonl", False)
    assert encoded.fit_counts() == [131, cut, dropped]
    assert rows_where(encoded, Fit.DROPPED) == ALL[120 : 120 + dropped]
    assert rows_where(encoded, Fit.CUT) == ALL[128 : 128 + cut]
    assert task.loss_items(encoded)[128:].tolist() == [4 if cut else 0] * 3
    trained = sorted(r for micro in task.micro_batches(ALL, encoded, 8) for r in micro)
    assert trained == [r for r in ALL if r not in rows_where(encoded, Fit.DROPPED)]
    # A rank whose share of a step is all dropped still runs a pass (the others wait for it): one dropped record.
    assert task.micro_batches(ALL[120:128], encoded, 8) == [[120]]
    refused = "the prompts fill it" if truncation == "cut" else "with data.truncation drop, none keeps all of them"
    with pytest.raises(ConfigError, match=f"train.jsonl: no record keeps a token to learn .*{refused}"):
        task.encode(tokenizer, pair_table(CASE), ALL[120 : 120 + dropped], "train.jsonl", False)


def test_the_counts_are_of_the_whole_data_over_every_rank_and_kept_with_the_cached_tokens(
    tokenizer, tiny_lm, tmp_path, monkeypatch
):
    """Two ranks each count their share; the plan gives one record to both (131 records for 2 ranks), counted once."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    rows = [{"prompt": q, "response": a} for q, a in CASE]
    data = {"train": {"uri": write_jsonl(tmp_path / "train.jsonl", rows)}}
    data["eval"] = {"uri": write_jsonl(tmp_path / "eval.jsonl", rows[:4] + rows[120:130])}
    run = settings(lm_job(tiny_lm, "cut", data), tmp_path)
    how = Tokenizing(task_for(run.job.spec), tokenizer, tiny_lm, False, logging.getLogger("test.long"))
    shares = [load_train_data(run, rank, 2, how, torch.device("cpu")) for rank in (0, 1)]
    assert set(shares[0].plan.rows(0)) & set(shares[1].plan.rows(1)), "a record trains on both ranks"
    parts = [local_fits(share, load_eval_data(run, rank, 2, how)) for rank, share in enumerate(shares)]
    assert all(part is not None for part in parts)
    totals = [a + b for a, b in zip(*parts, strict=True)]  # what the ranks' all-reduce gives
    files = file_truncations(run.job.spec, totals)
    assert [(f.data, f.uri, f.records, f.cut, f.dropped) for f in files] == [
        ("train", data["train"]["uri"], 131, 3, 8),
        ("eval", data["eval"]["uri"], 14, 2, 8),
    ]
    assert files[0].line() == (
        f"train data {data['train']['uri']}: of 131 records, 8 dropped (nothing to learn within maxSeqLength 64, "
        "data.truncation: cut), 3 cut at the end to maxSeqLength 64"
    )
    again = load_train_data(run, 0, 2, how, torch.device("cpu"))  # from the cache this time
    assert np.array_equal(again.encoded.fits, shares[0].encoded.fits)


def test_a_batch_of_dropped_records_adds_nothing_to_the_evaluation(tokenizer, tiny_lm, model):
    """Evaluation sorts records by length: the 8 dropped ones (a token each) make a batch of their own."""
    encoded = task_for(lm_job(tiny_lm, "cut").spec).encode(tokenizer, pair_table(CASE), ALL, "eval.jsonl", False)
    pad = tokenizer.pad_token_id
    batches = list(eval_batches(encoded, 8, collate_lm, pad, multiple_of=1, device=CPU, lockstep=False))
    dropped = batches[0][0]
    assert (dropped["labels"] == IGNORE).all() and dropped["input_ids"].shape == (8, 1)
    with torch.no_grad():  # what Hugging Face's mean gives it, counted by itself: the NaN
        assert model(**{k: v for k, v in dropped.items() if k != "num_items_in_batch"}).loss.isnan()
    found, _ = evaluate_lm(model, batches, None, CPU, nullcontext)
    assert math.isfinite(found["eval_loss"]) and math.isfinite(found["eval_perplexity"])
    without, _ = evaluate_lm(model, batches[1:], None, CPU, nullcontext)
    assert found == pytest.approx(without)


def test_a_micro_batch_without_loss_tokens_adds_zero_to_the_loss_and_the_gradients(tokenizer, tiny_lm):
    """Records with no token that carries loss, built by hand (encoding would have dropped them)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_lm)
    pad = tokenizer.pad_token_id
    learned = encode_lm(tokenizer, pair_table(), [0, 1], LmFormat("pairs", "response", 64))
    ids = [learned.ids[learned.offsets[r] : learned.offsets[r + 1]].tolist() for r in (0, 1)]
    silent = Encoded.from_lists(ids, None, [], masks=[[0] * len(i) for i in ids], response_starts=[len(i) for i in ids])
    items = int(learned.loss_mask.sum())
    batch = collate_lm(learned, [0, 1], pad)
    alone = gradients(model, [batch], [1.0])
    for empty in (collate_lm(silent, [0, 1], pad), collate_packed(silent, [[0, 1]], pad)):
        loss = model(**empty).loss
        assert loss.item() == 0.0 and (loss.detach() * 0).item() == 0.0  # the step loop's interval sum adds loss x 0
        both = gradients(model, [batch, empty], [loss_weight(items, items, 1), loss_weight(0, items, 1)])
        for name, grad in alone.items():
            assert torch.isfinite(both[name]).all(), name
            torch.testing.assert_close(both[name], grad, msg=name)
