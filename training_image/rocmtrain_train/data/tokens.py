"""Tokenised records: encoding them (on several threads, cached across restarts) and padding batches.

Encoded records are kept flat: all token ids in one int32 array with the offsets of each record,
a fraction of the memory of Python lists. The cache holds one rank's encoded records under a key of
everything they depend on (tokenizer files, maximum length, data files with their sizes and times,
and the rows), so a restarted worker skips tokenising.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rocmtrain_train.data.records import Records

# Texts handed to the tokenizer at once (it spreads each call over its threads).
ENCODE_CHUNK = 4096
# Tokenizer files whose size and time go into the cache key.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt", "spm.model")

log = logging.getLogger(__name__)


class Fit(IntEnum):
    """What the maximum length left of a record (language models: `data.truncation`)."""

    WHOLE = 0
    CUT = 1  # its tail cut off; it still carries loss
    DROPPED = 2  # kept as its first token alone, carrying no loss: nothing of it trains


@dataclass(frozen=True)
class Encoded:
    """Tokenised records, unpadded: record i is ids[offsets[i]:offsets[i + 1]]."""

    ids: np.ndarray  # int32
    offsets: np.ndarray  # int64, one more than there are records
    type_ids: np.ndarray | None  # int8, aligned with ids, where the tokenizer makes token types
    labels: np.ndarray  # int64, or float32 for regression; empty for a language model (its labels are its ids)
    loss_mask: np.ndarray | None = None  # int8, aligned with ids: the tokens that carry loss (language models)
    response_starts: np.ndarray | None = None  # int64 per record: where its last response begins (language models)
    fits: np.ndarray | None = None  # int8 per record: its `Fit` (language models)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def from_lists(
        cls,
        ids: Sequence[Sequence[int]],
        type_ids: Sequence[Sequence[int]] | None,
        labels: Sequence[float],
        *,
        regression: bool = False,
        masks: Sequence[Sequence[int] | np.ndarray] | None = None,
        response_starts: Sequence[int] | None = None,
        fits: Sequence[Fit] | None = None,
    ) -> Encoded:
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum([len(row) for row in ids], out=offsets[1:])

        def flat(rows: Sequence[Sequence[int] | np.ndarray], dtype: type) -> np.ndarray:
            return np.fromiter((t for row in rows for t in row), dtype=dtype, count=int(offsets[-1]))

        return cls(
            flat(ids, np.int32),
            offsets,
            None if type_ids is None else flat(type_ids, np.int8),
            np.asarray(labels, dtype=np.float32 if regression else np.int64),
            None if masks is None else flat(masks, np.int8),
            None if response_starts is None else np.asarray(response_starts, dtype=np.int64),
            None if fits is None else np.asarray(fits, dtype=np.int8),
        )

    def dropped(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """Whether each of `rows` was dropped (False where fits are not kept)."""
        if self.fits is None:
            return np.zeros(len(rows), dtype=bool)
        return self.fits[np.asarray(rows, dtype=np.int64)] == Fit.DROPPED

    def fit_counts(self, rows: Sequence[int] | np.ndarray | None = None) -> list[int]:
        """[records, cut, dropped] of `rows` (all records where None)."""
        assert self.fits is not None
        found = self.fits if rows is None else self.fits[np.asarray(rows, dtype=np.int64)]
        return [len(found), int((found == Fit.CUT).sum()), int((found == Fit.DROPPED).sum())]


def encode(tokenizer: Any, records: Records, max_length: int, *, regression: bool, token_types: bool = True) -> Encoded:
    """Tokenise without padding; texts longer than `max_length` tokens are truncated. Token types are
    kept where the tokenizer makes them and `token_types` says the model takes them.

    A fast tokenizer encodes each chunk on its own thread pool (`RAYON_NUM_THREADS` threads).
    """
    ids: list[list[int]] = []
    type_ids: list[list[int]] | None = [] if token_types else None
    for start in range(0, len(records), ENCODE_CHUNK):
        end = start + ENCODE_CHUNK
        pairs = records.pairs[start:end] if records.pairs is not None else None
        out = tokenizer(records.texts[start:end], pairs, truncation=True, max_length=max_length)
        ids += out["input_ids"]
        if "token_type_ids" in out and type_ids is not None:
            type_ids += out["token_type_ids"]
        else:
            type_ids = None
    return Encoded.from_lists(ids, type_ids, records.labels, regression=regression)


def cache_key(model_dir: Path, max_length: int, source: dict[str, Any], rows: Sequence[int]) -> str:
    """A digest of everything a rank's encoded records depend on."""
    files = {}
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            stat = path.stat()
            files[name] = [stat.st_size, stat.st_mtime_ns]
    described = {"model": str(model_dir), "tokenizer": files, "max_length": max_length, "source": source}
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode())
    digest.update(np.asarray(rows, dtype=np.int64).tobytes())
    return digest.hexdigest()[:40]


def load_cached(path: Path) -> Encoded | None:
    """The encoded records cached at `path`, or None where there are none (or they cannot be read)."""
    try:
        with np.load(path) as saved:
            return Encoded(
                saved["ids"],
                saved["offsets"],
                saved.get("type_ids"),
                saved["labels"],
                saved.get("loss_mask"),
                saved.get("response_starts"),
                saved.get("fits"),
            )
    except (OSError, ValueError, KeyError):
        return None


def save_cached(path: Path, encoded: Encoded) -> None:
    """Write the cache file atomically; a cache that cannot be written is skipped (it only saves time)."""
    optional = {
        "type_ids": encoded.type_ids,
        "loss_mask": encoded.loss_mask,
        "response_starts": encoded.response_starts,
        "fits": encoded.fits,
    }
    arrays: dict[str, Any] = {"ids": encoded.ids, "offsets": encoded.offsets, "labels": encoded.labels}
    arrays.update({name: value for name, value in optional.items() if value is not None})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
            np.savez(f, **arrays)
        os.replace(f.name, path)
    except OSError as exc:
        log.warning("tokenised records not cached at %s: %s", path, exc)


def collate(
    encoded: Encoded, rows: Sequence[int], pad_id: int, *, multiple_of: int = 1, pin: bool = False
) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest member, rounded up to `multiple_of` (pinned memory when `pin`)."""
    lengths = encoded.lengths[rows]
    width = int(-(-int(lengths.max()) // multiple_of) * multiple_of)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.arange(width)[None, :] < lengths[:, None]
    types = np.zeros((len(rows), width), dtype=np.int64) if encoded.type_ids is not None else None
    for i, row in enumerate(rows):
        start, end = encoded.offsets[row], encoded.offsets[row + 1]
        ids[i, : end - start] = encoded.ids[start:end]
        if types is not None and encoded.type_ids is not None:
            types[i, : end - start] = encoded.type_ids[start:end]
    batch = {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(mask.astype(np.int64)),
        "labels": torch.from_numpy(encoded.labels[list(rows)]),
    }
    if types is not None:
        batch["token_type_ids"] = torch.from_numpy(types)
    return {k: v.pin_memory() for k, v in batch.items()} if pin else batch
