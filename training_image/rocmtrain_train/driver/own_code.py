"""A job's own code (spec.code) on this machine (`rocmtrain run`): its command, with the cluster's contract.

The command runs as a child process, never through a shell, with the job's literal `spec.env` values
and the environment contract a cluster job's code gets (`rocmtrain.api.code`): world size, GPUs per
worker, this machine's CPU share per rank, the run folder, the job's spec, and the progress channel
under both names, which points at a loopback endpoint of the same two paths
(`rocmtrain_train.reporting.local_endpoint`). What the code reports shows in the console's progress
bar and goes to `metrics.jsonl` and `--summary`. Its Ray is its own: a Ray Train script's
`TorchTrainer` starts an embedded Ray, as `ray.init()` does outside a cluster. When the command
fails, its last error line and the user's frame of its traceback say why (`rocmtrain.api.tracebacks`).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rocmtrain.api.code import CodeRun, code_environment
from rocmtrain.api.contract import PYTHON
from rocmtrain.api.errors import ConfigError, RocmTrainError
from rocmtrain.api.models import ProgressReport, RocmTrainingJob
from rocmtrain.api.tracebacks import last_failure
from rocmtrain_train.config import RunSettings, resolve_relative
from rocmtrain_train.driver.driver_checks import available_gpus, check_gpus, check_storage
from rocmtrain_train.reporting.console_sink import ConsoleSink
from rocmtrain_train.reporting.driver_report import Sink
from rocmtrain_train.reporting.jsonl_sink import JsonlSink
from rocmtrain_train.reporting.local_endpoint import LocalEndpoint

# The end of the command's error output kept to explain a failure (a traceback and what follows it).
TAIL_BYTES = 64 * 1024
LINE_BYTES = 8 * 1024  # a longer line is relayed in pieces


class CodeFailed(RocmTrainError):
    """The command exited non-zero (or was ended by a signal); the message says why, error line first."""

    def __init__(self, returncode: int, why: str) -> None:
        super().__init__(why)
        self.returncode = returncode


@dataclass(frozen=True)
class CodeOutcome:
    """What a finished run of the code leaves: its last report (if it reported) and how many it sent."""

    last: ProgressReport | None
    reports: int

    @property
    def summary(self) -> dict[str, Any]:
        """The run's summary (`rocmtrain run --summary`): what the code last reported."""
        if self.last is None:
            return {"reports": 0}
        return {"reports": self.reports, **self.last.model_dump(by_alias=True, exclude_none=True, mode="json")}


def local_job(job: RocmTrainingJob, base_dir: str | None) -> RocmTrainingJob:
    """The job with its `./` locations (model source, data) made absolute, as its code reads them."""
    spec = job.spec
    update: dict[str, Any] = {}
    if spec.model_spec is not None:
        update["model_spec"] = spec.model_spec.model_copy(
            update={"source": resolve_relative(spec.model_spec.source, base_dir)}
        )
    if spec.data_spec is not None:
        sources = {"train": spec.data_spec.train, "eval": spec.data_spec.eval}
        update["data_spec"] = spec.data_spec.model_copy(
            update={
                field: source.model_copy(update={"uri": resolve_relative(source.uri, base_dir)})
                for field, source in sources.items()
                if source is not None
            }
        )
    return job.model_copy(update={"spec": spec.model_copy(update=update)})


def _relay(stream: IO[bytes], out: IO[bytes], tail: collections.deque[bytes]) -> None:
    """Copy the command's error output through, keeping its last TAIL_BYTES."""
    kept = 0
    for line in iter(lambda: stream.readline(LINE_BYTES), b""):
        out.write(line)
        out.flush()
        tail.append(line)
        kept += len(line)
        while kept > TAIL_BYTES and len(tail) > 1:
            kept -= len(tail.popleft())


def run_code(settings: RunSettings, *, console: bool = True) -> CodeOutcome:
    """Run the job's code to its end; CodeFailed when it fails, ConfigError when it cannot start."""
    code = settings.job.spec.code
    if code is None:
        raise ValueError("the job has no spec.code")
    if settings.use_gpu:
        check_gpus(settings, available_gpus())
    check_storage(settings)
    job = local_job(settings.job, settings.base_dir)
    sinks: list[Sink] = [JsonlSink(Path(settings.log_dir) / "metrics.jsonl")]
    if console:
        sinks.append(ConsoleSink())
    with tempfile.TemporaryDirectory(prefix="rocmtrain-progress-") as token_dir:
        endpoint = LocalEndpoint(job.metadata.namespace, job.metadata.name, sinks, Path(token_dir))
        run = CodeRun(
            run_path=settings.run_path,
            gpus_per_worker=settings.gpus_per_worker,
            cpus_per_worker=settings.cpus_per_worker,
            progress_url=endpoint.progress_url,
            trainer_status_url=endpoint.trainer_status_url,
            token_file=str(endpoint.token_file),
        )
        given = {var.name: var.value for var in job.spec.env if var.value is not None}  # secrets stay the cluster's
        try:
            returncode, tail = _run(
                code.argv(), code.working_dir or settings.base_dir, given | code_environment(job, run)
            )
        finally:
            endpoint.close()
            for sink in sinks:
                sink.close()
    if returncode != 0:
        failure = last_failure(b"".join(tail).decode(errors="replace"))
        exited = f"exited with {returncode}" if returncode > 0 else f"ended by signal {-returncode}"
        raise CodeFailed(
            returncode, f"{failure.text()}\n(the command {exited})" if failure else f"the command {exited}"
        )
    return CodeOutcome(endpoint.last, endpoint.reports)


def _run(argv: list[str], cwd: str | None, contract: dict[str, str]) -> tuple[int, collections.deque[bytes]]:
    """Run `argv` (no shell) with the contract added to this environment; its exit status and error tail.

    `python`, the image's interpreter on a cluster, is here the one `rocmtrain run` runs in (its packages).
    """
    if argv[0] == PYTHON:
        argv = [sys.executable, *argv[1:]]
    try:
        child = subprocess.Popen(argv, cwd=cwd, env=os.environ | contract, stderr=subprocess.PIPE)
    except OSError as exc:
        raise ConfigError(f"spec.code: cannot run {argv[0]!r}: {exc.strerror}") from exc
    assert child.stderr is not None
    tail: collections.deque[bytes] = collections.deque()
    relay = threading.Thread(target=_relay, args=(child.stderr, sys.stderr.buffer, tail), daemon=True)
    relay.start()
    try:
        returncode = child.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the child too (one process group): let it end itself
        returncode = child.wait()
    relay.join()
    return returncode, tail
