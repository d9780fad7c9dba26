"""GPU throughput: our loop next to AMD's recipe (and the best stock setup), on one GPU and on all of them.

The seed workload of AMD's Ray-on-ROCm fine-tuning example: bert-base-cased, 5 classes (star
ratings), 1,000 training samples, 3 epochs, batch 8 per device, bf16. The arms are those of
`train_throughput.py` (same code, same measurements), on GPUs: timing synchronised with the
device (our loop synchronises at every report and at the end; the Trainer at its loss read-out),
model FLOPs utilisation (MFU) and the peak GPU memory of any rank.

MFU counts the useful work only: 6 N + 12 L H S FLOPs per real (non-padding) token, with N the
non-embedding parameters, L layers, H the hidden size and S the mean real sequence length, over
the training loop's time and the peak bf16 dense FLOP/s of the GPUs (`--peak-tflops`, else looked
up by device name). Padding therefore lowers the MFU of an arm that computes on it.

Without `--model`, the model is bert-base's architecture with random weights and MiniLM's
tokenizer (no network is needed): throughput, MFU and memory are those of bert-base-cased (its
vocabulary is 5% smaller), accuracy means nothing then.

With `--lm`, the language-model case instead (`gpu_lm.py` says what it measures): Llama 3.2 1B- and
3B-shaped models with random weights, bf16, full fine-tuning and LoRA, our loop next to a minimal
PyTorch loop and TRL's SFTTrainer, in layouts, batchings and loss kernels, on one GPU; `--lm --smoke` runs it on a
tiny model, on a CPU too.

    python bench/gpu_throughput.py                                # 1 GPU and all GPUs, 3 runs each
    python bench/gpu_throughput.py --model /models/bert-base-cased --runs 1 --arms recipe,ours
    python bench/gpu_throughput.py --lm                           # the language-model case, one GPU
    python bench/gpu_throughput.py --lm --smoke                   # the same, tiny, on any device
    python bench/gpu_throughput.py --lm --sizes 3b --modes full --references "" --trl varlen \\
        --variants varlen+chunked,varlen+tokens16k+fused+gc          # the issue's goals alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import ray
import torch
from transformers import AutoConfig, AutoTokenizer, BertConfig, BertModel

from gpu_lm import GPU, MODES, SIZES, SMOKE, run_lm_case
from rocmtrain_train.model.pretrained import resolve_model
from train_throughput import (
    ARMS,
    COLUMNS,
    MODEL,
    Measured,
    Workload,
    generate,
    interleaved,
    medians,
    read_jsonl,
    run_arm,
    table,
)

# Peak dense bf16 FLOP/s per device (vendor data sheets); an MI250X shows up as two devices (GCDs). The NVIDIA
# entries are proxies: the GPU lent to this project's checks is an H200 (989 TFLOP/s), standing in for an MI300X.
PEAK_BF16_FLOPS = {
    "MI355X": 2516.6e12,
    "MI325X": 1307.4e12,
    "MI300X": 1307.4e12,
    "MI300A": 980.6e12,
    "MI250X": 191.5e12,
    "MI250": 181.0e12,
    "MI210": 181.0e12,
    "H200": 989.4e12,
    "H100": 989.4e12,
    "A100": 312.0e12,
}
SEED_WORKLOAD = {"num_labels": 5, "samples": 1000, "eval_samples": 200, "epochs": 3, "batch_size": 8}
LEARNING_RATE = 2e-5


def peak_flops(override_tflops: float | None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name.replace(" ", "")), None)


def random_bert_base(folder: Path) -> Path:
    """bert-base's architecture with random weights and MiniLM's (BERT WordPiece) tokenizer."""
    tokenizer_source = resolve_model(MODEL, None)
    assert tokenizer_source is not None
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def flops_per_token(model: str, mean_length: float) -> float:
    """Training FLOPs per token: 6 x non-embedding parameters + 12 x layers x hidden size x length."""
    config = AutoConfig.from_pretrained(model)
    hidden, layers = config.hidden_size, config.num_hidden_layers
    per_layer = 4 * hidden * hidden + 2 * hidden * config.intermediate_size  # attention and MLP weights
    return 6 * layers * per_layer + 12 * layers * hidden * mean_length


def gpu_figures(measured: Measured, work: Workload, peak: float | None) -> dict[str, Any]:
    mean_length = measured.real_tokens / measured.samples
    flops = flops_per_token(work.model, mean_length) * measured.real_tokens
    mfu = flops / measured.loop_seconds / (peak * work.ranks) if peak else None
    memory = measured.peak_memory_bytes
    return {"mfu": mfu, "peak_memory_gib": memory / 2**30 if memory else None}


def median_or_nan(values: Iterable[float | None]) -> float:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else float("nan")


def language_model(args: argparse.Namespace) -> int:
    """The language-model case (`gpu_lm.py`): needs a GPU unless `--smoke`."""
    found = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if found else "cpu"
    print(f"torch {torch.__version__} (hip {torch.version.hip}, cuda {torch.version.cuda}); device: {device}")
    if not found and not args.smoke:
        raise SystemExit("no GPU: torch.cuda (ROCm's HIP or CUDA) sees none; --smoke runs the case on a CPU")
    plan = SMOKE if args.smoke else GPU
    changes: dict[str, Any] = {"modes": tuple(m for m in args.modes.split(",") if m in MODES)}
    for name in ("variants", "references", "trl"):  # parsed (and refused where unknown) by the plan's `arms`
        if (given := getattr(args, name)) is not None:
            changes[name] = tuple(v for v in given.split(",") if v)
    if args.sizes:
        changes["sizes"] = tuple(s for s in args.sizes.split(",") if s in SIZES)
    if args.budget_s is not None:
        changes["budget_s"] = args.budget_s
    with tempfile.TemporaryDirectory(prefix="rocmtrain-gpu-lm-") as tmp:
        report = run_lm_case(replace(plan, **changes), Path(tmp), args.out, peak_flops(args.peak_tflops), device)
    print(f"results written to {args.out}")
    return 1 if report["errors"] else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a local folder of bert-base-cased (default: its architecture, random init)")
    parser.add_argument("--runs", type=int, default=3, help="runs per arm and GPU count (medians are reported)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of " + ", ".join(ARMS))
    parser.add_argument("--gpus", default="", help="comma-separated GPU counts (default: 1 and all)")
    parser.add_argument("--peak-tflops", type=float, help="peak dense bf16 TFLOP/s per GPU, for MFU")
    parser.add_argument("--out", type=Path, default=Path("gpu_throughput.json"), help="JSON results file")
    lm = parser.add_argument_group("the language-model case")
    lm.add_argument("--lm", action="store_true", help="run the language-model case (gpu_lm.py) instead")
    lm.add_argument("--smoke", action="store_true", help="tiny model and records, on whatever device there is")
    lm.add_argument("--sizes", help="comma-separated model sizes (default: 1b,3b; with --smoke: smoke)")
    lm.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    variants = "comma-separated variants (gpu_lm.Variant: parts joined by +, e.g. varlen+tokens16k+fused)"
    lm.add_argument("--variants", help=f"our loop's {variants}; default: the plan's")
    lm.add_argument("--references", help=f"the minimal loop's {variants}; '' for none; default: the plan's")
    lm.add_argument("--trl", help=f"TRL's {variants}; '' for none; default: the plan's")
    lm.add_argument("--budget-s", type=float, help="start no case after this many seconds (default: 400)")
    args = parser.parse_args()
    if args.lm:
        return language_model(args)
    if not torch.cuda.is_available():
        raise SystemExit("no GPU: torch.cuda (ROCm's HIP or CUDA) sees none")
    arms = tuple(a for a in ARMS if a in args.arms.split(","))
    available = torch.cuda.device_count()
    counts = sorted({int(c) for c in args.gpus.split(",") if c} or {1, available})
    peak = peak_flops(args.peak_tflops)
    device = torch.cuda.get_device_name(0)
    print(f"{available} x {device}, torch {torch.__version__} (hip {torch.version.hip}, cuda {torch.version.cuda})")

    rows: dict[str, dict[str, Any]] = {}
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rocmtrain-gpu-bench-") as tmp:
        folder = Path(tmp)
        model = args.model or str(random_bert_base(folder / "bert-base"))
        seed = SEED_WORKLOAD
        generate(folder / "data", seed["samples"], seed["eval_samples"], seed=11, classes=seed["num_labels"])
        assert len(read_jsonl(folder / "data" / "train.jsonl")) == seed["samples"]
        ray.init(num_gpus=available, num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        try:
            for count in counts:
                work = Workload(
                    model=model,
                    data=str(folder / "data"),
                    num_labels=seed["num_labels"],
                    ranks=count,
                    batch_size=seed["batch_size"],
                    epochs=seed["epochs"],
                    learning_rate=LEARNING_RATE,
                    use_gpu=True,
                    precision="bf16",
                    dataloader_workers=2,
                )
                results = interleaved(
                    arms,
                    args.runs,
                    lambda arm, seed, w=work: run_arm(
                        arm, replace(w, seed=seed), folder / f"{arm}-{w.ranks}gpu-{seed}"
                    ),
                )
                for arm, measured in results.items():
                    extra = [gpu_figures(m, work, peak) for m in measured]
                    key = f"{arm}, {count} GPU{'s' if count > 1 else ''}"
                    rows[key] = medians(measured) | {
                        name: median_or_nan(e[name] for e in extra) for name in ("mfu", "peak_memory_gib")
                    }
                    runs[key] = [asdict(m) | m.figures() | e for m, e in zip(measured, extra, strict=True)]
        finally:
            ray.shutdown()
    columns = [*COLUMNS, ("mfu", "MFU", ".3f"), ("peak_memory_gib", "peak GiB", ".2f")]
    print(table(rows, columns))
    report = {
        "device": device,
        "gpus": available,
        "peak_bf16_flops": peak,
        "model": args.model or "bert-base architecture, random init",
        "workload": asdict(replace(work, model="bert-base", data="generated, 5 classes")),
        "medians": rows,
        "runs": runs,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
