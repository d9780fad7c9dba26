"""Reading, sharding and batching records (no Ray, no model: these run in milliseconds)."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec.implementations.memory
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import DataSource, DataSpec, ModelSpec
from rocmtrain_train.data.records import (
    fingerprint,
    read_records,
    read_table,
    records,
    sample_order,
    split_files,
    text_lengths,
)
from rocmtrain_train.storage import object_store_filesystem, s3_endpoint

ROWS = [{"text": f"review number {i}", "label": i % 3} for i in range(10)]
CLASSIFY = ModelSpec(source="/models/x", numLabels=3)
DATA = DataSpec(train=DataSource(uri="/unused"))


def write(path: Path, rows: list[dict], fmt: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, path)
    else:
        pq.write_table(table, path)
    return path


def read(uri: str, **kwargs) -> list[tuple[str, int]]:
    records = read_records(DataSource(uri=uri), DATA, CLASSIFY, None, **kwargs)
    return list(zip(records.texts, records.labels, strict=True))


EXPECTED = [(r["text"], r["label"]) for r in ROWS]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_each_format_reads_the_same_records(tmp_path, fmt):
    path = write(tmp_path / f"train.{fmt}", ROWS, fmt)
    assert read(str(path)) == EXPECTED


def test_a_folder_reads_its_files_in_order_and_ignores_others(tmp_path):
    write(tmp_path / "part-0.parquet", ROWS[:4], "parquet")
    write(tmp_path / "sub" / "part-1.parquet", ROWS[4:], "parquet")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / "README.md").write_text("notes")
    assert read(str(tmp_path)) == EXPECTED


def test_a_folder_mixing_formats_is_refused(tmp_path):
    write(tmp_path / "a.parquet", ROWS, "parquet")
    write(tmp_path / "b.jsonl", ROWS, "jsonl")
    with pytest.raises(ConfigError, match="mixes formats"):
        read(str(tmp_path))


def test_relative_paths_resolve_against_the_job_folder(tmp_path):
    write(tmp_path / "data" / "train.jsonl", ROWS, "jsonl")
    records = read_records(DataSource(uri="./data/train.jsonl"), DATA, CLASSIFY, str(tmp_path))
    assert len(records) == len(ROWS)
    with pytest.raises(ConfigError, match="only allowed in local runs"):
        read_records(DataSource(uri="./data/train.jsonl"), DATA, CLASSIFY, None)


def test_object_store_uris_read_through_their_pyarrow_filesystem(tmp_path):
    """What is faked: the bucket. `s3://bucket/...` is served by a pyarrow SubTreeFileSystem over a
    local folder, injected where the real code calls `object_store_filesystem` (S3FileSystem or
    FileSystem.from_uri). Everything after that (listing, format choice, reading) is the real path."""
    write(tmp_path / "bucket" / "reviews" / "part-0.parquet", ROWS[:5], "parquet")
    write(tmp_path / "bucket" / "reviews" / "part-1.parquet", ROWS[5:], "parquet")
    opened = []

    def object_store(uri: str) -> tuple[pafs.FileSystem, str]:
        opened.append(uri)
        return pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()), uri.removeprefix("s3://")

    assert read("s3://bucket/reviews", object_store=object_store) == EXPECTED
    assert opened == ["s3://bucket/reviews"]


def test_s3_takes_its_endpoint_from_the_aws_variables(monkeypatch):
    """As the AWS SDKs and CLI do (the S3-specific variable first). pyarrow's S3FileSystem reads neither
    itself: without them it asks `<bucket>.s3.<region>.amazonaws.com`, whatever the variables say."""
    assert s3_endpoint({}) is None
    assert s3_endpoint({"AWS_ENDPOINT_URL": "http://a:9000"}) == "http://a:9000"
    assert s3_endpoint({"AWS_ENDPOINT_URL": "http://a:9000", "AWS_ENDPOINT_URL_S3": "http://b:9000"}) == "http://b:9000"
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    fs, path = object_store_filesystem("s3://bucket/reviews")
    options = fs.__reduce__()[1][0]  # pyarrow pickles an S3FileSystem as its options
    assert (options["endpoint_override"], path) == ("http://127.0.0.1:9", "bucket/reviews")


def memory_hub(files: dict[str, list[dict]]) -> pafs.FileSystem:
    """An in-memory stand-in for the hub, behind the same PyFileSystem(FSSpecHandler(...)) wrapper."""
    memory = fsspec.implementations.memory.MemoryFileSystem()
    memory.store.clear()
    memory.pseudo_dirs.clear()
    memory.pseudo_dirs.append("")
    for path, rows in files.items():
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(rows), sink)
        memory.pipe_file(path, sink.getvalue().to_pybytes())
    return pafs.PyFileSystem(pafs.FSSpecHandler(memory))


def test_hub_data_sets_read_the_files_of_the_split():
    """What is faked: the hub. `HfFileSystem` is replaced by fsspec's memory filesystem holding a
    data set repository in the hub's Parquet layout, wrapped exactly as the real one is."""
    hub = memory_hub(
        {
            "datasets/org/reviews/data/train-00000-of-00002.parquet": ROWS[:6],
            "datasets/org/reviews/data/train-00001-of-00002.parquet": ROWS[6:],
            "datasets/org/reviews/data/test-00000-of-00001.parquet": [{"text": "held out", "label": 0}],
        }
    )
    train = read_records(
        DataSource(uri="hf://datasets/org/reviews", split="train"), DATA, CLASSIFY, None, hub=lambda: hub
    )
    assert list(zip(train.texts, train.labels, strict=True)) == EXPECTED
    test = read_records(
        DataSource(uri="hf://datasets/org/reviews", split="test"), DATA, CLASSIFY, None, hub=lambda: hub
    )
    assert test.texts == ["held out"]


def test_hub_data_sets_fall_back_to_the_parquet_conversion_branch():
    """What is faked: the hub (see above); the repository has only the converted Parquet branch."""
    hub = memory_hub({"datasets/org/csvset@refs%2Fconvert%2Fparquet/default/train/0000.parquet": ROWS})
    source = DataSource(uri="hf://datasets/org/csvset", split="train")
    assert len(read_records(source, DATA, CLASSIFY, None, hub=lambda: hub)) == len(ROWS)


def test_split_selection_by_folder_or_file_name():
    root = "datasets/o/n"
    paths = [
        f"{root}/data/train-00000-of-00001.parquet",
        f"{root}/data/validation-00000-of-00001.parquet",
        f"{root}/default/train/0000.parquet",
        f"{root}/train.jsonl",
        f"{root}/trainer_notes.jsonl",
    ]
    assert split_files(paths, root, "train") == [paths[0], paths[2], paths[3]]
    assert split_files(paths, root, "validation") == [paths[1]]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (DataSource(uri="hf://datasets/org/reviews"), "needs a split"),
        (DataSource(uri="hf://org/reviews", split="train"), "hf://datasets/"),
        (DataSource(uri="org/reviews"), "expected an absolute path"),
    ],
)
def test_source_locations_are_checked_without_network(source, message):
    def no_hub() -> pafs.FileSystem:
        raise AssertionError("the hub must not be contacted")

    with pytest.raises(ConfigError, match=message):
        read_records(source, DATA, CLASSIFY, None, hub=no_hub)


@pytest.mark.parametrize(
    ("rows", "model", "message"),
    [
        ([{"text": "a", "label": 3}], CLASSIFY, "label 3 out of range 0..2"),
        ([{"text": "a", "label": -1}], CLASSIFY, "out of range"),
        ([{"text": "a", "label": "good"}], CLASSIFY, "not a class index"),
        ([{"text": "a", "label": 1.5}], CLASSIFY, "not a class index"),
        ([{"text": "a", "label": "x"}], ModelSpec(source="/m", task="regression"), "not a finite number"),
        ([{"body": "a", "label": 1}], CLASSIFY, r"no field 'text' \(fields: body, label\)"),
        ([{"text": "a", "label": 1}, {"text": None, "label": 1}], CLASSIFY, "record 1 has no value for 'text'"),
    ],
)
def test_bad_records_are_named(tmp_path, rows, model, message):
    path = write(tmp_path / "train.jsonl", rows, "jsonl")
    with pytest.raises(ConfigError, match=message):
        read_records(DataSource(uri=str(path)), DATA, model, None)


def test_regression_labels_are_floats(tmp_path):
    path = write(tmp_path / "train.jsonl", [{"text": "a", "label": 2}, {"text": "b", "label": 0.5}], "jsonl")
    records = read_records(DataSource(uri=str(path)), DATA, ModelSpec(source="/m", task="regression"), None)
    assert records.labels == [2.0, 0.5]


def test_max_samples_cuts_after_the_seeded_shuffle():
    assert sample_order(100, seed=1, max_samples=10) == sample_order(100, seed=1, max_samples=None)[:10]
    assert sample_order(100, seed=1, max_samples=10) != sample_order(100, seed=2, max_samples=10)


def test_tables_hold_only_the_job_fields_and_decode_only_the_rows_asked_for(tmp_path):
    rows = [{"question": f"q{i}", "answer": "a" * i, "score": i / 2, "unused": [i] * 100} for i in range(8)]
    path = write(tmp_path / "pairs.parquet", rows, "parquet")
    data = DataSpec(train=DataSource(uri=str(path)), textField="question", textPairField="answer", labelField="score")
    regress = ModelSpec(source="/m", task="regression")
    table = read_table(DataSource(uri=str(path)), data, regress, None)
    assert table.column_names == ["text", "label", "pair"]  # Parquet: only these columns were read
    assert text_lengths(table).tolist() == [len(f"q{i}") + i for i in range(8)]
    picked = records(table, [5, 1], regress, "pairs")
    assert (picked.texts, picked.pairs, picked.labels) == (["q5", "q1"], ["aaaaa", "a"], [2.5, 0.5])


def test_workers_check_the_labels_of_their_own_rows(tmp_path):
    path = write(tmp_path / "train.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 7}], "jsonl")
    table = read_table(DataSource(uri=str(path)), DATA, CLASSIFY, None, check=False)
    assert records(table, [0], CLASSIFY, "train").labels == [0]
    with pytest.raises(ConfigError, match="label 7 out of range"):
        records(table, [1], CLASSIFY, "train")


def test_the_fingerprint_changes_with_the_files(tmp_path):
    path = write(tmp_path / "train.jsonl", ROWS, "jsonl")
    before = fingerprint(DataSource(uri=str(path)), DATA, None)
    assert before == fingerprint(DataSource(uri=str(path)), DATA, None)
    write(path, ROWS[:-1], "jsonl")
    assert fingerprint(DataSource(uri=str(path)), DATA, None) != before


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_a_head_reads_the_first_records_and_the_first_of_every_file(tmp_path, fmt):
    first = tmp_path / "data" / f"a.{fmt}"
    write(first, ROWS, fmt)
    write(tmp_path / "data" / f"b.{fmt}", [{"text": "other", "label": 1}] * 5, fmt)
    if fmt == "parquet":  # row groups of 2: 3 records of the first file, 1 of the second
        pq.write_table(pa.Table.from_pylist(ROWS), first, row_group_size=2)
    table = read_table(DataSource(uri=str(tmp_path / "data")), DATA, CLASSIFY, None, head=3)
    texts = table.column("text").to_pylist()
    assert texts[:3] == [r["text"] for r in ROWS[:3]] and texts[-1] == "other"
    assert len(texts) == 4 if fmt == "parquet" else len(texts) >= 4  # JSON lines and CSV: whole first blocks
    write(tmp_path / "data" / f"b.{fmt}", [{"body": "other", "label": 1}], fmt)
    with pytest.raises(ConfigError, match=rf"b\.{fmt}\): no field 'text'"):
        read_table(DataSource(uri=str(tmp_path / "data")), DATA, CLASSIFY, None, head=3)
