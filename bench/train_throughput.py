"""Training throughput, three arms side by side in one run: AMD's recipe, the best stock setup, and ours.

1. recipe: the Ray-on-ROCm fine-tuning recipe of AMD's and Ray's published examples, as written:
   a Hugging Face `Trainer` inside Ray Train's `TorchTrainer` (`prepare_trainer`,
   `RayTrainReportCallback`), every record tokenised with `padding="max_length"` (512 tokens),
   the Trainer's defaults otherwise (in transformers 5 these include fused AdamW);
2. stock: the best setup a user could write with the same stock parts: the same `Trainer` with
   dynamic padding (`DataCollatorWithPadding`), length-grouped sampling, fused AdamW and
   DataLoader worker processes;
3. ours: this project's training loop (`rocmtrain_train.trainer.torch_trainer.run`).

All arms fine-tune the same model on the same generated reviews (about 150 tokens on average,
a long tail to 512) with the same ranks, global batch, epochs, learning rate, warmup and weight
decay, evaluate once per epoch and checkpoint once per epoch. Each arm runs `--runs` times at each
training-set size of `--samples`, interleaved (recipe, stock, ours at the first size, then at the
next, then the second run, ...), and the table shows medians. Run i trains with seed
`--train-seed` + i in every arm (the new head's weights, dropout, sample order): a run's accuracy
is one draw of a short run's luck, so every arm's median is over the same number of draws (ours
is deterministic for a seed; the Trainer's head is not, unless seeded). Measured per run:

- samples/s: training samples over the arm's wall time (the whole `fit`: start-up, tokenising,
  training, checkpoints) minus its evaluation time; "loop samples/s" is over the training loop's own
  time instead (the Trainer's `train_runtime` minus evaluation; our synchronised step time);
- tokens/s: real (non-padding) training tokens over the same wall time;
- padding: real tokens over the tokens the model computed on;
- accuracy on the evaluation set (the same records at every size).

The parity table sets ours against each other arm at each size: the accuracy medians, their
difference, and our samples/s over theirs.

    python bench/train_throughput.py --samples 384,768 --eval-samples 192 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import ray
import torch
from ray.train import CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain_train.config import local_settings
from rocmtrain_train.model.pretrained import resolve_model
from rocmtrain_train.reporting.jsonl_sink import JsonlSink
from rocmtrain_train.trainer.torch_trainer import run

REPO = Path(__file__).resolve().parents[1]
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
MAX_LENGTH = 512
WARMUP_RATIO = 0.06
WEIGHT_DECAY = 0.01
# Mean words per review that gives about 150 MiniLM tokens (examples/data/generate.py).
MEAN_WORDS = 125
ARMS = ("recipe", "stock", "ours")


@dataclass(frozen=True)
class Workload:
    """What every arm trains, and on what."""

    model: str  # a folder with the weights and tokenizer
    data: str  # a folder with train.jsonl and eval.jsonl
    num_labels: int
    ranks: int
    batch_size: int  # per rank
    epochs: int
    learning_rate: float
    use_gpu: bool = False
    precision: str = "fp32"  # fp32 on CPUs; bf16 on GPUs
    dataloader_workers: int = 1  # the stock arm's DataLoader processes per rank
    seed: int = 42  # the new head's weights, dropout and sample order, in every arm


@dataclass
class Measured:
    """One run of one arm."""

    wall_seconds: float  # the whole fit
    eval_seconds: float
    loop_seconds: float  # the training loop alone, without evaluation
    samples: int  # training samples, all epochs
    real_tokens: int
    padded_tokens: int
    eval_accuracy: float
    peak_memory_bytes: int | None = None  # GPU runs: the largest peak of any rank

    @property
    def train_seconds(self) -> float:
        return self.wall_seconds - self.eval_seconds

    def figures(self) -> dict[str, float]:
        return {
            "samples_per_second": self.samples / self.train_seconds,
            "loop_samples_per_second": self.samples / self.loop_seconds,
            "tokens_per_second": self.real_tokens / self.train_seconds,
            "padding_efficiency": self.real_tokens / self.padded_tokens,
            "eval_accuracy": self.eval_accuracy,
            "train_seconds": self.train_seconds,
        }


def generate(out: Path, samples: int, eval_samples: int, seed: int, classes: int = 3) -> None:
    generator = REPO / "examples" / "data" / "generate.py"
    command = [sys.executable, str(generator), str(out), "--train", str(samples), "--eval", str(eval_samples)]
    command += ["--mean-words", str(MEAN_WORDS), "--seed", str(seed), "--classes", str(classes)]
    subprocess.run(command, check=True)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the Hugging Face Trainer arms ---------------------------------------------------------------


def hf_worker(config: dict[str, Any]) -> None:
    """A Ray Train worker running the Hugging Face Trainer: the recipe, or the stock best (`config["arm"]`)."""
    import numpy as np
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

    work: Workload = config["workload"]
    stock = config["arm"] == "stock"
    if not work.use_gpu:
        torch.set_num_threads(1)  # one CPU per rank, as in our arm
    tokenizer = AutoTokenizer.from_pretrained(work.model)
    set_seed(work.seed)  # the new head starts from the run's seed, as in ours (the Trainer seeds only later)
    model = AutoModelForSequenceClassification.from_pretrained(work.model, num_labels=work.num_labels)

    def tokenized(name: str) -> list[dict[str, Any]]:
        rows = read_jsonl(Path(work.data) / name)
        padding = False if stock else "max_length"
        encoded = tokenizer([r["text"] for r in rows], padding=padding, truncation=True, max_length=MAX_LENGTH)
        return [{**{k: v[i] for k, v in encoded.items()}, "labels": r["label"]} for i, r in enumerate(rows)]

    def accuracy(prediction: Any) -> dict[str, float]:
        return {"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}

    class SavedEverywhere(TrainerCallback):
        """Waits until every rank has written its part of a checkpoint before Ray's callback copies it. The
        Trainer has no barrier there: a rank that copies while another still writes fails (seen under load)."""

        def on_save(self, *args: Any, **kwargs: Any) -> None:
            if torch.distributed.is_initialized():
                torch.distributed.barrier()

    class Counting(Trainer):
        """Counts the real and the padded tokens of every training batch (lazily: no device sync)."""

        real = torch.zeros((), dtype=torch.int64)
        padded = 0

        def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> torch.Tensor:
            mask = inputs["attention_mask"]
            self.real = self.real.to(mask.device) + mask.sum()
            self.padded += mask.numel()
            return super().training_step(model, inputs, *args, **kwargs)

    options: dict[str, Any] = {}
    if stock:
        options = {
            "train_sampling_strategy": "group_by_length",
            "optim": "adamw_torch_fused",
            "dataloader_num_workers": work.dataloader_workers,
            "dataloader_persistent_workers": work.dataloader_workers > 0,
            "dataloader_pin_memory": work.use_gpu,
        }
    arguments = TrainingArguments(
        output_dir=config["output"],
        eval_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=1,
        report_to="none",
        per_device_train_batch_size=work.batch_size,
        per_device_eval_batch_size=2 * work.batch_size,
        num_train_epochs=work.epochs,
        learning_rate=work.learning_rate,
        seed=work.seed,
        warmup_steps=WARMUP_RATIO,
        weight_decay=WEIGHT_DECAY,
        use_cpu=not work.use_gpu,
        bf16=work.precision == "bf16",
        disable_tqdm=True,
        **options,
    )
    trainer = Counting(
        model=model,
        args=arguments,
        train_dataset=tokenized("train.jsonl"),
        eval_dataset=tokenized("eval.jsonl"),
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if work.use_gpu else None)
        if stock
        else None,
        compute_metrics=accuracy,
    )
    trainer.add_callback(SavedEverywhere())
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    output = trainer.train()
    evaluations = [log for log in trainer.state.log_history if "eval_runtime" in log]
    device = trainer.args.device
    totals = torch.tensor([int(trainer.real.item()), trainer.padded], dtype=torch.int64, device=device)
    peak = torch.tensor([torch.cuda.max_memory_allocated() if work.use_gpu else 0], dtype=torch.int64, device=device)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals, op=torch.distributed.ReduceOp.SUM)
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
    if ray.train.get_context().get_world_rank() == 0:
        eval_runtime = sum(log["eval_runtime"] for log in evaluations)
        measured = {
            "loop_seconds": output.metrics["train_runtime"] - eval_runtime,
            "eval_seconds": eval_runtime,
            "eval_accuracy": evaluations[-1]["eval_accuracy"],
            "real_tokens": int(totals[0]),
            "padded_tokens": int(totals[1]),
            "peak_memory_bytes": int(peak[0]) or None,
        }
        Path(config["measured"]).write_text(json.dumps(measured))


def fit_on_workers(
    worker: Callable[[dict[str, Any]], None], config: dict[str, Any], ranks: int, use_gpu: bool, folder: Path, name: str
) -> float:
    """Run `worker(config)` on `ranks` Ray Train workers (a CPU, or a GPU, each), checkpoints under `folder`; return
    the seconds `fit` took."""
    trainer = TorchTrainer(
        worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=ranks, use_gpu=use_gpu, resources_per_worker={"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1}
        ),
        run_config=RunConfig(
            name=name, storage_path=str(folder / "ray"), checkpoint_config=CheckpointConfig(num_to_keep=1)
        ),
    )
    started = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - started


def hf_arm(arm: str, work: Workload, folder: Path) -> Measured:
    measured = folder / "measured.json"
    config = {"arm": arm, "workload": work, "output": str(folder / "hf"), "measured": str(measured)}
    wall = fit_on_workers(hf_worker, config, work.ranks, work.use_gpu, folder, f"bench-{arm}")
    found = json.loads(measured.read_text())
    samples = len(read_jsonl(Path(work.data) / "train.jsonl")) * work.epochs
    return Measured(wall_seconds=wall, samples=samples, **found)


# --- ours ------------------------------------------------------------------------------------------


def ours(work: Workload, folder: Path) -> Measured:
    """This project's loop: the same workload as a RocmTrainingJob, trained by `trainer.run`."""
    pods, gpus = (1, work.ranks) if work.use_gpu else (work.ranks, 0)
    job = RocmTrainingJob.model_validate(
        {
            "metadata": {"name": "bench-ours"},
            "spec": {
                "model": {"source": work.model, "numLabels": work.num_labels, "maxSeqLength": MAX_LENGTH},
                "data": {
                    "train": {"uri": f"{work.data}/train.jsonl"},
                    "eval": {"uri": f"{work.data}/eval.jsonl"},
                    "shuffleSeed": work.seed,
                },
                "training": {
                    "seed": work.seed,
                    "epochs": work.epochs,
                    "batchSizePerWorker": work.batch_size,
                    "learningRate": work.learning_rate,
                    "warmupRatio": WARMUP_RATIO,
                    "weightDecay": WEIGHT_DECAY,
                    "precision": work.precision,
                },
                "resources": {"workers": pods, "gpusPerWorker": gpus, "cpusPerWorker": str(max(1, gpus))},
                "checkpoint": {"keepLast": 1},
            },
        }
    )
    settings = local_settings(
        job,
        job_dir=str(folder),
        run_id=uuid.uuid4().hex,
        storage=str(folder / "ours"),
        cpu_count=max(work.ranks, 1),
    )
    reports_file = folder / "metrics.jsonl"
    started = time.perf_counter()
    outcome = run(settings, [JsonlSink(reports_file)], echo_log=False)
    wall = time.perf_counter() - started
    summary, ranks = outcome.summary, outcome.final_ranks
    reports = reports_file.read_text().splitlines()
    peaks = [json.loads(line).get("metrics", {}).get("gpuMemoryPeakBytes") for line in reports]
    return Measured(
        wall_seconds=wall,
        eval_seconds=summary["eval_seconds"],
        loop_seconds=summary["train_seconds"],
        samples=sum(r.samples for r in ranks),
        real_tokens=sum(r.tokens for r in ranks),
        padded_tokens=sum(r.padded_tokens for r in ranks),
        eval_accuracy=summary["eval_accuracy"],
        peak_memory_bytes=max((p for p in peaks if p), default=None),
    )


def wait_until_idle(timeout_s: float = 300.0) -> None:
    """Wait until the previous run has handed back all its Ray resources (not counted in any arm's time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        total, free = ray.cluster_resources(), ray.available_resources()
        if all(free.get(key, 0) >= total.get(key, 0) for key in ("CPU", "GPU")):
            return
        time.sleep(0.5)
    raise TimeoutError("Ray resources still held by a previous run")


def run_arm(arm: str, work: Workload, folder: Path) -> Measured:
    folder.mkdir(parents=True)
    wait_until_idle()
    return ours(work, folder) if arm == "ours" else hf_arm(arm, work, folder)


# --- running and reporting ---------------------------------------------------------------------------


def interleaved(
    cases: tuple[str, ...],
    runs: int,
    measure: Callable[[str, int], Measured],
    first_seed: int = 42,
    log: Callable[[str], None] = print,
) -> dict[str, list[Measured]]:
    """Every case (an arm, or an arm at one size) `runs` times, in turns, so that a slow spell of the machine
    hits all cases alike; `measure(case, seed)`. Run i of every case trains with seed `first_seed` + i: an
    accuracy is one draw of a run's luck, so each case's median is over the same draws as every other's."""
    results: dict[str, list[Measured]] = {name: [] for name in cases}
    for index in range(runs):
        seed = first_seed + index
        for name in cases:
            measured = measure(name, seed)
            results[name].append(measured)
            figures = measured.figures()
            log(f"run {index + 1} {name} (seed {seed}): " + ", ".join(f"{k}={v:.4g}" for k, v in figures.items()))
    return results


def medians(runs: list[Measured]) -> dict[str, float]:
    figures = [m.figures() for m in runs]
    return {key: statistics.median(f[key] for f in figures) for key in figures[0]}


def table(rows: dict[str, dict[str, float]], columns: list[tuple[str, str, str]]) -> str:
    """Rows of figures as an aligned text table; columns are (key, heading, format)."""
    lines = [["", *(heading for _, heading, _ in columns)]]
    for name, figures in rows.items():
        lines.append([name, *(format(figures[key], spec) for key, _, spec in columns)])
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True)))
        for line in lines
    )


COLUMNS = [
    ("samples_per_second", "samples/s", ".2f"),
    ("loop_samples_per_second", "loop samples/s", ".2f"),
    ("tokens_per_second", "tokens/s", ".0f"),
    ("padding_efficiency", "padding eff.", ".3f"),
    ("eval_accuracy", "accuracy", ".4f"),
    ("train_seconds", "train s", ".1f"),
]


def case(arm: str, samples: int) -> str:
    """The name of an arm's runs at one training-set size."""
    return f"{arm}, {samples} samples"


PARITY_COLUMNS = [
    ("their_accuracy", "their accuracy", ".4f"),
    ("our_accuracy", "our accuracy", ".4f"),
    ("accuracy_difference", "difference", "+.4f"),
    ("samples_per_second_ratio", "ours/theirs samples/s", ".2f"),
    ("loop_samples_per_second_ratio", "ours/theirs loop", ".2f"),
]


def parity(
    summary: dict[str, dict[str, float]], arms: tuple[str, ...], sizes: list[int]
) -> dict[str, dict[str, float]]:
    """Ours against each other arm at each size: accuracy medians, their difference, our samples/s over theirs."""
    rows = {}
    for base in (a for a in arms if a != "ours" and "ours" in arms):
        for samples in sizes:
            ours, theirs = summary[case("ours", samples)], summary[case(base, samples)]
            rows[f"ours vs {base}, {samples} samples"] = {
                "their_accuracy": theirs["eval_accuracy"],
                "our_accuracy": ours["eval_accuracy"],
                "accuracy_difference": ours["eval_accuracy"] - theirs["eval_accuracy"],
                "samples_per_second_ratio": ours["samples_per_second"] / theirs["samples_per_second"],
                "loop_samples_per_second_ratio": ours["loop_samples_per_second"] / theirs["loop_samples_per_second"],
            }
    return rows


def size_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=size_list, default=[384, 768], help="training records: comma-separated sizes")
    parser.add_argument("--eval-samples", type=int, default=192, help="evaluation records (the same at every size)")
    parser.add_argument("--workers", type=int, default=2, help="ranks (one CPU each)")
    parser.add_argument("--batch-size", type=int, default=8, help="per rank (global batch = ranks x this)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--runs", type=int, default=3, help="runs per arm and size (medians are reported)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of " + ", ".join(ARMS))
    parser.add_argument("--seed", type=int, default=11, help="data generator seed")
    parser.add_argument("--train-seed", type=int, default=42, help="run i trains with this seed + i in every arm")
    parser.add_argument("--out", type=Path, default=Path("train_throughput.json"), help="JSON results file")
    args = parser.parse_args()
    arms = tuple(a for a in ARMS if a in args.arms.split(","))

    model = resolve_model(MODEL, None)
    assert model is not None
    with tempfile.TemporaryDirectory(prefix="rocmtrain-bench-") as tmp:
        work_dir = Path(tmp)
        works = {}
        for samples in args.samples:
            generate(work_dir / f"data-{samples}", samples, args.eval_samples, args.seed)
            works[samples] = Workload(
                model=str(model),
                data=str(work_dir / f"data-{samples}"),
                num_labels=3,
                ranks=args.workers,
                batch_size=args.batch_size,
                epochs=args.epochs,
                learning_rate=args.learning_rate,
            )
        cases = {case(arm, samples): (arm, samples) for samples in args.samples for arm in arms}

        def measure(name: str, seed: int) -> Measured:
            arm, samples = cases[name]
            return run_arm(arm, replace(works[samples], seed=seed), work_dir / f"{arm}-{samples}-{seed}")

        ray.init(num_cpus=max(args.workers, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
        try:
            results = interleaved(tuple(cases), args.runs, measure, first_seed=args.train_seed)
        finally:
            ray.shutdown()
    summary = {name: medians(runs) for name, runs in results.items()}
    print(table(summary, COLUMNS))
    seeds = ", ".join(str(args.train_seed + i) for i in range(args.runs))
    print(f"\naccuracy by seed ({seeds}):")
    for name, runs in results.items():
        print(f"  {name}: " + " ".join(f"{m.eval_accuracy:.3f}" for m in runs))
    found = parity(summary, arms, args.samples)
    if found:
        print("\nparity (medians over the same seeds in every arm)")
        print(table(found, PARITY_COLUMNS))
    report = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "workload": asdict(replace(works[args.samples[0]], model=MODEL, data="generated", seed=args.train_seed)),
        "medians": summary,
        "parity": found,
        "runs": {name: [asdict(m) | m.figures() for m in runs] for name, runs in results.items()},
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
