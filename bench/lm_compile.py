"""Whether `training.compile` pays for language models: our training step eager and compiled, on the shapes the
token budget gives.

The model and data are bench/lm_throughput.py's (a Llama of hidden 256, 4 layers, from
examples/sft/make_model.py; the example's questions opened by 0 to 40 facts, 14 to 335 tokens a record).
The records go through our loop's own pieces: the token plan (`data.batch_plan.token_plan`, one rank),
the language-model task's micro-batches and collation (`tasks.causal_lm`) in the job's layout, and, for
the compiled arms, `model.pretrained.compile_model` with the bucket and row length our loop gives it
(`loop.rank_setup`): batches padded to multiples of 64 tokens, one graph per shape. Each step is a
forward and backward pass of every micro-batch and AdamW's update, on one thread.

Arms:

- eager: no compiling;
- compiled: `training.compile: true` as our loop runs it (inductor, static shapes: a graph per padded length);
- dynamic: the same model compiled once with dynamic shapes (`model.compile(dynamic=True)`), which a job
  cannot ask for: whether one graph for every length would make compiling pay.

Measured per arm: the whole run's time, its first step's (the first compile), the median step of the second
half (steady state), the distinct shapes, and the steps a compiled arm needs to win back its compiling
(its extra time over eager, divided by what it saves a step; none where it saves nothing).

    python bench/lm_compile.py --steps 60                          # flat rows (varlen) of 2048 tokens
    python bench/lm_compile.py --steps 60 --layout padded          # padded records, the same budget

`--smoke` runs every arm for 3 steps on a tiny model with dynamo's `eager` backend (tracing, no code
generation), to check the code without the minutes of compiling; a test runs it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from lm_throughput import MODELS, encoded_records, make_data, sft_script
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.plan.setup import Setup
from rocmtrain_train.data.batch_plan import token_plan
from rocmtrain_train.loop.rank_setup import COMPILE_BUCKET
from rocmtrain_train.model.pretrained import compile_model
from rocmtrain_train.tasks import task_for

ARMS = ("eager", "compiled", "dynamic")
LAYOUTS = {"flat": {"attentionImplementation": "varlen"}, "padded": {}, "packed": {"packing": True}}


@dataclass
class CompileRun:
    """One arm's run."""

    arm: str
    seconds: float
    first_step: float
    steady_step: float  # the median step of the second half
    steps: int
    tokens: int  # real tokens trained
    shapes: int  # distinct batch shapes
    losses: list[float]


def job(model: Path, layout: str, tokens: int, max_length: int) -> RocmTrainingJob:
    """A causal-lm job of the layout and token budget, as our loop would run it."""
    training = {"tokensPerWorker": tokens, "precision": "fp32", "compile": True, **LAYOUTS[layout]}
    return RocmTrainingJob.model_validate(
        {
            "metadata": {"name": "bench-compile"},
            "spec": {
                "model": {"source": str(model), "task": "causal-lm", "maxSeqLength": max_length},
                "data": {"train": {"uri": "train.jsonl"}, "promptField": "prompt", "responseField": "response"},
                "training": training,
            },
        }
    )


def batches(model: Path, data: Path, spec: Any, steps: int) -> tuple[list[list[dict[str, torch.Tensor]]], int]:
    """The first `steps` steps of the token plan, each as its collated micro-batches (padded to multiples of
    `COMPILE_BUCKET`, as our loop pads for a compiled model), and the real tokens they hold."""
    from transformers import AutoTokenizer

    encoded = encoded_records(str(model), str(data), spec.model.max_seq_length)
    task, pad = task_for(spec), AutoTokenizer.from_pretrained(model).pad_token_id
    order = list(range(len(encoded)))
    random.Random(0).shuffle(order)
    padded = not (spec.training.packing or spec.training.varlen)
    plan = token_plan(order, encoded.lengths, world_size=1, rank_tokens=spec.training.tokens_per_worker, padded=padded)
    found = []
    for step in plan.steps[:steps]:
        micro = task.micro_batches(list(step), encoded, spec.training.batch_size_per_worker)
        found.append([task.collate(encoded, m, pad, multiple_of=COMPILE_BUCKET) for m in micro])
    return found, int(sum(encoded.lengths[list(step)].sum() for step in plan.steps[:steps]))


def run_arm(
    arm: str, model_dir: Path, steps: list[list[dict[str, torch.Tensor]]], tokens: int, spec: Any, backend: str
) -> CompileRun:
    """Train `steps` from the same initial weights in one arm."""
    from transformers import AutoModelForCausalLM

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").train()
    model.config.use_cache = False
    if arm == "compiled":
        compile_model(model, Setup.of(spec).sequence, COMPILE_BUCKET, backend=backend)
    elif arm == "dynamic":
        model.compile(backend=backend, dynamic=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times, losses = [], []
    started = time.perf_counter()
    for micro_batches in steps:
        began = time.perf_counter()
        total = 0.0
        for batch in micro_batches:
            loss = model(**batch).loss
            loss.backward()
            total += float(loss.detach())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - began)
        losses.append(total)
    shapes = {tuple(b["input_ids"].shape) for step in steps for b in step}
    return CompileRun(
        arm=arm,
        seconds=time.perf_counter() - started,
        first_step=times[0],
        steady_step=statistics.median(times[len(times) // 2 :]),
        steps=len(times),
        tokens=tokens,
        shapes=len(shapes),
        losses=losses,
    )


def break_even(run: CompileRun, eager: CompileRun) -> float | None:
    """Steps after which a compiled arm has won back its compiling; None where a step saves nothing."""
    saved = eager.steady_step - run.steady_step
    extra = run.seconds - run.steps * run.steady_step - (eager.seconds - eager.steps * eager.steady_step)
    return extra / saved if saved > 0 else None


def measure(
    work: Path, *, steps: int, layout: str, tokens: int, size: str, backend: str, arms: tuple[str, ...]
) -> dict[str, Any]:
    """Every arm on the same steps (`size`: a model of lm_throughput's `MODELS`, records of at most its positions);
    the results, and the compiled arms' break-even against eager."""
    torch.set_num_threads(1)
    shape = MODELS[size]
    model = sft_script("make_model").build(work / "model", **shape)
    make_data(work / "data", repeat=4, context=40, seed=7, records=None, eval_records=0)
    spec = job(model, layout, tokens, shape["max_position_embeddings"]).spec
    shared, tokens_trained = batches(model, work / "data", spec, steps)
    runs = {arm: run_arm(arm, model, shared, tokens_trained, spec, backend) for arm in arms}
    eager = runs.get("eager")
    return {
        "config": {"steps": steps, "layout": layout, "tokensPerWorker": tokens, "size": size, "backend": backend},
        "runs": {arm: asdict(run) for arm, run in runs.items()},
        "break_even_steps": {a: break_even(r, eager) for a, r in runs.items() if eager and a != "eager"},
    }


def smoke(work: Path, print_: Callable[[str], None] = print) -> dict[str, Any]:
    """Every arm for 3 steps on a tiny model, dynamo's eager backend (no code generation)."""
    found = measure(work, steps=3, layout="flat", tokens=1024, size="tiny", backend="eager", arms=ARMS)
    print_(report(found))
    return found


def report(found: dict[str, Any]) -> str:
    lines = [f"{'arm':<10} {'total s':>8} {'first s':>8} {'steady s':>9} {'shapes':>7} {'tokens/s':>9}"]
    for arm, run in found["runs"].items():
        rate = run["tokens"] / max(run["steady_step"] * run["steps"], 1e-9)
        lines.append(
            f"{arm:<10} {run['seconds']:>8.1f} {run['first_step']:>8.2f} {run['steady_step']:>9.3f} "
            f"{run['shapes']:>7} {rate:>9.0f}"
        )
    for arm, steps in found["break_even_steps"].items():
        lines.append(f"{arm}: {'never wins' if steps is None else f'wins back its compiling after {steps:.0f} steps'}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--layout", choices=tuple(LAYOUTS), default="flat")
    parser.add_argument("--tokens", type=int, default=2048, help="tokensPerWorker")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("lm_compile.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rocmtrain-compile-") as tmp:
        if args.smoke:
            found = smoke(Path(tmp))
        else:
            arms = tuple(a for a in args.arms.split(",") if a in ARMS)
            found = measure(
                Path(tmp),
                steps=args.steps,
                layout=args.layout,
                tokens=args.tokens,
                size="bench",
                backend="inductor",
                arms=arms,
            )
            print(report(found))
    args.out.write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
