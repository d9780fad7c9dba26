"""A one-process check of sharded training on a GPU: FSDP2 with bf16 compute, full fine-tuning and a LoRA adapter
whose frozen base is bf16 beside fp32 adapter weights (the mixed-dtype case only a GPU reaches), a few steps of the
training image's strategy on a small Llama, and the export. Prints one JSON line per case; exit 1 on any failure.

    python bench/gpu_fsdp_check.py          # on a machine with a GPU (docs/benchmarks.md#gpus)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy
from transformers import AutoModelForCausalLM, LlamaConfig

from lm_throughput import sft_script
from rocmtrain.api.models import AdapterSpec, RocmTrainingJob
from rocmtrain_train.model.causal_lm import weights_dtype, with_adapter
from rocmtrain_train.strategy.sharded import Sharded, _full

SIZE = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 4, "num_attention_heads": 16}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}


def job(adapter: bool) -> RocmTrainingJob:
    spec = {
        "model": {"source": "/m", "task": "causal-lm"},
        "data": {"train": {"uri": "/d.jsonl"}},
        "training": {"sharding": "fsdp", "precision": "bf16"},
        "resources": {"workers": 1, "gpusPerWorker": 1},
        **({"adapter": {"rank": 16, "targetModules": ["all-linear"]}} if adapter else {}),
    }
    return RocmTrainingJob.model_validate({"metadata": {"name": "check"}, "spec": spec})


def case(adapter: bool, folder: Path, gpu: bool) -> dict[str, object]:
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    spec = job(adapter).spec
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32_000, num_key_value_heads=4, **(SIZE if gpu else TINY))
    model = AutoModelForCausalLM.from_config(config).to(weights_dtype(spec, gpu=gpu)).to(device)
    model.config.use_cache = False
    if adapter:
        model = with_adapter(model, AdapterSpec(rank=16, targetModules=["all-linear"]))
    # As `Sharded.for_run` makes it: bf16 compute and fp32 reduction on GPUs, fp32 on CPUs.
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if gpu else None
    strategy = Sharded(device, 1, 1, mixed)
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


def main() -> int:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    gpu = torch.cuda.is_available()  # without one, the same on the CPU (fp32, gloo): a check of the script itself
    dist.init_process_group("nccl" if gpu else "gloo", rank=0, world_size=1)
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        for adapter in (True, False):
            try:
                print(json.dumps(case(adapter, Path(folder), gpu)), flush=True)
            except Exception:  # report every case's fate, then fail
                failed = True
                print(json.dumps({"case": f"fsdp {'lora' if adapter else 'full'}", "error": traceback.format_exc()}))
            if gpu:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
