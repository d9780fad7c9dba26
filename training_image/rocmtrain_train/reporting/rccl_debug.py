"""Rank 0 of a job's own code (`spec.code`) has RCCL write its INIT and NET lines to a file, as rank 0 of
the built-in training loop does (`rccl_log`, `loop.rank_setup`).

Ray Train's TorchTrainer, not `loop.rank_setup`, sets up the ranks of a job's own code. `RcclDebug`,
a callback that `sdk.run_config` gives the TorchTrainer, runs on Ray Train's controller once the
workers and their process group have started (PyTorch creates RCCL's communicator later, at the first
collective) and before the training function runs: on rank 0 of a worker group with GPUs it sets
`rccl_log.debug_env`'s variables (the user's own NCCL_DEBUG* settings win), with the file in a
temporary folder of rank 0's pod, where `sdk.report` reads it. A worker group started again after a
worker failure gets it again.
"""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING

from ray.train.v2._internal.execution.callback import WorkerGroupCallback

from rocmtrain_train.reporting import rccl_log

if TYPE_CHECKING:
    from ray.train.v2._internal.execution.worker_group import WorkerGroup

RCCL_DIR_PREFIX = "rocmtrain-rccl-"


def raise_debug_level() -> None:
    """On rank 0's worker: RCCL's INIT and NET lines to `rccl_log.RCCL_LOG_NAME` in a folder of its own."""
    rccl_log.raise_debug_level(tempfile.mkdtemp(prefix=RCCL_DIR_PREFIX))


class RcclDebug(WorkerGroupCallback):
    """On Ray Train's controller: rank 0 of a GPU worker group (RCCL) raises RCCL's log level before training."""

    def after_worker_group_start(self, worker_group: WorkerGroup) -> None:
        if worker_group.get_resources_per_worker().get("GPU", 0) > 0:
            worker_group.execute_single(0, raise_debug_level)  # Ray Train's world rank 0 is worker 0
