"""Language-model fine-tuning throughput: TRL's `SFTTrainer` against ours, side by side in one run.

Every arm fine-tunes the same small causal LM with the same LoRA adapter on the same instruction
pairs, with the same ranks, epochs, learning rate and schedule, seed and sequence limit, on Ray
Train's `TorchTrainer` (one CPU and one torch thread a rank, torch DDP), with a checkpoint at the
end of each epoch and one evaluation at the end:

1. trl-packing: TRL's `SFTTrainer` as its documentation recommends for speed: `packing=True` with
   the best-fit-decreasing strategy (`bfd`, which trains padding-free: a device's packed rows go
   into one row, records kept apart by restarting position ids), `completion_only_loss`, the
   adapter through `peft_config`; rows of `max_length` (our `maxSeqLength`), as many rows a step as
   hold about the same tokens as our step's records; gradient checkpointing and bf16 off (fp32 on
   CPUs, as ours), the other settings TRL's;
2. trl-padding-free: the same with `padding_free=True` and no packing: exactly our records a step,
   one flattened row a device;
3. ours: this project's loop (`rocmtrain_train.trainer.torch_trainer.run`) with `training.packing`
   (rows of `maxSeqLength`, positions restarting at each record); `ours-padded` is the same without
   packing (dynamic padding of length-sorted batches).

The model is a Llama made from a config (examples/sft/make_model.py: hidden 256, 4 layers, 4 heads,
2 KV heads, MLP 768, about 3 M parameters; a word-level tokenizer) and the data are the example's
questions (examples/sft/generate.py) each opened by 0 to `--context` facts: 720 records of 14 to
335 tokens, 167 on average, so that packing and padding matter and compute, not per-step Python,
dominates a little (one step of 8 records a rank takes about 0.3 s of one core). Learning rate 1e-3,
linear warmup (5%) and decay, 8 records a rank and step, 1 epoch, LoRA rank 16, alpha 32, dropout
0.05 on every linear layer; run i of every arm trains with seed 42 + i.

Measured per run, reported as medians of `--runs` interleaved runs, and our figures over TRL's as
the median of the ratios within each round of runs:

- tokens/s: real tokens trained over the arm's wall time (the whole `fit`: Ray workers' start,
  model load, tokenising, training, checkpoints) less its evaluation; "loop tokens/s" is over the
  training loop's own time instead (TRL's `train_runtime`, its checkpoint included; our loop's
  synchronised step time). A real token is a token of a record, never padding: `real_tokens`
  counts the input ids that are not the pad id in each batch TRL trains on, and our loop counts
  the tokens of the records of each batch, which is the same number (TRL trains 1.7% more of them
  with packing: accelerate evens out the ranks' last batches with repeated records);
- padding efficiency: real tokens over the tokens the model computed on;
- tokens/CPU s: real tokens over the CPU time of the rank processes (the whole run): the figure that
  other work on a shared machine moves least;
- peak RSS: the largest resident set (VmHWM) of any rank's process; this and the CPU time are read
  from outside, by the bench, for every arm alike;
- eval loss: the mean loss over the response tokens of the evaluation records, computed by one
  function for every arm (`rocmtrain_train.evaluation.causal_lm.loss_sums`, what our loop's evaluation
  runs) on the trained model, all ranks' shards summed.

    python bench/lm_throughput.py --runs 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import ray
import torch

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain_train.config import local_settings
from rocmtrain_train.data.causal_lm.tokens import LmFormat, encode_lm
from rocmtrain_train.data.tokens import Encoded
from rocmtrain_train.reporting.jsonl_sink import JsonlSink
from rocmtrain_train.trainer.torch_trainer import run
from train_throughput import fit_on_workers, interleaved, medians, read_jsonl, table, wait_until_idle

REPO = Path(__file__).resolve().parents[1]
# The model: examples/sft/make_model.py's Llama, larger (its `build` overrides).
MODEL_SIZE = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
ARMS = ("trl-packing", "trl-padding-free", "ours", "ours-padded")
DEFAULT_ARMS = ("trl-packing", "trl-padding-free", "ours")
# Process titles of Ray Train's rank actors (both arms run under TorchTrainer).
RANK_PROCESS = "RayTrainWorker"


@dataclass(frozen=True)
class LmWorkload:
    """What every arm trains, and on what."""

    model: str  # a folder with the weights and tokenizer
    data: str  # a folder with train.jsonl and eval.jsonl (prompt, response)
    ranks: int
    batch_size: int  # records per rank and step
    epochs: int
    learning_rate: float
    max_length: int  # our maxSeqLength; TRL's max_length (its packed rows)
    mean_length: float  # tokens per training record, on average (sizes TRL's packed steps)
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    seed: int = 42
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    use_gpu: bool = False
    precision: str = "fp32"

    @property
    def packed_rows(self) -> int:
        """TRL's packed rows a device step: about the tokens of `batch_size` records, at least one row."""
        return max(1, round(self.batch_size * self.mean_length / self.max_length))


@dataclass
class LmMeasured:
    """One run of one arm."""

    wall_seconds: float  # the whole fit
    eval_seconds: float
    loop_seconds: float  # the training loop alone, without evaluation
    real_tokens: int  # all ranks, all epochs
    computed_tokens: int  # the tokens the model computed on: real and padding
    steps: int
    eval_loss: float
    peak_rss_bytes: int
    rank_cpu_seconds: float  # CPU time of every rank process, the whole run

    @property
    def train_seconds(self) -> float:
        return self.wall_seconds - self.eval_seconds

    def figures(self) -> dict[str, float]:
        return {
            "tokens_per_second": self.real_tokens / self.train_seconds,
            "loop_tokens_per_second": self.real_tokens / self.loop_seconds,
            "padding_efficiency": self.real_tokens / self.computed_tokens,
            "tokens_per_cpu_second": self.real_tokens / self.rank_cpu_seconds,
            "peak_rss_mib": self.peak_rss_bytes / 2**20,
            "eval_loss": self.eval_loss,
            "train_seconds": self.train_seconds,
            "steps": self.steps,
        }


def real_tokens(input_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """The tokens of a batch that belong to a record: every input id but the padding (a 0-d tensor, no sync)."""
    return (input_ids != pad_id).sum()


# --- the model and the data -------------------------------------------------------------------------


def sft_script(name: str) -> ModuleType:
    """A script of examples/sft (the language-model example's model maker or data generator), as a module."""
    path = REPO / "examples" / "sft" / f"{name}.py"
    sys.path.insert(0, str(path.parent))  # make_model imports generate
    spec = importlib.util.spec_from_file_location(f"sft_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_data(out: Path, repeat: int, context: int, seed: int) -> None:
    generator = REPO / "examples" / "sft" / "generate.py"
    command = [sys.executable, str(generator), str(out), "--repeat", str(repeat), "--context", str(context)]
    subprocess.run([*command, "--seed", str(seed)], check=True)


def encoded_records(model: str, data: str, max_length: int) -> Encoded:
    """The training records as our data path tokenises them (prompt with BOS, response, EOS; loss on the response)."""
    import pyarrow as pa
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    table = pa.Table.from_pylist(read_jsonl(Path(data) / "train.jsonl"))
    return encode_lm(tokenizer, table, list(range(table.num_rows)), LmFormat("pairs", "response", max_length))


def mean_length(model: str, data: str) -> float:
    """Tokens per training record (prompt with BOS, response, EOS), on average."""
    return float(encoded_records(model, data, max_length=2**20).lengths.mean())


# --- measuring ----------------------------------------------------------------------------------------


def _high_water_mark(process: psutil.Process) -> int | None:
    """A process's peak resident set (VmHWM), in bytes."""
    try:
        with open(f"/proc/{process.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class RankUse:
    """What the rank processes of a run used, as last read: per process, its peak resident set and CPU seconds."""

    peak_rss: dict[int, int] = field(default_factory=dict)
    cpu_seconds: dict[int, float] = field(default_factory=dict)

    def read(self, process: psutil.Process) -> None:
        try:
            times = process.cpu_times()
        except psutil.Error:
            return
        self.cpu_seconds[process.pid] = times.user + times.system
        if found := _high_water_mark(process):
            self.peak_rss[process.pid] = max(found, self.peak_rss.get(process.pid, 0))

    def measured(self) -> dict[str, Any]:
        peak = max(self.peak_rss.values(), default=0)
        return {"peak_rss_bytes": peak, "rank_cpu_seconds": sum(self.cpu_seconds.values())}


@contextmanager
def rank_use(period_s: float = 0.25) -> Iterator[RankUse]:
    """The rank processes' (Ray Train's workers, descendants of this process) peak resident set and CPU time, read
    every `period_s` seconds while the block runs (the last read of a process is at most that old). CPU time
    is the measure a machine shared with other work moves least."""
    use = RankUse()
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(period_s):
            for child in psutil.Process().children(recursive=True):
                try:
                    if RANK_PROCESS in child.name() + " ".join(child.cmdline()):
                        use.read(child)
                except psutil.Error:
                    continue

    thread = threading.Thread(target=watch, name="bench-rank-use", daemon=True)
    thread.start()
    try:
        yield use
    finally:
        stop.set()
        thread.join()


def eval_loss(model: torch.nn.Module, tokenizer: Any, work: LmWorkload, device: torch.device) -> float:
    """Mean loss over the response tokens of the evaluation records, this rank's shard summed with the others'
    (the function our loop's evaluation runs, on batches as our loop makes them)."""
    import pyarrow as pa
    import torch.distributed as dist

    from rocmtrain_train.data.batch_plan import sorted_batches
    from rocmtrain_train.data.causal_lm.tokens import LmFormat, collate_lm, encode_lm
    from rocmtrain_train.evaluation.causal_lm import loss_sums

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    table = pa.Table.from_pylist(read_jsonl(Path(work.data) / "eval.jsonl"))
    rows = list(range(rank, table.num_rows, world))
    encoded = encode_lm(tokenizer, table, rows, LmFormat("pairs", "response", work.max_length))
    batches = (collate_lm(encoded, b, tokenizer.pad_token_id) for b in sorted_batches(encoded.lengths, 16))
    was_training = model.training
    model.eval()
    sums = loss_sums(model, batches, device, nullcontext)
    model.train(was_training)
    if dist.is_initialized():
        dist.all_reduce(sums)
    return float(sums[0] / sums[1])


# --- TRL's SFTTrainer -----------------------------------------------------------------------------------


def trl_worker(config: dict[str, Any]) -> None:
    """A Ray Train worker running TRL's SFTTrainer with a peft LoRA adapter (`config["arm"]`: packing or not)."""
    from datasets import Dataset
    from peft import LoraConfig
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    work: LmWorkload = config["workload"]
    packing = config["arm"] == "trl-packing"
    if not work.use_gpu:
        torch.set_num_threads(1)  # one CPU per rank, as in our arm
    tokenizer = AutoTokenizer.from_pretrained(work.model)
    model = AutoModelForCausalLM.from_pretrained(work.model, attn_implementation="sdpa")
    # Prompt-completion records; the completion opens with the space that separates it from the prompt.
    rows = read_jsonl(Path(work.data) / "train.jsonl")
    train = Dataset.from_list([{"prompt": r["prompt"], "completion": " " + r["response"]} for r in rows])

    class SavedEverywhere(TrainerCallback):
        """Waits until every rank has written its part of a checkpoint before Ray's callback copies it: the
        Trainer has no barrier there, and a rank that copies while another still writes fails under load."""

        def on_save(self, *args: Any, **kwargs: Any) -> None:
            if torch.distributed.is_initialized():
                torch.distributed.barrier()

    class Counting(SFTTrainer):
        """Counts the real and the computed tokens of every training batch (lazily: no device sync)."""

        real = torch.zeros((), dtype=torch.int64)
        computed = 0

        def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> torch.Tensor:
            ids = inputs["input_ids"]
            self.real = self.real.to(ids.device) + real_tokens(ids, tokenizer.pad_token_id)
            self.computed += ids.numel()
            return super().training_step(model, inputs, *args, **kwargs)

    arguments = SFTConfig(
        output_dir=config["output"],
        per_device_train_batch_size=work.packed_rows if packing else work.batch_size,
        num_train_epochs=work.epochs,
        learning_rate=work.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=work.warmup_ratio,
        weight_decay=work.weight_decay,
        seed=work.seed,
        max_length=work.max_length if packing else None,  # padding-free without packing truncates nothing
        packing=packing,
        packing_strategy="bfd",
        padding_free=not packing,
        completion_only_loss=True,
        gradient_checkpointing=False,
        bf16=work.precision == "bf16",
        use_cpu=not work.use_gpu,
        eval_strategy="no",
        save_strategy="epoch",
        save_total_limit=1,
        report_to="none",
        disable_tqdm=True,
    )
    lora = LoraConfig(
        r=work.lora_rank,
        lora_alpha=work.lora_alpha,
        lora_dropout=work.lora_dropout,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    trainer = Counting(model=model, args=arguments, train_dataset=train, processing_class=tokenizer, peft_config=lora)
    trainer.add_callback(SavedEverywhere())
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    output = trainer.train()
    device = trainer.args.device
    started = time.perf_counter()
    loss = eval_loss(trainer.model, tokenizer, work, device)
    eval_seconds = time.perf_counter() - started
    totals = torch.stack([trainer.real, torch.tensor(trainer.computed, device=trainer.real.device)])
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals)
    if ray.train.get_context().get_world_rank() == 0:
        measured = {
            "loop_seconds": output.metrics["train_runtime"],
            "eval_seconds": eval_seconds,
            "real_tokens": int(totals[0]),
            "computed_tokens": int(totals[1]),
            "steps": trainer.state.global_step,
            "eval_loss": loss,
        }
        Path(config["measured"]).write_text(json.dumps(measured))


def trl_arm(arm: str, work: LmWorkload, folder: Path) -> LmMeasured:
    measured = folder / "measured.json"
    config = {"arm": arm, "workload": work, "output": str(folder / "trl"), "measured": str(measured)}
    with rank_use() as use:
        wall = fit_on_workers(trl_worker, config, work.ranks, work.use_gpu, folder, f"bench-{arm}")
    return LmMeasured(wall_seconds=wall, **use.measured(), **json.loads(measured.read_text()))


# --- ours -----------------------------------------------------------------------------------------------


def lm_job(work: LmWorkload, packing: bool) -> RocmTrainingJob:
    """The workload as a causal-lm RocmTrainingJob."""
    pods, gpus = (1, work.ranks) if work.use_gpu else (work.ranks, 0)
    return RocmTrainingJob.model_validate(
        {
            "metadata": {"name": "bench-lm"},
            "spec": {
                "model": {"source": work.model, "task": "causal-lm", "maxSeqLength": work.max_length},
                "data": {
                    "train": {"uri": f"{work.data}/train.jsonl"},
                    "eval": {"uri": f"{work.data}/eval.jsonl"},
                    "promptField": "prompt",
                    "responseField": "response",
                },
                "training": {
                    "epochs": work.epochs,
                    "batchSizePerWorker": work.batch_size,
                    "learningRate": work.learning_rate,
                    "warmupRatio": work.warmup_ratio,
                    "weightDecay": work.weight_decay,
                    "seed": work.seed,
                    "precision": work.precision,
                    "lossOn": "response",
                    "packing": packing,
                },
                "adapter": {
                    "type": "lora",
                    "rank": work.lora_rank,
                    "alpha": work.lora_alpha,
                    "dropout": work.lora_dropout,
                    "targetModules": ["all-linear"],
                },
                "resources": {"workers": pods, "gpusPerWorker": gpus, "cpusPerWorker": str(max(1, gpus))},
                "checkpoint": {"keepLast": 1},
            },
        }
    )


def ours(arm: str, work: LmWorkload, folder: Path) -> LmMeasured:
    """This project's loop: the workload as a RocmTrainingJob, trained by `trainer.torch_trainer.run`."""
    settings = local_settings(
        lm_job(work, packing=arm == "ours"),
        job_dir=str(folder),
        run_id=uuid.uuid4().hex,
        storage=str(folder / "ours"),
        cpu_count=max(work.ranks, 1),
    )
    with rank_use() as use:
        started = time.perf_counter()
        outcome = run(settings, [JsonlSink(folder / "metrics.jsonl")], echo_log=False)
        wall = time.perf_counter() - started
    summary = outcome.summary
    return LmMeasured(
        wall_seconds=wall,
        eval_seconds=summary["eval_seconds"],
        loop_seconds=summary["train_seconds"],
        real_tokens=sum(r.tokens for r in outcome.final_ranks),
        computed_tokens=sum(r.padded_tokens for r in outcome.final_ranks),
        steps=summary["steps"],
        eval_loss=summary["eval_loss"],
        **use.measured(),
    )


def run_arm(arm: str, work: LmWorkload, folder: Path) -> LmMeasured:
    """One run of an arm (after the previous run has handed back its Ray resources)."""
    folder.mkdir(parents=True)
    wait_until_idle()
    return ours(arm, work, folder) if arm.startswith("ours") else trl_arm(arm, work, folder)


# --- running and reporting ---------------------------------------------------------------------------------

COLUMNS = [
    ("tokens_per_second", "tokens/s", ".0f"),
    ("loop_tokens_per_second", "loop tokens/s", ".0f"),
    ("padding_efficiency", "padding eff.", ".3f"),
    ("tokens_per_cpu_second", "tokens/CPU s", ".0f"),
    ("peak_rss_mib", "peak RSS MiB", ".0f"),
    ("eval_loss", "eval loss", ".4f"),
    ("train_seconds", "train s", ".1f"),
    ("steps", "steps", ".0f"),
]


RATIOS = (("tokens_per_second", ""), ("loop_tokens_per_second", " (loop)"), ("tokens_per_cpu_second", " (CPU)"))


def ratios(results: dict[str, list[LmMeasured]]) -> dict[str, float]:
    """Our tokens/s (wall and loop) over each TRL arm's: the median of the ratios within each round of runs, which
    a slow spell of the machine moves less than it moves the arms' medians (taken from different rounds)."""
    found = {}
    for base in (arm for arm in results if arm.startswith("trl")):
        for mine in (arm for arm in results if arm.startswith("ours")):
            for key, label in RATIOS:
                each = [m.figures()[key] / b.figures()[key] for m, b in zip(results[mine], results[base], strict=True)]
                found[f"{mine}/{base}{label}"] = statistics.median(each)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=4, help="times each training question appears (180 each)")
    parser.add_argument("--context", type=int, default=40, help="most facts opening a prompt (7 tokens each)")
    parser.add_argument("--workers", type=int, default=2, help="ranks (one CPU each)")
    parser.add_argument("--batch-size", type=int, default=8, help="records per rank and step")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--max-length", type=int, default=512, help="our maxSeqLength, TRL's max_length")
    parser.add_argument("--runs", type=int, default=3, help="runs per arm (medians are reported)")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS), help="comma-separated subset of " + ", ".join(ARMS))
    parser.add_argument("--seed", type=int, default=7, help="data generator seed")
    parser.add_argument("--out", type=Path, default=Path("lm_throughput.json"), help="JSON results file")
    args = parser.parse_args()
    arms = tuple(a for a in args.arms.split(",") if a in ARMS)

    with tempfile.TemporaryDirectory(prefix="rocmtrain-lm-bench-") as tmp:
        work_dir = Path(tmp)
        model = sft_script("make_model").build(work_dir / "model", **MODEL_SIZE)
        make_data(work_dir / "data", args.repeat, args.context, args.seed)
        work = LmWorkload(
            model=str(model),
            data=str(work_dir / "data"),
            ranks=args.workers,
            batch_size=args.batch_size,
            epochs=args.epochs,
            learning_rate=args.learning_rate,
            max_length=args.max_length,
            mean_length=mean_length(str(model), str(work_dir / "data")),
        )
        records = len(read_jsonl(work_dir / "data" / "train.jsonl"))
        print(f"{records} training records of {work.mean_length:.1f} tokens on average; arms: {', '.join(arms)}")
        ray.init(num_cpus=max(args.workers, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
        try:
            # Run i of every arm trains with seed 42 + i: the medians span seeds, not one seed's luck.
            results = interleaved(
                arms, args.runs, lambda arm, i: run_arm(arm, replace(work, seed=work.seed + i), work_dir / f"{arm}-{i}")
            )
        finally:
            ray.shutdown()
    expected = records * work.epochs * work.mean_length
    summary = {arm: medians(runs) for arm, runs in results.items()}  # type: ignore[arg-type]
    print(table(summary, COLUMNS))
    found = ratios(results)
    print(", ".join(f"{k}: {v:.2f}x" for k, v in found.items()))
    for arm, runs in results.items():
        trained = runs[0].real_tokens
        if not math.isclose(trained, expected, rel_tol=0.02):
            print(f"note: {arm} trained on {trained} real tokens, the data has {expected:.0f} an epoch x epochs")
    report = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "workload": asdict(replace(work, model=f"examples/sft/make_model.py {MODEL_SIZE}", data="generated")),
        "medians": summary,
        "ratios": found,
        "runs": {arm: [asdict(m) | m.figures() for m in runs] for arm, runs in results.items()},
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
