"""The cluster entrypoint (`python -m rocmtrain_train`): the RayJob's driver on the Ray head.

Reads the job from `ROCMTRAIN_JOB`, checks it, and trains on the Ray cluster that KubeRay started,
reporting progress to stdout, `metrics.jsonl` and the operator's progress endpoint.
Exit status: 0 done, 1 training failed, 2 the job cannot run as configured; a failure ends with
one line `rocmtrain driver error: ...` (`DRIVER_ERROR_PREFIX`), which the job's Failed condition
shows first. A job that cannot run is also reported to the operator, in a last progress report
with `preflightError`: the operator fails it at once and ends the RayJob before KubeRay retries it.
The values of the AWS credential variables never appear in what the driver prints.
"""

from __future__ import annotations

import sys
import uuid

import ray

from rocmtrain.api.contract import DRIVER_ERROR_PREFIX
from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import PREFLIGHT_ERROR_LIMIT, Progress, ProgressReport
from rocmtrain_train.config import cluster_settings, job_from_env
from rocmtrain_train.driver.driver_checks import preflight
from rocmtrain_train.driver.train_job import run_sinks, train
from rocmtrain_train.reporting import operator_sink
from rocmtrain_train.storage import without_secrets
from rocmtrain_train.trainer.torch_trainer import failure_line


def _fail(message: str) -> None:
    print(f"{DRIVER_ERROR_PREFIX}{without_secrets(' '.join(message.split()))}", file=sys.stderr, flush=True)


def _refuse(error: ConfigError) -> None:
    """Report why the job cannot run to the operator (a final report's `preflightError`), then fail with it."""
    message = without_secrets(" ".join(str(error).split()))
    if (progress := operator_sink.from_env()) is not None:
        refusal = message[:PREFLIGHT_ERROR_LIMIT]
        progress.emit(ProgressReport(progress=Progress(), final=True, preflight_error=refusal))
        progress.close()
    _fail(message)


def main() -> int:
    try:
        settings = cluster_settings(job_from_env(), run_id=uuid.uuid4().hex)
        planned = preflight(settings)
    except ConfigError as exc:
        _refuse(exc)
        return 2
    ray.init()
    sinks = run_sinks(settings, planned, console=sys.stdout, progress_bar=False)
    if planned is not None:
        print(f"memory plan: {planned.summary()}", flush=True)
    try:
        outcome = train(settings, sinks, echo_log=True)
    except Exception as exc:
        print(f"training failed: {without_secrets(str(exc))}", file=sys.stderr)
        _fail(f"training failed: {failure_line(exc)}")
        return 1
    print(f"model saved to {outcome.summary['model_path']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
