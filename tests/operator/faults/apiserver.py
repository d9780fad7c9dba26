"""Restart kube-apiserver of the local test cluster while etcd (and the controller-manager) stay up."""

from __future__ import annotations

import time

from rocmtrain_testworld.kubecluster import ClusterError, KubeCluster


def restart_apiserver(kube: KubeCluster, timeout: float = 60.0) -> float:
    """Stop kube-apiserver (SIGTERM, SIGKILL after 5 s), start it again with the same flags; the seconds it was away.

    Returns once it serves our CRDs and KubeRay's again. The harness's `Process` keeps the new
    process, so it is stopped at the end of the session as before.
    """
    proc = kube.processes.get("kube-apiserver")
    if proc is None:
        raise ClusterError("restarting kube-apiserver needs the local control plane")
    started = time.monotonic()
    proc.stop(grace=5.0)  # SIGTERM; SIGKILL if it drains watches longer
    proc.start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            kube.request("GET", "/apis/rocmtrain.dev/v1alpha1", timeout=2)
            kube.request("GET", "/apis/ray.io/v1", timeout=2)
            return time.monotonic() - started
        except Exception as exc:  # connection refused, 503 while it starts, stale pooled connections
            if not proc.running():
                raise ClusterError("kube-apiserver did not come back") from exc
            if time.monotonic() > deadline:
                raise ClusterError(f"kube-apiserver not serving after {timeout}s") from exc
            time.sleep(0.2)
