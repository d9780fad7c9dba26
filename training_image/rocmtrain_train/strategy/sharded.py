"""Sharded training (`training.sharding: fsdp`): PyTorch FSDP2 (`fully_shard`), one unit per transformer block.

- **Layout.** Each transformer block's parameters, gradients and optimiser state are sharded over a group
  of ranks and gathered one block at a time. With `shardingScope: pod` (the default) the group is a worker
  pod's GPUs and pods hold replicas (hybrid sharding: the all-gathers stay on the node's xGMI links, the
  gradient all-reduce across pods is the only traffic between nodes); with `job` the group is every rank.
- **Precision.** On GPUs with `precision: bf16`, the blocks compute in bf16 from fp32 sharded parameters
  and reduce gradients in fp32 (`MixedPrecisionPolicy`), in place of autocast. On CPUs everything is fp32.
- **Resharding.** Blocks free their gathered parameters after the forward pass (reshard after forward) and
  gather them again for the backward; the root (embeddings, final norm, head) keeps them, as the backward
  starts with it.
- **Checkpoints.** Every rank writes its shards with `torch.distributed.checkpoint` (an adapter's only,
  where the base is frozen); they load at any world size (DCP reshards).
- **Loading.** The model comes built on the meta device; `prepare` shards it, and `model.sharded_load` fills each
  rank's shards from the safetensors files: no rank ever holds the whole model.
- **Export.** A consolidated Hugging Face folder (safetensors files of at most `EXPORT_SHARD_BYTES`, with an
  index where there are several, the config and the generation config), gathered one tensor at a time and
  written as each file fills: no rank ever holds the whole model. An adapter is exported in peft's format, and
  with `merge` the base with the adapter merged in, the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.ranks import shard_group
from rocmtrain_train.checkpoint.model_export import is_adapter, merged_location, save_folder
from rocmtrain_train.model.sharded_load import WEIGHTS_FILE, WEIGHTS_INDEX

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from rocmtrain_train.config import RunSettings

SHARDED_DIR = "sharded"
# Largest safetensors file of an export (Hugging Face's own default shard size).
EXPORT_SHARD_BYTES = 5 * 1024**3


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks: the modules transformers never splits across devices (`_no_split_modules`)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ConfigError(
            f"spec.training.sharding: fsdp shards a model by its transformer blocks, and {type(model).__name__} "
            "names none (_no_split_modules); use sharding: none"
        )
    return blocks


def _resharded(model: torch.nn.Module) -> torch.nn.Module:
    """The model with every unit's parameters sharded again: the root keeps its gathered (compute-dtype) copies
    after a forward pass without a backward one (an evaluation's), and they would stand in for its shards."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return model


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor, on every rank (a collective for a sharded one)."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


@dataclass
class Sharded:
    """FSDP2 over a mesh of `replicate` x `shard` ranks."""

    device: torch.device
    replicate: int
    shard: int
    mixed: MixedPrecisionPolicy | None
    lockstep = True

    @property
    def casts(self) -> bool:
        return self.mixed is not None

    @classmethod
    def for_run(cls, settings: RunSettings, device: torch.device) -> Sharded:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        training = settings.job.spec.training
        layout = settings.layout
        shard = shard_group(layout.world_size, layout.ranks_per_pod, training.sharding_scope)
        mixed = None
        if device.type == "cuda" and training.precision == "bf16":
            mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        return cls(device, layout.world_size // shard, shard, mixed)

    def _mesh(self) -> DeviceMesh:
        from torch.distributed.device_mesh import init_device_mesh

        if self.replicate > 1:
            return init_device_mesh(
                self.device.type, (self.replicate, self.shard), mesh_dim_names=("replicate", "shard")
            )
        return init_device_mesh(self.device.type, (self.shard,), mesh_dim_names=("shard",))

    def prepare(self, model: torch.nn.Module) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh, mixed = self._mesh(), self.mixed or MixedPrecisionPolicy()
        for block in transformer_blocks(model):
            fully_shard(block, mesh=mesh, mp_policy=mixed, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, mp_policy=mixed, reshard_after_forward=False)

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    @contextmanager
    def _sync(self, module: torch.nn.Module, sync: bool) -> Iterator[None]:
        module.set_requires_gradient_sync(sync)  # type: ignore[operator]  # an FSDPModule's
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)  # type: ignore[operator]

    def gradient_sync(self, module: torch.nn.Module, sync: bool) -> AbstractContextManager[Any]:
        return self._sync(module, sync)

    @staticmethod
    def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        weights, moments = get_state_dict(model, optimizer, options=StateDictOptions(ignore_frozen_params=True))
        return {"model": weights, "optimizer": moments}

    def save(self, directory: Path, *, rank: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(model, optimizer), checkpoint_id=str(directory / SHARDED_DIR))

    def load(self, directory: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        state = self._state(model, optimizer)
        dcp.load(state, checkpoint_id=str(directory / SHARDED_DIR))  # refuses a checkpoint without a key asked for
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=StateDictOptions(ignore_frozen_params=True, strict=False),  # a frozen base is not in it
        )

    def checksum(self, model: torch.nn.Module) -> float:
        with torch.no_grad():
            total = sum(
                (_full(p.detach()).double().sum() for p in _resharded(model).parameters()),
                torch.zeros((), dtype=torch.float64),
            )
        return float(total.item())

    def export(self, model: torch.nn.Module, tokenizer: Any, destination: str, *, rank: int, merge: bool) -> None:
        adapter = is_adapter(model)
        _resharded(model)
        if adapter:
            trained = {n: _full(p.detach()).cpu() for n, p in model.named_parameters() if p.requires_grad}
            if rank == 0:

                def write_adapter(path: str) -> None:
                    model.save_pretrained(path, state_dict=trained)  # type: ignore[operator]  # peft's
                    tokenizer.save_pretrained(path)

                save_folder(destination, write_adapter)
        if adapter and not merge:
            return
        base = model.get_base_model() if adapter else model  # type: ignore[operator]  # peft's
        target = merged_location(destination) if adapter else destination
        tensors = _merged_tensors(model) if adapter else _tensors(model)
        _write_consolidated(tensors, base, tokenizer, target, rank=rank)


def _tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight the model saves by name (a tied one once), whole, one at a time (every rank iterates; the model
    resharded)."""
    kept = dict(model.named_parameters())  # a tied weight once, under its first name
    for name, value in model.state_dict(keep_vars=True).items():
        if name in kept or not isinstance(value, torch.nn.Parameter):
            yield name, _full(value.detach())


def _merged_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's weights with the LoRA updates merged in, by the base's names, whole, one at a time."""
    from peft.tuners.lora import LoraLayer

    prefix = "base_model.model."
    layers = {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    for name, value in _tensors(model):
        if ".lora_" in name:
            continue
        clean = name.removeprefix(prefix).replace(".base_layer.", ".")
        owner = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
        layer: Any = layers.get(owner) if owner is not None else None
        if layer is not None and name.endswith(".base_layer.weight"):
            (adapter,) = layer.active_adapters
            a = _full(layer.lora_A[adapter].weight.detach())
            b = _full(layer.lora_B[adapter].weight.detach())
            delta = (b.float() @ a.float()) * layer.scaling[adapter]
            value = (value.float() + (delta.T if getattr(layer, "fan_in_fan_out", False) else delta)).to(value.dtype)
        yield clean, value


def _write_consolidated(
    tensors: Iterator[tuple[str, torch.Tensor]], model: Any, tokenizer: Any, destination: str, *, rank: int
) -> None:
    """Safetensors files of at most `EXPORT_SHARD_BYTES` and their index, the model's config (and generation config,
    as `save_pretrained` writes them) and the tokenizer, written by rank 0 as the tensors arrive (every rank takes
    part in gathering them)."""
    from safetensors.torch import save_file

    def write(path: str) -> None:
        folder = Path(path)
        if rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
        files: list[list[str]] = []
        pending: dict[str, torch.Tensor] = {}
        size = 0

        def flush() -> None:
            nonlocal pending, size
            if pending:
                save_file(pending, str(folder / f"part-{len(files):05d}.safetensors"), metadata={"format": "pt"})
                files.append(list(pending))
                pending, size = {}, 0

        for name, value in tensors:
            if rank == 0:
                pending[name] = value.cpu().contiguous()
                size += value.numel() * value.element_size()
                if size >= EXPORT_SHARD_BYTES:
                    flush()
        if rank != 0:
            return
        flush()
        weight_map = {}
        for i, names in enumerate(files):  # named as save_pretrained names them: one file, or numbered with an index
            final = WEIGHTS_FILE if len(files) == 1 else f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
            (folder / f"part-{i:05d}.safetensors").rename(folder / final)
            weight_map.update(dict.fromkeys(names, final))
        if len(files) > 1:
            index = {"metadata": {}, "weight_map": weight_map}
            (folder / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        model.config.save_pretrained(folder)
        if model.can_generate():
            model.generation_config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    if rank == 0:
        save_folder(destination, write)
    else:
        write("")
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
