"""One run: Ray Train's TorchTrainer built from the job (by the driver, or a search's trial) and run with progress
reporting.

Ranks: one Ray Train worker per GPU (`rocmtrain.api.ranks`), each reserving one GPU and its share
of the pod's CPUs, in a placement group packed onto as few nodes as possible. The GPUs of a worker
pod fill up with exactly its own ranks, and Ray Train numbers the ranks node by node, so ranks
k*G .. k*G+G-1 share a pod and their all-reduce stays on the node's xGMI links.

Fault tolerance and resume are Ray Train's: `FailureConfig(max_failures)` restarts the workers after
a failure, and `RunConfig(storage_path, name)` keeps a snapshot of the reported checkpoints under
`<storage>/<job name>/`, so a new driver on the same storage (a whole-job retry) finds them too. In
both cases every worker gets the latest checkpoint from `ray.train.get_checkpoint()` and continues
from its step, including the position inside the epoch (see `loop.step_loop`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig, UserCallback
from ray.train.torch import TorchConfig, TorchTrainer
from ray.train.v2._internal.constants import DEFAULT_HEALTH_CHECK_INTERVAL_S, HEALTH_CHECK_INTERVAL_S_ENV_VAR

from rocmtrain_train.config import RunSettings
from rocmtrain_train.reporting.driver_report import Reporter, Sink, summary
from rocmtrain_train.reporting.log_files import main_logger
from rocmtrain_train.reporting.rank_report import RankReport
from rocmtrain_train.reporting.relay import Inbox, Pump, ReportRelay, error_line


@dataclass(frozen=True)
class RunOutcome:
    """What a finished run leaves: its summary and the final metrics of every rank."""

    summary: dict[str, Any]
    final_ranks: list[RankReport]
    worker_failures: int


def failure_line(exc: BaseException) -> str:
    """One line saying why a run failed: the first failing worker's own error where Ray Train names one."""
    workers = getattr(exc, "worker_failures", None)
    if isinstance(workers, dict) and workers:
        rank = min(workers)
        return f"rank {rank}: {error_line(workers[rank])}"
    controller = getattr(exc, "controller_failure", None)
    return error_line(controller if isinstance(controller, BaseException) else exc)


def scaling_config(settings: RunSettings) -> ScalingConfig:
    """One Ray Train worker per rank of the layout, packed per node."""
    layout = settings.layout
    return ScalingConfig(
        num_workers=layout.world_size,
        use_gpu=settings.use_gpu,
        resources_per_worker=layout.resources_per_rank(),
        placement_strategy="PACK",
    )


def import_and_train_rank(config: dict[str, Any]) -> None:
    """Ray Train's `train_loop_per_worker`: imports the loop (torch's and transformers' models) on the rank
    and trains it (`loop.step_loop.train_rank`). The driver and each Tune trial actor pickle it by reference
    and never run it, and would otherwise spend seconds of CPU importing what only the ranks need."""
    from rocmtrain_train.loop.step_loop import train_rank

    train_rank(config)


def poll_interval_s(report_interval_s: float) -> float:
    """The controller's poll interval for ranks that report every `report_interval_s`: two polls per report,
    so that reports never queue up, at most Ray's default.

    Ray Train's controller polls the ranks every `HEALTH_CHECK_INTERVAL_S_ENV_VAR` seconds (2 s) and takes
    one report of each rank per poll; a rank's later reports wait in line. With 2 s and a report a second,
    the status falls further behind the ranks with every report, and the run ends only when the queue is
    empty."""
    return min(DEFAULT_HEALTH_CHECK_INTERVAL_S, report_interval_s / 2)


def build_trainer(settings: RunSettings, callbacks: Sequence[UserCallback] = ()) -> TorchTrainer:
    """The TorchTrainer of one run: the job's hyper-parameters, checkpoints under `settings.run_path`.

    Ray Train's controller reads its poll interval from the environment of the process that calls `fit`
    (the driver, or a search's trial actor), which it is set in here."""
    os.environ[HEALTH_CHECK_INTERVAL_S_ENV_VAR] = f"{poll_interval_s(settings.report_interval_s):g}"
    spec = settings.job.spec
    return TorchTrainer(
        import_and_train_rank,
        train_loop_config={"settings": settings},
        torch_config=TorchConfig(backend="nccl" if settings.use_gpu else "gloo"),
        scaling_config=scaling_config(settings),
        run_config=RunConfig(
            name=settings.name,
            storage_path=settings.storage,
            checkpoint_config=CheckpointConfig(num_to_keep=spec.checkpoint.keep_last),
            failure_config=FailureConfig(max_failures=spec.fault_tolerance.max_worker_failures),
            callbacks=list(callbacks),  # type: ignore[arg-type]  # Ray Train V2 takes UserCallbacks here
        ),
    )


def _fit(settings: RunSettings, reporter: Reporter) -> None:
    """Run the trainer while a pump feeds the reporter; every report is handled when this returns."""
    inbox = Inbox.remote()  # type: ignore[attr-defined]  # @ray.remote adds it
    pump = Pump(inbox, reporter)
    pump.start()
    try:
        build_trainer(settings, [ReportRelay(inbox)]).fit()
    finally:
        pump.stop()
        reporter.close()
        ray.kill(inbox)


def run(settings: RunSettings, sinks: list[Sink], *, echo_log: bool) -> RunOutcome:
    """Train on the connected Ray cluster; raises Ray Train's TrainingFailedError when the run fails."""
    log = main_logger(settings.log_dir, echo=echo_log)
    layout = settings.layout
    device = "1 GPU and " if settings.use_gpu else ""
    log.info(
        "training %s started: %d ranks (%d per worker pod) with %s%g CPU(s) each, storage %s, run %s",
        settings.name,
        layout.world_size,
        layout.ranks_per_pod,
        device,
        layout.cpus_per_rank,
        settings.run_path,
        settings.run_id,
    )
    reporter = Reporter(sinks, log)
    started = time.perf_counter()
    try:
        _fit(settings, reporter)
    except Exception as exc:
        log.error("training %s failed: %s", settings.name, exc)
        raise
    if reporter.final_ranks is None:
        raise RuntimeError("training finished without a final report")
    return RunOutcome(
        summary=summary(reporter.final_ranks, time.perf_counter() - started),
        final_ranks=reporter.final_ranks,
        worker_failures=reporter.failures,
    )
