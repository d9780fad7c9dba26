"""The build's lock: `make test` runs the Go build beside the tests that need none of its binaries, and a
test that needs one waits until the build has ended (rocmtrain_testworld.paths.wait_for_build)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rocmtrain_testworld.paths import BIN_DIR, wait_for_build

BUILD_SH = Path(__file__).resolve().parents[1] / "testworld" / "rocmtrain_testworld" / "build.sh"


def held(lock: Path) -> bool:
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def hold(lock: Path) -> subprocess.Popen[bytes]:
    """A process holding `lock` exclusively, as build.sh does while it builds (flock itself: its command,
    `sleep`, does not inherit the lock, so that killing flock releases it)."""
    holder = subprocess.Popen(["flock", "--close", str(lock), "sleep", "60"])
    deadline = time.monotonic() + 10
    while not (lock.exists() and held(lock)):
        assert time.monotonic() < deadline, "flock did not take the lock"
        time.sleep(0.05)
    return holder


def test_a_lookup_waits_while_the_build_holds_its_lock(tmp_path: Path):
    lock = tmp_path / ".build.lock"
    holder = hold(lock)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (wait_for_build(lock), done.set()), daemon=True)
    waiter.start()
    try:
        assert not done.wait(1.0), "returned while the build still held its lock"
    finally:
        holder.kill()
        holder.wait()
    assert done.wait(10), "still waiting after the build ended"


def test_no_lock_file_means_no_build_to_wait_for(tmp_path: Path):
    wait_for_build(tmp_path / ".build.lock")


@pytest.mark.gotools
def test_build_sh_takes_the_lock_before_it_looks_at_the_binaries(tmp_path: Path):
    lock = BIN_DIR / ".build.lock"
    log = tmp_path / "build.log"
    holder = hold(lock)
    try:
        with log.open("w") as out:
            build = subprocess.Popen([str(BUILD_SH)], stdout=out, stderr=subprocess.STDOUT)
        time.sleep(1.0)
        # Without the lock it would have said by now what it builds, or that nothing needs building.
        assert build.poll() is None and not log.read_text(), "build.sh went on while another build held the lock"
    finally:
        holder.kill()
        holder.wait()
    assert build.wait(timeout=600) == 0, log.read_text()
    assert log.read_text()
