"""The lean control plane: etcd, kube-apiserver and kube-controller-manager on loopback ports."""

from __future__ import annotations

import json
import shutil
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.paths import BIN_DIR, CRDS_DIR, KUBERAY_CRDS_DIR
from rocmtrain_testworld.pki import SERVICE_CIDR, Pki, kubeconfig
from rocmtrain_testworld.processes import CONTROL_PLANE, ClusterError, Process, free_port, http_ok, stop_all

SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
# Without kubelets nothing keeps plain fake nodes' heartbeats: the node
# lifecycle controller would taint them unreachable.
LEAN_CONTROLLERS = ("*", "-node-lifecycle-controller")


def binaries_present(names: Sequence[str] = CONTROL_PLANE) -> bool:
    """Whether ``make cluster-binaries`` has produced ``names`` and KubeRay's CRDs."""
    return all((BIN_DIR / b).is_file() for b in names) and any(KUBERAY_CRDS_DIR.glob("*.yaml"))


def start(
    workdir: Path | None = None,
    *,
    kubeconfig_path: Path | None = None,
    detach: bool = False,
    controllers: Sequence[str] = LEAN_CONTROLLERS,
    timeout: float = 90,
    under: Path | None = None,
    admission: Mapping[str, Any] | None = None,
) -> KubeCluster:
    """Start etcd, kube-apiserver and kube-controller-manager; return the cluster (``cluster.pki`` set).

    Without ``workdir``, a fresh one is made in ``under`` (the system's temp folder by default) and
    removed when the cluster stops.

    The controller-manager is started, not waited for (see :func:`wait_controller_manager`).
    ``detach``: see :class:`processes.Process`. ``admission``: kube-apiserver's AdmissionConfiguration
    (the plugins' cluster defaults), if any.
    """
    if not binaries_present():
        raise ClusterError(f"control-plane binaries missing in {BIN_DIR}; run `make cluster-binaries`")
    if workdir is None:
        if under is not None:
            under.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="rocmtrain-kube-", dir=under))
    workdir.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    pki = Pki(workdir / "pki")
    procs: list[Process] = []

    def process(name: str, args: list[str]) -> Process:
        proc = Process(name, args, logs=logs, cwd=workdir, detach=detach).start()
        procs.append(proc)
        return proc

    try:
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = process(
            "etcd",
            [
                "--name=default",
                f"--data-dir={workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        etcd.wait_until(lambda: http_ok(f"{etcd_url}/health"), 30)

        server = f"https://127.0.0.1:{api_port}"
        apiserver = process(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={workdir / 'pki'}",
                f"--tls-cert-file={pki.apiserver_crt}",
                f"--tls-private-key-file={pki.apiserver_key}",
                f"--client-ca-file={pki.ca_crt}",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--api-audiences={SA_ISSUER}",
                "--authorization-mode=Node,RBAC",
                # A namespace's annotations may send its pods to the process runtime's nodes (world.py).
                "--enable-admission-plugins=PodNodeSelector,PodTolerationRestriction",
                *_admission_flags(workdir, admission),
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Endpoints may not be loopback addresses; nothing in-cluster calls the API.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        )
        admin_cert, admin_key, admin_crt_path, admin_key_path = pki.client(
            "admin", "kubernetes-admin", "system:masters"
        )
        ctx = ssl.create_default_context(cafile=str(pki.ca_crt))
        ctx.load_cert_chain(str(admin_crt_path), str(admin_key_path))
        apiserver.wait_until(lambda: http_ok(f"{server}/readyz", ctx), timeout)

        kcm_kubeconfig = pki.kubeconfig(server, "kube-controller-manager", "system:kube-controller-manager")
        process(
            "kube-controller-manager",
            [
                f"--kubeconfig={kcm_kubeconfig}",
                f"--authentication-kubeconfig={kcm_kubeconfig}",
                f"--authorization-kubeconfig={kcm_kubeconfig}",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_crt}",
                f"--cluster-signing-cert-file={pki.ca_crt}",
                f"--cluster-signing-key-file={pki.ca_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--controllers={','.join(controllers)}",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
                "--profiling=false",
                "--v=1",
            ],
        )
        kubeconfig_path = kubeconfig_path or workdir / "kubeconfig"
        kubeconfig_path.parent.mkdir(parents=True, exist_ok=True)
        kubeconfig_path.write_text(kubeconfig(server, pki.ca_pem, admin_cert, admin_key, "kubernetes-admin"))
        kubeconfig_path.chmod(0o600)
        cluster = KubeCluster(kubeconfig_path, workdir=workdir)
        cluster.processes = {p.name: p for p in procs}
        cluster.pki = pki
    except BaseException:
        stop_all(procs)
        if not detach:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    return cluster


def _admission_flags(workdir: Path, admission: Mapping[str, Any] | None) -> list[str]:
    """kube-apiserver's flag naming ``admission``, written into ``workdir``; none without it."""
    if admission is None:
        return []
    path = workdir / "admission.json"
    path.write_text(json.dumps(admission, indent=2))
    return [f"--admission-control-config-file={path}"]


def install_crds(cluster: KubeCluster, *extra: dict[str, Any]) -> None:
    """Install KubeRay's CRDs, ``extra`` ones, and ours (which may fail: see ``cluster.crd_errors``).

    A CRD of ours that the server rejects does not stop the cluster: it is
    recorded so that tests of the control plane itself still run and CRD tests
    fail with the server's message.
    """
    kuberay = sorted(KUBERAY_CRDS_DIR.glob("*.yaml"))
    if not kuberay:
        raise ClusterError(f"no KubeRay CRDs in {KUBERAY_CRDS_DIR}; run `make cluster-binaries`")
    ours = sorted(CRDS_DIR.glob("*.yaml"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = [
            pool.submit(cluster.install_crds, [*kuberay, *extra], cache=True),
            pool.submit(cluster.install_crds, ours, errors=cluster.crd_errors),
        ]
        for future in done:
            future.result()


def wait_controller_manager(cluster: KubeCluster, timeout: float = 60) -> None:
    """Wait until kube-controller-manager has created the default ServiceAccount."""
    proc = cluster.processes.get("kube-controller-manager")

    def ready() -> bool:
        if proc is not None and not proc.running():
            raise ClusterError(f"kube-controller-manager exited:\n{proc.log.read_text(errors='replace')[-4000:]}")
        cluster.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
        return True

    cluster.wait_for(ready, timeout, "kube-controller-manager (default ServiceAccount)")
