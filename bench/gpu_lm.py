"""The language-model case of the GPU benchmark (`gpu_throughput.py --lm`): our loop next to a minimal PyTorch loop.

Llama-architecture models with random weights, made from a config (no download): Llama 3.2 1B's and
3B's shapes (hidden 2048 and 3072, 16 and 28 layers, 32 and 24 heads, 8 KV heads, MLP 8192,
vocabulary 128,256, tied embeddings), saved in bf16 as real checkpoints are. Their tokenizer is a
word-level one of as many made-up words as the vocabulary has (examples/sft/make_model.py's), and
the data are instruction pairs of those words, 512 to 2,048 tokens a record (uniformly; a quarter of
each is the response, which alone carries loss): record lengths like real fine-tuning data, through
our data path. What the words mean does not matter to throughput; their count does.

Each model trains with full fine-tuning and with a LoRA adapter (rank 16, alpha 32, all linear
layers), bf16 autocast, SDPA attention, on one GPU, in two loops:

- ours: the training image's loop (`rocmtrain_train.trainer.torch_trainer.run`), one Ray Train
  worker on the GPU, with dynamic padding of length-sorted batches (`training.packing` off);
- reference: a minimal hand-written loop over the same records in the same batches (tokenised and
  padded by our data path: sorted by length, padded to the longest rounded up to a multiple of 8 as
  ours pads on GPUs, the longest first): forward, backward, clip to norm 1 (ours' default), fused
  AdamW; nothing else. Ours over it is our loop's overhead.

4 records (2,048 to 8,192 tokens) a step, 16 steps, learning rate 1e-5 (full) or 2e-4 (LoRA), no
warmup; one run of each (the GPU is not shared, and time on it is short).

Measured per run: tokens/s of real (non-padding) tokens over the steps after the first (the first
step warms up kernels and the allocator), timed with the device synchronised; MFU, the model FLOPs
those tokens need over that time and the device's peak dense bf16 FLOP/s: per token
6 N + 12 L H S with full fine-tuning, 4 N + 12 L H S with LoRA (no weight gradients of the frozen
base; the adapter's own FLOPs are under 1%), N the parameters of every matrix product (the layers'
and the output head's; not the input embedding, a lookup), L layers, H the hidden size, S the mean
record length; the peak GPU memory allocated; and the whole run's wall time (ours: Ray worker
start, loading, tokenising, training, a checkpoint, the export).

Our loop also trains in the variants `--variants` names (issue 23's sharding arms): `none` (DDP, as above),
`fsdp` (`training.sharding: fsdp`: FSDP2 over the one GPU, bf16 compute, fp32 reduction), and either with
`+gc` (`training.gradientCheckpointing`). Each run records, beside its peak, the job's memory plan
(`rocmtrain plan`'s, from the model's config.json): the plan's total per GPU and the part the allocator
itself holds (the total less the margin for fragmentation and the runtime), which the measured peak
allocated is compared with (`peak/plan`).

`--smoke` runs the same on a tiny model and short records on whatever device there is (a CPU too),
to check the code without a GPU.
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import shutil
import statistics
import time
import uuid
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lm_throughput import encoded_records, sft_script
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.plan.fit import plan_job
from rocmtrain_train.config import local_settings
from rocmtrain_train.data.causal_lm.tokens import collate_lm
from rocmtrain_train.model.causal_lm import weights_dtype
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
LOOPS = ("ours", "reference")
VARIANTS = ("none", "fsdp", "none+gc", "fsdp+gc")  # our loop's sharding, and gradient checkpointing (+gc)
LEARNING_RATES = {"full": 1e-5, "lora": 2e-4}
LORA = {"rank": 16, "alpha": 32, "dropout": 0.05}
RESPONSE_SHARE = 0.25


@dataclass(frozen=True)
class LmGpuWorkload:
    """What both loops train, and on what."""

    data: str  # a folder with train.jsonl (prompt, response)
    batch_size: int  # records a step (one GPU)
    steps: int
    max_length: int
    use_gpu: bool
    cpus: int  # our worker's CPUs (and torch threads)
    variant: str = "none"  # one of VARIANTS: our loop's sharding, and gradient checkpointing (+gc)


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


def reference(model_dir: str, mode: str, work: LmGpuWorkload) -> LmRun:
    """The minimal loop: forward, backward, clip, fused AdamW, with bf16 autocast and SDPA on the GPU."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    started_wall = time.perf_counter()
    device = torch.device("cuda" if work.use_gpu else "cpu")
    encoded = encoded_records(model_dir, work.data, work.max_length)
    lengths = [int(n) for n in encoded.lengths]
    batches = _batches(len(lengths), lengths, work.batch_size)[: work.steps]
    # The weights as ours loads them (`weights_dtype`): fp32 masters under bf16 autocast for full fine-tuning (as the
    # Hugging Face Trainer's bf16 mode trains an fp32 model), a frozen bf16 base for LoRA.
    dtype = weights_dtype(lm_gpu_job(model_dir, mode, work, "reference").spec, gpu=work.use_gpu)
    model: Any = AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="sdpa", device_map=str(device), dtype=dtype
    )
    model.config.use_cache = False
    if mode == "lora":
        adapter = LoraConfig(
            r=LORA["rank"],
            lora_alpha=LORA["alpha"],
            lora_dropout=LORA["dropout"],
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, adapter)
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
        batch = {k: v.to(device) for k, v in collate_lm(encoded, rows, pad, multiple_of=multiple).items()}
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
        **planned(model_dir, mode, work),
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
    """The workload as a causal-lm RocmTrainingJob on one GPU (or one CPU worker)."""
    spec: dict[str, Any] = {
        "model": {"source": model_dir, "task": "causal-lm", "maxSeqLength": work.max_length},
        "data": {"train": {"uri": f"{work.data}/train.jsonl"}, "promptField": "prompt", "responseField": "response"},
        "training": {
            "epochs": 1,
            "batchSizePerWorker": work.batch_size,
            "learningRate": LEARNING_RATES[mode],
            "warmupRatio": 0.0,
            "weightDecay": 0.0,
            "precision": "bf16" if work.use_gpu else "fp32",
            "attentionImplementation": "sdpa",
            "lossOn": "response",
            "packing": False,
            "sharding": work.variant.removesuffix("+gc"),
            "gradientCheckpointing": work.variant.endswith("+gc"),
        },
        "resources": {"workers": 1, "gpusPerWorker": int(work.use_gpu), "cpusPerWorker": str(work.cpus)},
        "checkpoint": {"keepLast": 1},
    }
    if mode == "lora":
        spec["adapter"] = {"type": "lora", **LORA, "targetModules": ["all-linear"]}
    return RocmTrainingJob.model_validate({"metadata": {"name": name}, "spec": spec})


def planned(model_dir: str, mode: str, work: LmGpuWorkload) -> dict[str, int]:
    """The job's memory plan per GPU (`rocmtrain plan`'s): its total, and the part the allocator holds."""
    job = lm_gpu_job(model_dir, mode, work, "plan")
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
    return LmRun(
        tokens=total_tokens - first_tokens,
        seconds=outcome.summary["train_seconds"] - first_seconds,
        padded_tokens=sum(r.padded_tokens for r in ranks),
        all_tokens=total_tokens,
        steps=outcome.summary["steps"],
        peak_memory_bytes=max(peaks, default=None),
        wall_seconds=wall,
        mean_length=total_tokens / sum(r.samples for r in ranks),
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
    variants: tuple[str, ...] = ("none",)  # our loop's (VARIANTS)


SMOKE = LmPlan(
    sizes=("smoke",), modes=MODES, loops=LOOPS, steps=4, batch_size=4, lengths=(16, 64), budget_s=600, variants=VARIANTS
)
GPU = LmPlan(
    sizes=("1b", "3b"),
    modes=MODES,
    loops=LOOPS,
    steps=16,
    batch_size=4,
    lengths=(512, 2048),
    budget_s=400,
    variants=VARIANTS,
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


def run_lm_case(plan: LmPlan, folder: Path, out: Path, peak_flops: float | None, device_name: str) -> dict[str, Any]:
    """Every size, mode and loop of the plan, in that order; results (and errors) written to `out` after each."""
    import ray

    use_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if use_gpu else "cpu")
    cpus = os.cpu_count() or 1
    started = time.monotonic()
    report: dict[str, Any] = {
        "device": device_name,
        "peak_bf16_flops": peak_flops,
        "plan": asdict(plan),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "results": {},
        "errors": {},
        "skipped": [],
    }
    ray.init(num_cpus=cpus, num_gpus=int(use_gpu), include_dashboard=False, log_to_driver=False)
    try:
        for size in plan.sizes:
            model_dir = folder / f"model-{size}"
            work = LmGpuWorkload(
                data=str(folder / f"data-{size}"),
                batch_size=plan.batch_size,
                steps=plan.steps,
                max_length=plan.lengths[1],
                use_gpu=use_gpu,
                cpus=min(8, cpus),
            )
            built = False
            for mode in plan.modes:
                for loop, variant in arms(plan):
                    key = f"{size} {mode} {loop}"
                    if time.monotonic() - started > plan.budget_s:
                        report["skipped"].append(key)
                        continue
                    try:
                        if not built:
                            build_model(model_dir, size, plan.lengths[1], device)
                            vocab = SIZES[size]["vocab_size"]
                            make_data(Path(work.data), vocab, plan.steps * plan.batch_size, plan.lengths)
                            built = True
                        runs = folder / key.replace(" ", "-")
                        measured = (
                            reference(str(model_dir), mode, work)
                            if loop == "reference"
                            else ours(str(model_dir), mode, replace(work, variant=variant), runs)
                        )
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
    report["overhead"] = overheads(report["results"])
    out.write_text(json.dumps(report, indent=2) + "\n")
    rows = {key: {k: _number(v) for k, v in found.items()} for key, found in report["results"].items()}
    if rows:
        print(table(rows, COLUMNS))
    print(", ".join(f"{k}: {v:.2f}x" for k, v in report["overhead"].items()))
    return report


def arms(plan: LmPlan) -> list[tuple[str, str]]:
    """(loop, variant) in the order they run: the reference, then ours in each variant (`ours` alone is `none`,
    else `ours-fsdp`, `ours-gc`, `ours-fsdp-gc`)."""
    found = [("reference", "none")] if "reference" in plan.loops else []
    if "ours" in plan.loops:
        for variant in plan.variants:
            parts = [part for part in variant.replace("+", " ").split() if part != "none"]
            found.append(("-".join(["ours", *parts]), variant))
    return found


def overheads(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Ours' tokens/s over the reference's, per size and mode."""
    found = {}
    for key, mine in results.items():
        if key.endswith(" ours") and (base := results.get(key.replace(" ours", " reference"))):
            found[key.removesuffix(" ours") + ": ours/reference"] = (
                mine["tokens_per_second"] / base["tokens_per_second"]
            )
    return found


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan
