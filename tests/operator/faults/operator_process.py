"""The operator as its own process, as it runs in its Deployment: `python -m rocmtrain.controller`.

Unlike the in-process `KopfRunner` of the other operator tests, this one can be killed
with SIGKILL at any moment, and its memory (RSS) and metrics read from outside.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

from rocmtrain_testworld.processes import die_with_parent, free_port, healthz_ok


class OperatorProcess:
    """One operator process at a time, restartable; logs to `folder`/operator.log."""

    def __init__(
        self, kubeconfig: Path, folder: Path, namespaces: Iterable[str], env: Mapping[str, str] | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log = folder / "operator.log"
        self.namespaces = tuple(namespaces)
        self.extra_env = dict(env or {})
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = 60.0) -> None:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ROCMTRAIN_")},
            "KUBECONFIG": str(self.kubeconfig),
            "ROCMTRAIN_NAMESPACES": ",".join(self.namespaces),
            "ROCMTRAIN_METRICS_PORT": str(self.metrics_port),
            "ROCMTRAIN_HEALTH_PORT": str(self.health_port),
            "ROCMTRAIN_STALL_SECONDS": "3600",
            "ROCMTRAIN_RETRY_SECONDS": "1",
            **self.extra_env,
        }
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rocmtrain.controller"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        self.starts += 1
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the operator exited with {self.proc.returncode}; see {self.log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the operator is not healthy after {timeout}s; see {self.log}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no cleanup handler runs, as when a node dies or the OOM killer strikes."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM, as Kubernetes stops a pod; SIGKILL after 15 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def healthy(self) -> bool:
        return healthz_ok(self.health_port)

    def rss_mib(self) -> float:
        """The process's resident memory, MiB."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def metric(self, name: str, **labels: str) -> float:
        """The value of a metric on /metrics: unlabelled, or the series of `labels` (0 before its first count)."""
        series = name + ("{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}" if labels else "")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(series + " "):
                    return float(line.split()[-1])
        if labels:
            return 0.0
        raise KeyError(name)
