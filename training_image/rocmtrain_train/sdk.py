"""The SDK of your own training code (`spec.code`): the job's Ray Train settings, and progress reports.

The operator (and `rocmtrain run`) gives a job's code its environment contract (names in
`rocmtrain.api.contract`, documented in docs/guides/own-code.md); these read it::

    from ray.train.torch import TorchTrainer
    from rocmtrain_train import sdk

    def train_func():
        for step in range(1, 101):
            loss = ...
            sdk.report(step=step, total_steps=100, metrics={"loss": loss})  # rank 0 sends, the others skip

    TorchTrainer(train_func, scaling_config=sdk.scaling_config(), run_config=sdk.run_config()).fit()

`report` puts the metrics where a KEP-2779 report puts them (`rocmtrain.api.trainer_status`: `loss`,
`eval_accuracy`, `learning_rate`, ... into their status fields, any other name into
`status.metrics.custom`), and sends it from a background thread, so training never waits for the
operator. On GPUs, rank 0's reports also carry the network RCCL chose, as its log tells: `run_config`
has rank 0 raise RCCL's log level (`reporting.rccl_debug`), and `report` reads the log once RCCL has
written it (`rccl_log`). Hugging Face `Trainer` needs none of this: its `KubeflowCallback` reports by
itself (KEP-2779's reports have no network).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocmtrain.api.contract import (
    CHECKPOINTS_TO_KEEP_ENV,
    CPUS_PER_RANK_ENV,
    DATA_ENV,
    GPUS_PER_WORKER_ENV,
    MAX_WORKER_FAILURES_ENV,
    MODEL_ENV,
    STORAGE_PATH_ENV,
    TRAINING_ENV,
    WORLD_SIZE_ENV,
)
from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import DataSpec, ModelSpec, NetworkTransport, ProgressReport, TrainingSpec
from rocmtrain.api.trainer_status import TrainerStatusError, place_metrics, report_from
from rocmtrain_train.reporting import operator_sink, rccl_log

if TYPE_CHECKING:
    from ray.train import RunConfig, ScalingConfig

log = logging.getLogger(__name__)


class ContractError(ConfigError, RuntimeError):
    """The environment contract is missing a variable: the code runs outside a RocmTrainingJob (a RuntimeError too,
    as the SDK's callers may catch it)."""


def _variable(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ContractError(f"{name} is not set: run this code as a RocmTrainingJob with spec.code (or rocmtrain run)")
    return value


def scaling_config(**overrides: Any) -> ScalingConfig:
    """Ray Train's ScalingConfig for the job: one worker per rank (`ROCMTRAIN_WORLD_SIZE`), each with one GPU
    where the pods have GPUs and its share of its pod's CPUs, packed per node; `overrides` win."""
    from ray.train import ScalingConfig

    gpus = int(_variable(GPUS_PER_WORKER_ENV))
    resources = {"CPU": float(_variable(CPUS_PER_RANK_ENV)), **({"GPU": 1.0} if gpus else {})}
    settings: dict[str, Any] = {
        "num_workers": int(_variable(WORLD_SIZE_ENV)),
        "use_gpu": gpus > 0,
        "resources_per_worker": resources,
        "placement_strategy": "PACK",
    }
    return ScalingConfig(**(settings | overrides))


def run_config(**overrides: Any) -> RunConfig:
    """Ray Train's RunConfig for the job: its run folder (`ROCMTRAIN_STORAGE_PATH`) as storage_path/name, so that
    a retried job resumes from its checkpoints, the spec's worker-failure and checkpoint limits, and a callback
    that has rank 0 on GPUs write RCCL's INIT and NET lines to a file (`reporting.rccl_debug`), which tells
    `report` the network; `overrides` win, but `callbacks` are added to that one."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig

    from rocmtrain_train.reporting.rccl_debug import RcclDebug

    root, _, name = _variable(STORAGE_PATH_ENV).rstrip("/").rpartition("/")
    settings: dict[str, Any] = {
        "storage_path": root,
        "name": name,
        "failure_config": FailureConfig(max_failures=int(_variable(MAX_WORKER_FAILURES_ENV))),
        "checkpoint_config": CheckpointConfig(num_to_keep=int(_variable(CHECKPOINTS_TO_KEEP_ENV))),
        "callbacks": [RcclDebug(), *(overrides.pop("callbacks", None) or [])],
    }
    return RunConfig(**(settings | overrides))


def storage_path() -> str:
    """The job's run folder, `<checkpoint.storagePath>/<namespace>/<name>` (a path or an object-store URI)."""
    return _variable(STORAGE_PATH_ENV)


def model() -> ModelSpec | None:
    """spec.model, where the job has one."""
    raw = os.environ.get(MODEL_ENV)
    return ModelSpec.model_validate_json(raw) if raw else None


def data() -> DataSpec | None:
    """spec.data, where the job has one."""
    raw = os.environ.get(DATA_ENV)
    return DataSpec.model_validate_json(raw) if raw else None


def training() -> TrainingSpec:
    """spec.training, its defaults filled in."""
    return TrainingSpec.model_validate(json.loads(_variable(TRAINING_ENV)))


def model_path() -> Path:
    """The local folder of spec.model.source: a path as it is, a hub model from an installed package or the Hugging
    Face cache (or the hub), an object-store folder copied into the local cache."""
    from rocmtrain_train.model.pretrained import resolve_model

    spec = model()
    if spec is None:
        raise ContractError(f"{MODEL_ENV} is not set: the job has no spec.model")
    path = resolve_model(spec.source, None)
    assert path is not None  # resolve_model downloads unless told not to
    return path


def is_reporting_rank() -> bool:
    """Whether this process reports: rank 0 of a Ray Train worker group, or a process outside one (the driver)."""
    try:
        import ray.train

        return ray.train.get_context().get_world_rank() == 0
    except (ImportError, RuntimeError):
        return True


class _Network:
    """The network this process's RCCL chose, read once from its log (NCCL_DEBUG_FILE, the user's or the one
    `run_config` has rank 0 set) once RCCL has created that file, with its first communicator."""

    def __init__(self) -> None:
        self.read = False
        self.found: NetworkTransport | None = None

    def get(self) -> NetworkTransport | None:
        if not self.read:
            template, host, pid = os.environ.get("NCCL_DEBUG_FILE"), socket.gethostname(), os.getpid()
            if template is None or os.path.exists(rccl_log.debug_file(template, host, pid)):
                self.read = True
                self.found = rccl_log.read_transport(template, host, pid, log)
                rccl_log.TransportLog(log).seen(self.found)
        return self.found


class _Reporter:
    """The sender of this process's reports, what an ETA needs (when the first step was reported), and the
    network RCCL chose."""

    def __init__(self) -> None:
        self.sink = operator_sink.from_env()
        self.first: tuple[float, int] | None = None
        self.lock = threading.Lock()
        self.network = _Network()
        if self.sink is None:
            log.info("no progress endpoint in the environment: sdk.report sends nothing")

    def eta(self, step: int | None, total_steps: int | None) -> float | None:
        """Seconds left at the pace since the first report with a step."""
        if step is None or total_steps is None:
            return None
        now = time.monotonic()
        with self.lock:
            if self.first is None or step < self.first[1]:
                self.first = (now, step)
                return None
            started, first_step = self.first
        done = step - first_step
        return (now - started) / done * max(total_steps - step, 0) if done > 0 else None


@functools.cache
def _reporter() -> _Reporter:
    return _Reporter()


def report(
    *,
    step: int | None = None,
    total_steps: int | None = None,
    epoch: float | None = None,
    metrics: Mapping[str, float] | None = None,
    final: bool = False,
) -> bool:
    """Report progress into the job's status; True when the report was queued.

    Only rank 0 of a Ray Train worker group (or a process outside one, such as the driver) sends; other ranks
    return False at once. Metric names as in the KEP-2779 table (docs/guides/own-code.md): `loss`,
    `eval_loss`, `eval_accuracy`, `learning_rate`, ... fill their status fields, other names
    `status.metrics.custom`. On GPUs, rank 0's reports carry the network RCCL chose (`status.network`), from
    the first report after RCCL's first communicator, where its log tells. A report that is not valid (a NaN,
    more than 32 other metrics, a value out of its field's bounds) is logged and dropped: reporting never fails
    the training. The last report (`final`, or `step == total_steps`) waits up to 10 s for the reports before
    it to be delivered.
    """
    if not is_reporting_rank():
        return False
    reporter = _reporter()
    if reporter.sink is None:
        return False
    try:
        values = {name: float(value) for name, value in (metrics or {}).items()}
        if not all(math.isfinite(value) for value in values.values()):
            raise TrainerStatusError("non-finite metric value")
        progress, placed, source = place_metrics(values)
        progress |= {key: value for key, value in (("step", step), ("totalSteps", total_steps)) if value is not None}
        if epoch is not None:
            progress["epoch"] = epoch
        final = final or (step is not None and step == total_steps)
        if step is not None and total_steps:
            progress["percent"] = min(100.0, 100.0 * step / total_steps)
        if (eta := reporter.eta(step, total_steps)) is not None:
            progress["etaSeconds"] = 0.0 if final else eta
        built: ProgressReport = report_from(progress, placed, source, final)
    except (TrainerStatusError, TypeError, ValueError) as exc:
        log.warning("progress report dropped: %s", exc)
        return False
    if (network := reporter.network.get()) is not None:
        built = built.model_copy(update={"network": network})
    reporter.sink.emit(built)
    from rocmtrain_train.reporting.ray_report import mark_own_report  # imports Ray Train

    mark_own_report()  # Ray Train's own reports of this run are not forwarded as well (`reporting.ray_report`)
    if final:
        reporter.sink.flush()
    return True
