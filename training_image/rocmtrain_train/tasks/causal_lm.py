"""Causal language models: next-token loss on the tokens that carry it, averaged over the whole global batch.

A micro-batch weighs in by its tokens that carry loss (`loss_items`), so the step's loss is the mean
over every such token of the step, across ranks and micro-batches: no mean of per-batch means. A rank's
records of a step go into forward passes in one of three layouts:

- padded (the default): `batchSizePerWorker` records a pass, longest first, padded to the longest;
- packed (`training.packing`): packed into rows of `maxSeqLength` tokens (`data.causal_lm.tokens.pack`),
  `batchSizePerWorker` rows a pass;
- flat (`attentionImplementation: varlen`, padding-free): `batchSizePerWorker` records a pass as one
  row, back to back, positions restarting at each record.

With `training.tokensPerWorker`, a pass holds records up to that many tokens instead, padding counted:
padded records while their count times the longest fits, packed rows while their count times
`maxSeqLength` fits, or one flat row of up to that many (records shared out evenly over the passes).
Records that `data.truncation` dropped train in no forward pass, nor give a generation's prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import RocmTrainingJobSpec
from rocmtrain.api.models.chat_template_args import template_args
from rocmtrain_train.data.batch_plan import micro_batches, token_batches
from rocmtrain_train.data.causal_lm.tokens import LmFormat, collate_lm, collate_packed, encode_lm, loss_counts, pack
from rocmtrain_train.data.tokens import Encoded
from rocmtrain_train.evaluation.batches import eval_batches
from rocmtrain_train.evaluation.causal_lm import Generated, evaluate_lm, generate
from rocmtrain_train.model.causal_lm import check_causal_lm_files, load_causal_lm
from rocmtrain_train.reporting.rank_report import Evaluation
from rocmtrain_train.tasks import Autocast, MicroBatch, Samples


def _rank() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclass(frozen=True)
class LanguageModel:
    """Causal-LM fine-tuning: full, or of a LoRA adapter (`spec.adapter`)."""

    spec: RocmTrainingJobSpec

    @property
    def format(self) -> LmFormat:
        spec = self.spec
        return LmFormat(
            spec.data.record_shape,
            spec.loss_on,
            spec.model.max_seq_length,
            spec.model.chat_template,
            chat_template_args=template_args(spec.data.chat_template_args),
            truncation=spec.data.over_length,
        )

    def check_model(self, path: Path) -> Any:
        return check_causal_lm_files(path, self.spec)

    def load(self, path: Path, *, gpu: bool) -> tuple[Any, Any]:
        return load_causal_lm(path, self.spec, gpu=gpu)

    def encode(self, tokenizer: Any, table: pa.Table, rows: Sequence[int], where: str, token_types: bool) -> Encoded:
        encoded = encode_lm(tokenizer, table, rows, self.format)
        if len(encoded) and not loss_counts(encoded).any():
            why = (
                "the prompts fill it; raise maxSeqLength"
                if self.spec.data.over_length == "cut"
                else "with data.truncation drop, none keeps all of them; raise maxSeqLength, or cut them"
            )
            raise ConfigError(
                f"{where}: no record keeps a token to learn within spec.model.maxSeqLength "
                f"({self.spec.model.max_seq_length} tokens): {why}"
            )
        return encoded

    def loss_items(self, encoded: Encoded) -> np.ndarray:
        return loss_counts(encoded)

    def micro_batches(self, rows: Sequence[int], encoded: Encoded, batch_size: int) -> list[MicroBatch]:
        """The records not dropped, cut into forward passes; where all are, the first alone: every rank runs a
        pass in each step, and a dropped record adds 0 to it."""
        rows = [r for r, dropped in zip(rows, encoded.dropped(rows), strict=True) if not dropped] or list(rows[:1])
        training, lengths = self.spec.training, encoded.lengths
        budget, row_length = training.tokens_per_worker, self.spec.model.max_seq_length
        if training.varlen:
            flat = pack(rows, lengths, budget) if budget else micro_batches(rows, lengths, batch_size)
            return [[row] for row in flat]
        if training.packing:
            packed = pack(rows, lengths, row_length)
            per_pass = budget // row_length if budget else batch_size
            return [packed[i : i + per_pass] for i in range(0, len(packed), per_pass)]
        return list(token_batches(rows, lengths, budget) if budget else micro_batches(rows, lengths, batch_size))

    def collate(
        self, encoded: Encoded, micro: MicroBatch, pad_id: int, *, multiple_of: int, pin: bool = False
    ) -> dict[str, torch.Tensor]:
        if self.spec.training.packing or self.spec.training.varlen:
            return collate_packed(encoded, micro, pad_id, multiple_of=multiple_of, pin=pin)  # type: ignore[arg-type]
        return collate_lm(encoded, micro, pad_id, multiple_of=multiple_of, pin=pin)  # type: ignore[arg-type]

    def _generation_rows(self, data: Encoded) -> list[int]:
        """This rank's share of the first `evaluation.generate.records` evaluation records (shared out every W-th),
        those dropped left out."""
        spec = self.spec.evaluation.generate
        assert spec is not None
        rank, world_size = _rank()
        first = range(min(len(range(rank, spec.records, world_size)), len(data)))
        return [r for r, dropped in zip(first, data.dropped(first), strict=True) if not dropped]

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
            data, batch_size, collate_lm, pad, multiple_of=multiple_of, device=device, lockstep=lockstep
        )
        options = self.spec.evaluation.generate

        def generated() -> Generated:
            assert options is not None
            chosen = [] if data is None else self._generation_rows(data)
            empty = Encoded.from_lists([], None, [], masks=[], response_starts=[])
            return generate(
                model,
                tokenizer,
                data if data is not None else empty,
                chosen,
                options,
                batch_size=batch_size,
                device=device,
                autocast=autocast,
                lockstep=lockstep,
            )

        return evaluate_lm(model, batches, generated if options is not None else None, device, autocast)
