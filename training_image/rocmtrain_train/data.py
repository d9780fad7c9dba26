"""Records: reading JSONL, CSV or Parquet from a path, an object store or the hub; sharding; batching.

Sharding: the records are shuffled once with `data.shuffleSeed`, cut to `maxSamples`, and worker k
takes every W-th record starting at k. Training shards are padded to the same length by repeating
records from the start of the shard (at most one per worker, as torch's DistributedSampler does), so
every worker runs the same number of micro-batches and optimiser steps and DDP never waits on a
worker that has run out of data. Evaluation shards are not padded: their metrics are all-reduced sums.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq
import torch

from rocmtrain.api.contract import HUB_SCHEME
from rocmtrain.api.models import DataSource, DataSpec, ModelSpec
from rocmtrain_train.config import ConfigError
from rocmtrain_train.storage import (
    HubFactory,
    ObjectStoreFactory,
    describe,
    filesystem,
    hub_filesystem,
    list_files,
    object_store_filesystem,
)

FORMAT_EXTENSIONS = {"jsonl": (".jsonl", ".json", ".ndjson"), "csv": (".csv",), "parquet": (".parquet", ".pq")}
# The hub's automatic Parquet conversion of data sets stored in other formats.
HUB_PARQUET_REVISION = "@refs%2Fconvert%2Fparquet"
# Length-grouped batching sorts this many batches' worth of records at a time.
GROUP_BATCHES = 50


@dataclass(frozen=True)
class Records:
    """Texts (and optional second texts) with their labels."""

    texts: list[str]
    pairs: list[str] | None
    labels: list[int] | list[float]

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, indices: list[int]) -> Records:
        return Records(
            texts=[self.texts[i] for i in indices],
            pairs=None if self.pairs is None else [self.pairs[i] for i in indices],
            labels=[self.labels[i] for i in indices],
        )


@dataclass(frozen=True)
class Encoded:
    """Tokenised records, unpadded."""

    features: dict[str, list[list[int]]]  # input_ids and, where the tokenizer makes them, token_type_ids
    labels: list[int] | list[float]

    @property
    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.features["input_ids"]]


# --- finding and reading files -------------------------------------------------------


def format_of(path: str) -> str | None:
    suffix = PurePosixPath(path).suffix.lower()
    return next((fmt for fmt, exts in FORMAT_EXTENSIONS.items() if suffix in exts), None)


def split_files(paths: list[str], root: str, split: str) -> list[str]:
    """Files of a hub data set repository that belong to `split`.

    A file belongs to the split when a folder below `root` is named after it (`default/train/0000.parquet`)
    or its file name starts with it (`data/train-00000-of-00001.parquet`, `train.jsonl`).
    """
    chosen = []
    for path in paths:
        full = PurePosixPath(path)
        parts = full.relative_to(root).parts if full.is_relative_to(root) else full.parts[3:]
        name = parts[-1]
        if split in parts[:-1] or name == split or name.startswith((f"{split}-", f"{split}.", f"{split}_")):
            chosen.append(path)
    return chosen


def _hub_files(source: DataSource, hub: HubFactory) -> tuple[pafs.FileSystem, list[str]]:
    repo = source.uri.removeprefix(HUB_SCHEME)
    if not repo.startswith("datasets/") or repo.count("/") < 2:
        raise ConfigError(f"{source.uri}: hub data sets are written hf://datasets/<org>/<name>[/<folder>]")
    if source.split is None:
        raise ConfigError(f"{source.uri}: a hub data set needs a split (for example split: train)")
    fs = hub()
    org, name, *folder = repo.removeprefix("datasets/").split("/")
    problems = []
    for revision in ("", HUB_PARQUET_REVISION):
        root = "/".join(["datasets", org, name + revision, *folder])
        try:
            data = [p for p in list_files(fs, root) if format_of(p)]
        except ConfigError as exc:
            problems.append(str(exc))
            continue
        if chosen := split_files(data, root, source.split):
            return fs, chosen
    detail = f" ({problems[0]})" if problems else ""
    raise ConfigError(f"{source.uri}: no JSONL, CSV or Parquet files of split {source.split!r}{detail}")


def source_files(
    source: DataSource,
    base_dir: str | None,
    *,
    object_store: ObjectStoreFactory = object_store_filesystem,
    hub: HubFactory = hub_filesystem,
) -> tuple[pafs.FileSystem, list[str], str]:
    """The filesystem, the files and the format of a data source.

    A single file is read as `format` (or as its extension says); in a folder, the files of that
    format are read and others (`_SUCCESS`, READMEs) are ignored.
    """
    if source.uri.startswith(HUB_SCHEME):
        fs, files = _hub_files(source, hub)
    else:  # a split here is refused by validation (`rocmtrain.api.validate`)
        fs, path = filesystem(source.uri, base_dir, object_store=object_store)
        files = list_files(fs, path)
        if files == [path]:
            fmt = source.format or format_of(path)
            if fmt is None:
                raise ConfigError(f"{source.uri}: unknown format; name it .jsonl, .csv or .parquet or set format")
            return fs, files, fmt
    formats = {source.format} if source.format else {fmt for f in files if (fmt := format_of(f)) is not None}
    if not formats:
        raise ConfigError(f"{source.uri}: no .jsonl, .csv or .parquet files")
    if len(formats) > 1:
        raise ConfigError(f"{source.uri}: mixes formats {sorted(formats)}; point at one format or set format")
    fmt = formats.pop()
    if not (chosen := [f for f in files if format_of(f) == fmt]):
        raise ConfigError(f"{source.uri}: no {fmt} files")
    return fs, chosen, fmt


def _read_file(fs: pafs.FileSystem, path: str, fmt: str) -> pa.Table:
    try:
        with fs.open_input_file(path) as f:
            if fmt == "parquet":
                return pq.read_table(f)
            if fmt == "csv":
                return pacsv.read_csv(f)
            return pajson.read_json(f)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ConfigError(f"cannot read {path} as {fmt}: {exc}") from exc


def _column(table: pa.Table, field: str, where: str) -> list:
    if field not in table.column_names:
        raise ConfigError(f"{where}: no field {field!r} (fields: {', '.join(table.column_names)})")
    values = table.column(field).to_pylist()
    if (missing := next((i for i, v in enumerate(values) if v is None), None)) is not None:
        raise ConfigError(f"{where}: record {missing} has no value for {field!r}")
    return values


def check_labels(labels: list, model: ModelSpec, where: str) -> None:
    """Class indices within 0..numLabels-1, or numbers for regression."""
    last = (model.num_labels or 0) - 1  # numLabels is set for classification (the model requires it)
    for i, label in enumerate(labels):
        if model.task == "regression":
            if isinstance(label, bool) or not isinstance(label, int | float) or not math.isfinite(label):
                raise ConfigError(f"{where}: record {i}: regression label {label!r} is not a finite number")
            continue
        if isinstance(label, float) and label.is_integer():
            label = int(label)
        if isinstance(label, bool) or not isinstance(label, int):
            raise ConfigError(f"{where}: record {i}: label {label!r} is not a class index (0..{last})")
        if not 0 <= label <= last:
            raise ConfigError(f"{where}: record {i}: label {label} out of range 0..{last}")


def read_records(
    source: DataSource,
    data: DataSpec,
    model: ModelSpec,
    base_dir: str | None,
    *,
    object_store: ObjectStoreFactory = object_store_filesystem,
    hub: HubFactory = hub_filesystem,
) -> Records:
    """Every record of a source, checked: the fields exist, no value is missing, labels fit the task."""
    fs, files, fmt = source_files(source, base_dir, object_store=object_store, hub=hub)
    texts: list[str] = []
    pairs: list[str] | None = [] if data.text_pair_field else None
    labels: list = []
    for path in files:
        if describe(fs, path).size == 0:
            continue
        table = _read_file(fs, path, fmt)
        where = f"{source.uri} ({PurePosixPath(path).name})" if len(files) > 1 else source.uri
        texts += [str(t) for t in _column(table, data.text_field, where)]
        if pairs is not None and data.text_pair_field:
            pairs += [str(t) for t in _column(table, data.text_pair_field, where)]
        file_labels = _column(table, data.label_field, where)
        check_labels(file_labels, model, where)
        labels += file_labels
    if not texts:
        raise ConfigError(f"{source.uri}: no records")
    if model.task == "regression":
        return Records(texts, pairs, [float(v) for v in labels])
    return Records(texts, pairs, [int(v) for v in labels])


# --- sampling and sharding -------------------------------------------------------------


def sample_order(count: int, seed: int, max_samples: int | None) -> list[int]:
    """Record indices after a seeded shuffle, cut to `max_samples`."""
    order = list(range(count))
    random.Random(seed).shuffle(order)  # noqa: S311 - reproducible shuffling, not cryptography
    return order[:max_samples]


def shard(order: list[int], rank: int, world_size: int, *, pad: bool) -> list[int]:
    """Worker `rank`'s records: every `world_size`-th index; padded to equal length when `pad`."""
    own = order[rank::world_size]
    if pad:
        own += own[: math.ceil(len(order) / world_size) - len(own)]
    return own


# --- tokenising and batching -------------------------------------------------------------


def encode(tokenizer: object, records: Records, max_length: int) -> Encoded:
    """Tokenise without padding; texts longer than `max_length` tokens are truncated."""
    out = tokenizer(records.texts, records.pairs, truncation=True, max_length=max_length)  # type: ignore[operator]
    features = {k: out[k] for k in ("input_ids", "token_type_ids") if k in out}
    return Encoded(features=features, labels=records.labels)


def length_grouped_batches(lengths: list[int], batch_size: int, seed: str) -> list[list[int]]:
    """Batches of similar length: shuffle, sort within groups of GROUP_BATCHES batches, shuffle the batches.

    Yields ceil(len(lengths) / batch_size) batches, so equal shards give equal batch counts.
    """
    rng = random.Random(seed)  # noqa: S311 - reproducible shuffling, not cryptography
    order = list(range(len(lengths)))
    rng.shuffle(order)
    span = batch_size * GROUP_BATCHES
    batches = []
    for start in range(0, len(order), span):
        group = sorted(order[start : start + span], key=lambda i: lengths[i], reverse=True)
        batches += [group[j : j + batch_size] for j in range(0, len(group), batch_size)]
    rng.shuffle(batches)
    return batches


def sorted_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Batches in length order (evaluation: least padding, no shuffling needed)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[j : j + batch_size] for j in range(0, len(order), batch_size)]


def collate(
    encoded: Encoded, indices: list[int], pad_id: int, *, regression: bool, multiple_of: int = 1
) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest member (rounded up to `multiple_of`)."""
    longest = max(len(encoded.features["input_ids"][i]) for i in indices)
    width = -(-longest // multiple_of) * multiple_of
    batch = {}
    for name, rows in encoded.features.items():
        fill = pad_id if name == "input_ids" else 0
        batch[name] = torch.tensor([rows[i] + [fill] * (width - len(rows[i])) for i in indices], dtype=torch.long)
    lengths = torch.tensor([len(encoded.features["input_ids"][i]) for i in indices])
    batch["attention_mask"] = (torch.arange(width)[None, :] < lengths[:, None]).long()
    labels = [encoded.labels[i] for i in indices]
    batch["labels"] = torch.tensor(labels, dtype=torch.float32 if regression else torch.long)
    return batch
