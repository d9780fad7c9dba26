"""Training on this machine (`rocmtrain run`): the cluster's training loop, with an embedded Ray."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rocmtrain.plan.fit import JobPlan
from rocmtrain.plan.gpu_memory import GpuMemory
from rocmtrain_train.checkpoint import staging
from rocmtrain_train.config import RunSettings
from rocmtrain_train.driver.driver_checks import available_gpus, preflight
from rocmtrain_train.reporting import operator_sink
from rocmtrain_train.reporting.console_sink import ConsoleSink
from rocmtrain_train.reporting.driver_report import Sink, with_planned_memory
from rocmtrain_train.reporting.jsonl_sink import JsonlSink
from rocmtrain_train.reporting.log_upload import keep_logs
from rocmtrain_train.trainer.torch_trainer import RunOutcome, run

if TYPE_CHECKING:
    from rocmtrain_train.search.tune_trials import SearchOutcome

LOOPBACK = "127.0.0.1"
# Where Ray's state API and job clients find the dashboard, before any search among local processes.
API_SERVER_ADDRESS_ENV = "RAY_API_SERVER_ADDRESS"
RAY_ADDRESS_ENV = "RAY_ADDRESS"  # the cluster `ray.init()` joins; the embedded Ray never does


def train(settings: RunSettings, sinks: list[Sink], *, echo_log: bool) -> RunOutcome | SearchOutcome:
    """One training run, or the job's hyper-parameter search when it has `spec.tuning`; its logs are kept beside
    the run on object storage however it ends (`keep_logs`)."""
    try:
        if settings.job.spec.tuning is not None:
            from rocmtrain_train.search.tune_trials import run_search

            return run_search(settings, sinks, echo_log=echo_log)
        return run(settings, sinks, echo_log=echo_log)
    finally:
        keep_logs(settings)


def run_sinks(
    settings: RunSettings, planned: JobPlan | None, *, console: TextIO | None, progress_bar: bool | None = None
) -> list[Sink]:
    """Where a run's progress reports go: `metrics.jsonl`, the console where `console` names its stream, and the
    operator's progress endpoint where the environment names one (a cluster job's status); each passes the memory
    plan's bytes per GPU on (`with_planned_memory`)."""
    sinks: list[Sink] = [JsonlSink(Path(settings.log_dir) / "metrics.jsonl")]
    if console is not None:
        language_model = settings.job.spec.model.task == "causal-lm"
        sinks.append(ConsoleSink(console, progress_bar=progress_bar, language_model=language_model))
    if (progress := operator_sink.from_env()) is not None:
        sinks.append(progress)
    return with_planned_memory(sinks, planned)


def local_gpu_memory() -> GpuMemory | None:
    """The memory of this machine's smallest GPU, as PyTorch sees it."""
    import torch

    sizes = [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
    return GpuMemory(min(sizes), "this machine's smallest GPU") if sizes else None


def embedded_ray_options(settings: RunSettings) -> dict[str, Any]:
    """`ray.init`'s arguments for the job's embedded Ray: enough CPUs and GPUs for every concurrent rank.

    A search also gets Ray's dashboard, on a free loopback port: it serves the state API, which Ray
    Train's PlacementGroupCleaner asks whether a trial's Train controller still lives. Without it, a
    trial Tune stops early (its controller dies with it) keeps its workers' placement group, and with
    it their CPUs and GPUs, until the search ends.

    The Ray is always a new one (`address="local"`): left to `ray.init()`, it would join the cluster that
    `RAY_ADDRESS` or `/tmp/ray/ray_current_cluster` names (the latest `ray start` on this machine), and
    refuse its own CPU and GPU counts there.
    """
    options: dict[str, Any] = {
        "address": "local",
        "num_cpus": max(os.cpu_count() or 1, int(settings.concurrent_workers * settings.cpus_per_worker)),
        "num_gpus": settings.total_gpus * settings.job.spec.concurrent_runs,
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    if settings.job.spec.tuning is None:
        return options
    return options | {"include_dashboard": True, "dashboard_host": LOOPBACK, "dashboard_port": free_loopback_port()}


def start_embedded_ray(options: dict[str, Any]) -> None:
    """`ray.init(**options)`, with every Ray process told where the dashboard is, if it has one, and not
    told of any other Ray (`RAY_ADDRESS`).

    Left to find the state API, the PlacementGroupCleaner looks among this machine's processes for a
    Ray, and gives up for good beside another one; given `RAY_ADDRESS`, Ray Train's processes ask that
    cluster's. The environment reaches Ray's processes as they inherit it, so it is set only while Ray
    starts: a runtime_env would cost each worker process a round trip to Ray's runtime-env agent (0.2 s
    each here).
    """
    import ray

    port = options.get("dashboard_port")
    dashboard = None if port is None else f"http://{LOOPBACK}:{port}"
    previous = {name: os.environ.get(name) for name in (API_SERVER_ADDRESS_ENV, RAY_ADDRESS_ENV)}
    _set_environ({API_SERVER_ADDRESS_ENV: dashboard, RAY_ADDRESS_ENV: None})
    on_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(**options)
    finally:
        _set_environ(previous)
        if callable(on_sigterm):  # Ray sets its own (sys.exit): `rocmtrain run`'s stops the run as Ctrl-C does
            signal.signal(signal.SIGTERM, on_sigterm)


def _set_environ(values: dict[str, str | None]) -> None:
    """Sets each variable to its value, or unsets it where the value is None."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def free_loopback_port() -> int:
    """A TCP port of the loopback address that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def run_local(settings: RunSettings, *, console: bool = True) -> RunOutcome | SearchOutcome:
    """Check the job, start an embedded Ray unless one is running, and train (or search)."""
    import ray

    gpus = settings.use_gpu
    planned = preflight(
        settings, available_gpus=available_gpus() if gpus else None, local_gpu=local_gpu_memory() if gpus else None
    )
    started_ray = not ray.is_initialized()
    if started_ray:
        start_embedded_ray(embedded_ray_options(settings))
    sinks = run_sinks(settings, planned, console=sys.stderr if console else None)
    try:
        return train(settings, sinks, echo_log=False)
    finally:
        if started_ray:
            ray.shutdown()
        staging.remove_run(settings.run_id)  # its ranks ran on this machine, and have ended
