"""Sequence classification and regression: a fresh head on a pretrained encoder, one label per record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from rocmtrain.api.models import RocmTrainingJobSpec
from rocmtrain_train.data.batch_plan import micro_batches
from rocmtrain_train.data.records import records
from rocmtrain_train.data.tokens import Encoded, collate, encode
from rocmtrain_train.evaluation.batches import eval_batches
from rocmtrain_train.evaluation.classification import evaluate
from rocmtrain_train.model.pretrained import check_model_files, load_model
from rocmtrain_train.reporting.rank_report import Evaluation
from rocmtrain_train.tasks import Autocast, MicroBatch, Samples


@dataclass(frozen=True)
class Classification:
    """Classifiers (`sequence-classification`) and regression heads: the loss is the mean over records."""

    spec: RocmTrainingJobSpec

    def check_model(self, path: Path) -> Any:
        return check_model_files(path, self.spec.model, self.spec.training)

    def load(self, path: Path, *, gpu: bool) -> tuple[Any, Any]:
        return load_model(path, self.spec.model, self.spec.training)

    def encode(self, tokenizer: Any, table: pa.Table, rows: Sequence[int], where: str, token_types: bool) -> Encoded:
        model = self.spec.model
        found = records(table, rows, model, where)
        regression = model.task == "regression"
        return encode(tokenizer, found, model.max_seq_length, regression=regression, token_types=token_types)

    def loss_items(self, encoded: Encoded) -> np.ndarray:
        return np.ones(len(encoded), dtype=np.int64)

    def micro_batches(self, rows: Sequence[int], encoded: Encoded, batch_size: int) -> list[MicroBatch]:
        return list(micro_batches(rows, encoded.lengths, batch_size))

    def collate(
        self, encoded: Encoded, micro: MicroBatch, pad_id: int, *, multiple_of: int, pin: bool = False
    ) -> dict[str, torch.Tensor]:
        return collate(encoded, micro, pad_id, multiple_of=multiple_of, pin=pin)  # type: ignore[arg-type]

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
        pad = tokenizer.pad_token_id
        batches = eval_batches(
            data, batch_size, collate, pad, multiple_of=multiple_of, device=device, lockstep=lockstep
        )
        return evaluate(model, batches, self.spec.model, device, autocast), []
