"""The batch plan (pure: no Ray, no model): what every rank trains on at every step."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from rocmtrain_train.data.batch_plan import GROUP_STEPS, batch_plan, micro_batches, sorted_batches
from rocmtrain_train.data.records import sample_order

LENGTHS = [(i * 37) % 200 + 1 for i in range(1000)]


@pytest.mark.parametrize(
    ("count", "world_size", "per_rank"), [(10, 1, 4), (10, 3, 2), (11, 4, 1), (7, 7, 1), (1000, 6, 8)]
)
def test_every_record_once_per_epoch_in_equal_shares(count, world_size, per_rank):
    order = sample_order(count, seed=5, max_samples=None)
    plan = batch_plan(order, LENGTHS, world_size=world_size, step_size=world_size * per_rank)
    trained = Counter(i for step in plan.steps for i in step)
    assert set(trained) == set(range(count))
    assert sum(trained.values()) == count + (-count % world_size)  # fewer than W records repeat
    for step in range(len(plan.steps)):
        shares = [plan.portion(step, rank) for rank in range(world_size)]
        assert len({len(share) for share in shares}) == 1  # DDP never waits for a rank that ran out
        assert sorted(i for share in shares for i in share) == sorted(plan.steps[step])
    assert len(plan.steps) == math.ceil((count + (-count % world_size)) / plan.step_size)
    rows = [plan.rows(rank) for rank in range(world_size)]
    assert set().union(*rows) == set(range(count))
    if count % world_size == 0:  # without repeats, every record belongs to one rank only
        assert sum(len(r) for r in rows) == count
    counted = [plan.counted(rank) for rank in range(world_size)]  # each record counted by one rank of those with it
    assert sorted(i for c in counted for i in c) == list(range(count))
    assert all(set(c) <= set(r) for c, r in zip(counted, rows, strict=True))


def test_the_same_global_batch_gives_the_same_steps_at_any_world_size():
    order = sample_order(960, seed=42, max_samples=None)
    one = batch_plan(order, LENGTHS, world_size=1, step_size=32)
    two = batch_plan(order, LENGTHS, world_size=2, step_size=32)
    four = batch_plan(order, LENGTHS, world_size=4, step_size=32)
    assert one.steps == two.steps == four.steps
    assert one.epoch_order(7, 0) == two.epoch_order(7, 0)
    assert one.digest == two.digest  # a checkpoint of one resumes the other exactly
    assert batch_plan(order, LENGTHS, world_size=2, step_size=64).digest != two.digest


def test_steps_group_similar_lengths_and_ranks_get_similar_loads():
    plan = batch_plan(list(range(1000)), LENGTHS, world_size=4, step_size=40)
    spread = sum(max(LENGTHS[i] for i in s) - min(LENGTHS[i] for i in s) for s in plan.steps) / len(plan.steps)
    assert spread < 15  # random steps of 40 would spread over ~190
    for step in range(len(plan.steps)):
        loads = [sum(LENGTHS[i] for i in plan.portion(step, rank)) for rank in range(4)]
        assert max(loads) - min(loads) <= max(LENGTHS[i] for i in plan.steps[step])


def test_each_epoch_has_its_own_order_and_starts_with_the_longest_step():
    plan = batch_plan(sample_order(2000, 1, None), [*LENGTHS, *LENGTHS], world_size=2, step_size=16)
    orders = [plan.epoch_order(seed=3, epoch=e) for e in range(3)]
    assert all(sorted(order) == list(range(len(plan.steps))) for order in orders)
    assert orders[0] != orders[1] != orders[2] and orders[0] == plan.epoch_order(seed=3, epoch=0)
    assert all(plan.longest[order[0]] == max(plan.longest) for order in orders)
    assert len(plan.steps) > GROUP_STEPS  # more than one length group


def test_resuming_another_plan_skips_as_many_samples():
    plan = batch_plan(list(range(100)), LENGTHS, world_size=2, step_size=10)  # 10 steps
    assert plan.resume_at(seed=1, epoch=0, samples_done=0) == 0
    assert plan.resume_at(seed=1, epoch=0, samples_done=30) == 3
    assert plan.resume_at(seed=1, epoch=0, samples_done=32) == 4  # never trains a seen sample twice
    assert plan.resume_at(seed=1, epoch=0, samples_done=100) == 10


def test_micro_batches_split_a_share_longest_first():
    lengths = [5, 50, 20, 40, 10]
    assert micro_batches([0, 1, 2, 3, 4], lengths, 2) == [[1, 3], [2, 4], [0]]
    assert [len(b) for b in sorted_batches(lengths, 2)] == [2, 2, 1]


def test_impossible_plans_are_refused():
    with pytest.raises(ValueError, match="cannot plan"):
        batch_plan([1, 2, 3], LENGTHS, world_size=2, step_size=3)
    with pytest.raises(ValueError, match="cannot plan"):
        batch_plan([], LENGTHS, world_size=1, step_size=4)
