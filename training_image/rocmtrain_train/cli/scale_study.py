"""`rocmtrain scale JOB.yaml --workers 1,2,4`: the same job at several world sizes, and how it scales.

Each size is a copy of the job with `resources.workers` set and `-w<N>` added to its name,
trained from scratch (`checkpoint.resume: never`), one size after the other so they do not
compete. Locally (the default) each size trains with an embedded Ray as `rocmtrain run` does,
every worker with the same CPUs (this machine's cores shared out for the largest size) or the
job's GPUs. With `--cluster`, each size is created as a RocmTrainingJob in `--namespace` and
followed until it ends; its `status.metrics` are the measurements (the cluster needs the
operator, and `rocmtrain scale` the `operator` extra for its Kubernetes client).

The report (`rocmtrain_train.cli.scaling_report`) goes to stdout as Markdown, and to `--out` as
scaling.md, scaling.json and scaling.png. Exit status: 0 measured, 1 a run failed,
2 the job or the sizes cannot run as configured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from rocmtrain.api.contract import GROUP, PLURAL, VERSION
from rocmtrain.api.models import MAX_NAME_LENGTH, Phase, RocmTrainingJob
from rocmtrain.api.validate import validate_job
from rocmtrain_train.cli.run import EXIT_CONFIG, EXIT_FAILED, LOCAL_REPORT_INTERVAL_SECONDS, read_one_job
from rocmtrain_train.cli.scaling_report import SizeResult, as_json, chart, markdown, scaling_rows

POLL_SECONDS = 5.0
METRICS_GRACE_SECONDS = 60.0  # a succeeded job's last progress report arrives within this


def _sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers takes a comma-separated list of counts, not {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError("--workers takes counts of at least 1")
    return sizes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rocmtrain scale", description="Train a job at several world sizes and report how it scales."
    )
    parser.add_argument("job", type=Path, help="RocmTrainingJob YAML file")
    parser.add_argument("--workers", type=_sizes, required=True, help="world sizes to measure, for example 1,2,4")
    parser.add_argument("--out", type=Path, help="report folder (default: runs/<job name>-scaling)")
    parser.add_argument("--cpu", action="store_true", help="local: train on the CPU even if the job asks for GPUs")
    parser.add_argument("--cluster", action="store_true", help="run the sizes as RocmTrainingJobs on the cluster")
    parser.add_argument("-n", "--namespace", default="default", help="--cluster: namespace of the jobs")
    parser.add_argument("--kubeconfig", help="--cluster: kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--timeout", type=float, default=6 * 3600, help="--cluster: seconds to wait for each job")
    return parser


def variant(job: RocmTrainingJob, workers: int, context: str) -> RocmTrainingJob:
    """`job` at `workers` workers, named `<name>-w<workers>`, trained from scratch."""
    document = job.model_dump(by_alias=True, exclude_none=True, mode="json")
    suffix = f"-w{workers}"
    document["metadata"] = {
        "name": job.metadata.name[: MAX_NAME_LENGTH - len(suffix)].rstrip("-") + suffix,
        "namespace": job.metadata.namespace,
    }
    document.pop("status", None)
    document["spec"]["resources"]["workers"] = workers
    document["spec"]["checkpoint"]["resume"] = "never"
    sized, errors = validate_job(document, context="cluster" if context == "cluster" else "local")
    if sized is None:
        raise ValueError("; ".join(map(str, errors)))
    return sized


# ---- local ----------------------------------------------------------------------------------


def measure_locally(job: RocmTrainingJob, sizes: list[int], job_dir: Path, out: Path, cpu: bool) -> list[SizeResult]:
    """Train each size with an embedded Ray; every worker gets the same share of this machine's CPUs."""
    from rocmtrain_train.config import local_settings
    from rocmtrain_train.driver import train_job

    per_worker = max(1, (os.cpu_count() or 1) // max(sizes))
    results = []
    for workers in sizes:
        settings = local_settings(
            variant(job, workers, "local"),
            job_dir=str(job_dir),
            run_id=uuid.uuid4().hex,
            storage=str(out / "runs"),
            force_cpu=cpu,
            cpu_count=per_worker * workers,
            report_interval_s=LOCAL_REPORT_INTERVAL_SECONDS,
        )
        print(f"{workers} worker(s): training ({settings.log_dir})", file=sys.stderr, flush=True)
        outcome = train_job.run_local(settings, console=False)
        results.append(SizeResult.from_summary(workers, outcome.summary))
        _said(results[-1])
    return results


def _said(result: SizeResult) -> None:
    print(f"{result.workers} worker(s): {result.train_seconds:.1f} s of training", file=sys.stderr, flush=True)


# ---- cluster --------------------------------------------------------------------------------


async def _measure_on_cluster(
    job: RocmTrainingJob, sizes: list[int], namespace: str, kubeconfig: str | None, timeout: float
) -> list[SizeResult]:
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=kubeconfig or os.environ.get("KUBECONFIG"), client_configuration=configuration
    )
    async with client.ApiClient(configuration) as api:
        jobs = client.CustomObjectsApi(api)
        results = []
        for workers in sizes:
            sized = variant(job, workers, "cluster")
            body = sized.dump()
            body["metadata"]["namespace"] = namespace
            name = sized.metadata.name
            await jobs.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
            print(f"{workers} worker(s): created RocmTrainingJob {namespace}/{name}", file=sys.stderr, flush=True)
            status = await _until_ended(jobs, namespace, name, timeout)
            if Phase.of(status.get("phase")) is not Phase.SUCCEEDED:
                ready: dict[str, Any] = next(
                    (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
                )
                raise RuntimeError(f"{namespace}/{name} ended {status.get('phase')}: {ready.get('message', '')}")
            results.append(SizeResult.from_summary(workers, status.get("metrics") or {}))
            _said(results[-1])
        return results


async def _until_ended(jobs: Any, namespace: str, name: str, timeout: float) -> dict[str, Any]:
    """The job's status once it failed, or succeeded with its final metrics (which may come a moment later)."""
    deadline = time.monotonic() + timeout
    while True:
        found = await jobs.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        status = found.get("status") or {}
        phase = Phase.of(status.get("phase"))
        if phase is Phase.FAILED or (phase is Phase.SUCCEEDED and "trainSeconds" in (status.get("metrics") or {})):
            return status
        if phase is Phase.SUCCEEDED:
            deadline = min(deadline, time.monotonic() + METRICS_GRACE_SECONDS)
        if time.monotonic() > deadline:
            what = "reported no metrics" if phase is Phase.SUCCEEDED else f"did not end within {timeout:.0f} s"
            raise TimeoutError(f"{namespace}/{name} {what}")
        await asyncio.sleep(POLL_SECONDS)


# ---- the command ----------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """train a job at several world sizes and report its scaling (`rocmtrain scale --help`)"""
    args = _parser().parse_args(argv)
    job = read_one_job(args.job, "cluster" if args.cluster else "local", command="scale")
    if job is None:
        return EXIT_CONFIG
    try:
        for workers in args.workers:
            variant(job, workers, "cluster" if args.cluster else "local")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    out = args.out or Path("runs") / f"{job.metadata.name}-scaling"
    try:
        if args.cluster:
            results = asyncio.run(_measure_on_cluster(job, args.workers, args.namespace, args.kubeconfig, args.timeout))
            where = f"on the cluster (namespace {args.namespace})"
        else:
            results = measure_locally(job, args.workers, args.job.resolve().parent, out, args.cpu)
            where = "locally"
    except ModuleNotFoundError as exc:
        print(
            f"error: rocmtrain scale is missing {exc.name} (the `train` extra, or `operator` for --cluster)",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    except Exception as exc:
        print(f"error: a run failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    rows = scaling_rows(results)
    title = f"{job.metadata.name}, {where}"
    report = markdown(rows, title)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.md").write_text(report, encoding="utf-8")
    (out / "scaling.json").write_text(json.dumps(as_json(rows), indent=2) + "\n", encoding="utf-8")
    sys.stdout.write(report)
    try:
        chart(rows, out / "scaling.png", title)
    except ModuleNotFoundError:
        print("no chart: matplotlib is not installed (the `plot` extra)", file=sys.stderr)
    else:
        print(f"chart: {out / 'scaling.png'}", file=sys.stderr)
    return 0
