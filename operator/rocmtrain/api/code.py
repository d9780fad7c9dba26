"""A job's own training code (`spec.code`): its command line and the environment it is given (pure).

The renderer makes the RayJob's entrypoint with `entrypoint` and puts `code_environment` on the Ray
head and every worker; `rocmtrain run` runs `CodeSpec.argv` with the same environment. The names
are the contract's (`rocmtrain.api.contract`), documented in docs/guides/own-code.md, and read by
`rocmtrain_train.sdk`.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from rocmtrain.api.contract import (
    CHECKPOINTS_TO_KEEP_ENV,
    CPUS_PER_RANK_ENV,
    DATA_ENV,
    GPUS_PER_WORKER_ENV,
    JOB_NAME_ENV,
    JOB_NAMESPACE_ENV,
    KUBEFLOW_CA_ENV,
    KUBEFLOW_TOKEN_ENV,
    KUBEFLOW_URL_ENV,
    MAX_WORKER_FAILURES_ENV,
    MODEL_ENV,
    PROGRESS_CA_ENV,
    PROGRESS_TOKEN_ENV,
    PROGRESS_URL_ENV,
    RAY_REPORT_FORWARDER,
    RAY_TRAIN_CALLBACKS_ENV,
    STORAGE_PATH_ENV,
    TRAINING_ENV,
    WORKERS_ENV,
    WORLD_SIZE_ENV,
    join_location,
)
from rocmtrain.api.models import ApiModel, CodeSpec, RocmTrainingJob
from rocmtrain.api.ranks import rank_layout

# Runs the command in a folder: `sh -c CHDIR <folder> <argv...>` makes the folder $0 and the command "$@",
# so that both stay data (positional parameters) and no shell ever reads them as shell text.
CHDIR: Final = 'cd -- "$0" && exec "$@"'


def entrypoint(code: CodeSpec) -> str:
    """The RayJob's entrypoint: the command line with every argument quoted (`shlex.join`).

    Two shells read it before the command runs: KubeRay's submitter runs `ray job submit ... --
    <entrypoint>` in `bash -c`, and Ray's job supervisor runs what `ray job submit` joined again with
    `shlex.join` in `/bin/sh -c`. A quoted word reads as itself in both, so each argument arrives as
    written, whatever it holds (quotes, `$(...)`, newlines).
    """
    argv = code.argv()
    if code.working_dir is not None:
        argv = ["sh", "-c", CHDIR, code.working_dir, *argv]
    return shlex.join(argv)


def run_folder(storage_path: str, namespace: str, name: str) -> str:
    """A job's run folder, `<storagePath>/<namespace>/<name>`: jobs of one name in two namespaces never share it."""
    return join_location(storage_path, namespace, name)


@dataclass(frozen=True)
class CodeRun:
    """Where a job's code runs, beyond its spec: what the environment contract tells it.

    run_path: the run folder (`run_folder`); gpus_per_worker: AMD GPUs of each worker pod (0 on CPUs);
    cpus_per_worker: CPUs of each worker pod (for `rocmtrain run`, this machine's share); the progress
    endpoint's URLs (ours and KEP-2779's), CA bundle file and token file, where progress is taken.
    """

    run_path: str
    gpus_per_worker: int
    cpus_per_worker: float
    progress_url: str | None = None
    trainer_status_url: str | None = None
    ca_file: str | None = None
    token_file: str | None = None


def _exact(number: float) -> str:
    """A number as written, never rounded (a share of CPUs rounded up would not fit its pod): 6, 0.3333."""
    return str(int(number)) if number.is_integer() else repr(number)


def _compact(model: ApiModel) -> str:
    return json.dumps(model.dump(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def ray_train_callbacks(given: str | None) -> str:
    """`RAY_TRAIN_CALLBACKS`: the callbacks the job names (`given`), then the forwarder of `ray.train.report`."""
    named = [name.strip() for name in (given or "").split(",") if name.strip()]
    return ",".join([*named, RAY_REPORT_FORWARDER] if RAY_REPORT_FORWARDER not in named else named)


def code_environment(job: RocmTrainingJob, run: CodeRun, inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment contract of a job's code, variable by variable (names in `rocmtrain.api.contract`).

    `inherited`: the environment the code would otherwise have beyond spec.env (`rocmtrain run`'s own), where a
    `RAY_TRAIN_CALLBACKS` of the user's may be set, kept ahead of the product's.
    """
    spec = job.spec
    given = {var.name: var.value for var in spec.env if var.value is not None}
    layout = rank_layout(spec.resources.workers, run.gpus_per_worker, run.cpus_per_worker)
    env = {
        JOB_NAME_ENV: job.metadata.name,
        JOB_NAMESPACE_ENV: job.metadata.namespace,
        WORLD_SIZE_ENV: str(layout.world_size),
        WORKERS_ENV: str(layout.pods),
        GPUS_PER_WORKER_ENV: str(run.gpus_per_worker),
        CPUS_PER_RANK_ENV: _exact(layout.cpus_per_rank),
        STORAGE_PATH_ENV: run.run_path,
        MAX_WORKER_FAILURES_ENV: str(spec.fault_tolerance.max_worker_failures),
        CHECKPOINTS_TO_KEEP_ENV: str(spec.checkpoint.keep_last),
        TRAINING_ENV: _compact(spec.training),
        RAY_TRAIN_CALLBACKS_ENV: ray_train_callbacks(
            given.get(RAY_TRAIN_CALLBACKS_ENV) or (inherited or {}).get(RAY_TRAIN_CALLBACKS_ENV)
        ),
    }
    if spec.model_spec is not None:
        env[MODEL_ENV] = _compact(spec.model_spec)
    if spec.data_spec is not None:
        env[DATA_ENV] = _compact(spec.data_spec)
    if run.progress_url and run.trainer_status_url and run.token_file:
        env |= {
            PROGRESS_URL_ENV: run.progress_url,
            PROGRESS_TOKEN_ENV: run.token_file,
            KUBEFLOW_URL_ENV: run.trainer_status_url,
            KUBEFLOW_TOKEN_ENV: run.token_file,
        }
        if run.ca_file:
            env |= {PROGRESS_CA_ENV: run.ca_file, KUBEFLOW_CA_ENV: run.ca_file}
    return env
