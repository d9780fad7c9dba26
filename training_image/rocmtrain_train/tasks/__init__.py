"""Tasks: what the training loop asks of the thing it trains, behind one seam.

A task loads its model and tokenizer, checks that they fit the job, turns a rank's records into
tokens, cuts a rank's share of a step into micro-batches and pads them, weighs each micro-batch in
the step's loss, and evaluates. The loop itself (`loop.step_loop`) knows none of this:

- `classification`: sequence-classification and regression heads (`spec.model.task`);
- `causal_lm`: causal language models (`causal-lm`), with loss masking, packing and LoRA.

A task joins its pieces from the stages below, where each stage names a task's own module for it
(`data.causal_lm`, `model.causal_lm`, `evaluation.classification`, `evaluation.causal_lm`); the shared
modules (`data.records`, `data.tokens`, `model.pretrained`) also hold a classifier's plain records, tokens and head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from rocmtrain.api.models import RocmTrainingJobSpec

if TYPE_CHECKING:
    import torch

    from rocmtrain_train.data.tokens import Encoded
    from rocmtrain_train.reporting.rank_report import Evaluation

# What one forward pass trains on: records, or (packed) rows of records.
MicroBatch = Sequence[int] | Sequence[Sequence[int]]
Autocast = Callable[[], AbstractContextManager[Any]]
# A few generated texts of an evaluation (prompt, output, reference), for the log and the summary.
Samples = list[dict[str, str]]


class Task(Protocol):
    """The task of a job, as the loop and the driver see it."""

    @property
    def spec(self) -> RocmTrainingJobSpec:
        """The job it trains for."""

    def check_model(self, path: Path) -> Any:
        """Raise ConfigError where the model's config or tokenizer does not fit the job; return the tokenizer."""

    def load(self, path: Path, *, gpu: bool) -> tuple[Any, Any]:
        """The model to train (in the precision of its weights' role, on GPUs or not) and its tokenizer; a causal LM
        that FSDP shards comes on the meta device, for the rank to fill its shards (`model.sharded_load`)."""

    def encode(self, tokenizer: Any, table: pa.Table, rows: Sequence[int], where: str, token_types: bool) -> Encoded:
        """The given rows of a read table, tokenised."""

    def loss_items(self, encoded: Encoded) -> np.ndarray:
        """Per record, what it adds to the count the step's loss is averaged over: 1 (a classifier's record),
        or its tokens that carry loss (a language model)."""

    def micro_batches(self, rows: Sequence[int], encoded: Encoded, batch_size: int) -> list[MicroBatch]:
        """A rank's records of one step (indices into `encoded`), cut into forward passes (at least one); records
        that train on nothing may be left out."""

    def collate(
        self, encoded: Encoded, micro: MicroBatch, pad_id: int, *, multiple_of: int, pin: bool = False
    ) -> dict[str, torch.Tensor]:
        """The tensors of one forward pass."""

    def evaluate(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        data: Encoded | None,
        *,
        batch_size: int,
        multiple_of: int,
        device: torch.device,
        autocast: Autocast,
        lockstep: bool,
    ) -> tuple[Evaluation, Samples]:
        """Evaluate this rank's shard with the others (a collective: every rank calls it; in `lockstep`, every rank
        runs as many forward passes); the same metrics on every rank, and this rank's samples."""


def task_for(spec: RocmTrainingJobSpec) -> Task:
    """The task of a job."""
    if spec.model.task == "causal-lm":
        from rocmtrain_train.tasks.causal_lm import LanguageModel

        return LanguageModel(spec)
    from rocmtrain_train.tasks.classification import Classification

    return Classification(spec)
