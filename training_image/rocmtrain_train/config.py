"""Run settings: the job (the CRD's own model) plus where and how this run executes.

The job reaches a cluster run through `ROCMTRAIN_JOB` and a local run through the job
file; both are read with `rocmtrain.api.validate.validate_job`, as the operator and
`rocmtrain validate` read them, so a job this package trains passed every API check.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from rocmtrain.api.contract import JOB_ENV, RELATIVE_PREFIX, join_location
from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import STORAGE_REQUIRED, RocmTrainingJob
from rocmtrain.api.quantity import parse_quantity, whole_cpus
from rocmtrain.api.ranks import RankLayout, rank_layout
from rocmtrain.api.validate import validate_job

# Where the driver's logs go on a cluster when checkpoints go to an object store (the head's own disk).
CLUSTER_LOG_ROOT = "/tmp/rocmtrain/runs"  # noqa: S108 - a fixed, documented location inside the image
DEFAULT_LOCAL_STORAGE = "./runs"
# Seconds between metric reports from the workers.
DEFAULT_REPORT_INTERVAL_SECONDS = 10.0


@dataclass(frozen=True)
class RunSettings:
    """Everything a worker needs besides the job: it travels to each worker in the train loop config."""

    job: RocmTrainingJob
    storage: str  # runs' root (a cluster's: storagePath/namespace): an absolute local path or an object-store URI
    log_dir: str  # local folder of main.log and rank-<k>.log
    use_gpu: bool
    cpus_per_worker: float  # CPUs of one worker pod (locally: this machine's share), split among its ranks
    run_id: str  # unique per driver start; `resume: never` only restores checkpoints of this run
    base_dir: str | None = None  # folder that `./` locations are relative to (local runs)
    report_interval_s: float = DEFAULT_REPORT_INTERVAL_SECONDS
    run_name: str | None = None  # the run's folder under the storage; the job name unless set

    @property
    def name(self) -> str:
        return self.run_name or self.job.metadata.name

    @property
    def num_workers(self) -> int:
        return self.job.spec.resources.workers

    @property
    def concurrent_workers(self) -> int:
        """Worker pods of all the runs at once (the trials a search runs together)."""
        return self.job.spec.worker_pods

    @property
    def gpus_per_worker(self) -> int:
        return self.job.spec.resources.gpus_per_worker if self.use_gpu else 0

    @property
    def layout(self) -> RankLayout:
        """The ranks: one per GPU of each worker pod (one per pod on CPUs), each with its share of the CPUs."""
        return rank_layout(self.num_workers, self.gpus_per_worker, self.cpus_per_worker)

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def total_gpus(self) -> int:
        """GPUs this run uses: the job's (`ResourcesSpec.total_gpus`), or none when it trains on the CPU."""
        return self.layout.total_gpus

    @property
    def torch_threads(self) -> int:
        """Threads of each rank's thread pools: its whole CPUs."""
        return whole_cpus(self.layout.cpus_per_rank)

    @property
    def run_path(self) -> str:
        """The run folder (Ray Train's experiment folder): checkpoints and the final model."""
        return join_location(self.storage, self.name)

    @property
    def model_output(self) -> str:
        return join_location(self.run_path, "model")


def resolve_relative(location: str, base_dir: str | None) -> str:
    """Resolve a `./` location against the job file's folder; other locations are returned unchanged."""
    if not location.startswith(RELATIVE_PREFIX):
        return location
    if base_dir is None:
        raise ConfigError(f"relative location {location!r} is only allowed in local runs (`rocmtrain run`)")
    return str(Path(base_dir, location).resolve())


def job_from_env(environ: dict[str, str] | None = None) -> RocmTrainingJob:
    """The job the operator put in `ROCMTRAIN_JOB`, validated as a cluster job."""
    environ = dict(os.environ) if environ is None else environ
    raw = environ.get(JOB_ENV)
    if not raw:
        raise ConfigError(f"environment variable {JOB_ENV} is not set")
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{JOB_ENV} does not hold a valid RocmTrainingJob: {exc}") from exc
    job, errors = validate_job(document, context="cluster")
    if job is None:
        raise ConfigError(f"{JOB_ENV} does not hold a valid RocmTrainingJob: " + "; ".join(map(str, errors)))
    return job


def cluster_settings(job: RocmTrainingJob, run_id: str) -> RunSettings:
    """Settings of a run on a Ray cluster started by the operator (the RayJob's driver).

    The storage path is required there (`rocmtrain.api.validate`): the workers upload their own
    checkpoints from their pods, so only shared storage holds them all. The run folder is
    `<storagePath>/<namespace>/<name>`: jobs of one name in two namespaces never share checkpoints,
    and a job re-created under its namespace and name continues its predecessor's run (`resume: auto`).
    """
    root = job.spec.checkpoint.storage_path
    if root is None:
        raise ConfigError(f"spec.checkpoint.storagePath: {STORAGE_REQUIRED}")
    name = job.metadata.name
    storage = join_location(root, job.metadata.namespace)
    local_storage = storage.startswith("/")
    return RunSettings(
        job=job,
        storage=storage,
        log_dir=join_location(storage if local_storage else CLUSTER_LOG_ROOT, name, "logs"),
        use_gpu=job.spec.resources.gpus_per_worker > 0,
        cpus_per_worker=float(parse_quantity(job.spec.resources.cpus_per_worker)),
        run_id=run_id,
    )


def local_settings(
    job: RocmTrainingJob,
    *,
    job_dir: str,
    run_id: str,
    storage: str | None = None,
    force_cpu: bool = False,
    cpu_count: int = 1,
    report_interval_s: float = DEFAULT_REPORT_INTERVAL_SECONDS,
) -> RunSettings:
    """Settings of `rocmtrain run`: this machine's CPUs are shared out among the ranks.

    Storage: `storage` (relative to the current folder), else the spec's storagePath (`./` relative to
    the job file), else `./runs`.
    """
    resources = job.spec.resources
    if storage is not None:
        root = str(Path(storage).resolve())
    elif job.spec.checkpoint.storage_path:
        root = resolve_relative(job.spec.checkpoint.storage_path, job_dir)
    else:
        root = str(Path(DEFAULT_LOCAL_STORAGE).resolve())
    use_gpu = resources.gpus_per_worker > 0 and not force_cpu
    ranks_per_pod = resources.gpus_per_worker if use_gpu else 1
    machine_share = cpu_count // (job.spec.worker_pods * ranks_per_pod)
    cpus = ranks_per_pod * max(1, min(whole_cpus(resources.cpus_per_worker) // ranks_per_pod, machine_share))
    log_root = root if root.startswith("/") else str(Path(DEFAULT_LOCAL_STORAGE).resolve())
    return RunSettings(
        job=job,
        storage=root,
        log_dir=join_location(log_root, job.metadata.name, "logs"),
        use_gpu=use_gpu,
        cpus_per_worker=float(cpus),
        run_id=run_id,
        base_dir=job_dir,
        report_interval_s=report_interval_s,
    )
