"""`rocmtrain run JOB.yaml`: train a job on this machine with an embedded Ray.

This is the training package's subcommand of the `rocmtrain` command: `rocmtrain`
finds it through the `rocmtrain.commands` entry point (pyproject.toml), so it is
offered only where this package is installed (not in the operator image). The job
file is read with `rocmtrain.api.manifests.read_jobs` in the local context, so
`rocmtrain run` refuses exactly what `rocmtrain validate --context local` refuses,
with the same messages. Torch and Ray are imported only once the job is valid.
A job with its own code (spec.code) runs that code instead, with the cluster's environment
contract and the progress endpoints on the loopback address (`rocmtrain_train.driver.own_code`).
Exit status: 0 trained, 1 training failed, 2 the job cannot run as configured (the driver's
pre-flight: one line `error: ...`, such as an object store that cannot be read or written); stopped by
Ctrl-C, SIGTERM or SIGHUP, 128 + the signal's number (130, 143, 129), after the whole run has stopped, Ray
included, with one line `stopped by SIGTERM: N processes (...)` (`rocmtrain_train.driver.stop_signals`). The
values of the AWS credential variables never appear in what it prints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from rocmtrain.api.manifests import read_jobs
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.api.validate import Context

if TYPE_CHECKING:
    from rocmtrain_train.config import RunSettings
    from rocmtrain_train.driver.own_code import CodeOutcome
    from rocmtrain_train.search.tune_trials import SearchOutcome
    from rocmtrain_train.trainer.torch_trainer import RunOutcome

EXIT_FAILED = 1
EXIT_CONFIG = 2
# Seconds between metric reports in local runs (shorter than on a cluster: someone is watching).
LOCAL_REPORT_INTERVAL_SECONDS = 2.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rocmtrain run", description="Train a job locally on Ray.")
    parser.add_argument("job", type=Path, help="RocmTrainingJob YAML file")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even if the job asks for GPUs")
    parser.add_argument("--storage", help="checkpoint and model storage folder (default: the job's, else ./runs)")
    parser.add_argument("--summary", type=Path, help="write the final metrics to this JSON file")
    return parser


def read_one_job(path: Path, context: Context = "local", command: str = "run") -> RocmTrainingJob | None:
    """The one valid job of the file, else None after printing why (as `rocmtrain validate` does)."""
    try:
        jobs, errors = read_jobs(str(path), context)
    except OSError as exc:
        print(f"error: cannot read {path}: {exc}", file=sys.stderr)
        return None
    if not errors and len(jobs) != 1:
        errors = [f"{path}: holds {len(jobs)} jobs; rocmtrain {command} takes one"]
    for line in errors:
        print(line, file=sys.stderr)
    return None if errors else jobs[0]


def _failure(job: RocmTrainingJob, exc: Exception) -> str:
    """Why a run failed, without the AWS credentials' values: the job's own code's error and frame, or the built-in
    loop's one line (the first failing rank's error, such as an object store's refusing a checkpoint upload)."""
    from rocmtrain_train.storage import without_secrets

    if job.spec.code is not None:
        return without_secrets(str(exc))
    from rocmtrain_train.trainer.torch_trainer import failure_line

    return without_secrets(failure_line(exc))


def main(argv: list[str]) -> int:
    """train a job locally on Ray (`rocmtrain run --help`)"""
    args = _parser().parse_args(argv)
    job = read_one_job(args.job)
    if job is None:
        return EXIT_CONFIG
    try:
        from rocmtrain.api.errors import ConfigError
        from rocmtrain_train.config import local_settings
        from rocmtrain_train.driver.stop_signals import StopSignals, end_processes, exit_status
    except ModuleNotFoundError as exc:
        print(
            f"error: rocmtrain run needs the `train` extra (missing {exc.name}): "
            "pip install 'rocm-train-operator[train]'",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    try:
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
        return EXIT_CONFIG
    with StopSignals() as stop:
        try:
            outcome = _train(job, settings)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP: the run has unwound, its Ray shut down
            stop.ending = True
            received = stop.received or signal.SIGINT
            stopped = end_processes(stop.processes)
            with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
                print(f"stopped by {received.name}: {stopped}\nlogs: {settings.log_dir}", file=sys.stderr)
            return exit_status(received)
    if isinstance(outcome, int):
        return outcome
    if args.summary:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(json.dumps(outcome.summary, indent=2) + "\n", encoding="utf-8")
    return 0


def _train(job: RocmTrainingJob, settings: RunSettings) -> CodeOutcome | RunOutcome | SearchOutcome | int:
    """Train (or run the job's code) and print where the results are; the exit status where it cannot run or
    fails."""
    from rocmtrain.api.errors import ConfigError
    from rocmtrain_train.driver import own_code

    outcome: CodeOutcome | RunOutcome | SearchOutcome
    try:
        if job.spec.code is not None:  # the job's own code runs in a process of its own, Ray included
            outcome = own_code.run_code(settings)
            print(f"done: {outcome.reports} progress reports; run folder {settings.run_path}\nlogs: {settings.log_dir}")
        else:
            from rocmtrain_train.driver import train_job

            outcome = train_job.run_local(settings)
            print(f"model saved to {outcome.summary['model_path']}\nlogs: {settings.log_dir}")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:
        print(f"training failed: {_failure(job, exc)}\nlogs: {settings.log_dir}", file=sys.stderr)
        return EXIT_FAILED
    return outcome
