"""A rank's evaluation batches, shared by every task's sharded evaluation.

Where the ranks must run the same forward passes (a sharded model gathers its weights in each), a rank
with fewer batches runs filler passes that count for nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from rocmtrain_train.collectives import MAX, over_ranks
from rocmtrain_train.data.batch_plan import sorted_batches
from rocmtrain_train.data.tokens import Encoded

Batch = dict[str, torch.Tensor]
# A batch to evaluate, and whether it counts (a filler pass that keeps the ranks in step does not).
Counted = tuple[Batch, bool]


def eval_batches(
    data: Encoded | None,
    batch_size: int,
    collate: Callable[..., Batch],
    pad_id: int,
    *,
    multiple_of: int,
    device: torch.device,
    lockstep: bool,
) -> Iterator[Counted]:
    """This rank's evaluation records in batches of similar length, collated as they are needed, each counted;
    then, where the ranks go in `lockstep`, uncounted one-token fillers until this rank has run as many passes as
    the rank with the most."""
    rows = [] if data is None else sorted_batches(data.lengths, batch_size)
    total = int(over_ranks([len(rows)], MAX, device)[0]) if lockstep else len(rows)
    filler = {"input_ids": torch.full((1, 1), pad_id), "attention_mask": torch.ones((1, 1), dtype=torch.int64)}
    for i in range(total):
        yield (collate(data, rows[i], pad_id, multiple_of=multiple_of), True) if i < len(rows) else (filler, False)
