"""Language-model fine-tuning throughput: TRL's `SFTTrainer` against ours, side by side, at each attention layout.

Every arm fine-tunes the same small causal LM with the same LoRA adapter on the same instruction
pairs, with the same ranks, epochs, learning rate and schedule, seed and sequence limit, on Ray
Train's `TorchTrainer` (one CPU and one torch thread a rank, torch DDP), with a checkpoint at the
end of each epoch and one evaluation at the end. The arms come in pairs, one of TRL's and one of
ours at the same attention layout, so that a ratio compares the loops and not the layouts (on a CPU,
SDPA over one flattened row of 1,300 tokens costs more than over 3 rows of 512):

- flat (a device's records of a step as one row, back to back, positions restarting at each record,
  no padding): trl-padding-free (`padding_free=True`, no packing) against ours-varlen
  (`training.attentionImplementation: varlen`);
- padded (a step's records padded to the longest): trl-padded (`padding_free=False`, no packing: TRL's
  collator pads each batch of its shuffled records) against ours-padded (our default: records sorted
  by length into steps, padded to the longest of each pass);
- rows (records packed into rows of at most `max_length`): trl-packing, TRL's `SFTTrainer` as its
  documentation recommends for speed (`packing=True` with the best-fit-decreasing strategy, `bfd`;
  as many rows a step as hold about the same tokens as our step's records) against ours-packing
  (`training.packing`: rows of `maxSeqLength`, positions restarting at each record). TRL trains its
  packed rows padding-free: it flattens a device's packed rows into one row, so its true layout is flat,
  and trl-packing differs from trl-padding-free in how records are grouped into steps.

TRL's arms: `completion_only_loss`, the adapter through `peft_config`, SDPA attention, gradient
checkpointing and bf16 off (fp32 on CPUs, as ours), the other settings TRL's; its loss is the model's
own. Ours computes the loss as a job does by default (`training.lossImplementation` unset), unless
`--loss` names one for all our arms.

The model is a Llama made from a config (examples/sft/make_model.py: hidden 256, 4 layers, 4 heads,
2 KV heads, MLP 768, about 3 M parameters; a word-level tokenizer) and the data are the example's
questions (examples/sft/generate.py) each opened by 0 to `--context` facts: 180 x `--repeat` records (360 at 2) of 14 to
335 tokens, 167 on average, so that packing and padding matter and compute, not per-step Python,
dominates a little (one step of 8 records a rank takes about 0.3 s of one core). Learning rate 1e-3,
linear warmup (5%) and decay, 8 records a rank and step, 1 epoch, LoRA rank 16, alpha 32, dropout
0.05 on every linear layer; run i of every arm trains with seed 42 + i.

Measured per run, reported as medians of `--runs` interleaved runs (every arm once a round), and our
figures over TRL's as the median of the ratios within each round: for each layout, ours over TRL's arm
of that layout; then every other pair of our arms and TRL's (the cross ratios).

- tokens/s: real tokens trained over the arm's wall time (the whole `fit`: Ray workers' start,
  model load, tokenising, training, checkpoints) less its evaluation; "loop tokens/s" is over the
  training loop's own time instead (TRL's `train_runtime`, its checkpoint included; our loop's
  synchronised step time). A real token is a token of a record, never padding: `real_tokens`
  counts the input ids that are not the pad id in each batch TRL trains on, and our loop counts
  the tokens of the records of each batch, which is the same number (TRL's may be a little more
  with several ranks: accelerate evens out the ranks' last batches with repeated records);
- padding efficiency: real tokens over the tokens the model computed on;
- tokens/CPU s: real tokens over the CPU time of the rank processes (the whole run): the figure that
  other work on a shared machine moves least;
- peak RSS: the largest resident set (VmHWM) of any rank's process; this and the CPU time are read
  from outside, by the bench, for every arm alike;
- eval loss: the mean loss over the response tokens of the evaluation records, computed by one
  function for every arm (`rocmtrain_train.evaluation.causal_lm.loss_sums`, what our loop's evaluation
  runs) on the trained model, all ranks' shards summed.

After the runs the bench checks what it measured: every arm trained some steps to a finite eval
loss, on as many real tokens as the data holds (TRL's arms: up to the evening-out's repeats), and the
flat arms computed on no padding (on CPUs, where nothing pads a row to a multiple).

The benchmark (`make bench-lm`: 5 interleaved rounds of every arm on half the data, about 20 minutes on 2
quiet cores), and one arm pair:

    python bench/lm_throughput.py --runs 5 --repeat 2 --out runs/bench-lm.json
    python bench/lm_throughput.py --runs 5 --repeat 2 --arms trl-padding-free,ours-varlen

`--smoke` runs every arm once for a few steps on a tiny model (hidden 32, 2 layers) and 32 records,
on one rank, and exits 1 if a check fails (tests/bench/test_lm_throughput_smoke.py runs it in-process).
It is the same path as these flags:

    python bench/lm_throughput.py --model tiny --repeat 1 --context 4 --records 32 --eval-records 16 \\
        --workers 1 --batch-size 4 --max-length 128 --runs 1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import psutil
import ray
import torch

import train_throughput
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain_train.config import local_settings
from rocmtrain_train.data.causal_lm.tokens import LmFormat, encode_lm
from rocmtrain_train.data.tokens import Encoded
from rocmtrain_train.reporting.jsonl_sink import JsonlSink
from rocmtrain_train.trainer.torch_trainer import run
from train_throughput import fit_on_workers, interleaved, medians, read_jsonl, table, wait_until_idle

REPO = Path(__file__).resolve().parents[1]
# The models: examples/sft/make_model.py's Llama, resized (its `build` overrides).
MODELS = {
    "bench": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
    },
    "tiny": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 128,
    },
}
# What `--smoke` stands for: every arm once, a few steps on the tiny model, one rank (`--workers` may say 2).
SMOKE_FLAGS = [
    "--model", "tiny", "--repeat", "1", "--context", "4", "--records", "32", "--eval-records", "16",
    "--workers", "1", "--batch-size", "4", "--max-length", "128", "--runs", "1",
]  # fmt: skip
# Process titles of Ray Train's rank actors (every arm runs under TorchTrainer).
RANK_PROCESS = "RayTrainWorker"

Layout = Literal["flat", "padded", "rows"]


@dataclass(frozen=True)
class Arm:
    """Whose loop an arm runs, and the attention layout it trains in."""

    loop: Literal["trl", "ours"]
    layout: Layout


ARMS = {
    "trl-padding-free": Arm("trl", "flat"),
    "ours-varlen": Arm("ours", "flat"),
    "trl-padded": Arm("trl", "padded"),
    "ours-padded": Arm("ours", "padded"),
    "trl-packing": Arm("trl", "rows"),
    "ours-packing": Arm("ours", "rows"),
}


@dataclass(frozen=True)
class LmWorkload:
    """What every arm trains, and on what."""

    model: str  # a folder with the weights and tokenizer
    data: str  # a folder with train.jsonl and eval.jsonl (prompt, response)
    ranks: int
    batch_size: int  # records per rank and step
    epochs: int
    learning_rate: float
    max_length: int  # our maxSeqLength; TRL's max_length (its packed rows, its padded records)
    records: int  # training records
    data_tokens: int  # their tokens (prompt with BOS, response, EOS), an epoch
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    seed: int = 42
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    use_gpu: bool = False
    precision: str = "fp32"
    loss: str | None = None  # our arms' training.lossImplementation; None: what a job gets by default

    @property
    def mean_length(self) -> float:
        """Tokens per training record, on average."""
        return self.data_tokens / self.records

    @property
    def packed_rows(self) -> int:
        """TRL's packed rows a device step: about the tokens of `batch_size` records, at least one row."""
        return max(1, round(self.batch_size * self.mean_length / self.max_length))

    @property
    def evened_out(self) -> int:
        """The most real tokens TRL's arms may train beyond the data's: accelerate fills the ranks' last batches
        of each epoch with repeated records, at most a batch of rows of `max_length` a rank."""
        return (self.ranks - 1) * self.epochs * max(self.batch_size, self.packed_rows) * self.max_length


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


def make_data(
    out: Path, *, repeat: int, context: int, seed: int, records: int | None, eval_records: int | None
) -> None:
    """The example's records (examples/sft/generate.py), the first `records` and `eval_records` of them kept."""
    sft_script("generate").write(out, seed=seed, repeat=repeat, most_facts=context)
    for name, kept in (("train", records), ("eval", eval_records)):
        path = out / f"{name}.jsonl"
        path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:kept]))


def encoded_records(model: str, data: str, max_length: int) -> Encoded:
    """The training records as our data path tokenises them (prompt with BOS, response, EOS; loss on the response)."""
    import pyarrow as pa
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    table = pa.Table.from_pylist(read_jsonl(Path(data) / "train.jsonl"))
    return encode_lm(tokenizer, table, list(range(table.num_rows)), LmFormat("pairs", "response", max_length))


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

    from rocmtrain_train.data.causal_lm.tokens import collate_lm
    from rocmtrain_train.evaluation.batches import eval_batches
    from rocmtrain_train.evaluation.causal_lm import loss_sums

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    table = pa.Table.from_pylist(read_jsonl(Path(work.data) / "eval.jsonl"))
    rows = list(range(rank, table.num_rows, world))
    encoded = encode_lm(tokenizer, table, rows, LmFormat("pairs", "response", work.max_length))
    pad = tokenizer.pad_token_id
    # The model is the one TRL trained, unwrapped from DDP: its passes need no other rank's.
    batches = eval_batches(encoded, 16, collate_lm, pad, multiple_of=1, device=device, lockstep=False)
    was_training = model.training
    model.eval()
    sums = loss_sums(model, batches, device, nullcontext)
    model.train(was_training)
    if dist.is_initialized():
        dist.all_reduce(sums)
    return float(sums[0] / sums[1])


# --- TRL's SFTTrainer -----------------------------------------------------------------------------------


def trl_layout(layout: Layout, work: LmWorkload) -> dict[str, Any]:
    """SFTConfig's settings for a layout: flat is padding-free (no max_length: it would not be enforced); rows are
    bfd packing into rows of max_length, trained padding-free; padded pads each batch, records cut at max_length."""
    if layout == "rows":
        return {"packing": True, "padding_free": True, "max_length": work.max_length, "batch": work.packed_rows}
    flat = layout == "flat"
    return {
        "packing": False,
        "padding_free": flat,
        "max_length": None if flat else work.max_length,
        "batch": work.batch_size,
    }


def trl_worker(config: dict[str, Any]) -> None:
    """A Ray Train worker running TRL's SFTTrainer with a peft LoRA adapter, in the layout `config["layout"]`."""
    from datasets import Dataset  # type: ignore[import-untyped]
    from peft import LoraConfig
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    work: LmWorkload = config["workload"]
    layout = trl_layout(config["layout"], work)
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
        per_device_train_batch_size=layout["batch"],
        num_train_epochs=work.epochs,
        learning_rate=work.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=work.warmup_ratio,
        weight_decay=work.weight_decay,
        seed=work.seed,
        max_length=layout["max_length"],
        packing=layout["packing"],
        packing_strategy="bfd",
        padding_free=layout["padding_free"],
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
    prepare_trainer(trainer)  # in place
    output = trainer.train()
    device = trainer.args.device
    started = time.perf_counter()
    assert isinstance(trainer.model, torch.nn.Module)
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
    # The ranks run trl_worker, sent by value with what it uses of the bench: Ray's workers cannot import bench/.
    for module in (sys.modules[__name__], train_throughput):
        ray.cloudpickle.register_pickle_by_value(module)
    measured = folder / "measured.json"
    config = {"layout": ARMS[arm].layout, "workload": work, "output": str(folder / "trl"), "measured": str(measured)}
    with rank_use() as use:
        wall = fit_on_workers(trl_worker, config, work.ranks, work.use_gpu, folder, f"bench-{arm}")
    return LmMeasured(wall_seconds=wall, **use.measured(), **json.loads(measured.read_text()))


# --- ours -----------------------------------------------------------------------------------------------


def lm_job(work: LmWorkload, layout: Layout) -> RocmTrainingJob:
    """The workload as a causal-lm RocmTrainingJob that trains in `layout`."""
    pods, gpus = (1, work.ranks) if work.use_gpu else (work.ranks, 0)
    training: dict[str, Any] = {
        "epochs": work.epochs,
        "batchSizePerWorker": work.batch_size,
        "learningRate": work.learning_rate,
        "warmupRatio": work.warmup_ratio,
        "weightDecay": work.weight_decay,
        "seed": work.seed,
        "precision": work.precision,
        "lossOn": "response",
        "packing": layout == "rows",
        "attentionImplementation": "varlen" if layout == "flat" else "sdpa",
    }
    if work.loss is not None:
        training["lossImplementation"] = work.loss
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
                "training": training,
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
        lm_job(work, ARMS[arm].layout),
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
    return ours(arm, work, folder) if ARMS[arm].loop == "ours" else trl_arm(arm, work, folder)


# --- checking, running and reporting ------------------------------------------------------------------------

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


def ratios(results: dict[str, list[LmMeasured]], *, same_layout: bool) -> dict[str, float]:
    """Our figures over TRL's (tokens/s over the wall and over the loop, tokens per CPU second) for each pair of an
    arm of ours and one of TRL's at the same layout, or (`same_layout` False) at different ones: the median of the
    ratios within each round, which a slow spell of the machine moves less than the arms' medians."""
    found = {}
    for mine in (arm for arm in results if ARMS[arm].loop == "ours"):
        for base in (arm for arm in results if ARMS[arm].loop == "trl"):
            if (ARMS[mine].layout == ARMS[base].layout) != same_layout:
                continue
            for key, label in RATIOS:
                each = [m.figures()[key] / b.figures()[key] for m, b in zip(results[mine], results[base], strict=True)]
                found[f"{mine}/{base}{label}"] = statistics.median(each)
    return found


def problems(results: dict[str, list[LmMeasured]], work: LmWorkload) -> list[str]:
    """What is wrong with the runs: an arm that trained no step or to no finite eval loss, on other than the data's
    real tokens (TRL's: up to its evening-out more), or, in the flat layout on CPUs, on any padding."""
    found = []
    expected = work.data_tokens * work.epochs
    for arm, runs in results.items():
        extra = work.evened_out if ARMS[arm].loop == "trl" else 0
        for i, run_ in enumerate(runs):
            where = f"{arm} run {i + 1}"
            if run_.steps <= 0:
                found.append(f"{where}: trained {run_.steps} steps")
            if not math.isfinite(run_.eval_loss):
                found.append(f"{where}: eval loss {run_.eval_loss}")
            if not expected <= run_.real_tokens <= expected + extra:
                found.append(f"{where}: trained {run_.real_tokens} real tokens, the data has {expected}")
            flat = ARMS[arm].layout == "flat" and not work.use_gpu
            if flat and run_.computed_tokens != run_.real_tokens:
                found.append(f"{where}: flat, yet computed on {run_.computed_tokens - run_.real_tokens} padding tokens")
    return found


@dataclass
class LmReport:
    """What a bench run measured, and its checks."""

    work: LmWorkload
    results: dict[str, list[LmMeasured]]
    problems: list[str]

    @property
    def medians(self) -> dict[str, dict[str, float]]:
        return {arm: medians(runs) for arm, runs in self.results.items()}  # type: ignore[arg-type]

    def lines(self) -> list[str]:
        """The table of medians, the ratios (per layout, then across), and the problems."""
        found = [table(self.medians, COLUMNS)]
        for same, heading in ((True, "same layout"), (False, "across layouts")):
            if pairs := ratios(self.results, same_layout=same):
                found.append(f"{heading}: " + ", ".join(f"{k}: {v:.2f}x" for k, v in pairs.items()))
        return found + [f"problem: {p}" for p in self.problems]

    def as_json(self, config: dict[str, str]) -> dict[str, Any]:
        work = replace(self.work, model=f"examples/sft/make_model.py ({config['model']})", data="generated")
        return {
            "config": config,
            "workload": asdict(work) | {"mean_length": work.mean_length, "packed_rows": work.packed_rows},
            "arms": {arm: asdict(ARMS[arm]) for arm in self.results},
            "medians": self.medians,
            "ratios": ratios(self.results, same_layout=True),
            "cross_ratios": ratios(self.results, same_layout=False),
            "problems": self.problems,
            "runs": {arm: [asdict(m) | m.figures() for m in runs] for arm, runs in self.results.items()},
        }


@contextmanager
def ray_cluster(cpus: int) -> Iterator[None]:
    """The Ray this process runs already (a test's), else one of its own with `cpus` CPUs, stopped after."""
    if ray.is_initialized():
        yield
        return
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    found.add_argument("--smoke", action="store_true", help="every arm once, briefly: " + " ".join(SMOKE_FLAGS))
    found.add_argument("--model", choices=sorted(MODELS), default="bench", help="the Llama's size")
    found.add_argument("--repeat", type=int, default=4, help="times each training question appears (180 each)")
    found.add_argument("--context", type=int, default=40, help="most facts opening a prompt (7 tokens each)")
    found.add_argument("--records", type=int, default=None, help="keep the first N training records (default all)")
    found.add_argument("--eval-records", type=int, default=None, help="keep the first N evaluation records")
    found.add_argument("--workers", type=int, default=2, help="ranks (one CPU each)")
    found.add_argument("--batch-size", type=int, default=8, help="records per rank and step")
    found.add_argument("--epochs", type=int, default=1)
    found.add_argument("--learning-rate", type=float, default=1e-3)
    found.add_argument("--max-length", type=int, default=512, help="our maxSeqLength, TRL's max_length")
    found.add_argument("--loss", choices=("chunked", "fused", "model"), help="our arms' training.lossImplementation")
    found.add_argument("--runs", type=int, default=3, help="runs per arm (medians are reported)")
    found.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of " + ", ".join(ARMS))
    found.add_argument("--seed", type=int, default=7, help="data generator seed")
    found.add_argument("--out", type=Path, default=Path("lm_throughput.json"), help="JSON results file")
    return found


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The flags; with --smoke, SMOKE_FLAGS first, so that flags given after them win."""
    found = parser().parse_args(argv)
    return parser().parse_args([*SMOKE_FLAGS, *argv]) if found.smoke else found


def arm_list(text: str) -> tuple[str, ...]:
    arms = tuple(a for a in text.split(",") if a)
    if unknown := [a for a in arms if a not in ARMS]:
        raise SystemExit(f"unknown arms {unknown}: choose from {', '.join(ARMS)}")
    return arms


def measure(args: argparse.Namespace, work_dir: Path, log: Callable[[str], None] = print) -> LmReport:
    """Make the model and the data in `work_dir`, run the arms in turns, and check what they measured."""
    arms = arm_list(args.arms)
    model = sft_script("make_model").build(work_dir / "model", **MODELS[args.model])
    data = work_dir / "data"
    make_data(
        data,
        repeat=args.repeat,
        context=args.context,
        seed=args.seed,
        records=args.records,
        eval_records=args.eval_records,
    )
    lengths = encoded_records(str(model), str(data), args.max_length).lengths
    work = LmWorkload(
        model=str(model),
        data=str(data),
        ranks=args.workers,
        batch_size=args.batch_size,
        epochs=args.epochs,
        learning_rate=args.learning_rate,
        max_length=args.max_length,
        records=len(lengths),
        data_tokens=int(lengths.sum()),
        loss=args.loss,
    )
    log(f"{work.records} training records of {work.mean_length:.1f} tokens on average; arms: {', '.join(arms)}")
    with ray_cluster(max(args.workers, os.cpu_count() or 1)):
        # Run i of every arm trains with seed 42 + i: the medians span seeds, not one seed's luck.
        results = interleaved(
            arms,
            args.runs,
            lambda arm, seed: run_arm(arm, replace(work, seed=seed), work_dir / f"{arm}-{seed}"),  # type: ignore[arg-type,return-value]
            log=log,
        )
    return LmReport(work, results, problems(results, work))  # type: ignore[arg-type]


def smoke(work_dir: Path, *flags: str) -> LmReport:
    """`--smoke` in this process (under its Ray, if it runs one): every arm once, a few steps on the tiny model."""
    return measure(parse(["--smoke", *flags]), work_dir)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="rocmtrain-lm-bench-") as tmp:
        report = measure(args, Path(tmp))
    print("\n".join(report.lines()))
    config = {k: str(v) for k, v in vars(args).items()}
    args.out.write_text(json.dumps(report.as_json(config), indent=2) + "\n")
    print(f"results written to {args.out}")
    return 1 if args.smoke and report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
