"""Records: reading JSONL, CSV or Parquet from a path, an object store or the hub.

A data source is read into an Arrow table of just the fields the job names (`text`, `pair`,
`label`; a causal-lm job's are `causal_lm.records`'), columnar and compact; only the rows a rank trains
on become Python strings (`records`). The records are shuffled once with `data.shuffleSeed` and cut to `maxSamples`
(`sample_order`); which rank trains on which of them is `batch_plan`'s business.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from rocmtrain.api.contract import HUB_SCHEME
from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import DataSource, DataSpec, ModelSpec
from rocmtrain_train.data.causal_lm.records import check_columns, lm_fields, lm_lengths
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
# Column names of a read table, whatever the job's field names are.
TEXT, PAIR, LABEL = "text", "pair", "label"


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


def _first(batches: Iterable[pa.RecordBatch], limit: int) -> list[pa.RecordBatch]:
    """Batches until they hold `limit` records; the next one is never read."""
    taken, count = [], 0
    for batch in batches:
        taken.append(batch)
        count += batch.num_rows
        if count >= limit:
            break
    return taken


def _read_file(fs: pafs.FileSystem, path: str, fmt: str, columns: list[str], limit: int | None) -> pa.Table:
    """One file, or with a `limit` its first records (at least `limit` where it has them): Parquet's first row
    groups, the first blocks of JSON lines and CSV. Of Parquet only the named columns are read (JSON lines and
    CSV have no such index)."""
    try:
        with fs.open_input_file(path) as f:
            if fmt == "parquet":
                parquet = pq.ParquetFile(f)
                present = set(parquet.schema_arrow.names)
                named = columns if present >= set(columns) else None
                if limit is None or not parquet.metadata.num_rows:
                    return parquet.read(columns=named)
                return pa.Table.from_batches(_first(parquet.iter_batches(batch_size=limit, columns=named), limit))
            if limit is None:
                return pacsv.read_csv(f) if fmt == "csv" else pajson.read_json(f)
            reader = pacsv.open_csv(f) if fmt == "csv" else pajson.open_json(f)
            return pa.Table.from_batches(_first(reader, limit), reader.schema)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ConfigError(f"cannot read {path} as {fmt}: {exc}") from exc


def _column(table: pa.Table, field: str, where: str) -> pa.ChunkedArray:
    if field not in table.column_names:
        raise ConfigError(f"{where}: no field {field!r} (fields: {', '.join(table.column_names)})")
    values = table.column(field)
    if values.null_count:
        missing = next(i for i, v in enumerate(values.is_null().to_pylist()) if v)
        raise ConfigError(f"{where}: record {missing} has no value for {field!r}")
    return values


def _as_text(values: pa.ChunkedArray) -> pa.ChunkedArray:
    return values if pa.types.is_string(values.type) else pc.cast(values, pa.string())


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


def record_fields(data: DataSpec, model: ModelSpec) -> dict[str, str]:
    """Column of a read table -> the record field it holds, for the job's task."""
    if model.task == "causal-lm":
        return lm_fields(data)
    fields = {TEXT: data.text_field, LABEL: data.label_field}
    if data.text_pair_field:
        fields[PAIR] = data.text_pair_field
    return fields


def _checked(
    columns: dict[str, pa.ChunkedArray], data: DataSpec, model: ModelSpec, where: str, *, check: bool
) -> dict[str, pa.ChunkedArray]:
    """The columns of one file, checked for the task (labels only with `check`: workers check their own rows)."""
    if model.task == "causal-lm":
        return check_columns(columns, data, where)
    if check:
        check_labels(columns[LABEL].to_pylist(), model, where)
    return {name: _as_text(values) if name in (TEXT, PAIR) else values for name, values in columns.items()}


def read_table(
    source: DataSource,
    data: DataSpec,
    model: ModelSpec,
    base_dir: str | None,
    *,
    object_store: ObjectStoreFactory = object_store_filesystem,
    hub: HubFactory = hub_filesystem,
    check: bool = True,
    head: int | None = None,
) -> pa.Table:
    """The records of a source as a table of `text`, (`pair`,) `label` (causal-lm: see `causal_lm.records`): the
    fields exist and have values; with `check`, every label fits the task too (workers check their own rows).

    With a `head`, only the first records are read (the driver's pre-flight): at least `head` where the source
    has them, and at least one of every file, so that every file's fields are checked."""
    fs, files, fmt = source_files(source, base_dir, object_store=object_store, hub=hub)
    fields = record_fields(data, model)
    tables: list[pa.Table] = []
    for path in files:
        if describe(fs, path).size == 0:
            continue
        limit = None if head is None else max(1, head - sum(t.num_rows for t in tables))
        table = _read_file(fs, path, fmt, list(fields.values()), limit)
        where = f"{source.uri} ({PurePosixPath(path).name})" if len(files) > 1 else source.uri
        columns = {name: _column(table, field, where) for name, field in fields.items()}
        tables.append(pa.table(_checked(columns, data, model, where, check=check)))
    if not tables or not sum(t.num_rows for t in tables):
        raise ConfigError(f"{source.uri}: no records")
    return pa.concat_tables(tables)


def fingerprint(
    source: DataSource,
    data: DataSpec,
    base_dir: str | None,
    *,
    object_store: ObjectStoreFactory = object_store_filesystem,
    hub: HubFactory = hub_filesystem,
) -> dict[str, object]:
    """What a source's records depend on: its files with their sizes and modification times, and the fields."""
    fs, files, fmt = source_files(source, base_dir, object_store=object_store, hub=hub)
    described = []
    for path in files:
        info = describe(fs, path)
        described.append([path, info.size, info.mtime_ns])
    fields = [data.text_field, data.text_pair_field, data.label_field, *data.lm_fields]
    return {"uri": source.uri, "format": fmt, "files": described, "fields": fields}


def text_lengths(table: pa.Table) -> np.ndarray:
    """Characters per record (text and pair): a cheap stand-in for token counts when grouping by length."""
    if LABEL not in table.column_names:
        return lm_lengths(table)
    lengths = pc.utf8_length(table.column(TEXT)).to_numpy()
    if PAIR in table.column_names:
        lengths = lengths + pc.utf8_length(table.column(PAIR)).to_numpy()
    return lengths.astype(np.int64)


@dataclass(frozen=True)
class Records:
    """Texts (and optional second texts) with their labels."""

    texts: list[str]
    pairs: list[str] | None
    labels: list[int] | list[float]

    def __len__(self) -> int:
        return len(self.texts)


def records(table: pa.Table, rows: Sequence[int], model: ModelSpec, where: str) -> Records:
    """The given rows of a table as Python values (only these are decoded); their labels are checked."""
    taken = table.take(pa.array(rows, type=pa.int64()))
    labels = taken.column(LABEL).to_pylist()
    check_labels(labels, model, where)
    pairs = taken.column(PAIR).to_pylist() if PAIR in taken.column_names else None
    texts = taken.column(TEXT).to_pylist()
    if model.task == "regression":
        return Records(texts, pairs, [float(v) for v in labels])
    return Records(texts, pairs, [int(v) for v in labels])


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
    table = read_table(source, data, model, base_dir, object_store=object_store, hub=hub)
    return records(table, range(table.num_rows), model, source.uri)


def sample_order(count: int, seed: int, max_samples: int | None) -> list[int]:
    """Record indices after a seeded shuffle, cut to `max_samples`."""
    order = list(range(count))
    random.Random(seed).shuffle(order)  # noqa: S311 - reproducible shuffling, not cryptography
    return order[:max_samples]
