"""Stopping `rocmtrain run`: SIGTERM and SIGHUP stop the whole run as Ctrl-C does, and nothing of it is left.

Within `StopSignals`, SIGINT, SIGTERM and SIGHUP each raise KeyboardInterrupt in the main thread, so a run
unwinds the way Ctrl-C unwinds it (the embedded Ray shut down, a job's own code told to stop with SIGINT, its
Ray by it), after noting the processes the run has then: `end_processes` ends whichever of them outlive the
unwinding (SIGTERM, then SIGKILL after `GRACE_SECONDS`), and waits until they are gone.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any

import psutil

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_SECONDS = 10.0


def exit_status(signum: signal.Signals) -> int:
    """The shell's exit status of a program a signal ended: 128 + its number (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    return 128 + int(signum)


@dataclass
class StopSignals:
    """While entered (in the main thread): the stop signals raise KeyboardInterrupt. `received`: the first one;
    `processes`: the run's processes then, by name; `ending`: set while they are ended (a further signal waits)."""

    received: signal.Signals | None = None
    processes: dict[psutil.Process, str] = field(default_factory=dict)
    ending: bool = False
    _previous: dict[signal.Signals, Any] = field(default_factory=dict)

    def __enter__(self) -> StopSignals:
        self._previous = {signum: signal.signal(signum, self._stop) for signum in STOP_SIGNALS}
        _ACTIVE.append(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        _ACTIVE.remove(self)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        if self.ending:
            return
        if self.received is None:
            self.received = signal.Signals(signum)
            self.processes = {process: _name(process) for process in psutil.Process().children(recursive=True)}
        raise KeyboardInterrupt


_ACTIVE: list[StopSignals] = []


def forward_stop(child: subprocess.Popen[bytes]) -> None:
    """Tell a child process to stop as Ctrl-C does (SIGINT), unless Ctrl-C itself stopped the run: it reached the
    child too (one process group), and a second SIGINT would cut the child's own clean-up short."""
    if not (_ACTIVE and _ACTIVE[-1].received == signal.SIGINT):
        child.send_signal(signal.SIGINT)


def end_processes(processes: dict[psutil.Process, str], grace: float = GRACE_SECONDS) -> str:
    """End those of `processes` that still run (SIGTERM, then SIGKILL after `grace` seconds), wait until every one is
    gone, and say what was stopped: the processes by name, and how many had to be killed."""
    living = [process for process in processes if process.is_running()]
    for process in living:
        _signal(process, signal.SIGTERM)
    _, stubborn = psutil.wait_procs(living, timeout=grace)
    for process in stubborn:
        _signal(process, signal.SIGKILL)
    psutil.wait_procs(stubborn)
    if not processes:
        return "no other process"
    names = Counter(processes.values())
    listed = ", ".join(f"{count}× {name}" if count > 1 else name for name, count in sorted(names.items()))
    killed = f"; {len(stubborn)} killed after {grace:g} s" if stubborn else ""
    return f"{len(processes)} processes ({listed}){killed}"


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.Error:  # it ended before it was asked
        return "a process"


def _signal(process: psutil.Process, signum: signal.Signals) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        process.send_signal(signum)
