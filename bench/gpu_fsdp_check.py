"""One-process checks of sharded training (`training.sharding: fsdp`) on a GPU. Prints one JSON line per case; exit 1
on any failure.

- By default: FSDP2 with bf16 compute, full fine-tuning and a LoRA adapter whose frozen base is bf16 beside fp32
  adapter weights (the mixed-dtype case only a GPU reaches), a few steps of the training image's strategy on a small
  Llama, and the export.
- `--plan`: the memory plan against the real thing. The Llama 3.1 8B shape (examples/models/llama-3.1-8b) with random
  weights, made on the GPU and saved in bf16 as Hugging Face saves a released model (safetensors files of at most
  5 GB and their index; the host holds one file at a time), is loaded by the 8B LoRA example
  (examples/cluster-llama-lora-mi300x.yaml) made a one-GPU FSDP job, as a job's rank loads it (`task.load`, then
  `model.sharded_load.shard_and_fill`: built on the meta device, sharded over the one rank, its shards filled from
  the files); then `--steps` optimiser steps on one micro-batch of the job (batchSizePerWorker rows of maxSeqLength
  tokens, packed as the job packs them) with the job's optimiser and autocast. The peaks of the load and of the steps
  (`torch.cuda.max_memory_allocated`, reset before each) are set against the plan's load and step phases
  (`rocmtrain plan`'s) less their margin: the margin covers what the allocator's count leaves out (its
  fragmentation, the runtime's own memory). Exit 1 also where a peak is above its plan.

Without a GPU, or with `--smoke`, either runs on the CPU (gloo, fp32) at a tiny shape, a check of the script itself;
there a peak is what torch's CPU allocator held, as its profiler records the allocations (`Allocated`).

    python bench/gpu_fsdp_check.py [--plan] [--smoke]   # on a machine with a GPU (docs/benchmarks.md#gpus)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.profiler import ProfilerActivity, profile
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from gpu_lm import release
from lm_throughput import sft_script
from rocmtrain.api.models import AdapterSpec, RocmTrainingJob, RocmTrainingJobSpec
from rocmtrain.plan.memory import PhasePlan, plan_memory
from rocmtrain.plan.model_shapes import model_shape
from rocmtrain.plan.setup import Setup
from rocmtrain_train.data.tokens import Encoded
from rocmtrain_train.loop.rank_setup import autocast_for, optimizer_for, pad_multiple
from rocmtrain_train.model.causal_lm import weights_dtype, with_adapter
from rocmtrain_train.model.sharded_load import is_empty, shard_and_fill
from rocmtrain_train.strategy.sharded import Sharded, _full
from rocmtrain_train.tasks import task_for

SIZE = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 4, "num_attention_heads": 16}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}

REPO = Path(__file__).resolve().parents[1]
LORA_EXAMPLE = REPO / "examples" / "cluster-llama-lora-mi300x.yaml"
LLAMA_8B = REPO / "examples" / "models" / "llama-3.1-8b" / "config.json"
# `--plan` on the CPU: the 8B config at a tiny size (3.6 M parameters), rows of 64 tokens, files of 4 MB (several).
PLAN_TINY = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
}
TINY_SEQUENCE = 64
FILE_SIZE, TINY_FILE_SIZE = "5GB", "4MB"  # 5 GB: the most a released model's file holds
MIB = 2**20

Batch = dict[str, torch.Tensor]


def job(adapter: bool) -> RocmTrainingJob:
    spec = {
        "model": {"source": "/m", "task": "causal-lm"},
        "data": {"train": {"uri": "/d.jsonl"}},
        "training": {"sharding": "fsdp", "precision": "bf16"},
        "resources": {"workers": 1, "gpusPerWorker": 1},
        **({"adapter": {"rank": 16, "targetModules": ["all-linear"]}} if adapter else {}),
    }
    return RocmTrainingJob.model_validate({"metadata": {"name": "check"}, "spec": spec})


def mixed_precision(gpu: bool) -> MixedPrecisionPolicy | None:
    """As `Sharded.for_run` makes it for precision bf16: bf16 compute and fp32 reduction on GPUs, fp32 on CPUs."""
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if gpu else None


def case(adapter: bool, folder: Path, gpu: bool) -> dict[str, object]:
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    spec = job(adapter).spec
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32_000, num_key_value_heads=4, **(SIZE if gpu else TINY))
    model = AutoModelForCausalLM.from_config(config).to(weights_dtype(spec, gpu=gpu)).to(device)
    model.config.use_cache = False
    if adapter:
        model = with_adapter(model, AdapterSpec(rank=16, targetModules=["all-linear"]))
    strategy = Sharded(device, 1, 1, mixed_precision(gpu))
    strategy.prepare(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    ids = torch.randint(0, 32_000, (4, 1024 if gpu else 32), device=device)
    losses, started = [], time.perf_counter()
    for _ in range(5):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
    if gpu:
        torch.cuda.synchronize(device)
    dtypes = sorted({str(_full(p.detach()).dtype) for p in model.parameters()})
    tokenizer = sft_script("make_model").tokenizer(["word"])
    strategy.export(model, tokenizer, str(folder / ("lora" if adapter else "full")), rank=0, merge=adapter)
    return {
        "case": "fsdp lora" if adapter else "fsdp full",
        "losses": [round(x, 4) for x in losses],
        "step_seconds": round((time.perf_counter() - started) / 5, 4),
        "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if gpu else None,
        "weight_dtypes": dtypes,
        "exported": sorted(p.name for p in (folder / ("lora" if adapter else "full")).rglob("*.safetensors")),
    }


# --- the memory plan against the real thing (--plan) ------------------------------------------------------------


def save_model(folder: Path, config: dict[str, Any], device: torch.device, file_size: str) -> Path:
    """A model of `config` with random weights (made on `device`), saved in bf16 as Hugging Face saves a released
    model: safetensors files of at most `file_size` and their index, each file's tensors copied to the host as it is
    written; and a word-level tokenizer with a chat template (the example's records are chats)."""
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.bfloat16)
    model.save_pretrained(folder, max_shard_size=file_size)
    sft_script("make_model").tokenizer(["word"]).save_pretrained(folder)
    return folder


def one_gpu_job(model: Path, gpu: bool) -> RocmTrainingJobSpec:
    """The 8B LoRA example as a one-GPU FSDP job (`sharding: fsdp`, 1 worker x 1 GPU) of the model in `model`; without
    a GPU, a CPU job of rows of `TINY_SEQUENCE` tokens."""
    raw = yaml.safe_load(LORA_EXAMPLE.read_text())
    spec = raw["spec"]
    spec["model"]["source"] = str(model)
    spec["training"]["sharding"] = "fsdp"
    spec["resources"] |= {"workers": 1, "gpusPerWorker": 1 if gpu else 0}
    if not gpu:
        spec["model"]["maxSeqLength"] = TINY_SEQUENCE
        del spec["resources"]["gpu"]
    return RocmTrainingJob.model_validate(raw).spec


@dataclass
class PhasePeak:
    """The most bytes the allocator held at once during a phase, above what it held before the first phase."""

    peak: int = 0


@dataclass
class Allocated:
    """What the device's allocator holds, phase by phase: on a GPU its own count (`max_memory_allocated`, reset at
    each phase's start); on the CPU, torch's allocations and frees as its profiler records them (`profile_memory`),
    summed from the first phase's start: the same figure. Between phases nothing is counted on the CPU."""

    device: torch.device
    held: int = field(init=False)  # the bytes held before the first phase (GPU), or at the last phase's end (CPU)

    def __post_init__(self) -> None:
        self.held = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0

    @contextmanager
    def phase(self) -> Iterator[PhasePeak]:
        phase = PhasePeak()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            yield phase
            phase.peak = torch.cuda.max_memory_allocated(self.device) - self.held
            return
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            yield phase
        events = profiler.profiler.kineto_results.events()
        changes = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
        running = list(accumulate((size for _, size in changes), initial=self.held))
        phase.peak, self.held = max(running), running[-1]


def micro_batch(spec: RocmTrainingJobSpec, setup: Setup, vocab: int, pad_id: int, device: torch.device) -> Batch:
    """The plan's micro-batch as the job's loop makes it (`Task.micro_batches`, `Task.collate`): `setup.batch` rows of
    `setup.sequence` random tokens, two records a row where the job packs, each record's second half its response."""
    task, per_row = task_for(spec), 2 if spec.training.packing else 1
    length = setup.sequence // per_row
    ids = np.random.default_rng(0).integers(0, vocab, size=(setup.batch * per_row, length))
    response = [0] * (length // 2) + [1] * (length - length // 2)
    encoded = Encoded.from_lists(ids.tolist(), None, [], masks=[response] * len(ids))
    (micro,) = task.micro_batches(range(len(ids)), encoded, setup.batch)
    batch = task.collate(encoded, micro, pad_id, multiple_of=pad_multiple(spec.training, device))
    return {name: tensor.to(device) for name, tensor in batch.items()}


def train_steps(
    model: torch.nn.Module, spec: RocmTrainingJobSpec, strategy: Sharded, batch: Batch, steps: int
) -> list[float]:
    """`steps` optimiser steps on `batch` as the job's loop takes them: its AdamW, autocast and clipping."""
    training = spec.training
    optimizer = optimizer_for(model, training, 1)
    autocast = autocast_for(training, strategy.device, strategy)
    losses = []
    for _ in range(steps):
        with autocast():
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), training.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(float(loss.detach()), 4))
    return losses


def against(name: str, peak: int, planned: PhasePlan) -> dict[str, object]:
    """A phase's peak beside its plan less the margin (what the allocator itself holds), in MiB, and their ratio."""
    allocated = planned.total - planned.margin
    return {
        f"{name}_peak_mib": round(peak / MIB, 1),
        f"plan_{name}_mib": round(allocated / MIB, 1),
        f"plan_{name}_margin_mib": round(planned.margin / MIB, 1),
        f"{name}_ratio": round(peak / allocated, 3),
        f"{name}_exceeds_plan": peak > allocated,
    }


def against_plan(folder: Path, gpu: bool, steps: int) -> dict[str, object]:
    """The 8B shape (tiny without a GPU) loaded and trained as a one-GPU FSDP job, its peaks against its plan."""
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    config = json.loads(LLAMA_8B.read_text()) | ({} if gpu else PLAN_TINY)
    started = time.perf_counter()
    model_dir = save_model(folder / "model", config, device, FILE_SIZE if gpu else TINY_FILE_SIZE)
    release(device)  # the load starts from an empty GPU
    spec = one_gpu_job(model_dir, gpu)
    setup = Setup.of(spec)
    plan = plan_memory(model_shape(config), setup)
    task = task_for(spec)
    saved = time.perf_counter()
    allocated = Allocated(device)
    with allocated.phase() as load:
        model, tokenizer = task.load(model_dir, gpu=gpu)
        if not is_empty(model):
            raise RuntimeError("the model loaded whole: a one-GPU FSDP job's load did not take the sharded path")
        strategy = Sharded(device, 1, 1, mixed_precision(gpu))
        shard_and_fill(model, model_dir, device, strategy.prepare)
    loaded = time.perf_counter()
    with allocated.phase() as step:
        batch = micro_batch(spec, setup, config["vocab_size"], tokenizer.pad_token_id, device)
        losses = train_steps(model, spec, strategy, batch, steps)
    return {
        "case": f"llama-3.1-8b{'' if gpu else ' tiny'} lora, fsdp over 1 rank, against the plan",
        "device": torch.cuda.get_device_name(device) if gpu else "cpu",
        "files": len(list(model_dir.glob("*.safetensors"))),
        "micro_batch": list(batch["input_ids"].shape),
        **against("load", load.peak, plan.load),
        **against("step", step.peak, plan.step),
        "losses": losses,
        "seconds": {
            "save": round(saved - started, 1),
            "load": round(loaded - saved, 1),
            "steps": round(time.perf_counter() - loaded, 1),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", action="store_true", help="the 8B shape's load and steps against the memory plan")
    parser.add_argument("--smoke", action="store_true", help="on the CPU at a tiny shape, with or without a GPU")
    parser.add_argument("--steps", type=int, default=3, help="optimiser steps of --plan (default 3)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    gpu = torch.cuda.is_available() and not args.smoke  # else the same on the CPU (fp32, gloo)
    checks: dict[str, Callable[[Path], dict[str, object]]] = (
        {"fsdp plan": partial(against_plan, gpu=gpu, steps=args.steps)}
        if args.plan
        else {f"fsdp {'lora' if a else 'full'}": partial(case, a, gpu=gpu) for a in (True, False)}
    )
    dist.init_process_group("nccl" if gpu else "gloo", rank=0, world_size=1)
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        for name, check in checks.items():
            try:
                result = check(Path(folder))
            except Exception:  # report every case's fate, then fail
                result = {"case": name, "error": traceback.format_exc()}
            failed |= "error" in result or any(v is True for k, v in result.items() if k.endswith("_exceeds_plan"))
            print(json.dumps(result), flush=True)
            release(torch.device("cuda", 0) if gpu else torch.device("cpu"))
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
