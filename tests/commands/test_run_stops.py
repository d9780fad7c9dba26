"""`rocmtrain run` stopped by a signal, and a job's own code it cannot start.

Real parts: `rocmtrain run` as a command in a session of its own, the job's code (tests/own_code) as its child
process with its own Ray (raylet, GCS, a worker running an actor). What is asserted is what is left: the exit
status, the line saying what was stopped, and no process in the run's process group once it has returned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

SCRIPTS = Path(__file__).resolve().parents[1] / "own_code"
ROCMTRAIN = Path(sys.executable).parent / "rocmtrain"


def write_job(folder: Path, code: dict[str, object]) -> list[str]:
    """A small job running `code` (one CPU worker of 2Gi, no sharedMemory), in `folder`; the `rocmtrain run` line."""
    job = {
        "apiVersion": "rocmtrain.dev/v1alpha1",
        "kind": "RocmTrainingJob",
        "metadata": {"name": "stopped", "namespace": "ml"},
        "spec": {
            "code": code,
            "resources": {"workers": 1, "gpusPerWorker": 0, "cpusPerWorker": "1", "memoryPerWorker": "2Gi"},
        },
    }
    (folder / "job.yaml").write_text(yaml.safe_dump(job))
    return [str(ROCMTRAIN), "run", str(folder / "job.yaml"), "--storage", str(folder / "runs")]


def group_members(pgid: int) -> list[str]:
    """The processes of process group `pgid`, as `name (pid)`."""
    found = []
    for process in psutil.process_iter(["name"]):
        try:
            if os.getpgid(process.pid) == pgid:
                found.append(f"{process.info['name']} ({process.pid})")
        except ProcessLookupError:
            continue
    return found


@pytest.mark.ray  # the code starts a Ray of its own
def test_sigterm_stops_the_whole_run_its_code_and_its_ray_and_says_what_it_stopped(tmp_path: Path) -> None:
    argv = write_job(tmp_path, {"command": ["python", str(SCRIPTS / "ray_until_stopped.py")]})
    run = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert run.stderr is not None
    seen = []
    for line in run.stderr:  # until the code's Ray worker trains (or the run ends, which fails below)
        seen.append(line)
        if line.strip() == "training":
            break
    assert run.poll() is None, "".join(seen)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, err
    (stopped,) = [line for line in err.splitlines() if line.startswith("stopped by SIGTERM: ")]
    assert "raylet" in stopped and "python" in stopped, stopped
    assert group_members(run.pid) == [], "nothing of the run is left"


def test_a_missing_working_dir_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "not-here"
    argv = write_job(tmp_path, {"command": ["python", "train.py"], "workingDir": str(missing)})
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert f"error: spec.code.workingDir: {missing} is not a folder on this machine" in done.stderr.splitlines()
