"""Restart kube-apiserver of the local test cluster while etcd (and the controller-manager) stay up."""

from __future__ import annotations

import subprocess
import time

from cluster.kubecluster import ClusterError, KubeCluster, _die_with_parent, _kill_groups


def restart_apiserver(kube: KubeCluster, timeout: float = 60.0) -> float:
    """Stop kube-apiserver (SIGTERM, SIGKILL after 5 s), start it again with the same flags; the seconds it was away.

    Returns once it serves our CRDs and KubeRay's again. The new process replaces the old one
    in `kube.processes`, so the harness stops it at the end of the session as before.
    """
    proc = kube.processes.get("kube-apiserver")
    if proc is None or kube.workdir is None:
        raise ClusterError("restarting kube-apiserver needs the local control plane")
    started = time.monotonic()
    _kill_groups([proc.pid], grace=5.0, children=[proc])  # SIGTERM; SIGKILL if it drains watches longer
    with open(kube.workdir / "logs" / "kube-apiserver.log", "ab") as log:
        kube.processes["kube-apiserver"] = subprocess.Popen(
            proc.args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=kube.workdir,
            preexec_fn=_die_with_parent,
        )
    deadline = time.monotonic() + timeout
    while True:
        try:
            kube.request("GET", "/apis/rocmtrain.dev/v1alpha1", timeout=2)
            kube.request("GET", "/apis/ray.io/v1", timeout=2)
            return time.monotonic() - started
        except Exception as exc:  # connection refused, 503 while it starts, stale pooled connections
            if kube.processes["kube-apiserver"].poll() is not None:
                raise ClusterError("kube-apiserver did not come back") from exc
            if time.monotonic() > deadline:
                raise ClusterError(f"kube-apiserver not serving after {timeout}s") from exc
            time.sleep(0.2)
