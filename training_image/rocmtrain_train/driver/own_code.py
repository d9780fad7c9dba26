"""A job's own code (spec.code) on this machine (`rocmtrain run`): its command, with the cluster's contract.

The command runs as a child process, never through a shell, with the job's literal `spec.env` values
and the environment contract a cluster job's code gets (`rocmtrain.api.code`): world size, GPUs per
worker, this machine's CPU share per rank, the run folder, the job's spec, and the progress channel
under both names, which points at a loopback endpoint of the same two paths
(`rocmtrain_train.reporting.local_endpoint`). What the code reports shows in the console's progress
bar and goes to `metrics.jsonl` and `--summary`. Its Ray is its own: a Ray Train script's
`TorchTrainer` starts an embedded Ray, as `ray.init()` does outside a cluster. When the command
fails, its last error line and the user's frame of its traceback say why (`rocmtrain.api.tracebacks`).
A run that Ray Train kept in its default storage (`~/ray_results`) is told what that does on a cluster
(`default_storage_note`); reports whose step goes backwards, that the code is likely not data-parallel
(`rocmtrain_train.reporting.local_endpoint`).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rocmtrain.api.code import CodeRun, code_environment
from rocmtrain.api.contract import PYTHON, is_object_store
from rocmtrain.api.errors import ConfigError, RocmTrainError
from rocmtrain.api.models import ProgressReport, RocmTrainingJob
from rocmtrain.api.tracebacks import last_failure
from rocmtrain_train.config import RunSettings, resolve_relative
from rocmtrain_train.driver.driver_checks import available_gpus, check_gpus, check_storage
from rocmtrain_train.driver.stop_signals import forward_stop
from rocmtrain_train.reporting.console_sink import ConsoleSink
from rocmtrain_train.reporting.driver_report import Sink
from rocmtrain_train.reporting.jsonl_sink import JsonlSink
from rocmtrain_train.reporting.local_endpoint import LocalEndpoint

# Ray Train's default storage under HOME, for a run whose RunConfig names no storage_path
# (ray.train.constants.DEFAULT_STORAGE_PATH), and the file it writes into each run's folder there to check that
# every node sees it (ray.train.v2's VALIDATE_STORAGE_MARKER_FILENAME).
RAY_RESULTS = "ray_results"
STORAGE_MARKER = ".validate_storage_marker"
# tqdm takes its defaults from TQDM_* variables (tqdm 4.66 and later): this one turns every bar of a process off.
TQDM_DISABLE_ENV = "TQDM_DISABLE"
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
    backward_steps: int = 0  # reports whose step went backwards (`rocmtrain.api.report_checks`)

    @property
    def summary(self) -> dict[str, Any]:
        """The run's summary (`rocmtrain run --summary`): what the code last reported, and how often its step
        went backwards (where it did)."""
        if self.last is None:
            return {"reports": 0}
        backward = {"backwardSteps": self.backward_steps} if self.backward_steps else {}
        return {
            "reports": self.reports,
            **backward,
            **self.last.model_dump(by_alias=True, exclude_none=True, mode="json"),
        }


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


def own_bars_off(draws_bar: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """`TQDM_DISABLE=1` for the code while the console draws the run's progress bar: the code's own tqdm bars (Hugging
    Face's Trainer, TRL, datasets) would overwrite it on the same line. Not where this environment sets it already."""
    return {TQDM_DISABLE_ENV: "1"} if draws_bar and TQDM_DISABLE_ENV not in environ else {}


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
    bars = {}
    if console:
        sinks.append(shown := ConsoleSink())
        bars = own_bars_off(shown.draws_bar, os.environ)
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
        started = time.time()
        try:
            contract = code_environment(job, run, os.environ)  # keeps a RAY_TRAIN_CALLBACKS of this shell's
            returncode, tail = _run(code.argv(), code.working_dir or settings.base_dir, bars | given | contract)
        finally:
            endpoint.close()
            for sink in sinks:
                sink.close()
    home = Path(given.get("HOME") or os.environ.get("HOME") or Path.home())
    if note := default_storage_note(job, settings.run_path, default_storage_runs(home, started)):
        print(note, file=sys.stderr)
    if returncode != 0:
        failure = last_failure(b"".join(tail).decode(errors="replace"))
        exited = f"exited with {returncode}" if returncode > 0 else f"ended by signal {-returncode}"
        raise CodeFailed(
            returncode, f"{failure.text()}\n(the command {exited})" if failure else f"the command {exited}"
        )
    return CodeOutcome(endpoint.last, endpoint.reports, endpoint.backward_steps)


def default_storage_runs(home: Path, since: float) -> list[Path]:
    """The Ray Train runs in Ray's default storage under `home` (`RAY_RESULTS`) that began at `since` or later."""
    markers = (home / RAY_RESULTS).glob(f"*/{STORAGE_MARKER}")
    return sorted(marker.parent for marker in markers if marker.stat().st_mtime >= since)


def default_storage_note(job: RocmTrainingJob, run_path: str, runs: list[Path]) -> str | None:
    """What `runs` in Ray's default storage mean on a cluster, where Ray Train's workers are on other pods than
    its driver: shared where the operator can make that default the run folder (a storagePath on a volume, by
    the head's HOME: `rocmtrain.render.env.code_home`), a failure at the first checkpoint where it cannot (an
    object store); None without such runs."""
    if not runs:
        return None
    where = ", ".join(str(run) for run in runs)
    storage = job.spec.checkpoint.storage_path
    if storage is not None and is_object_store(storage):
        return (
            f"warning: Ray Train kept this run in its default storage ({where}), which on a cluster is a folder of "
            f"each pod's own: Ray Train would fail when a worker saves a checkpoint ('Unable to set up cluster "
            f"storage'). Name the storage in RunConfig, as sdk.run_config() does: storage_path={storage!r}"
        )
    return (
        f"note: Ray Train kept this run in its default storage ({where}), not in the run folder {run_path}. On a "
        "cluster that default is the run folder's ray_results/, shared by every pod; sdk.run_config() keeps it in "
        "the run folder here too"
    )


def _run(argv: list[str], cwd: str | None, contract: dict[str, str]) -> tuple[int, collections.deque[bytes]]:
    """Run `argv` (no shell) with the contract added to this environment; its exit status and error tail.

    `python`, the image's interpreter on a cluster, is here the one `rocmtrain run` runs in (its packages).
    """
    if argv[0] == PYTHON:
        argv = [sys.executable, *argv[1:]]
    if cwd is not None and not Path(cwd).is_dir():  # else Popen's error names the program, not the folder
        raise ConfigError(f"spec.code.workingDir: {cwd} is not a folder on this machine")
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
    except KeyboardInterrupt:  # `rocmtrain run` is stopping (`stop_signals`): so is the command, its Ray with it
        forward_stop(child)
        child.wait()
        relay.join()
        raise
    relay.join()
    return returncode, tail
