"""The batch plan: which records each rank trains on at each optimiser step, computed alike on every rank.

The sampled records (`records.sample_order`) are padded to a multiple of the world size W by
repeating the first ones (fewer than W, as torch's DistributedSampler does), sorted by length
within groups of `GROUP_STEPS` steps (length in characters: known before tokenising) but for flat
rows, and cut into step batches of the global batch B = W x batchSizePerWorker x gradientAccumulationSteps. Rank r
trains on records r, r + W, r + 2W, ... of each step batch: the ranks get equal counts of similar
lengths (none waits for a longer one), and each rank reads and tokenises only its own records.
The step batches stay fixed for the run; each epoch trains them in a new seeded order with the
longest one first, so that running out of memory shows up at the first step.

So the same global batch gives the same plan at any W: 2 ranks x 16 train exactly what 1 x 32 does
(and 1 x 16 with two accumulation steps), and a run resumes at another world size where it
stopped. With another global batch, a resumed run continues after as many samples of the epoch.

With a token budget (`training.tokensPerWorker`, `token_plan`), steps are cut by tokens instead: the
records' token lengths (all ranks', gathered) are sorted within groups of about `GROUP_STEPS` steps'
tokens, cut into lines of W records of similar length (one per rank), and each step takes lines while a
rank's share stays within tokensPerWorker x gradientAccumulationSteps tokens (at least one line): a W-th of
the lines' tokens, or where records are padded, as many records as there are lines at the step's longest.
Every step carries about the same tokens.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Steps whose records are sorted by length together.
GROUP_STEPS = 50

Lengths = Sequence[int] | np.ndarray


@dataclass(frozen=True)
class BatchPlan:
    """The step batches of a run (record ids, into the data source) and the ranks that share them."""

    steps: tuple[tuple[int, ...], ...]
    world_size: int
    longest: tuple[int, ...]  # the longest record (in characters) of each step

    @property
    def step_size(self) -> int:
        """The global batch: records per optimiser step (the first step's: the last may hold fewer, and steps of a
        token budget as many as their tokens allow)."""
        return len(self.steps[0])

    @property
    def digest(self) -> str:
        """Identifies the steps: a checkpoint of the same steps resumes at exactly its step, at any world size."""
        data = np.asarray([i for step in self.steps for i in (*step, -1)], dtype=np.int64)
        return hashlib.sha256(data.tobytes()).hexdigest()[:32]

    def portion(self, step: int, rank: int) -> list[int]:
        """The records rank `rank` trains on in step `step`."""
        return list(self.steps[step][rank :: self.world_size])

    def rows(self, rank: int) -> list[int]:
        """Every record rank `rank` ever trains on, sorted (what it reads and tokenises)."""
        return sorted({i for step in range(len(self.steps)) for i in self.portion(step, rank)})

    def counted(self, rank: int) -> list[int]:
        """The records of `rows(rank)` that rank `rank` counts where the ranks count the data together: each record
        on the lowest rank that trains on it (the plan repeats a few records to give every rank as many)."""
        ids = np.fromiter((i for step in self.steps for i in step), dtype=np.int64)
        ranks = np.concatenate([np.arange(len(step)) % self.world_size for step in self.steps])
        lowest = np.full(int(ids.max()) + 1, self.world_size)
        np.minimum.at(lowest, ids, ranks)
        return [r for r in self.rows(rank) if lowest[r] == rank]

    def epoch_order(self, seed: int, epoch: int) -> list[int]:
        """The steps of an epoch in training order: seeded per epoch, the longest step first."""
        order = list(range(len(self.steps)))
        random.Random(f"{seed}:{epoch}").shuffle(order)  # noqa: S311 - reproducible shuffling, not cryptography
        first = max(order, key=lambda s: (self.longest[s], -s))
        order.remove(first)
        return [first, *order]

    def resume_at(self, seed: int, epoch: int, samples_done: int) -> int:
        """Steps of epoch `epoch` to skip so that at least `samples_done` of its samples count as trained
        (resuming from another plan's checkpoint)."""
        done = 0
        for position, step in enumerate(self.epoch_order(seed, epoch)):
            if done >= samples_done:
                return position
            done += len(self.steps[step])
        return len(self.steps)


def _whole_lines(order: Sequence[int], world_size: int) -> list[int]:
    """`order` with its first records repeated (fewer than `world_size`) to a multiple of the world size, as torch's
    DistributedSampler pads: every rank gets as many records."""
    return list(order) + [order[i % len(order)] for i in range(-len(order) % world_size)]


def batch_plan(
    order: Sequence[int], lengths: Lengths, *, world_size: int, step_size: int, by_length: bool = True
) -> BatchPlan:
    """The plan for sampled records `order` (record ids) of the given lengths, sorted by length within groups of
    steps (`by_length`: padded records then pad little, and packed rows of short records are short) or in their
    sampled order (flat rows: one row of a step's long records would cost SDPA attention quadratic in its
    tokens, where rows of random records are all about the mean)."""
    if step_size % world_size or not order:
        raise ValueError(f"cannot plan {len(order)} records in steps of {step_size} for {world_size} ranks")
    padded = _whole_lines(order, world_size)
    span = step_size * GROUP_STEPS
    steps: list[tuple[int, ...]] = []
    for start in range(0, len(padded), span):
        group = padded[start : start + span]
        if by_length:
            group = sorted(group, key=lambda i: lengths[i], reverse=True)
        steps += [tuple(group[j : j + step_size]) for j in range(0, len(group), step_size)]
    longest = tuple(max(int(lengths[i]) for i in step) for step in steps)
    return BatchPlan(steps=tuple(steps), world_size=world_size, longest=longest)


def token_plan(order: Sequence[int], lengths: Lengths, *, world_size: int, rank_tokens: int, padded: bool) -> BatchPlan:
    """The plan for sampled records `order` (record ids) of the given token lengths, in steps where each rank's
    share holds at most `rank_tokens` tokens (`padded`: counting the padding to the step's longest record), but
    where one line of `world_size` records holds more."""
    if not order or rank_tokens < 1:
        raise ValueError(f"cannot plan {len(order)} records in steps of {rank_tokens} tokens a rank")
    repeated = _whole_lines(order, world_size)
    steps: list[tuple[int, ...]] = []
    for group in _token_groups(repeated, lengths, rank_tokens * world_size * GROUP_STEPS, world_size):
        ordered = sorted(group, key=lambda i: lengths[i], reverse=True)
        step: list[int] = []
        tokens = 0  # the step's so far; its longest record is its first (`ordered` is longest first)
        for at in range(0, len(ordered), world_size):
            line = ordered[at : at + world_size]
            size, lines = sum(int(lengths[i]) for i in line), len(step) // world_size + 1
            if step and (lines * int(lengths[step[0]]) if padded else (tokens + size) / world_size) > rank_tokens:
                steps.append(tuple(step))
                step, tokens = [], 0
            step += line
            tokens += size
        steps.append(tuple(step))
    longest = tuple(max(int(lengths[i]) for i in step) for step in steps)
    return BatchPlan(steps=tuple(steps), world_size=world_size, longest=longest)


def _token_groups(padded: list[int], lengths: Lengths, span: int, world_size: int) -> list[list[int]]:
    """`padded` cut, in order, into groups of about `span` tokens, each of whole lines of `world_size` records."""
    groups: list[list[int]] = [[]]
    tokens = 0
    for at in range(0, len(padded), world_size):
        if tokens >= span:
            groups.append([])
            tokens = 0
        line = padded[at : at + world_size]
        groups[-1] += line
        tokens += sum(int(lengths[i]) for i in line)
    return groups


def micro_batches(rows: Sequence[int], token_lengths: Lengths, batch_size: int) -> list[list[int]]:
    """A rank's share of a step cut into micro-batches, longest first (least padding; same gradient)."""
    ordered = sorted(rows, key=lambda i: token_lengths[i], reverse=True)
    return [ordered[j : j + batch_size] for j in range(0, len(ordered), batch_size)]


def token_batches(rows: Sequence[int], token_lengths: Lengths, budget: int) -> list[list[int]]:
    """A rank's share of a step cut into padded micro-batches of at most `budget` tokens, padding counted (records x
    the longest of them), longest first; a record longer than the budget alone."""
    found: list[list[int]] = []
    for row in sorted(rows, key=lambda i: token_lengths[i], reverse=True):
        if found and (len(found[-1]) + 1) * int(token_lengths[found[-1][0]]) <= budget:
            found[-1].append(row)
        else:
            found.append([row])
    return found


def sorted_batches(lengths: Lengths, batch_size: int) -> list[list[int]]:
    """Batches in length order (evaluation: least padding, no shuffling needed)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[j : j + batch_size] for j in range(0, len(order), batch_size)]
