"""The test cluster's processes: start them on loopback, wait until ready, stop them without leftovers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from rocmtrain_testworld.paths import BIN_DIR

# Proxy settings would send the components' HTTP calls (KubeRay's to the Ray
# dashboard) to a proxy off this machine: never passed on.
_DROPPED_ENV = {"http_proxy", "https_proxy", "all_proxy", "no_proxy", "kubeconfig"}
# Started in this order, stopped in the reverse one, after everything else.
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")


class ClusterError(RuntimeError):
    """The cluster could not be started or reached."""


_GIVEN_PORTS: set[int] = set()
_GIVEN_LOCK = threading.Lock()


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now and that this process has not returned before.

    The callers bind it later, often after picking others for the same server (SeaweedFS takes eight), and the
    kernel may offer a port it offered a moment ago: a repeat would make the server's second listener fail."""
    with _GIVEN_LOCK:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _GIVEN_PORTS:
                _GIVEN_PORTS.add(port)
                return port


def _libc_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()  # resolved before any fork: nothing may import in preexec_fn
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: own process group, and SIGKILL when the Python process dies (Linux)."""
    os.setsid()
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def group_alive(pgid: int) -> bool:
    """Whether the group led by ``pgid`` still runs; a zombie leader counts as gone.

    Our binaries do not fork, so the leader stands for its group. Zombies matter
    for `down`: orphans are reaped by whatever adopted them, maybe late.
    """
    try:
        stat = Path(f"/proc/{pgid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel about the group
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def kill_groups(pgids: Iterable[int], grace: float = 10.0, children: Iterable[subprocess.Popen[bytes]] = ()) -> None:
    """SIGTERM the process groups ``pgids`` together, SIGKILL what is left after ``grace`` s.

    ``children`` (our own Popen objects among them) are reaped along the way.
    """
    procs = {p.pid: p for p in children}
    remaining = list(pgids)
    for pgid in remaining:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while remaining and time.monotonic() < deadline:
        for pgid in list(remaining):
            if pgid in procs:
                procs[pgid].poll()
            if not group_alive(pgid):
                remaining.remove(pgid)
        time.sleep(0.05)
    for pgid in remaining:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for proc in procs.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def http_ok(url: str, context: object = None) -> bool:
    """Whether GET ``url`` answers 200 (``context``: an ssl.SSLContext for https)."""
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as r:  # noqa: S310
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Process:
    """One binary of the cluster, logging to ``<logs>/<name>.log``; restartable with the same arguments.

    ``detach`` keeps it alive after this Python process exits (for `up`);
    otherwise the kernel kills it with the thread that started it
    (PR_SET_PDEATHSIG: start it from a long-lived thread).
    ``wrap`` prefixes the command line (see ``sandbox.LoopbackNames.wrap``);
    ``ready`` tells whether it serves (its health endpoint, say). ``binary`` is a
    file in the binaries folder, or an absolute path (a Python, for the process
    runtime); ``identity`` is what `is_ours` finds in its command line (by default
    the binary's name).
    """

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        *,
        logs: Path,
        cwd: Path,
        binary: str | None = None,
        identity: str | None = None,
        env: Mapping[str, str] | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
        ready: Callable[[], bool] | None = None,
        detach: bool = False,
    ) -> None:
        self.name = name
        self.binary = binary or name
        self.identity = identity or Path(self.binary).name
        self.args = list(args)
        self.log = logs / f"{name}.log"
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if k.lower() not in _DROPPED_ENV} | dict(env or {})
        self.wrap = wrap
        self.ready = ready
        self.detach = detach
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def start(self) -> Process:
        argv = [str(BIN_DIR / self.binary), *self.args]
        if self.wrap is not None:
            argv = self.wrap(argv)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            if self.starts:
                log.write(f"\n---- restart {self.starts} ----\n".encode())
                log.flush()
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=self.env,
                start_new_session=self.detach,
                preexec_fn=None if self.detach else die_with_parent,
            )
        self.starts += 1
        return self

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str = "ready") -> None:
        """Poll ``check``; fail with the log's tail if the process exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not check():
            if self.popen is not None and self.popen.poll() is not None:
                raise ClusterError(f"{self.name} exited with {self.popen.returncode}:\n{log_tail(self.log)}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.name} not {what} after {timeout}s:\n{log_tail(self.log)}")
            time.sleep(0.05)

    def wait_ready(self, timeout: float = 60) -> None:
        if self.ready is not None:
            self.wait_until(self.ready, timeout)

    def stop(self, grace: float = 10.0) -> None:
        if self.popen is not None:
            kill_groups([self.popen.pid], grace, children=[self.popen])

    def restart(self, timeout: float = 60) -> None:
        """Stop (SIGTERM, as a rollout would), start again with the same arguments, wait until ready."""
        self.stop()
        self.start()
        self.wait_ready(timeout)


def stop_all(processes: Sequence[Process]) -> None:
    """Stop ``processes`` (in start order) from the last: clients before the servers they need.

    The ones after the control plane (add-ons) go together; then the control
    plane one at a time: the apiserver shuts down in ~1 s once the
    controller-manager is gone (5 s+ if both go at once), and hangs without etcd.
    """
    started = [p for p in processes if p.popen is not None]
    core = [p for p in started if p.name in CONTROL_PLANE]
    addons = [p for p in started if p.name not in CONTROL_PLANE]
    if addons:
        kill_groups([p.pid for p in addons], children=[p.popen for p in addons if p.popen is not None])
    for proc in reversed(core):
        proc.stop()


def stop_pids(pids: Mapping[str, int]) -> None:
    """:func:`stop_all` for processes known by pid only (``down``)."""
    addons = [pid for name, pid in pids.items() if name not in CONTROL_PLANE]
    if addons:
        kill_groups(addons)
    for name in reversed(CONTROL_PLANE):
        if name in pids:
            kill_groups([pids[name]])


def is_ours(identity: str, pid: int) -> bool:
    """Whether ``pid`` still runs our process of that ``identity`` (guards against PID reuse):
    its executable has that name, or its command line holds it (``python -m rocmtrain_testworld.runtime``)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True  # no /proc: trust the pid file
    return Path(exe.removesuffix(" (deleted)")).name == identity or identity in argv


def healthz_ok(port: int) -> bool:
    """Whether an HTTP server on 127.0.0.1:`port` answers 200 on /healthz (the operator's liveness)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False
