"""`rocmtrain run JOB.yaml`: the same training loop on this machine, with an embedded Ray."""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path

import yaml
from pydantic import ValidationError

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain_train import http_sink
from rocmtrain_train.config import ConfigError, RunSettings, local_settings
from rocmtrain_train.preflight import preflight
from rocmtrain_train.sinks import ConsoleSink, JsonlSink
from rocmtrain_train.trainer import RunOutcome, run

# Seconds between metric reports in local runs (shorter than on a cluster: someone is watching).
LOCAL_REPORT_INTERVAL_SECONDS = 2.0


def load_job(path: Path) -> RocmTrainingJob:
    """A RocmTrainingJob from a YAML file, validated by the API models."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    try:
        return RocmTrainingJob.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path} is not a valid RocmTrainingJob:\n{exc}") from exc


def available_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def run_local(settings: RunSettings, *, console: bool = True) -> RunOutcome:
    """Check the job, start an embedded Ray unless one is running, and train."""
    import ray

    preflight(settings, available_gpus=available_gpus() if settings.use_gpu else None)
    started_ray = not ray.is_initialized()
    if started_ray:
        gpus = settings.num_workers * settings.gpus_per_worker
        ray.init(
            num_cpus=max(os.cpu_count() or 1, int(settings.num_workers * settings.cpus_per_worker)),
            num_gpus=gpus,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="WARNING",
        )
    sinks = [JsonlSink(Path(settings.log_dir) / "metrics.jsonl")]
    if console:
        sinks.append(ConsoleSink())
    if (progress := http_sink.from_env()) is not None:  # report into a cluster job's status, if asked to
        sinks.append(progress)
    try:
        return run(settings, sinks, echo_log=False)
    finally:
        if started_ray:
            ray.shutdown()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rocmtrain run", description=__doc__)
    parser.add_argument("job", type=Path, help="RocmTrainingJob YAML file")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even if the job asks for GPUs")
    parser.add_argument("--storage", help="checkpoint and model storage folder (default: the job's, else ./runs)")
    parser.add_argument("--summary", type=Path, help="write the final metrics to this JSON file")
    args = parser.parse_args(argv)
    try:
        job = load_job(args.job)
        settings = local_settings(
            job,
            job_dir=str(args.job.resolve().parent),
            run_id=uuid.uuid4().hex,
            storage=args.storage,
            force_cpu=args.cpu,
            cpu_count=os.cpu_count() or 1,
            report_interval_s=LOCAL_REPORT_INTERVAL_SECONDS,
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        outcome = run_local(settings)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"training failed: {exc}\nlogs: {settings.log_dir}", file=sys.stderr)
        return 1
    print(f"model saved to {outcome.summary['model_path']}\nlogs: {settings.log_dir}")
    if args.summary:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(json.dumps(outcome.summary, indent=2) + "\n", encoding="utf-8")
    return 0
