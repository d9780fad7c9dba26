"""Environment of the Ray containers, in a fixed order.

Order: runtime defaults (a user variable of the same name replaces its default),
then the user's `spec.env`, then the variables the operator owns (`ROCMTRAIN_*`
on the head; for a job's own code, its environment contract, `rocmtrain.api.code`,
on the head and every worker). Owned variables come last, so they win even over a
name that validation should have refused. Their names are in `rocmtrain.api.contract`,
where the training image reads them from.
"""

from __future__ import annotations

from typing import Any

from rocmtrain.api.code import CodeRun, code_environment, run_folder
from rocmtrain.api.contract import (
    JOB_ENV,
    PROGRESS_CA_ENV,
    PROGRESS_TOKEN_ENV,
    PROGRESS_URL_ENV,
    TMP_PATH,
    is_object_store,
    progress_path,
    trainer_status_path,
)
from rocmtrain.api.job_config import job_config_json
from rocmtrain.api.models import NetworkSpec, RocmTrainingJob
from rocmtrain.api.quantity import parse_quantity, whole_cpus
from rocmtrain.render.options import RenderOptions
from rocmtrain.render.volumes import PROGRESS_CA_PATH, PROGRESS_TOKEN_PATH

# Runtime defaults for pods with AMD GPUs (RCCL reads the NCCL_* names):
# - NCCL_DEBUG=WARN: RCCL reports unusual conditions (a fallback transport, a
#   topology it cannot use) without the per-collective chatter of INFO. Rank 0 of
#   the training loop (and of a job's own code, through `sdk.run_config`) raises it
#   to INFO for INIT and NET, into a file of its own, to read which network RCCL
#   chose (`rocmtrain_train.reporting.rccl_log`), so that `rocmtrain run` on GPUs
#   does it too.
# - HSA_FORCE_FINE_GRAIN_PCIE=1: enables RCCL's peer-to-peer transport between
#   PCIe-connected GPUs of one pod (ROCm's RCCL usage tips); harmless over xGMI.
# Not set: HIP_VISIBLE_DEVICES (the device plugin exposes only the allocated GPUs
# and Ray assigns them to its workers; Ray refuses ROCR_VISIBLE_DEVICES), and
# TORCH_NCCL_ASYNC_ERROR_HANDLING (PyTorch's default, 3, already ends the process
# on a failed collective, which Ray Train then handles as a worker failure).
GPU_ENV = (("NCCL_DEBUG", "WARN"), ("HSA_FORCE_FINE_GRAIN_PCIE", "1"))


def progress_url(job: RocmTrainingJob, base_url: str) -> str:
    """The job's progress endpoint under the operator's base URL."""
    return base_url + progress_path(job.metadata.namespace, job.metadata.name)


def _var(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def home() -> dict[str, Any]:
    """HOME on the writable /tmp: the root filesystem is read-only, and Hugging Face, MIOpen and
    Ray keep their caches under HOME."""
    return _var("HOME", TMP_PATH)


def code_home(job: RocmTrainingJob) -> list[dict[str, Any]]:
    """For a job's own code whose storagePath is a path on a volume, the head's HOME in the job's run folder, so
    that Ray Train's default storage is shared by every pod; else nothing.

    Ray Train keeps a run whose `RunConfig` names no `storage_path` in `~/ray_results`
    (`ray.train.constants.DEFAULT_STORAGE_PATH`, expanded from HOME when the driver imports Ray Train; Ray
    2.60 reads no variable for it, RAY_STORAGE only in Ray Train v1). The driver runs on the head and passes
    that path to the workers, so with HOME on /tmp each pod would write its own `/tmp/ray_results` and Ray
    Train fail when a worker saves a checkpoint ("Unable to set up cluster storage"). With HOME in the run
    folder, it is `<run folder>/ray_results`, on the volume every pod mounts. The caches that follow
    XDG_CACHE_HOME and XDG_CONFIG_HOME (Hugging Face's, PyTorch's, pip's) stay on /tmp. An object-store
    storagePath cannot be a HOME: there the code names its storage (`sdk.run_config()`).
    """
    storage = job.spec.checkpoint.storage_path
    if job.spec.code is None or storage is None or is_object_store(storage):
        return []
    return [
        _var("HOME", run_folder(storage, job.metadata.namespace, job.metadata.name)),
        _var("XDG_CACHE_HOME", f"{TMP_PATH}/.cache"),
        _var("XDG_CONFIG_HOME", f"{TMP_PATH}/.config"),
    ]


def head_defaults(job: RocmTrainingJob, cpus: str) -> list[dict[str, Any]]:
    """The head's runtime defaults: a Ray container's without GPUs, with `code_home` in place of HOME."""
    home = code_home(job)
    names = {var["name"] for var in home}
    return home + [var for var in runtime_defaults(cpus, 0) if var["name"] not in names]


def runtime_defaults(cpus: str, gpus: int) -> list[dict[str, Any]]:
    """Defaults for one Ray container with `cpus` CPUs and `gpus` AMD GPUs.

    OMP_NUM_THREADS is the container's whole CPUs, so PyTorch's thread pools follow the
    CPU limit rather than the node's core count (Ray would otherwise pick 1 for actors
    that request no CPUs).
    """
    env = [home(), _var("OMP_NUM_THREADS", str(whole_cpus(cpus)))]
    if gpus:
        env += [_var(name, value) for name, value in GPU_ENV]
    return env


def network_env(network: NetworkSpec | None) -> list[dict[str, Any]]:
    """RCCL's network variables (NCCL_IB_HCA, NCCL_SOCKET_IFNAME, NCCL_IB_GID_INDEX) for the set fields."""
    return [_var(name, value) for name, value in network.nccl_env().items()] if network is not None else []


def code_env(job: RocmTrainingJob, options: RenderOptions) -> list[dict[str, Any]]:
    """The environment contract of a job's own code (spec.code), for the head and every worker container."""
    spec, base = job.spec, options.progress_base_url
    if spec.checkpoint.storage_path is None:  # a cluster job has one (`rocmtrain.api.validate`)
        raise ValueError("a cluster job needs spec.checkpoint.storagePath")
    run = CodeRun(
        run_path=run_folder(spec.checkpoint.storage_path, job.metadata.namespace, job.metadata.name),
        gpus_per_worker=spec.resources.gpus_per_worker,
        cpus_per_worker=float(parse_quantity(spec.resources.cpus_per_worker)),
        progress_url=progress_url(job, base) if base else None,
        trainer_status_url=base + trainer_status_path(job.metadata.namespace, job.metadata.name) if base else None,
        ca_file=PROGRESS_CA_PATH if base and options.progress_ca_configmap else None,
        token_file=PROGRESS_TOKEN_PATH if base else None,
    )
    return [_var(name, value) for name, value in code_environment(job, run).items()]


def owned_worker_env(job: RocmTrainingJob, options: RenderOptions) -> list[dict[str, Any]]:
    """The operator's variables on a worker container: a job's own code's environment contract, else none."""
    return code_env(job, options) if job.spec.code is not None else []


def owned_head_env(job: RocmTrainingJob, options: RenderOptions) -> list[dict[str, Any]]:
    """The operator's variables on the head container: the job, and where to report progress (for a job's own
    code, its whole environment contract)."""
    env = [_var(JOB_ENV, job_config_json(job))]
    if job.spec.code is not None:
        return env + code_env(job, options)
    if options.progress_base_url:
        env.append(_var(PROGRESS_URL_ENV, progress_url(job, options.progress_base_url)))
        env.append(_var(PROGRESS_TOKEN_ENV, PROGRESS_TOKEN_PATH))
        if options.progress_ca_configmap:
            env.append(_var(PROGRESS_CA_ENV, PROGRESS_CA_PATH))
    return env


def container_env(
    job: RocmTrainingJob, defaults: list[dict[str, Any]], owned: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Defaults not overridden by the user, the user's variables, then the owned ones."""
    user = [var.dump() for var in job.spec.env]
    user_names = {var["name"] for var in user}
    return [var for var in defaults if var["name"] not in user_names] + user + owned
