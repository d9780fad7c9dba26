"""This rank's records: the batch plan every rank shares, and its own rows, read and tokenised.

Each rank reads the data source's fields into Arrow, plans the batches from the records' lengths
(`data.batch_plan`), and decodes and tokenises only the rows it trains on. Steps of a token budget
(`training.tokensPerWorker`) are planned from the records' token lengths: each rank tokenises every W-th
record, and one all-reduce gives every rank all the lengths; the tokenised rows are cached
under `$ROCMTRAIN_CACHE/tokens` (`data.tokens`), so a restarted worker skips tokenising. Evaluation
records are shared out every W-th to each rank. What `maxSeqLength` did to a language model's records is
counted by each rank for its share (`local_fits`), each record on one rank, so that the counts summed over
the ranks are those of the whole data (`file_truncations`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import torch

from rocmtrain.api.models import DataSource, RocmTrainingJobSpec
from rocmtrain_train.collectives import SUM, over_ranks
from rocmtrain_train.config import RunSettings
from rocmtrain_train.data.batch_plan import BatchPlan, batch_plan, token_plan
from rocmtrain_train.data.causal_lm.chat import CHAT_TURNS
from rocmtrain_train.data.records import fingerprint, read_table, sample_order, text_lengths
from rocmtrain_train.data.tokens import Encoded, cache_key, load_cached, save_cached
from rocmtrain_train.model.pretrained import cache_dir
from rocmtrain_train.reporting.rank_report import FileTruncation

if TYPE_CHECKING:
    from rocmtrain_train.tasks import Task


@dataclass(frozen=True)
class Tokenizing:
    """How this rank tokenises: the task, the model's tokenizer, and whether the model takes token types."""

    task: Task
    tokenizer: Any
    model_dir: Path
    token_types: bool
    log: logging.Logger


def takes_token_types(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes token_type_ids (BERT does; decoder-only models do not)."""
    return "token_type_ids" in inspect.signature(model.forward).parameters


def encode_rows(
    settings: RunSettings, source: DataSource, table: pa.Table, rows: Sequence[int], how: Tokenizing
) -> Encoded:
    """The given records of a source, tokenised; from the cache when this rank tokenised them before."""
    spec = settings.job.spec
    origin = {**fingerprint(source, spec.data, settings.base_dir), "task": _task_key(settings)}
    path = cache_dir() / "tokens" / f"{cache_key(how.model_dir, spec.model.max_seq_length, origin, rows)}.npz"
    cached = load_cached(path)
    if cached is not None:
        how.log.info("%d tokenised records of %s from the cache %s", len(cached), source.uri, path)
        return cached
    encoded = how.task.encode(how.tokenizer, table, rows, source.uri, how.token_types)
    save_cached(path, encoded)
    return encoded


def _task_key(settings: RunSettings) -> dict[str, Any]:
    """What tokenised records depend on besides the data and the tokenizer: the task and how it makes sequences."""
    spec = settings.job.spec
    if spec.model.task != "causal-lm":
        return {"task": spec.model.task}
    return {
        "task": spec.model.task,
        "lossOn": spec.loss_on,
        "chatTemplate": spec.model.chat_template,
        "chatTemplateArgs": spec.data.chat_template_args,
        "chatTurns": CHAT_TURNS,
        "truncation": spec.data.over_length,
    }


@dataclass(frozen=True)
class TrainData:
    """This rank's training records: the plan every rank shares, and its own records, tokenised."""

    plan: BatchPlan
    encoded: Encoded
    position: dict[int, int]  # record id -> index in `encoded`
    items: np.ndarray  # per encoded record, its weight in the loss (`Task.loss_items`)
    counted: list[int]  # the encoded records this rank counts for the whole data (`BatchPlan.counted`)


def token_lengths(
    settings: RunSettings,
    table: pa.Table,
    order: Sequence[int],
    how: Tokenizing,
    device: torch.device,
    *,
    rank: int,
    world_size: int,
) -> np.ndarray:
    """Every sampled record's token length (0 for those not sampled): this rank tokenises every W-th of them (from
    the cache when it did before), and one all-reduce sums the ranks' shares."""
    share = sorted(set(order))[rank::world_size]
    lengths = np.zeros(table.num_rows, dtype=np.int64)
    if share:
        lengths[share] = encode_rows(settings, settings.job.spec.data.train, table, share, how).lengths
    return over_ranks(lengths, SUM, device)


def _plan(
    settings: RunSettings, table: pa.Table, rank: int, world_size: int, how: Tokenizing, device: torch.device
) -> BatchPlan:
    """The batch plan: steps of records, or of a token budget."""
    spec = settings.job.spec
    training = spec.training
    order = sample_order(table.num_rows, spec.data.shuffle_seed, spec.data.train.max_samples)
    budget, accumulation = training.tokens_per_worker, training.gradient_accumulation_steps
    if budget is not None:
        lengths = token_lengths(settings, table, order, how, device, rank=rank, world_size=world_size)
        padded = not (training.packing or training.varlen)
        return token_plan(order, lengths, world_size=world_size, rank_tokens=budget * accumulation, padded=padded)
    step_size = world_size * training.batch_size_per_worker * accumulation
    lengths = text_lengths(table)
    return batch_plan(order, lengths, world_size=world_size, step_size=step_size, by_length=not training.varlen)


def load_train_data(
    settings: RunSettings, rank: int, world_size: int, how: Tokenizing, device: torch.device
) -> TrainData:
    spec = settings.job.spec
    source = spec.data.train
    table = read_table(source, spec.data, spec.model, settings.base_dir, check=False)
    plan = _plan(settings, table, rank, world_size, how, device)
    rows = plan.rows(rank)
    encoded = encode_rows(settings, source, table, rows, how)
    position = {record: i for i, record in enumerate(rows)}
    counted = [position[record] for record in plan.counted(rank)]
    return TrainData(plan, encoded, position, how.task.loss_items(encoded), counted)


def load_eval_data(settings: RunSettings, rank: int, world_size: int, how: Tokenizing) -> Encoded | None:
    """This rank's share of the evaluation records (every W-th; not padded: metrics are all-reduced sums)."""
    spec = settings.job.spec
    source = spec.data.eval
    if source is None:
        return None
    table = read_table(source, spec.data, spec.model, settings.base_dir, check=False)
    rows = sample_order(table.num_rows, spec.data.shuffle_seed, source.max_samples)[rank::world_size]
    return encode_rows(settings, source, table, rows, how) if rows else None


def local_fits(train: TrainData, eval_data: Encoded | None) -> list[int] | None:
    """This rank's part of [records, cut, dropped] of the training data, then of the evaluation data (summed over
    the ranks: the whole data's); None where the task keeps no fits (a classifier's records)."""
    if train.encoded.fits is None:
        return None
    evaluated = eval_data.fit_counts() if eval_data is not None else [0, 0, 0]
    return [*train.encoded.fit_counts(train.counted), *evaluated]


def file_truncations(spec: RocmTrainingJobSpec, totals: Sequence[int]) -> list[FileTruncation]:
    """Per data file, what maxSeqLength did to its records, from `local_fits` summed over the ranks."""
    files: list[tuple[Literal["train", "eval"], DataSource | None]] = [
        ("train", spec.data.train),
        ("eval", spec.data.eval),
    ]
    found = []
    for i, (data, source) in enumerate(files):
        if source is not None:
            records, cut, dropped = totals[3 * i : 3 * i + 3]
            limit = spec.model.max_seq_length
            found.append(FileTruncation(data, source.uri, records, cut, dropped, limit, spec.data.over_length))
    return found
