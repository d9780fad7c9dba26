"""Training throughput: this project's loop against the Hugging Face Trainer recipe, side by side.

The baseline is the recipe of AMD's and Ray's published Ray-on-ROCm fine-tuning examples: a
`transformers.Trainer` inside Ray Train's `TorchTrainer` (`prepare_trainer`, `RayTrainReportCallback`),
with every record tokenised with `padding="max_length"` (512 tokens). Both runs fine-tune the same
model (all-MiniLM-L6-v2) on the same generated reviews (about 150 tokens on average, a long tail to
512), with the same workers, global batch, epochs, learning rate, warmup and weight decay, on this
machine's CPUs. Training samples per second exclude evaluation for both.

    python bench/train_throughput.py --samples 768 --eval-samples 192
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import ray
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain_train.config import local_settings
from rocmtrain_train.model import resolve_model
from rocmtrain_train.trainer import run

REPO = Path(__file__).resolve().parents[1]
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
NUM_LABELS = 3
MAX_LENGTH = 512
WARMUP_RATIO = 0.06
WEIGHT_DECAY = 0.01
# Mean words per review that gives about 150 MiniLM tokens (examples/data/generate.py).
MEAN_WORDS = 125


def generate(out: Path, samples: int, eval_samples: int, seed: int) -> None:
    generator = REPO / "examples" / "data" / "generate.py"
    command = [sys.executable, str(generator), str(out), "--train", str(samples), "--eval", str(eval_samples)]
    subprocess.run([*command, "--mean-words", str(MEAN_WORDS), "--seed", str(seed)], check=True)


def ours(args: argparse.Namespace, data: Path, work: Path) -> dict[str, Any]:
    """This project's loop: dynamic padding, length-grouped batches, fused AdamW."""
    job = RocmTrainingJob.model_validate(
        {
            "metadata": {"name": "bench-ours"},
            "spec": {
                "model": {"source": MODEL, "numLabels": NUM_LABELS, "maxSeqLength": MAX_LENGTH},
                "data": {"train": {"uri": str(data / "train.jsonl")}, "eval": {"uri": str(data / "eval.jsonl")}},
                "training": {
                    "epochs": args.epochs,
                    "batchSizePerWorker": args.batch_size,
                    "learningRate": args.learning_rate,
                    "warmupRatio": WARMUP_RATIO,
                    "weightDecay": WEIGHT_DECAY,
                    "precision": "fp32",
                },
                "resources": {"workers": args.workers, "gpusPerWorker": 0, "cpusPerWorker": "1"},
                "checkpoint": {"keepLast": 1},
            },
        }
    )
    settings = local_settings(
        job, job_dir=str(work), run_id=uuid.uuid4().hex, storage=str(work / "ours"), cpu_count=args.workers
    )
    started = time.perf_counter()
    summary = run(settings, [], echo_log=False).summary
    return {
        "samples_per_second": summary["samples_per_second"],
        "eval_accuracy": summary["eval_accuracy"],
        "train_seconds": summary["train_seconds"],
        "wall_seconds": time.perf_counter() - started,
    }


def baseline_worker(config: dict[str, Any]) -> None:
    """The published recipe, run by each Ray Train worker."""
    import numpy as np
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

    torch.set_num_threads(1)  # the same one CPU per worker as the other run
    tokenizer = AutoTokenizer.from_pretrained(config["model"])
    model = AutoModelForSequenceClassification.from_pretrained(config["model"], num_labels=NUM_LABELS)

    def tokenized(path: str) -> list[dict[str, Any]]:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        encoded = tokenizer([r["text"] for r in rows], padding="max_length", truncation=True, max_length=MAX_LENGTH)
        return [{**{k: v[i] for k, v in encoded.items()}, "labels": r["label"]} for i, r in enumerate(rows)]

    def accuracy(prediction: Any) -> dict[str, float]:
        return {"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}

    arguments = TrainingArguments(
        output_dir=config["output"],
        eval_strategy="epoch",
        save_strategy="epoch",
        report_to="none",
        per_device_train_batch_size=config["batch_size"],
        per_device_eval_batch_size=2 * config["batch_size"],
        num_train_epochs=config["epochs"],
        learning_rate=config["learning_rate"],
        warmup_steps=WARMUP_RATIO,
        weight_decay=WEIGHT_DECAY,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=tokenized(config["train"]),
        eval_dataset=tokenized(config["eval"]),
        compute_metrics=accuracy,
    )
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    output = trainer.train()
    evaluations = [log for log in trainer.state.log_history if "eval_runtime" in log]
    if ray.train.get_context().get_world_rank() == 0:
        measured = {
            "train_runtime": output.metrics["train_runtime"],
            "eval_runtime": sum(log["eval_runtime"] for log in evaluations),
            "eval_accuracy": evaluations[-1]["eval_accuracy"],
            "train_samples": len(trainer.train_dataset) * config["epochs"],
        }
        Path(config["measured"]).write_text(json.dumps(measured))


def baseline(args: argparse.Namespace, data: Path, work: Path) -> dict[str, Any]:
    model_dir = resolve_model(MODEL, None)
    trainer = TorchTrainer(
        baseline_worker,
        train_loop_config={
            "model": str(model_dir),
            "train": str(data / "train.jsonl"),
            "eval": str(data / "eval.jsonl"),
            "output": str(work / "hf-output"),
            "measured": str(work / "baseline.json"),
            "batch_size": args.batch_size,
            "epochs": args.epochs,
            "learning_rate": args.learning_rate,
        },
        scaling_config=ScalingConfig(num_workers=args.workers, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name="bench-baseline", storage_path=str(work / "baseline")),
    )
    started = time.perf_counter()
    trainer.fit()
    metrics = json.loads((work / "baseline.json").read_text())
    train_seconds = metrics["train_runtime"] - metrics["eval_runtime"]
    return {
        "samples_per_second": metrics["train_samples"] / train_seconds,
        "eval_accuracy": metrics["eval_accuracy"],
        "train_seconds": train_seconds,
        "wall_seconds": time.perf_counter() - started,
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = [("", "samples/s", "eval accuracy", "train s", "wall s")]
    for name, r in results.items():
        rows.append(
            (
                name,
                f"{r['samples_per_second']:.2f}",
                f"{r['eval_accuracy']:.4f}",
                f"{r['train_seconds']:.1f}",
                f"{r['wall_seconds']:.1f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=768, help="training records")
    parser.add_argument("--eval-samples", type=int, default=192, help="evaluation records")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16, help="per worker (global batch = workers x this)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--seed", type=int, default=11, help="data generator seed")
    parser.add_argument("--out", type=Path, default=Path("train_throughput.json"), help="JSON results file")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rocmtrain-bench-") as tmp:
        work = Path(tmp)
        generate(work / "data", args.samples, args.eval_samples, args.seed)
        ray.init(num_cpus=max(args.workers, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
        try:
            results = {"rocmtrain loop": ours(args, work / "data", work)}
            print(table(results), flush=True)
            results["HF Trainer, max_length padding"] = baseline(args, work / "data", work)
        finally:
            ray.shutdown()
    mine, theirs = results.values()
    speedup = mine["samples_per_second"] / theirs["samples_per_second"]
    print(table(results))
    accuracy_gain = mine["eval_accuracy"] - theirs["eval_accuracy"]
    print(f"speed-up: {speedup:.2f}x samples/s; eval accuracy difference: {accuracy_gain:+.4f}")
    report = {"config": {k: str(v) for k, v in vars(args).items()}, "results": results, "speedup": speedup}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
