"""Loading a model that FSDP shards as the sharded frameworks load one: built on the meta device, sharded, and each
rank's shards filled from the model folder's safetensors files, each rank reading only its rows of each weight.

- **Build** (`model.causal_lm`): the model and its adapter on the meta device, in no memory; only the adapter's
  matrices are real (on the CPU, as peft initialised them).
- **Shard**: the strategy (`Sharded.prepare`, FSDP2) gives each rank its rows of every weight; `to_empty` allocates
  only those, on the rank's device, in the load dtype.
- **Fill**: each weight's rows are read from its file and cast to the load dtype as they are copied. safetensors'
  `get_slice` (its default mmap backend) is a view of the memory-mapped file, so only the rows copied are read (its
  `pread` backend would read the whole tensor); each file is opened and closed around one tensor's copy, so at most
  one tensor's rows are mapped at a time. A tied weight is one tensor, filled once; buffers that the files do not
  hold (rotary frequencies) are computed again by the model's own initialisation, as `from_pretrained` does.

A rank's peak is its shards of the weights in the load dtype and one tensor's shard being read: what the memory
plan counts, never the whole model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rocmtrain.api.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

WEIGHTS_FILE, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
# How peft names a wrapped model's tensors: under this prefix, a LoRA layer's own weights under `base_layer`.
PEFT_PREFIX, PEFT_BASE_LAYER = "base_model.model.", ".base_layer."
SHOWN_MISSING = 3


def weight_files(path: Path) -> dict[str, Path] | None:
    """The file that holds each saved tensor, by its saved name (an index's map, or the one file's names); None where
    the model has no safetensors files (PyTorch .bin files)."""
    from safetensors import safe_open

    index = path / WEIGHTS_INDEX
    if index.is_file():
        return {name: path / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    single = path / WEIGHTS_FILE
    if not single.is_file():
        return None
    with safe_open(single, framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


def is_empty(model: torch.nn.Module) -> bool:
    """Whether the model was built on the meta device, its weights to be filled after sharding (`shard_and_fill`)."""
    return any(p.is_meta for p in model.parameters())


def _unwrapped(name: str) -> str:
    """A tensor's name in the transformers model, without peft's wrapping."""
    return name.removeprefix(PEFT_PREFIX).replace(PEFT_BASE_LAYER, ".")


def _tensors(model: torch.nn.Module) -> Iterator[tuple[list[str], torch.Tensor]]:
    """Every tensor the model saves, once, with all its names (a tied weight has several)."""
    names: dict[int, list[str]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        names.setdefault(id(tensor), []).append(name)
        tensors[id(tensor)] = tensor
    for key, tensor in tensors.items():
        yield names[key], tensor


def _pretrained(model: torch.nn.Module) -> PreTrainedModel:
    """The transformers model (inside peft's wrapping, where it has an adapter)."""
    from transformers import PreTrainedModel

    return next(m for m in model.modules() if isinstance(m, PreTrainedModel))


def _model_names(pretrained: PreTrainedModel, saved: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """The saved tensor each of the model's tensors loads from, by the model's name, as `from_pretrained` maps them
    (the family's renamings, the base model's prefix added or stripped); and the model's tensors that transformers
    converts from the saved ones on loading (several into one: fused experts), which no rank can read by rows."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(pretrained)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    expected = {_unwrapped(name): tensor for name, tensor in pretrained.state_dict().items()}
    prefix = pretrained.base_model_prefix
    found: dict[str, str] = {}
    converted: list[str] = []
    for name in saved:
        renamed, conversion = rename_source_key(name, renamings, converters, prefix, expected)
        if renamed not in expected and name in expected:  # as transformers: a name that needed no renaming
            renamed, conversion = rename_source_key(name, [], [], prefix, expected)
        if renamed in expected and conversion is not None:
            converted.append(renamed)
        elif renamed in expected:
            found.setdefault(renamed, name)
    return found, converted


def readable_by_rows(model: torch.nn.Module, path: Path) -> bool:
    """Whether each rank can read its rows of the model's weights from the files: safetensors files, none of whose
    tensors transformers converts on loading."""
    saved = weight_files(path)
    return saved is not None and not _model_names(_pretrained(model), saved)[1]


@dataclass(frozen=True)
class WeightSources:
    """Where each of a model's tensors comes from, by each of its names: a file and the name it is saved under, or
    the value it holds already (an adapter's matrix, initialised before sharding)."""

    files: dict[str, tuple[Path, str]]
    kept: dict[str, torch.Tensor]


def weight_sources(model: torch.nn.Module, path: Path) -> WeightSources:
    """Where each tensor of a model built on the meta device comes from; ConfigError where the files lack any."""
    saved = weight_files(path)
    if saved is None:
        raise ConfigError(f"model {path}: no safetensors files to fill a sharded model from")
    found, _ = _model_names(_pretrained(model), saved)
    files: dict[str, tuple[Path, str]] = {}
    kept: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    for names, tensor in _tensors(model):
        name = next((found[n] for n in map(_unwrapped, names) if n in found), None)
        if not tensor.is_meta:
            kept.update(dict.fromkeys(names, tensor.detach()))  # to_empty gives the module new tensors: this one stays
        elif name is not None:
            files.update(dict.fromkeys(names, (saved[name], name)))
        else:
            missing.append(names[0])
    if missing:
        raise ConfigError(
            f"spec.training.sharding: fsdp fills each rank's shards from the model's safetensors files, which hold "
            f"no weight named {', '.join(missing[:SHOWN_MISSING])}{' ...' if len(missing) > SHOWN_MISSING else ''} "
            f"({len(missing)} missing); use sharding: none, which loads the model whole"
        )
    return WeightSources(files, kept)


def _local(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...] | None]:
    """This rank's part of a tensor, and where it sits in the whole one (None: it is the whole one)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(tensor, DTensor):
        return tensor, None
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return tensor.to_local(), tuple(slice(start, start + size) for start, size in zip(offset, shape, strict=True))


def _read(local: torch.Tensor, where: tuple[slice, ...] | None, file: Path, name: str, shape: torch.Size) -> None:
    """Copy this rank's rows of a saved tensor into `local`, cast to its dtype; only those rows are read."""
    from safetensors import safe_open

    with safe_open(file, framework="pt") as f:
        part = f.get_slice(name)
        if tuple(part.get_shape()) != tuple(shape):
            raise ConfigError(
                f"model file {file.name}: {name} has shape {tuple(part.get_shape())}, the model's config {tuple(shape)}"
            )
        rows = part[where] if where is not None else f.get_tensor(name)
        local.copy_(rows.to(local.device))


def _recompute_buffers(model: torch.nn.Module) -> None:
    """Buffers the files do not hold (rotary frequencies), computed again by the model's own initialisation, as
    `from_pretrained` does after building a model on the meta device."""
    pretrained = _pretrained(model)
    for module in model.modules():
        if module._non_persistent_buffers_set:
            pretrained._init_weights(module)


def shard_and_fill(
    model: torch.nn.Module, path: Path, device: torch.device, shard: Callable[[torch.nn.Module], None]
) -> None:
    """Shard a model built on the meta device (`shard`: the strategy's `prepare`), allocate this rank's shards on
    `device`, and fill them from the model folder's safetensors files (the adapter's from its initial values)."""
    import torch

    sources = weight_sources(model, path)
    shard(model)
    model.to_empty(device=device)
    _recompute_buffers(model)
    with torch.no_grad():
        for names, tensor in _tensors(model):
            local, where = _local(tensor)
            name = names[0]
            if name in sources.kept:
                local.copy_(sources.kept[name][where] if where is not None else sources.kept[name])
            else:
                _read(local, where, *sources.files[name], tensor.shape)
