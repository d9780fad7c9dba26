"""Causal language models: loading one for training (optionally with a LoRA adapter) and checking it fits the job.

Any architecture transformers loads with `AutoModelForCausalLM` trains (Llama, Qwen2/3, Mistral,
GPT-NeoX, GPT-2, ...), with the attention kernels `training.attentionImplementation` names
(`pretrained.attention_kernels`: varlen is flash-attention's variable-length kernel on GPUs), and
gradient checkpointing on request. The KV cache is off during training: it is of no use there, and
packed rows need it off (transformers reads their record boundaries only without one). The loss is
the kernel `training.lossImplementation` picks (`linear_loss.loss_kernel`): by default the head and the
cross-entropy a chunk of tokens at a time (Liger's fused kernel on GPUs where it is installed), never
every token's logits at once.

With `spec.adapter`, peft wraps the model in a LoRA adapter: only the adapter's matrices train.
Target modules are the job's names (matched against the ends of module paths, as peft matches
them), `all-linear`, or peft's default for the model family; names that match no linear module
are refused before any weight loads, with the model's linear module names listed. The adapter's
matrices start as peft initialises them, from the job's seed: the same on every rank, however the
base loads.

With `training.sharding: fsdp`, the model (and its adapter) is built on the meta device, without
weights, for `model.sharded_load` to fill each rank's shards after sharding; a model saved as
PyTorch .bin files or whose weights transformers converts on loading (fused experts), and every
DDP job, loads whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import ALL_LINEAR, AdapterSpec, RocmTrainingJobSpec
from rocmtrain.plan.model_shapes import training_dtype
from rocmtrain_train.model.linear_loss import liger_installed, loss_kernel, plain_head, use_loss_kernel
from rocmtrain_train.model.pretrained import attention_kernels, check_model_config, set_pad_token
from rocmtrain_train.model.sharded_load import readable_by_rows, weight_sources

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

# Modules peft can put a LoRA adapter on that count as linear layers (GPT-2's projections are Conv1D).
LINEAR_KINDS = ("Linear", "Conv1D")
GENERATION_CONFIG = "generation_config.json"


def linear_modules(model: torch.nn.Module) -> list[str]:
    """Paths of the model's linear layers, the output head left out (what LoRA can adapt)."""
    heads: Any = getattr(model, "get_output_embeddings", None)
    output = heads() if heads is not None else None
    return [
        name
        for name, module in model.named_modules()
        if type(module).__name__ in LINEAR_KINDS and module is not output and name
    ]


def _matches(path: str, name: str) -> bool:
    return path == name or path.endswith("." + name)


def target_modules(adapter: AdapterSpec, model_type: str, linear: list[str]) -> list[str] | str:
    """The modules the adapter targets, as peft takes them; unknown names raise ConfigError with the choices."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    names = adapter.target_modules or DEFAULTS.get(model_type) or [ALL_LINEAR]
    if names == [ALL_LINEAR]:
        return ALL_LINEAR
    if missing := [n for n in names if not any(_matches(path, n) for path in linear)]:
        short = sorted({path.rsplit(".", 1)[-1] for path in linear})
        raise ConfigError(
            f"spec.adapter.targetModules: {', '.join(missing)} match no linear module of the model; its linear "
            f"modules are {', '.join(short)} (or use all-linear)"
        )
    return list(names)


def _skeleton(config: Any, **options: Any) -> torch.nn.Module:
    """The model without weights (on the meta device): its modules, in no memory (`options`: from_config's)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, **options)


def _empty_model(path: Path, spec: RocmTrainingJobSpec, dtype: torch.dtype, attention: str) -> Any:
    """The model as `from_pretrained` makes it (its config, generation config, attention kernels, dtype, in eval
    mode), on the meta device: without weights, for `sharded_load.shard_and_fill` to fill after sharding."""
    from transformers import AutoConfig, GenerationConfig

    model: Any = _skeleton(AutoConfig.from_pretrained(path), attn_implementation=attention, dtype=dtype)
    if (path / GENERATION_CONFIG).is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model.eval()


def _refuse_packed_with_cache(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A forward pre-hook of the decoder: a packed batch (position_ids without an attention mask) is isolated only
    without the KV cache (transformers finds the records' boundaries from position_ids only then), so a packed batch
    with the cache on is refused rather than letting its records silently see each other."""
    packed = kwargs.get("position_ids") is not None and kwargs.get("attention_mask") is None
    use_cache = kwargs.get("use_cache")
    cached = module.config.use_cache if use_cache is None else use_cache  # type: ignore[union-attr]
    if packed and (cached or kwargs.get("past_key_values") is not None):
        raise ValueError(
            "a packed batch (position_ids without an attention mask) needs the KV cache off (use_cache=False): with "
            "a cache, transformers does not read the records' boundaries and packed records would attend to each other"
        )


def load_tokenizer(path: Path, spec: RocmTrainingJobSpec) -> Any:
    """The model's tokenizer, with padding, an end-of-sequence token, and the job's chat template if it gives one."""
    from transformers import AutoTokenizer

    name = spec.model.source
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.eos_token_id is None:
        raise ConfigError(
            f"model {name}: the tokenizer has no end-of-sequence token, which every training sequence ends with "
            "(set eos_token in its tokenizer_config.json)"
        )
    set_pad_token(tokenizer, name)
    if spec.model.chat_template is not None:
        tokenizer.chat_template = spec.model.chat_template
    if spec.data.record_shape == "chat" and not tokenizer.chat_template:
        raise ConfigError(
            f"model {name}: the tokenizer has no chat template to render the chats of data.messagesField; "
            "set spec.model.chatTemplate"
        )
    return tokenizer


def check_causal_lm_files(path: Path, spec: RocmTrainingJobSpec) -> Any:
    """The model's config and tokenizer load and fit the job (before any worker loads the weights), an adapter's
    target modules too; returns the tokenizer."""
    config = check_model_config(path, spec.model, spec.training)
    if spec.adapter is not None:
        target_modules(spec.adapter, config.model_type, linear_modules(_skeleton(config)))
    if spec.training.sharding == "fsdp" and readable_by_rows(skeleton := _skeleton(config), path):
        weight_sources(skeleton, path)  # the files hold every weight a sharded load fills
    try:
        return load_tokenizer(path, spec)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"model {spec.model.source}: cannot load its tokenizer: {exc}") from exc


def with_adapter(model: PreTrainedModel, adapter: AdapterSpec) -> PreTrainedModel:
    """The model wrapped in a LoRA adapter (peft); the base weights freeze."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        task_type="CAUSAL_LM",
        r=adapter.rank,
        lora_alpha=adapter.scale_numerator,
        lora_dropout=adapter.dropout,
        target_modules=target_modules(adapter, model.config.model_type, linear_modules(model)),
    )
    return get_peft_model(model, config)  # type: ignore[return-value]  # a PeftModel forwards like the model


def init_adapter(model: torch.nn.Module, seed: int) -> None:
    """Initialise the adapter's matrices as peft does (`reset_lora_parameters`: A as a linear layer's default, B
    zero), from `seed`, on the CPU where the base is on the meta device: the same values on every rank, whether the
    base loaded whole or is filled after sharding."""
    import torch
    from peft.tuners.lora import LoraLayer

    torch.manual_seed(seed)
    for module in model.modules():
        if not isinstance(module, LoraLayer):
            continue
        for parts in (getattr(module, name) for name in module.adapter_layer_names):
            if any(p.is_meta for p in parts.parameters()):
                parts.to_empty(device="cpu")
        for adapter in module.active_adapters:
            lora_config: Any = model.peft_config[adapter]  # type: ignore[index]  # a PeftModel's
            module.reset_lora_parameters(adapter, lora_config.init_lora_weights)


def weights_dtype(spec: RocmTrainingJobSpec, *, gpu: bool) -> torch.dtype:
    """The dtype the model's weights load in: the contract's rule, which the memory plan counts by."""
    import torch

    name = training_dtype(adapter=spec.adapter is not None, on_gpu=gpu, precision=spec.training.precision)
    return getattr(torch, name)


def load_causal_lm(path: Path, spec: RocmTrainingJobSpec, *, gpu: bool) -> tuple[Any, Any]:
    """The tokenizer and the model to train, in training mode: the pretrained causal LM (in `weights_dtype`,
    whatever the dtype it was saved in), with the job's adapter if it has one. With `training.sharding: fsdp` and
    files each rank can read its rows of, on the meta device (`sharded_load.is_empty`), for the rank to fill its
    shards after sharding."""
    from transformers import AutoModelForCausalLM

    training = spec.training
    tokenizer = load_tokenizer(path, spec)
    dtype, attention = weights_dtype(spec, gpu=gpu), attention_kernels(training, gpu=gpu)
    model: Any = _empty_model(path, spec, dtype, attention) if training.sharding == "fsdp" else None
    if model is None or not readable_by_rows(model, path):
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attention, dtype=dtype)
    model.config.use_cache = False
    model.base_model.register_forward_pre_hook(_refuse_packed_with_cache, with_kwargs=True)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if training.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if spec.adapter is not None:
        model = with_adapter(model, spec.adapter)
        init_adapter(model, training.seed)
    kernel = loss_kernel(
        training.loss_implementation, gpu=gpu, liger_installed=liger_installed(), plain_head=plain_head(model)
    )
    use_loss_kernel(model, kernel)
    return model.train(), tokenizer  # from_pretrained's is in eval mode: no gradient checkpointing, no dropout
