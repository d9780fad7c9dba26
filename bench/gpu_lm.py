"""The language-model case of the GPU benchmark (`gpu_throughput.py --lm`): our loop next to a minimal PyTorch loop.

Llama-architecture models with random weights, made from a config (no download): Llama 3.2 1B's and
3B's shapes (hidden 2048 and 3072, 16 and 28 layers, 32 and 24 heads, 8 KV heads, MLP 8192,
vocabulary 128,256, tied embeddings), saved in bf16 as real checkpoints are. Their tokenizer is a
word-level one of as many made-up words as the vocabulary has (examples/sft/make_model.py's), and
the data are instruction pairs of those words, 512 to 2,048 tokens a record (uniformly; a quarter of
each is the response, which alone carries loss): record lengths like real fine-tuning data, through
our data path. What the words mean does not matter to throughput; their count does.

Each model trains with full fine-tuning and with a LoRA adapter (rank 16, alpha 32, all linear
layers), bf16 autocast, on one GPU, in three loops, each in the variants its plan names (`Variant`: parts
joined by `+`, e.g. `varlen+tokens16k+fused`):

- ours: the training image's loop (`rocmtrain_train.trainer.torch_trainer.run`), one Ray Train
  worker on the GPU. Parts: `fsdp` (`training.sharding: fsdp`: FSDP2 over the one GPU, bf16 compute, fp32
  reduction; `none` is DDP), `gc` (`training.gradientCheckpointing`), `varlen` (`attentionImplementation: varlen`:
  one flat row of records a micro-batch, flash-attention's variable-length kernel where flash-attn is installed,
  else SDPA with a block-diagonal mask; without it, dynamic padding of length-sorted batches), `tokens16k`
  (`training.tokensPerWorker` 16,384: micro-batches filled to a token budget instead of `batch_size` records;
  `tokens256` is 256), and the loss (`training.lossImplementation`): `chunked`, `fused` (Liger's fused linear
  cross-entropy) or `model` (the model's own head and loss); without one, the job's default;
- reference: a minimal hand-written loop over the same records in the same micro-batches (tokenised and
  collated by our data path: sorted by length and padded to the longest rounded up to a multiple of 8 as ours
  pads on GPUs, the longest first; or one flat row a micro-batch with `varlen`, the attention kernels ours
  picks): forward, backward, clip to norm 1 (ours' default), fused AdamW; nothing else. Its loss is the model's,
  or Liger's fused linear cross-entropy with `fused` (transformers' `apply_liger_kernel`, that kernel alone);
  `varlen`, `tokens…` and `gc` as ours. Ours over it is our loop's overhead;
- trl: TRL's `SFTTrainer` in this process on the same pre-tokenised records (labels on the responses only),
  `batch_size` records a step, fused AdamW, clip to norm 1, bf16. `varlen` is `padding_free=True` (one flat row,
  the same attention kernels as ours); its loss is always its own chunked log-probabilities head (TRL 1.16
  refuses Liger's fused cross-entropy: it replaces that head), which `chunked` names; `liger` adds
  `use_liger_kernel` (Liger's RoPE, RMSNorm and SwiGLU kernels); `gc` as ours.

An arm that needs Liger (`fused`, `liger`) is skipped, with the reason, where Liger cannot run (no GPU, or no
liger-kernel package); flash-attn missing only turns `varlen` into SDPA's masked path, which each result's
`kernels` records. On a GPU, an arm whose memory plan (the allocator's part) exceeds the device's memory is
skipped too, rather than spending device time on an out-of-memory error.

Steps of records: 4 records (2,048 to 8,192 tokens) a step, 16 steps; with a token budget, as many records as
fill about 16 steps. Learning rate 1e-5 (full) or 2e-4 (LoRA), no warmup; one run of each (the GPU is not
shared, and time on it is short).

Measured per run: tokens/s of real (non-padding) tokens over the steps after the first (the first
step warms up kernels and the allocator), timed with the device synchronised; MFU, the model FLOPs
those tokens need over that time and the device's peak dense bf16 FLOP/s: per token
6 N + 12 L H S with full fine-tuning, 4 N + 12 L H S with LoRA (no weight gradients of the frozen
base; the adapter's own FLOPs are under 1%), N the parameters of every matrix product (the layers'
and the output head's; not the input embedding, a lookup), L layers, H the hidden size, S the mean
record length (attention stays within a record in every layout); gradient checkpointing's recomputation is not
counted; the peak GPU memory allocated; and the whole run's wall time (ours: Ray worker start, loading,
tokenising, training, a checkpoint, the export). Each run also records the job's memory plan (`rocmtrain plan`'s,
from the model's config.json): the plan's total per GPU and the part the allocator itself holds (the total less
the margin for fragmentation and the runtime), which the measured peak allocated is compared with (`peak/plan`).

Ratios: each of our arms over the reference's and TRL's arms of the same layout, batching, sharding and
checkpointing (`same kernels` where the loss is the same too). The issue's goals are printed as met or not:
at least 40% MFU for a 3B full fine-tune in bf16 (our best arm), and at least 1.0x TRL with the same kernels.

`--smoke` runs the same on a tiny model and short records on whatever device there is (a CPU too),
to check the code without a GPU.
"""

from __future__ import annotations

import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import random
import re
import shutil
import statistics
import time
import uuid
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lm_throughput import encoded_records, real_tokens, sft_script
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.plan.fit import plan_job
from rocmtrain_train.config import local_settings
from rocmtrain_train.data.batch_plan import token_batches
from rocmtrain_train.data.causal_lm.tokens import IGNORE, collate_lm, collate_packed, pack
from rocmtrain_train.data.tokens import Encoded
from rocmtrain_train.model.causal_lm import weights_dtype
from rocmtrain_train.model.pretrained import attention_kernels
from train_throughput import read_jsonl, table

# Llama 3.2 1B's and 3B's shapes; `smoke` is tiny, for a check on a CPU.
SIZES: dict[str, dict[str, Any]] = {
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128_256,
    },
    "3b": {
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "vocab_size": 128_256,
    },
    "smoke": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
}
MODES = ("lora", "full")
LOOPS = ("reference", "trl", "ours")  # in the order their arms run
VARIANTS = ("none", "fsdp", "none+gc", "fsdp+gc")  # issue 23's: our loop's sharding, and gradient checkpointing
LOSSES = ("chunked", "fused", "model")  # training.lossImplementation
LOOP_LOSS = {"reference": "model", "trl": "chunked"}  # what these loops' loss is without a `fused` part
# transformers' Liger kernel settings for Liger's fused linear cross-entropy alone (the reference's `fused`)
LIGER_LOSS = {"rope": False, "rms_norm": False, "swiglu": False, "cross_entropy": False}
LIGER_LOSS_ONLY = LIGER_LOSS | {"fused_linear_cross_entropy": True}
LEARNING_RATES = {"full": 1e-5, "lora": 2e-4}
LORA: dict[str, Any] = {"rank": 16, "alpha": 32, "dropout": 0.05}
RESPONSE_SHARE = 0.25
GOAL_MFU = 0.40  # issue 48: a 3B full fine-tune in bf16 on one GPU
GOAL_OVER_TRL = 1.0  # and ours over TRL with the same kernels
_TOKENS = re.compile(r"tokens(\d+)(k?)")


@dataclass(frozen=True)
class Variant:
    """What an arm trains with beyond its loop: parts joined by `+` (`fsdp+gc`, `varlen+tokens16k+fused`)."""

    sharding: str = "none"  # none (DDP) | fsdp
    gc: bool = False  # gradient checkpointing
    varlen: bool = False  # one flat row of records a micro-batch
    tokens: int | None = None  # tokensPerWorker: micro-batches of a token budget, not of `batch_size` records
    loss: str | None = None  # one of LOSSES; None: the loop's default
    liger: bool = False  # TRL's use_liger_kernel (Liger's layer kernels)

    @classmethod
    def parse(cls, text: str) -> Variant:
        found = cls()
        for part in text.split("+"):
            if part in ("none", "fsdp"):
                found = replace(found, sharding=part)
            elif part == "gc":
                found = replace(found, gc=True)
            elif part == "varlen":
                found = replace(found, varlen=True)
            elif part == "liger":
                found = replace(found, liger=True)
            elif part in LOSSES:
                found = replace(found, loss=part)
            elif budget := _TOKENS.fullmatch(part):
                found = replace(found, tokens=int(budget.group(1)) * (1024 if budget.group(2) else 1))
            else:
                raise ValueError(
                    f"variant {text!r}: unknown part {part!r} (none, fsdp, gc, varlen, tokensN[k], liger, "
                    f"{', '.join(LOSSES)})"
                )
        return found

    def parts(self) -> list[str]:
        """The parts that differ from the defaults, in a fixed order (`none` for none)."""
        tokens = f"tokens{self.tokens // 1024}k" if self.tokens and self.tokens % 1024 == 0 else f"tokens{self.tokens}"
        named = [
            (self.sharding != "none", self.sharding),
            (self.varlen, "varlen"),
            (self.tokens is not None, tokens),
            (self.loss is not None, self.loss or ""),
            (self.liger, "liger"),
            (self.gc, "gc"),
        ]
        return [part for wanted, part in named if wanted]

    def refused(self, loop: str) -> str | None:
        """Why `loop` cannot train this variant; None where it can."""
        if loop == "ours":
            return "our loop has no Liger layer kernels (liger)" if self.liger else None
        if self.sharding != "none":
            return f"the {loop} loop trains on one GPU without sharding"
        if loop == "reference":
            return (
                "the reference's loss is the model's or Liger's (model, fused)"
                if self.loss == "chunked"
                else ("liger is TRL's" if self.liger else None)
            )
        if self.loss not in (None, "chunked"):
            return "TRL's loss is its own chunked head (TRL 1.16 refuses Liger's fused cross-entropy)"
        return "TRL's steps are of records, not of a token budget" if self.tokens else None

    def resolved(self, loop: str) -> Variant:
        """The same with the loss the loop computes written out."""
        return replace(self, loss=self.loss or LOOP_LOSS.get(loop))


@dataclass(frozen=True)
class LmGpuWorkload:
    """What the loops train, and on what."""

    data: str  # a folder with train.jsonl (prompt, response)
    batch_size: int  # records a step (one GPU), without a token budget
    steps: int
    max_length: int
    use_gpu: bool
    cpus: int  # our worker's CPUs (and torch threads)
    variant: str = "none"  # a `Variant`'s parts

    @property
    def parsed(self) -> Variant:
        return Variant.parse(self.variant)


@dataclass
class LmRun:
    """One run of one loop."""

    tokens: int  # real tokens of the timed steps (all but the first)
    seconds: float  # their time
    padded_tokens: int  # tokens computed on in all steps, padding included
    all_tokens: int  # real tokens of all steps
    steps: int
    peak_memory_bytes: int | None
    wall_seconds: float
    mean_length: float  # real tokens a record
    planned_bytes: int = 0  # the memory plan's total per GPU
    planned_allocated_bytes: int = 0  # of it, what the allocator itself holds (the margin left out)
    kernels: dict[str, str] = field(default_factory=dict)  # the attention and loss it ran with

    def figures(self, flops_per_token: float, peak_flops: float | None) -> dict[str, float | None]:
        rate = self.tokens / self.seconds
        peak = self.peak_memory_bytes
        return {
            "tokens_per_second": rate,
            "mfu": rate * flops_per_token / peak_flops if peak_flops else None,
            "peak_memory_gib": peak / 2**30 if peak else None,
            "planned_gib": self.planned_bytes / 2**30,
            "peak_over_plan": peak / self.planned_allocated_bytes if peak and self.planned_allocated_bytes else None,
            "padding_efficiency": self.all_tokens / self.padded_tokens,
            "wall_seconds": self.wall_seconds,
            "steps": self.steps,
        }


# --- kernels ------------------------------------------------------------------------------------------------


def installed_kernels() -> dict[str, str | None]:
    """The versions of the kernel packages the arms can use (None where not installed)."""
    return {name: _version(name) for name in ("flash_attn", "liger_kernel", "triton")}


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    for dist in (module.replace("_", "-"), module):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "installed"


def liger_runs(use_gpu: bool) -> bool:
    """Liger's kernels are Triton kernels: they need a GPU and the liger-kernel package."""
    return use_gpu and importlib.util.find_spec("liger_kernel") is not None


def unavailable(variant: Variant, use_gpu: bool) -> str | None:
    """Why an arm cannot run here (a kernel it needs is missing); None where it can."""
    if (variant.loss == "fused" or variant.liger) and not liger_runs(use_gpu):
        return "needs Liger's kernels: a GPU and the liger-kernel package"
    return None


# --- model, data, FLOPs -------------------------------------------------------------------------------


def build_model(folder: Path, size: str, max_length: int, device: torch.device) -> Path:
    """A Llama of `SIZES[size]` with random weights (made on `device`, saved in bf16) and a word-level tokenizer
    of as many made-up words as its vocabulary."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    shape = dict(SIZES[size])
    maker = sft_script("make_model")
    tokenizer = maker.tokenizer([f"w{i}" for i in range(shape["vocab_size"] - len(maker.SPECIAL))])
    assert len(tokenizer) == shape["vocab_size"]
    config = LlamaConfig(
        **shape,
        max_position_embeddings=max(max_length, 2048),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    release(device)
    return folder


def make_data(folder: Path, vocab: int, records: int, lengths: tuple[int, int], seed: int = 0) -> Path:
    """train.jsonl: `records` instruction pairs of made-up words (Zipf-distributed), each of a length drawn
    uniformly from `lengths` tokens (BOS and EOS included), a quarter of it the response."""
    rng = np.random.default_rng(seed)
    words = vocab - len(sft_script("make_model").SPECIAL)
    weights = 1.0 / np.arange(1, words + 1)
    weights /= weights.sum()
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for length in rng.integers(lengths[0], lengths[1] + 1, size=records):
        response = max(1, int(length * RESPONSE_SHARE))
        ids = rng.choice(words, size=int(length) - 2, p=weights)
        text = [f"w{i}" for i in ids]
        cut = len(text) - response
        lines.append(json.dumps({"prompt": " ".join(text[:cut]), "response": " ".join(text[cut:])}))
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def flops_per_token(model: str, mean_length: float, *, lora: bool) -> float:
    """Training FLOPs per token: 6 N (4 N with LoRA: no weight gradients of the frozen base) + 12 L H S, N the
    parameters of every matrix product (attention, MLP, output head)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    hidden, layers = config.hidden_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * config.intermediate_size
    matrices = layers * per_layer + hidden * config.vocab_size
    return (4 if lora else 6) * matrices + 12 * layers * hidden * mean_length


# --- the reference: a minimal loop ---------------------------------------------------------------------


def _batches(count: int, lengths: list[int], batch_size: int, seed: int = 0) -> list[list[int]]:
    """Records sorted by length, cut into batches; the longest batch first, the others shuffled."""
    ordered = sorted(range(count), key=lambda i: -lengths[i])
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    rest = batches[1:]
    random.Random(seed).shuffle(rest)
    return [batches[0], *rest]


def micro_batches(lengths: list[int], work: LmGpuWorkload) -> list[list[int]]:
    """The reference's micro-batches (a step each), as our loop cuts them: `batch_size` records, or records up to
    the token budget (one flat row of up to that many with `varlen`; else padded records, padding counted)."""
    budget, rows = work.parsed.tokens, range(len(lengths))
    if budget is None:
        return _batches(len(lengths), lengths, work.batch_size)[: work.steps]
    return pack(rows, lengths, budget) if work.parsed.varlen else token_batches(rows, lengths, budget)


def load_model(model_dir: str, mode: str, work: LmGpuWorkload, loop: str) -> tuple[Any, dict[str, str]]:
    """The model as the reference and TRL's arm train it: the weights in the dtype ours loads them in
    (`weights_dtype`: fp32 masters under bf16 autocast for full fine-tuning, as the Hugging Face Trainer's bf16 mode
    trains an fp32 model; a frozen bf16 base for LoRA), ours' attention kernels; and the kernels it got."""
    from transformers import AutoModelForCausalLM

    spec = lm_gpu_job(model_dir, mode, work, loop).spec
    attention = attention_kernels(spec.training, gpu=work.use_gpu)
    device = "cuda" if work.use_gpu else "cpu"
    dtype = weights_dtype(spec, gpu=work.use_gpu)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation=attention, device_map=device, dtype=dtype
    )
    model.config.use_cache = False
    variant = work.parsed.resolved(loop)
    return model, {"attention": attention, "loss": variant.loss or "default", "liger": str(work.parsed.liger).lower()}


def lora_config() -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=LORA["rank"],
        lora_alpha=LORA["alpha"],
        lora_dropout=LORA["dropout"],
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )


def reference(model_dir: str, mode: str, work: LmGpuWorkload) -> LmRun:
    """The minimal loop: forward, backward, clip, fused AdamW, with bf16 autocast on the GPU."""
    from peft import get_peft_model
    from transformers.integrations.liger import apply_liger_kernel

    started_wall = time.perf_counter()
    device = torch.device("cuda" if work.use_gpu else "cpu")
    encoded = encoded_records(model_dir, work.data, work.max_length)
    lengths = [int(n) for n in encoded.lengths]
    batches = micro_batches(lengths, work)
    model, kernels = load_model(model_dir, mode, work, "reference")
    if work.parsed.loss == "fused":
        apply_liger_kernel(model, LIGER_LOSS_ONLY)
    if work.parsed.gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if mode == "lora":
        model = get_peft_model(model, lora_config())
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LEARNING_RATES[mode], weight_decay=0.0, fused=True)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if work.use_gpu else nullcontext
    pad = model.config.pad_token_id
    multiple = 8 if work.use_gpu else 1  # as our loop pads on GPUs
    tokens = padded = all_tokens = 0
    started = time.perf_counter()
    for step, rows in enumerate(batches):
        if step == 1:
            synchronize(device)
            started, tokens = time.perf_counter(), 0
        collated = (
            collate_packed(encoded, [rows], pad, multiple_of=multiple)
            if work.parsed.varlen
            else collate_lm(encoded, rows, pad, multiple_of=multiple)
        )
        batch = {k: v.to(device) for k, v in collated.items()}
        with autocast():
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        real = sum(lengths[r] for r in rows)
        tokens, all_tokens, padded = tokens + real, all_tokens + real, padded + batch["input_ids"].numel()
    synchronize(device)
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) if work.use_gpu else None
    del model, optimizer, params, batch, loss
    release(device)
    return LmRun(
        tokens=tokens,
        seconds=seconds,
        padded_tokens=padded,
        all_tokens=all_tokens,
        steps=len(batches),
        peak_memory_bytes=peak,
        wall_seconds=time.perf_counter() - started_wall,
        mean_length=statistics.fmean(lengths),
        kernels=kernels,
        **planned(model_dir, mode, work, "reference"),
    )


# --- TRL's SFTTrainer -------------------------------------------------------------------------------------


def labelled(encoded: Encoded) -> list[dict[str, list[int]]]:
    """The records as TRL takes pre-tokenised ones: their ids, and labels on the tokens that carry loss."""
    assert encoded.loss_mask is not None
    labels = np.where(encoded.loss_mask > 0, encoded.ids, IGNORE)
    spans = zip(encoded.offsets[:-1], encoded.offsets[1:], strict=True)
    return [{"input_ids": encoded.ids[a:b].tolist(), "labels": labels[a:b].tolist()} for a, b in spans]


def trl(model_dir: str, mode: str, work: LmGpuWorkload, folder: Path) -> LmRun:
    """TRL's SFTTrainer on one device, in this process: `batch_size` records a step, timed after the first."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    started_wall = time.perf_counter()
    device = torch.device("cuda" if work.use_gpu else "cpu")
    variant = work.parsed
    encoded = encoded_records(model_dir, work.data, work.max_length)
    model, kernels = load_model(model_dir, mode, work, "trl")
    pad = model.config.pad_token_id
    counted: list[torch.Tensor] = []  # real tokens per step, on the device (no sync)
    computed: list[int] = []  # tokens computed on per step, padding included
    clock: dict[str, float] = {}

    class Counting(SFTTrainer):
        def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> torch.Tensor:
            counted.append(real_tokens(inputs["input_ids"], pad))
            computed.append(inputs["input_ids"].numel())
            return super().training_step(model, inputs, *args, **kwargs)

    class Clock(TrainerCallback):
        """Starts the clock when the first step ends, stops it when the last does (the device synchronised)."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step in (1, state.max_steps):
                synchronize(device)
                clock.setdefault("started", time.perf_counter())
                clock["ended"] = time.perf_counter()

    arguments = SFTConfig(
        output_dir=str(folder),
        per_device_train_batch_size=work.batch_size,
        num_train_epochs=1,
        learning_rate=LEARNING_RATES[mode],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch_fused",
        max_length=None,  # padding-free without packing truncates nothing; our data path has cut the records
        padding_free=variant.varlen,
        pad_to_multiple_of=8 if work.use_gpu and not variant.varlen else None,
        gradient_checkpointing=variant.gc,
        use_liger_kernel=variant.liger,
        bf16=work.use_gpu,
        use_cpu=not work.use_gpu,
        dataloader_num_workers=0,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    trainer = Counting(
        model=model,
        args=arguments,
        train_dataset=Dataset.from_list(labelled(encoded)),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=lora_config() if mode == "lora" else None,
        callbacks=[Clock()],
    )
    trainer.train()
    steps = trainer.state.global_step
    per_step = [int(n) for n in counted]
    peak = torch.cuda.max_memory_allocated(device) if work.use_gpu else None
    del trainer, model
    release(device)
    shutil.rmtree(folder, ignore_errors=True)
    return LmRun(
        tokens=sum(per_step[1:]),
        seconds=clock["ended"] - clock["started"],
        padded_tokens=sum(computed),
        all_tokens=sum(per_step),
        steps=steps,
        peak_memory_bytes=peak,
        wall_seconds=time.perf_counter() - started_wall,
        mean_length=statistics.fmean(int(n) for n in encoded.lengths),
        kernels=kernels,
        **planned(model_dir, mode, work, "trl"),
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    """Hand this process's cached GPU memory back (our loop's runs train in another process) and reset its peak."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# --- ours --------------------------------------------------------------------------------------------------


class Recorder:
    """A sink that keeps every progress report of a run."""

    def __init__(self) -> None:
        self.reports: list[Any] = []

    def emit(self, report: Any) -> None:
        self.reports.append(report)

    def close(self) -> None:
        """Nothing to close."""


def lm_gpu_job(model_dir: str, mode: str, work: LmGpuWorkload, name: str) -> RocmTrainingJob:
    """The workload as a causal-lm RocmTrainingJob on one GPU (or one CPU worker), in the workload's variant."""
    variant = work.parsed
    training: dict[str, Any] = {
        "epochs": 1,
        "batchSizePerWorker": work.batch_size,
        "learningRate": LEARNING_RATES[mode],
        "warmupRatio": 0.0,
        "weightDecay": 0.0,
        "precision": "bf16" if work.use_gpu else "fp32",
        "attentionImplementation": "varlen" if variant.varlen else "sdpa",
        "lossOn": "response",
        "packing": False,
        "sharding": variant.sharding,
        "gradientCheckpointing": variant.gc,
    }
    if variant.tokens:
        training["tokensPerWorker"] = variant.tokens
    if variant.loss:
        training["lossImplementation"] = variant.loss
    spec: dict[str, Any] = {
        "model": {"source": model_dir, "task": "causal-lm", "maxSeqLength": work.max_length},
        "data": {"train": {"uri": f"{work.data}/train.jsonl"}, "promptField": "prompt", "responseField": "response"},
        "training": training,
        "resources": {"workers": 1, "gpusPerWorker": int(work.use_gpu), "cpusPerWorker": str(work.cpus)},
        "checkpoint": {"keepLast": 1},
    }
    if mode == "lora":
        spec["adapter"] = {"type": "lora", **LORA, "targetModules": ["all-linear"]}
    return RocmTrainingJob.model_validate({"metadata": {"name": name}, "spec": spec})


def planned(model_dir: str, mode: str, work: LmGpuWorkload, loop: str = "ours") -> dict[str, int]:
    """The job's memory plan per GPU (`rocmtrain plan`'s): its total, and the part the allocator holds; for the
    reference's and TRL's arms, the job with the loss they compute (the model's, chunked or fused)."""
    variant = work.parsed.resolved(loop)
    as_job = replace(work, variant="+".join(replace(variant, liger=False).parts()) or "none")
    job = lm_gpu_job(model_dir, mode, as_job, "plan")
    plan = plan_job(job.spec, json.loads((Path(model_dir) / "config.json").read_text()), None).plan
    return {"planned_bytes": plan.total, "planned_allocated_bytes": plan.total - plan.peak.margin}


def disk_needed(model_dir: str, mode: str) -> int:
    """Bytes our loop writes in a run: with full fine-tuning, a checkpoint of the fp32 master weights and AdamW's two
    fp32 states (6 times the bf16 checkpoint) twice (written, then copied to the storage by Ray Train) and the
    exported fp32 model (twice the bf16 checkpoint)."""
    weights = sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))
    return 14 * weights if mode == "full" else weights // 10


def ours(model_dir: str, mode: str, work: LmGpuWorkload, folder: Path) -> LmRun:
    """Our loop, one Ray Train worker; the timed steps are those after the first report (which comes after step 1)."""
    from rocmtrain_train.trainer.torch_trainer import run

    folder.mkdir(parents=True, exist_ok=True)
    free, needed = shutil.disk_usage(folder).free, disk_needed(model_dir, mode)
    if free < needed:
        raise RuntimeError(f"{free / 2**30:.0f} GiB of disk free, and the run writes about {needed / 2**30:.0f} GiB")
    records = len(read_jsonl(Path(work.data) / "train.jsonl"))
    if work.parsed.tokens is None:
        assert records == work.batch_size * work.steps, "one epoch of exactly `steps` steps"
    settings = local_settings(
        lm_gpu_job(model_dir, mode, work, f"lm-{mode}"),
        job_dir=str(folder),
        run_id=uuid.uuid4().hex,
        storage=str(folder / "storage"),
        cpu_count=os.cpu_count() or 1,
    )
    recorder = Recorder()
    started = time.perf_counter()
    outcome = run(settings, [recorder], echo_log=False)
    wall = time.perf_counter() - started
    first = recorder.reports[0]
    assert first.progress.step == 1, "the first report comes after step 1"
    first_seconds = first.metrics.train_seconds
    first_tokens = round(first.metrics.tokens_per_second * first_seconds)
    ranks = outcome.final_ranks
    total_tokens = sum(r.tokens for r in ranks)
    peaks = [p for r in recorder.reports if (p := r.metrics.gpu_memory_peak_bytes)]
    attention = attention_kernels(settings.job.spec.training, gpu=work.use_gpu)
    return LmRun(
        tokens=total_tokens - first_tokens,
        seconds=outcome.summary["train_seconds"] - first_seconds,
        padded_tokens=sum(r.padded_tokens for r in ranks),
        all_tokens=total_tokens,
        steps=outcome.summary["steps"],
        peak_memory_bytes=max(peaks, default=None),
        wall_seconds=wall,
        mean_length=total_tokens / sum(r.samples for r in ranks),
        kernels={"attention": attention, "loss": work.parsed.loss or "default", "liger": "false"},
        **planned(model_dir, mode, work),
    )


# --- the case --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LmPlan:
    """What `run_lm_case` runs."""

    sizes: tuple[str, ...]
    modes: tuple[str, ...]
    loops: tuple[str, ...]
    steps: int
    batch_size: int
    lengths: tuple[int, int]
    budget_s: float  # cases not started by then are skipped (each writes its results as it ends)
    variants: tuple[str, ...] = ("none",)  # our loop's (`Variant`s)
    references: tuple[str, ...] = ("none",)  # the reference's
    trl: tuple[str, ...] = ()  # TRL's


SMOKE = LmPlan(
    sizes=("smoke",),
    modes=MODES,
    loops=LOOPS,
    steps=4,
    batch_size=4,
    lengths=(16, 64),
    budget_s=900,
    variants=("model", "fsdp+gc", "varlen+chunked", "varlen+fused", "varlen+tokens256+chunked", "tokens256+chunked"),
    references=("none", "varlen", "varlen+tokens256", "varlen+fused"),
    trl=("varlen", "varlen+liger"),
)
GPU = LmPlan(
    sizes=("1b", "3b"),
    modes=MODES,
    loops=LOOPS,
    steps=16,
    batch_size=4,
    lengths=(512, 2048),
    budget_s=400,
    variants=("model", "varlen+chunked", "varlen+fused", "varlen+tokens16k+fused", "varlen+tokens16k+fused+gc"),
    references=("none", "varlen+fused"),
    trl=("varlen", "varlen+liger"),
)

COLUMNS = [
    ("tokens_per_second", "tokens/s", ".0f"),
    ("mfu", "MFU", ".3f"),
    ("peak_memory_gib", "peak GiB", ".1f"),
    ("planned_gib", "plan GiB", ".1f"),
    ("peak_over_plan", "peak/plan", ".2f"),
    ("padding_efficiency", "padding eff.", ".3f"),
    ("wall_seconds", "wall s", ".1f"),
    ("steps", "steps", ".0f"),
]


def arms(plan: LmPlan) -> list[tuple[str, str]]:
    """(arm, variant) in the order they run: the reference's, TRL's, then ours, each in its plan's variants; an arm
    is its loop and its variant's parts (`ours`, `ours-fsdp-gc`, `trl-varlen-liger`). A variant the loop cannot
    train is refused here, before anything runs."""
    found = []
    for loop, variants in (("reference", plan.references), ("trl", plan.trl), ("ours", plan.variants)):
        for text in variants if loop in plan.loops else ():
            variant = Variant.parse(text)
            if reason := variant.refused(loop):
                raise ValueError(f"{loop} in variant {text!r}: {reason}")
            found.append(("-".join([loop, *variant.parts()]), text))
    return found


def records_for(plan: LmPlan, variant: Variant) -> int:
    """Records of one epoch of about `plan.steps` steps: `batch_size` a step, or as many as fill the token budget."""
    if variant.tokens is None:
        return plan.steps * plan.batch_size
    return max(plan.steps, plan.steps * variant.tokens * 2 // sum(plan.lengths))


def too_big(model_dir: str, mode: str, work: LmGpuWorkload, loop: str, device_bytes: int | None) -> str | None:
    """Why an arm would run out of the device's memory by its plan (the allocator's part alone); None where it fits."""
    needed = planned(model_dir, mode, work, loop)["planned_allocated_bytes"]
    if device_bytes is None or needed <= device_bytes:
        return None
    return f"its plan holds {needed / 2**30:.1f} GiB, over the device's {device_bytes / 2**30:.1f} GiB"


def run_arm(arm: str, model_dir: str, mode: str, work: LmGpuWorkload, folder: Path) -> LmRun:
    loop = arm.split("-")[0]
    if loop == "reference":
        return reference(model_dir, mode, work)
    return trl(model_dir, mode, work, folder) if loop == "trl" else ours(model_dir, mode, work, folder)


def run_lm_case(plan: LmPlan, folder: Path, out: Path, peak_flops: float | None, device_name: str) -> dict[str, Any]:
    """Every size, mode and arm of the plan, in that order; results (and errors, and skipped arms with the reason)
    written to `out` after each."""
    import ray

    use_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if use_gpu else "cpu")
    device_bytes = torch.cuda.get_device_properties(device).total_memory if use_gpu else None
    cpus = os.cpu_count() or 1
    started = time.monotonic()
    kernels = installed_kernels()
    print("kernels: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in kernels.items()), flush=True)
    report: dict[str, Any] = {
        "device": device_name,
        "peak_bf16_flops": peak_flops,
        "plan": asdict(plan),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "kernels": kernels,
        "results": {},
        "errors": {},
        "skipped": {},
    }
    planned_arms = arms(plan)
    ray.init(num_cpus=cpus, num_gpus=int(use_gpu), include_dashboard=False, log_to_driver=False)
    try:
        for size in plan.sizes:
            model_dir = folder / f"model-{size}"
            base = LmGpuWorkload(
                data="",
                batch_size=plan.batch_size,
                steps=plan.steps,
                max_length=plan.lengths[1],
                use_gpu=use_gpu,
                cpus=min(8, cpus),
            )
            made: set[int] = set()
            for mode in plan.modes:
                for arm, variant in planned_arms:
                    key = f"{size} {mode} {arm}"
                    records = records_for(plan, Variant.parse(variant))
                    work = replace(base, variant=variant, data=str(folder / f"data-{size}-{records}"))
                    if time.monotonic() - started > plan.budget_s:
                        reason: str | None = "the time budget is spent"
                    else:
                        reason = unavailable(work.parsed, use_gpu)
                    if reason:
                        report["skipped"][key] = reason
                        print(f"{key}: skipped, {reason}", flush=True)
                        continue
                    try:
                        if not made:
                            build_model(model_dir, size, plan.lengths[1], device)
                        if records not in made:
                            make_data(Path(work.data), SIZES[size]["vocab_size"], records, plan.lengths)
                            made.add(records)
                        if reason := too_big(str(model_dir), mode, work, arm.split("-")[0], device_bytes):
                            report["skipped"][key] = reason
                            print(f"{key}: skipped, {reason}", flush=True)
                            continue
                        runs = folder / key.replace(" ", "-")
                        measured = run_arm(arm, str(model_dir), mode, work, runs)
                        shutil.rmtree(runs, ignore_errors=True)
                        flops = flops_per_token(str(model_dir), measured.mean_length, lora=mode == "lora")
                        report["results"][key] = asdict(measured) | measured.figures(flops, peak_flops)
                    except Exception as exc:  # one case failing must not lose the others
                        report["errors"][key] = f"{type(exc).__name__}: {exc}"[:2000]
                    report["elapsed_s"] = time.monotonic() - started
                    out.write_text(json.dumps(report, indent=2) + "\n")
                    print(f"{key}: {report['results'].get(key) or report['errors'].get(key)}", flush=True)
            shutil.rmtree(model_dir, ignore_errors=True)
    finally:
        ray.shutdown()
    report["ratios"] = ratios(report["results"], dict(planned_arms))
    report["goals"] = goals(report["results"], dict(planned_arms))
    out.write_text(json.dumps(report, indent=2) + "\n")
    rows = {key: {k: _number(v) for k, v in found.items()} for key, found in report["results"].items()}
    if rows:
        print(table(rows, COLUMNS))
    for line in [*(f"{k}: {v:.2f}x" for k, v in report["ratios"].items()), *report["goals"]]:
        print(line)
    return report


def _comparable(ours_arm: str, other_arm: str, variants: dict[str, str], *, same_loss: bool) -> bool:
    """Two arms of the same layout, batching, sharding and checkpointing (and kernels, where `same_loss`)."""
    mine = Variant.parse(variants[ours_arm]).resolved("ours")
    theirs = Variant.parse(variants[other_arm]).resolved(other_arm.split("-")[0])
    if not same_loss:  # nor the same Liger kernels
        mine, theirs = replace(mine, loss=None, liger=False), replace(theirs, loss=None, liger=False)
    return mine == theirs


def _pairs(results: dict[str, dict[str, Any]], variants: dict[str, str], *, same_loss: bool) -> list[tuple[str, str]]:
    """(our key, the other loop's key) of the comparable arms of each size and mode, both measured."""
    split = {key: key.rsplit(" ", 1) for key in results}  # "size mode", arm
    return [
        (mine, other)
        for mine, (case, arm) in split.items()
        if arm.split("-")[0] == "ours"
        for other, (other_case, other_arm) in split.items()
        if other_case == case
        and other_arm.split("-")[0] != "ours"
        and _comparable(arm, other_arm, variants, same_loss=same_loss)
    ]


def ratios(results: dict[str, dict[str, Any]], variants: dict[str, str]) -> dict[str, float]:
    """Ours' tokens/s over the reference's and TRL's of the same layout, batching, sharding and checkpointing."""
    return {
        f"{mine} / {other.split(' ')[2]}": results[mine]["tokens_per_second"] / results[other]["tokens_per_second"]
        for mine, other in _pairs(results, variants, same_loss=False)
    }


def goals(results: dict[str, dict[str, Any]], variants: dict[str, str]) -> list[str]:
    """The issue's goals, met or not: a 3B full fine-tune at GOAL_MFU or more (our best arm), and ours at
    GOAL_OVER_TRL times TRL's tokens/s or more with the same kernels (every such pair of a 3B full fine-tune)."""
    ours = {k: r for k, r in results.items() if k.startswith("3b full ours") and r.get("mfu") is not None}
    if ours:
        best = max(ours, key=lambda k: ours[k]["mfu"])
        met = "met" if ours[best]["mfu"] >= GOAL_MFU else "not met"
        mfu = f"goal: 3B full fine-tune >= {GOAL_MFU:.0%} MFU: {met} ({ours[best]['mfu']:.1%}, {best})"
    else:
        mfu = f"goal: 3B full fine-tune >= {GOAL_MFU:.0%} MFU: not measured"
    pairs = [
        (mine, other)
        for mine, other in _pairs(results, variants, same_loss=True)
        if mine.startswith("3b full ") and other.split(" ")[2].startswith("trl")
    ]
    if not pairs:
        return [mfu, f"goal: 3B full ours >= {GOAL_OVER_TRL:.1f}x TRL with the same kernels: not measured"]
    found = {
        f"{m} / {o.split(' ')[2]}": results[m]["tokens_per_second"] / results[o]["tokens_per_second"] for m, o in pairs
    }
    met = "met" if min(found.values()) >= GOAL_OVER_TRL else "not met"
    shown = ", ".join(f"{k} {v:.2f}x" for k, v in found.items())
    return [mfu, f"goal: 3B full ours >= {GOAL_OVER_TRL:.1f}x TRL with the same kernels: {met} ({shown})"]


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan
