"""The real kube-scheduler (same Kubernetes version as the apiserver), as user system:kube-scheduler."""

from __future__ import annotations

import ssl
from pathlib import Path

import yaml

from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.processes import Process, free_port, http_ok


def process(cluster: KubeCluster, workdir: Path, *, detach: bool = False) -> Process:
    """kube-scheduler (not started) with a loopback health port and no leader election."""
    assert cluster.pki is not None, "the scheduler runs beside a local control plane"
    kubeconfig = cluster.pki.kubeconfig(cluster.server, "kube-scheduler", "system:kube-scheduler")
    config = workdir / "kube-scheduler.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 100, "burst": 200},
                "leaderElection": {"leaderElect": False},
            }
        )
    )
    port = free_port()
    # Self-signed serving certificate: /readyz is open to anonymous requests.
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    return Process(
        "kube-scheduler",
        [
            f"--config={config}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={workdir / 'pki' / 'kube-scheduler'}",
            "--profiling=false",
            "--v=1",
        ],
        logs=workdir / "logs",
        cwd=workdir,
        ready=lambda: http_ok(f"https://127.0.0.1:{port}/readyz", insecure),
        detach=detach,
    )
