"""How a language model's records go into forward passes (no Ray): padded, packed into rows, or one flat row
(`attentionImplementation: varlen`, padding-free), of a record count or of a token budget (`tokensPerWorker`).

A flat row trains exactly what its records do alone, each attending only within itself; steps of a token
budget carry about the same tokens (a plan of record counts does not), and no forward pass holds more tokens
than the budget, padding counted, in any layout. The token lengths the plan needs are each rank's share, summed
over real ranks (gloo).
"""

from __future__ import annotations

import logging
import os
import random
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch

from rocmtrain.plan.setup import Setup
from rocmtrain_train.data.batch_plan import batch_plan, token_batches, token_plan
from rocmtrain_train.data.causal_lm.tokens import collate_lm
from rocmtrain_train.loop.rank_shard import Tokenizing, token_lengths
from rocmtrain_train.model.causal_lm import load_causal_lm
from rocmtrain_train.tasks import task_for
from train import gloo
from train.jobs import job, settings
from train.test_lm_data import QUESTIONS, pair_table, write_jsonl

CPU = torch.device("cpu")
# Records of many lengths: the questions opened by 0 to 20 filler words.
RECORDS = [(q.replace("question :", "question :" + " the" * (i % 21)), a) for i, (q, a) in enumerate(QUESTIONS * 12)]


def lm_job(tiny_lm, training: dict, name: str = "layouts", *more: dict):
    spec = {
        "model": {"task": "causal-lm", "numLabels": None, "maxSeqLength": 48},
        "data": {"promptField": "prompt", "responseField": "response"},
        "training": {"precision": "fp32", **training},
    }
    return job(name, spec, *more, model=tiny_lm)


def summed(model, batches) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss summed over the tokens that carry it, and its gradients, over `batches`."""
    model.zero_grad()
    total = torch.zeros(())
    for batch in batches:
        loss = model(**batch).loss * batch["num_items_in_batch"]
        loss.backward()
        total += loss.detach()
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_a_flat_row_trains_what_its_records_do_alone_and_no_record_sees_another(tokenizer, tiny_lm):
    spec = lm_job(tiny_lm, {"attentionImplementation": "varlen", "batchSizePerWorker": 6}).spec
    task = task_for(spec)
    model, _ = load_causal_lm(tiny_lm, spec, gpu=False)
    assert model.config._attn_implementation == "sdpa"  # on CPUs: the block-diagonal mask of restarting positions
    rows = list(range(6))
    encoded = task.encode(tokenizer, pair_table(RECORDS), rows, "train.jsonl", False)
    [micro] = task.micro_batches(rows, encoded, 6)
    flat = task.collate(encoded, micro, tokenizer.pad_token_id, multiple_of=1)
    assert flat["input_ids"].shape == (1, int(encoded.lengths[rows].sum())) and "attention_mask" not in flat
    alone = [collate_lm(encoded, [r], tokenizer.pad_token_id) for r in rows]
    loss, grads = summed(model, [flat])
    expected, expected_grads = summed(model, alone)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    # the same row with positions that run on across records: they would see each other, and the loss differ
    joined = dict(flat, position_ids=torch.arange(flat["input_ids"].shape[1])[None])
    assert not torch.allclose(summed(model, [joined])[0], expected, rtol=1e-3)


def test_steps_of_a_token_budget_carry_about_the_same_tokens_and_every_record_once():
    rng = random.Random(3)
    lengths = np.array([rng.randint(8, 512) for _ in range(2000)])
    order = list(range(len(lengths)))
    rng.shuffle(order)
    by_tokens = token_plan(order, lengths, world_size=4, rank_tokens=2048, padded=False)
    by_records = batch_plan(order, lengths, world_size=4, step_size=4 * 8)
    per_step = {
        "tokens": [int(lengths[list(s)].sum()) for s in by_tokens.steps],
        "records": [int(lengths[list(s)].sum()) for s in by_records.steps],
    }
    assert sorted(i for s in by_tokens.steps for i in s) == sorted(order)  # 2000 records: 4 ranks, none repeated
    assert all(len(step) % 4 == 0 for step in by_tokens.steps)  # whole lines: a record for each rank
    for step in by_tokens.steps:  # each rank's share within the budget, but where one line holds more
        assert len(step) == 4 or lengths[list(step)].sum() / 4 <= 2048
    spread = {k: statistics.pstdev(v) / statistics.mean(v) for k, v in per_step.items()}
    assert spread["tokens"] < spread["records"] / 3
    assert statistics.mean(per_step["tokens"]) > 0.9 * 4 * 2048
    padded = token_plan(order, lengths, world_size=4, rank_tokens=2048, padded=True)
    assert all(len(s) // 4 * lengths[list(s)].max() <= 2048 or len(s) == 4 for s in padded.steps)
    assert (
        padded.digest != by_tokens.digest
        and token_plan(order, lengths, world_size=4, rank_tokens=2048, padded=False) == by_tokens
    )


def test_flat_rows_keep_the_sampled_order_where_padded_records_and_packed_rows_sort_by_length():
    """Sorting by length saves padding, and packs short records into short rows; a step of long records in one flat
    row would cost SDPA attention quadratic in its tokens (bench/lm_throughput.py measured both)."""
    lengths = np.array([5, 50, 7, 40, 9, 30, 11, 20])
    order = [3, 0, 6, 1, 7, 2, 5, 4]
    sorted_plan = batch_plan(order, lengths, world_size=2, step_size=4)
    assert sorted_plan.steps == ((1, 3, 5, 7), (6, 4, 2, 0))
    assert batch_plan(order, lengths, world_size=2, step_size=4, by_length=False).steps == ((3, 0, 6, 1), (7, 2, 5, 4))


@pytest.mark.parametrize("layout", [{}, {"packing": True}, {"attentionImplementation": "varlen"}])
def test_no_forward_pass_of_a_token_budget_holds_more_tokens_padding_counted(tokenizer, tiny_lm, layout):
    budget = 96
    task = task_for(lm_job(tiny_lm, {"tokensPerWorker": budget, **layout}).spec)
    rows = list(range(len(RECORDS)))
    encoded = task.encode(tokenizer, pair_table(RECORDS), rows, "train.jsonl", False)
    passes = task.micro_batches(rows, encoded, 1)
    shapes = [
        task.collate(encoded, micro, tokenizer.pad_token_id, multiple_of=1)["input_ids"].shape for micro in passes
    ]
    assert all(rows * width <= budget for rows, width in shapes)
    assert sum(r * w for r, w in shapes) > 0.6 * budget * len(shapes)  # filled, not one record a pass
    flat = [r for micro in passes for item in micro for r in (item if isinstance(item, list) else [item])]
    assert sorted(flat) == rows
    if layout.get("attentionImplementation"):
        assert all(r == 1 for r, _ in shapes)


def test_token_budget_micro_batches_are_the_longest_first_at_most_the_budget_with_their_padding():
    lengths = [40, 10, 30, 30, 12, 50]
    assert token_batches(range(6), lengths, 60) == [[5], [0], [2, 3], [4, 1]]


def _lengths_on_ranks(rank: int, world: int, run, cache: str, expected: np.ndarray) -> None:
    from transformers import AutoTokenizer

    from rocmtrain_train.model.pretrained import CACHE_ENV

    os.environ[CACHE_ENV] = cache  # the fork server's environment is older than the test's
    spec = run.job.spec
    model = Path(spec.model.source)
    how = Tokenizing(task_for(spec), AutoTokenizer.from_pretrained(model), model, False, logging.getLogger())
    order = list(range(len(RECORDS)))
    found = token_lengths(run, pair_table(RECORDS), order, how, CPU, rank=rank, world_size=world)
    np.testing.assert_array_equal(found, expected)


def test_each_rank_tokenises_its_share_and_every_rank_gets_every_length(tokenizer, tiny_lm, tmp_path):
    rows = [{"prompt": q, "response": a} for q, a in RECORDS]
    data = {"data": {"train": {"uri": write_jsonl(tmp_path / "train.jsonl", rows)}}}
    run = settings(lm_job(tiny_lm, {"tokensPerWorker": 96}, "lengths", data), tmp_path / "run")
    task = task_for(run.job.spec)
    expected = task.encode(tokenizer, pair_table(RECORDS), list(range(len(RECORDS))), "train.jsonl", False).lengths
    gloo.spawn(2, _lengths_on_ranks, run, str(tmp_path / "cache"), expected)
    assert len(list((tmp_path / "cache" / "tokens").glob("*.npz"))) == 2  # a share each: neither tokenised all


def test_the_plan_counts_a_flat_row_and_a_budget_as_their_tokens(tiny_lm):
    def setup(training: dict, gpus: int = 0) -> Setup:
        spec = lm_job(tiny_lm, {"batchSizePerWorker": 4, **training}).spec
        return Setup.of(
            spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus_per_worker": gpus})})
        )

    flat = setup({"attentionImplementation": "varlen"})
    assert (flat.batch, flat.sequence, flat.eval_batch, flat.forward_pass.sequence) == (1, 4 * 48, 8, 48)
    assert not flat.flash and setup({"attentionImplementation": "varlen"}, gpus=1).flash
    budget = setup({"tokensPerWorker": 200})
    assert (budget.batch, budget.sequence, budget.eval_batch) == (200 // 48, 48, 8)
    flat_budget = setup({"attentionImplementation": "varlen", "tokensPerWorker": 1000})
    assert (flat_budget.batch, flat_budget.sequence) == (1, 1000)
