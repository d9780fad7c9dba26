"""Integer counts combined over the ranks: one all-reduce of a whole list, on the rank's device, or the counts as they
are where the run has one rank (no process group)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

SUM, MIN, MAX = dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX


def over_ranks(values: Sequence[int] | np.ndarray, op: dist.ReduceOp.RedOpType, device: torch.device) -> np.ndarray:
    """Every rank's `values` (as many on each) combined element by element with `op` (SUM, MIN or MAX)."""
    counts = torch.as_tensor(np.asarray(values, dtype=np.int64), device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(counts, op=op)
    return counts.cpu().numpy()
