"""A real, local Kubernetes control plane for the test suite.

Starts etcd, kube-apiserver and kube-controller-manager (built by
``tests/cluster/build.sh`` into ``.cluster/bin``) on free loopback ports,
installs the repo's CRDs (``crds/*.yaml``) and KubeRay's CRDs, and registers
fake AMD GPU nodes. There is no scheduler and no kubelet: pods stay Pending.

When ``ROCMTRAIN_TEST_KUBECONFIG`` names an existing cluster's kubeconfig, no
process is started; the CRDs are still installed there.

For people::

    python tests/cluster/kubecluster.py up     # prints the kubeconfig path
    python tests/cluster/kubecluster.py down
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from rocmtrain.progress.tls import CA_KEY_USAGE

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = REPO_ROOT / ".cluster"
BIN_DIR = Path(os.environ.get("CLUSTER_BIN_DIR", CLUSTER_DIR / "bin"))
CRDS_DIR = REPO_ROOT / "crds"
KUBERAY_CRDS_DIR = BIN_DIR / "crds"
PIDS_FILE = CLUSTER_DIR / "pids"
STATE_DIR = CLUSTER_DIR / "state"
KUBECONFIG_FILE = CLUSTER_DIR / "kubeconfig"

EXTERNAL_KUBECONFIG_ENV = "ROCMTRAIN_TEST_KUBECONFIG"
FAKE_NODES_ENV = "ROCMTRAIN_TEST_FAKE_NODES"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
FIELD_MANAGER = "rocmtrain-tests"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CIDR = "10.96.0.0/16"

GPU_RESOURCE = "amd.com/gpu"
FAKE_NODE_COUNT = 2
# Labels as AMD's node labeller publishes them for an MI300X (OAM) node.
AMD_MI300X_LABELS = {
    "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM",
    "amd.com/gpu.family": "AI",
    "amd.com/gpu.vram": "192G",
    "amd.com/gpu.device-id": "74a1",
    "amd.com/gpu.cu-count": "304",
    "amd.com/gpu.simd-count": "1216",
    "amd.com/gpu.driver-version": "6.10.5",
    "amd.com/gpu.compute-partitioning-mode": "spx",
    "amd.com/gpu.memory-partitioning-mode": "nps1",
}


# libyaml parses KubeRay's multi-MB CRDs ~10x faster than the pure-Python loader.
_YamlLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_UTC = dt.timezone(dt.timedelta(0))  # datetime.UTC needs Python 3.11


class ClusterError(RuntimeError):
    """The control plane could not be started or reached."""


# --------------------------------------------------------------------------
# certificates


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _issue(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    server_sans: Iterable[str] = (),
    client: bool = False,
) -> x509.Certificate:
    """Sign a certificate for ``key`` (self-signed CA when ``ca`` is None)."""
    now = dt.datetime.now(_UTC)
    issuer_name, signer = (ca[0].subject, ca[1]) if ca else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
    )
    if ca is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        builder = builder.add_extension(CA_KEY_USAGE, critical=True)
    else:
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [ExtendedKeyUsageOID.SERVER_AUTH]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    sans: list[x509.GeneralName] = []
    for san in server_sans:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(san)))
        except ValueError:
            sans.append(x509.DNSName(san))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _write(path: Path, data: bytes | str, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)
    return path


def _kubeconfig(server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str) -> str:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "rocmtrain-test", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}
        ],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)}}],
        "contexts": [{"name": "rocmtrain-test", "context": {"cluster": "rocmtrain-test", "user": user}}],
        "current-context": "rocmtrain-test",
    }
    return yaml.safe_dump(doc, sort_keys=False)


class _Pki:
    """Certificates and keys for one control plane, written under ``dir``."""

    def __init__(self, pki_dir: Path) -> None:
        self.dir = pki_dir
        ca_key = _new_key()
        ca = _issue(_name("rocmtrain-test-ca"), ca_key, None)
        self.ca_pem = _cert_pem(ca)
        self.ca_crt = _write(pki_dir / "ca.crt", self.ca_pem, 0o644)
        self.ca_key = _write(pki_dir / "ca.key", _key_pem(ca_key))

        key = _new_key()
        sans = [
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            str(next(ipaddress.ip_network(SERVICE_CIDR).hosts())),
        ]
        cert = _issue(_name("kube-apiserver"), key, (ca, ca_key), server_sans=sans)
        self.apiserver_crt = _write(pki_dir / "apiserver.crt", _cert_pem(cert), 0o644)
        self.apiserver_key = _write(pki_dir / "apiserver.key", _key_pem(key))

        sa_key = _new_key()
        self.sa_key = _write(pki_dir / "sa.key", _key_pem(sa_key))
        self.sa_pub = _write(
            pki_dir / "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            0o644,
        )
        self._ca = (ca, ca_key)

    def client(self, name: str, cn: str, org: str | None = None) -> tuple[bytes, bytes, Path, Path]:
        """Issue a client certificate; return (cert PEM, key PEM, cert path, key path)."""
        key = _new_key()
        cert = _issue(_name(cn, org), key, self._ca, client=True)
        cert_pem, key_pem = _cert_pem(cert), _key_pem(key)
        return (
            cert_pem,
            key_pem,
            _write(self.dir / f"{name}.crt", cert_pem, 0o644),
            _write(self.dir / f"{name}.key", key_pem),
        )


# --------------------------------------------------------------------------
# processes


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def _die_with_parent() -> None:
    """preexec_fn: own process group, and SIGKILL when the Python process dies (Linux)."""
    os.setsid()
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
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


def _kill_groups(pgids: Iterable[int], grace: float = 10.0, children: Iterable[subprocess.Popen[bytes]] = ()) -> None:
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
            if not _group_alive(pgid):
                remaining.remove(pgid)
        time.sleep(0.05)
    for pgid in remaining:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for proc in procs.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _stop_processes(procs: dict[str, subprocess.Popen[bytes]] | dict[str, int]) -> None:
    """Stop the control plane one process at a time, clients first: the apiserver
    shuts down in ~1 s once the controller-manager is gone (5 s+ if both go at once),
    and hangs without etcd.
    """
    order = [*reversed(BINARIES), *(n for n in procs if n not in BINARIES)]
    for name in order:
        proc = procs.get(name)
        if isinstance(proc, subprocess.Popen):
            _kill_groups([proc.pid], children=[proc])
        elif proc is not None:
            _kill_groups([proc])


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --------------------------------------------------------------------------
# API helpers (generic REST on top of the sync `kubernetes` client)


def request(
    api: k8s.ApiClient,
    method: str,
    path: str,
    *,
    query: dict[str, str] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float = 30,
) -> dict[str, Any]:
    """Send one REST call; return the decoded JSON body, raise ApiException on non-2xx."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
        # The REST layer JSON-encodes bodies sent as JSON; other types go as text.
        if "json" not in content_type and not isinstance(body, (str, bytes)):
            body = json.dumps(body)
    _m, url, hdrs, ser_body, _ = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=list((query or {}).items()),
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(method, url, header_params=hdrs, body=ser_body, _request_timeout=timeout)
    resp.read()
    if not 200 <= resp.status <= 299:
        raise ApiException.from_response(http_resp=resp, body=resp.data.decode(errors="replace"), data=None)
    return json.loads(resp.data) if resp.data else {}


def _api_message(err: ApiException) -> str:
    """The ``message`` of a Status body, else the raw body."""
    try:
        return str(json.loads(err.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return str(err.body or err)


def load_documents(source: str | Path | dict[str, Any] | Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Objects from a YAML file path, a YAML string, a dict or a list of dicts."""
    if isinstance(source, dict):
        return [source]
    if isinstance(source, Path):
        source = source.read_text()
    docs = list(yaml.load_all(source, Loader=_YamlLoader)) if isinstance(source, str) else list(source)
    out: list[dict[str, Any]] = []
    for doc in docs:
        if not doc:
            continue
        if doc.get("kind", "").endswith("List") and "items" in doc:
            out.extend(doc["items"])
        else:
            out.append(doc)
    return out


def _load_cached(path: Path) -> list[dict[str, Any]]:
    """:func:`load_documents` of a YAML file through a JSON cache beside it."""
    cached = path.with_name(f".{path.name}.json")
    try:
        if cached.stat().st_mtime_ns >= path.stat().st_mtime_ns:
            return list(json.loads(cached.read_text()))
    except (OSError, ValueError):
        pass
    docs = load_documents(path)
    with contextlib.suppress(OSError):
        tmp = cached.with_name(f"{cached.name}.{os.getpid()}")
        tmp.write_text(json.dumps(docs))
        tmp.replace(cached)
    return docs


class KubeCluster:
    """A running (local or external) cluster, as the tests see it."""

    def __init__(self, kubeconfig: Path, *, workdir: Path | None = None, external: bool = False) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.external = external
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.fake_nodes: list[str] = []
        self.crd_errors: dict[str, str] = {}
        self.namespaces: list[str] = []
        self._resources: dict[str, list[dict[str, Any]]] = {}
        self._api: k8s.ApiClient | None = None
        self._api_lock = threading.Lock()
        self._stopped = False
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        self.server: str = cfg.host

    # ---- clients ------------------------------------------------------------

    def api_client(self) -> k8s.ApiClient:
        """A new sync ``kubernetes`` ApiClient for this cluster (close it when done)."""
        return k8s_config.new_client_from_config(config_file=str(self.kubeconfig))

    @property
    def api(self) -> k8s.ApiClient:
        """A shared ApiClient owned by this object."""
        with self._api_lock:
            if self._api is None:
                self._api = self.api_client()
            return self._api

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """Generic REST call on the shared client; see :func:`request`."""
        return request(self.api, method, path, **kwargs)

    # ---- apply -------------------------------------------------------------

    def _resource(self, api_version: str, kind: str) -> dict[str, Any]:
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        for refresh in (False, True):
            if refresh or api_version not in self._resources:
                try:
                    self._resources[api_version] = self.request("GET", base)["resources"]
                except ApiException as e:
                    if e.status != 404 or refresh:
                        raise
                    self._resources[api_version] = []
                    continue
            for res in self._resources[api_version]:
                if res["kind"] == kind and "/" not in res["name"]:
                    return {"base": base, **res}
        raise ClusterError(f"no resource for {api_version} {kind} on {self.server}")

    def path_for(self, obj: dict[str, Any], namespace: str | None = None, *, named: bool = True) -> str:
        """REST path of ``obj`` (its collection when ``named`` is False)."""
        res = self._resource(obj["apiVersion"], obj["kind"])
        path = res["base"]
        if res["namespaced"]:
            ns = obj.get("metadata", {}).get("namespace") or namespace or "default"
            path += f"/namespaces/{ns}"
        path += f"/{res['name']}"
        if named:
            path += f"/{obj['metadata']['name']}"
        return path

    def apply(
        self,
        source: str | Path | dict[str, Any] | Iterable[dict[str, Any]],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
    ) -> list[dict[str, Any]]:
        """Server-side apply every object in ``source`` (YAML text, file, dict(s))."""
        query = {"fieldManager": FIELD_MANAGER, "force": "true"}
        if dry_run:
            query["dryRun"] = "All"
        return [
            self.request(
                "PATCH",
                self.path_for(obj, namespace),
                query=query,
                body=obj,
                content_type="application/apply-patch+yaml",
            )
            for obj in load_documents(source)
        ]

    apply_yaml = apply

    def create(self, obj: dict[str, Any], namespace: str | None = None, *, dry_run: bool = False) -> dict[str, Any]:
        """POST one object; raises ApiException (e.g. 422 on validation errors)."""
        query = {"fieldManager": FIELD_MANAGER}
        if dry_run:
            query["dryRun"] = "All"
        return self.request("POST", self.path_for(obj, namespace, named=False), query=query, body=obj)

    def delete(self, obj: dict[str, Any], namespace: str | None = None, *, propagation: str = "Background") -> None:
        """Delete one object (ignored when already gone)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        with contextlib.suppress(ApiException):
            self.request("DELETE", self.path_for(obj, namespace), body=body)

    def new_namespace(self, prefix: str = "test") -> str:
        """Create a uniquely named namespace and return its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        self.namespaces.append(name)
        return name

    def service_account_kubeconfig(self, namespace: str, account: str, path: Path, seconds: int = 7200) -> Path:
        """Write a standalone kubeconfig holding a TokenRequest token of `namespace/account` to `path`."""
        token = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )["status"]["token"]
        cluster = yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]
        if "certificate-authority" in cluster:  # inline a CA file, so the kubeconfig stands alone
            ca = Path(cluster.pop("certificate-authority")).read_bytes()
            cluster = {**cluster, "certificate-authority-data": base64.b64encode(ca).decode()}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": cluster}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": account, "context": {"cluster": "cluster", "user": account}}],
            "current-context": account,
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    # ---- bootstrap ----------------------------------------------------------

    def install_crds(
        self,
        paths: Iterable[Path],
        timeout: float = 60,
        errors: dict[str, str] | None = None,
        *,
        cache: bool = False,
    ) -> list[str]:
        """Apply CRD files and wait until each CRD is Established; return their names.

        With ``errors``, a file the server rejects is recorded there (file name ->
        server message) instead of raising. ``cache`` keeps a parsed JSON copy
        beside each file (for the large KubeRay CRDs in the binaries folder).
        """

        def install(path: Path) -> list[dict[str, Any]]:
            docs = _load_cached(path) if cache else load_documents(path)
            try:
                for obj in docs:
                    self.apply(obj)
            except ApiException as e:
                if errors is None:
                    raise
                errors[path.name] = _api_message(e)
                return []
            return docs

        # In parallel: the apiserver spends its time per CRD, and has 2+ cores.
        with ThreadPoolExecutor(max_workers=4) as pool:
            crds = [crd for docs in pool.map(install, paths) for crd in docs]
        # Established CRDs (and only those) are listed in discovery; polling it
        # is far cheaper than re-reading multi-MB CRD objects.
        wanted = {
            (f"/apis/{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["plural"])
            for crd in crds
            for v in crd["spec"]["versions"]
            if v.get("served", True)
        }

        def established() -> bool:
            for base, plural in sorted(wanted):
                if plural not in {r["name"] for r in self.request("GET", base)["resources"]}:
                    return False
                wanted.discard((base, plural))
            return True

        names = [crd["metadata"]["name"] for crd in crds]
        self.wait_for(established, timeout, f"CRDs to be Established: {names}", interval=0.05)
        self._resources.clear()

        # The apiserver builds a CRD's validators on its first request (seconds
        # for KubeRay's); do that here, in parallel, rather than in some test.
        def warm(crd: dict[str, Any]) -> None:
            version = next(v["name"] for v in crd["spec"]["versions"] if v.get("served", True))
            plural = crd["spec"]["names"]["plural"]
            self.request("GET", f"/apis/{crd['spec']['group']}/{version}/{plural}", query={"limit": "1"})

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(warm, crds))
        return names

    def register_fake_nodes(self, count: int = FAKE_NODE_COUNT, gpus: int = 8) -> list[str]:
        """Create Ready nodes advertising ``gpus`` x ``amd.com/gpu`` (MI300X labels)."""
        names = []
        for i in range(count):
            name = f"fake-mi300x-{i}"
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "fake-mi300x-8",
                **AMD_MI300X_LABELS,
            }
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
            self.apply(node)
            resources = {
                "cpu": "192",
                "memory": "2Ti",
                "pods": "110",
                "ephemeral-storage": "1Ti",
                GPU_RESOURCE: str(gpus),
            }
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

            def cond(kind: str, status: str, reason: str, at: str = now) -> dict[str, str]:
                return {
                    "type": kind,
                    "status": status,
                    "reason": reason,
                    "lastHeartbeatTime": at,
                    "lastTransitionTime": at,
                }

            status = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name},
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "conditions": [
                        cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                        cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                        cond("PIDPressure", "False", "KubeletHasSufficientPID"),
                        cond("Ready", "True", "KubeletReady"),
                    ],
                    "addresses": [
                        {"type": "InternalIP", "address": f"127.0.1.{i + 1}"},
                        {"type": "Hostname", "address": name},
                    ],
                    "nodeInfo": {
                        "architecture": "amd64",
                        "operatingSystem": "linux",
                        "osImage": "Ubuntu 22.04.4 LTS",
                        "kernelVersion": "5.15.0-116-generic",
                        "containerRuntimeVersion": "containerd://1.7.19",
                        "kubeletVersion": "v1.36.3",
                        "kubeProxyVersion": "",
                        "machineID": "",
                        "systemUUID": "",
                        "bootID": "",
                    },
                },
            }
            self.request(
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                query={"fieldManager": FIELD_MANAGER, "force": "true"},
                body=status,
                content_type="application/apply-patch+yaml",
            )
            # Admission (TaintNodesByCondition) taints new nodes not-ready; without
            # a node-lifecycle controller nothing would lift it.
            self.request(
                "PATCH",
                f"/api/v1/nodes/{name}",
                body={"spec": {"taints": None}},
                content_type="application/merge-patch+json",
            )
            names.append(name)
        self.fake_nodes = names
        return names

    def wait_for(self, check: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
        """Poll ``check`` until it returns True; raise ClusterError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(ApiException):
                if check():
                    return
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(interval)

    def bootstrap(self, *, fake_nodes: bool) -> None:
        """Install CRDs (ours and KubeRay's) and, if asked, the fake GPU nodes.

        A CRD of ours that the server rejects does not stop the cluster: it is
        recorded in :attr:`crd_errors` so that tests of the
        control plane itself still run and CRD tests fail with the server's message.
        """
        kuberay = sorted(KUBERAY_CRDS_DIR.glob("*.yaml"))
        if not kuberay:
            raise ClusterError(f"no KubeRay CRDs in {KUBERAY_CRDS_DIR}; run `make cluster-binaries`")
        ours = sorted(CRDS_DIR.glob("*.yaml"))
        with ThreadPoolExecutor(max_workers=2) as pool:
            done = [
                pool.submit(self.install_crds, kuberay, cache=True),
                pool.submit(self.install_crds, ours, errors=self.crd_errors),
            ]
            for future in done:
                future.result()
        if fake_nodes:
            self.register_fake_nodes()

    # ---- lifecycle -----------------------------------------------------------

    def stop(self) -> None:
        """Local: stop the processes and remove the workdir. External: delete what tests created here."""
        if self._stopped:
            return
        self._stopped = True
        if self.external:  # leave the cluster as found, but for the CRDs
            for name in self.namespaces:
                self.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
            for name in self.fake_nodes:
                self.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        if self._api is not None:
            with contextlib.suppress(Exception):
                self._api.close()
        if self.external:
            return
        _stop_processes(self.processes)
        if self.workdir is not None and self.workdir.name.startswith("rocmtrain-kube-"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> KubeCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------
# starting


def binaries_present() -> bool:
    """Whether ``make cluster-binaries`` has produced everything."""
    return all((BIN_DIR / b).is_file() for b in BINARIES) and any(KUBERAY_CRDS_DIR.glob("*.yaml"))


def _https_ready(url: str, ctx: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as r:  # noqa: S310
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_local(
    workdir: Path | None = None,
    *,
    kubeconfig_path: Path | None = None,
    detach: bool = False,
    timeout: float = 90,
) -> KubeCluster:
    """Start etcd, kube-apiserver and kube-controller-manager; return the cluster.

    ``detach`` keeps the processes alive after this Python process exits
    (for ``up``); otherwise the kernel kills them with it (PR_SET_PDEATHSIG,
    which fires when the calling *thread* ends: call this from a long-lived one).
    """
    if not binaries_present():
        raise ClusterError(f"control-plane binaries missing in {BIN_DIR}; run `make cluster-binaries`")
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="rocmtrain-kube-"))
    workdir.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    pki = _Pki(workdir / "pki")
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with open(logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [str(BIN_DIR / name), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                start_new_session=detach,
                preexec_fn=None if detach else _die_with_parent,
            )
        procs[name] = proc
        return proc

    def wait(name: str, check: Callable[[], bool], limit: float) -> None:
        deadline = time.monotonic() + limit
        while not check():
            proc = procs[name]
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with {proc.returncode}:\n{_log_tail(logs / f'{name}.log')}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{name} not ready after {limit}s:\n{_log_tail(logs / f'{name}.log')}")
            time.sleep(0.05)

    try:
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        spawn(
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
        wait("etcd", lambda: _http_ok(f"{etcd_url}/health"), 30)

        server = f"https://127.0.0.1:{api_port}"
        spawn(
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
        kcm_cert, kcm_key, *_ = pki.client("kcm", "system:kube-controller-manager")
        ctx = ssl.create_default_context(cafile=str(pki.ca_crt))
        ctx.load_cert_chain(str(admin_crt_path), str(admin_key_path))
        wait("kube-apiserver", lambda: _https_ready(f"{server}/readyz", ctx), timeout)

        kcm_kubeconfig = _write(
            workdir / "kube-controller-manager.kubeconfig",
            _kubeconfig(server, pki.ca_pem, kcm_cert, kcm_key, "system:kube-controller-manager"),
        )
        spawn(
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
                # No kubelets: keep the fake nodes Ready and untainted.
                "--controllers=*,-node-lifecycle-controller",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
                "--profiling=false",
                "--v=1",
            ],
        )

        kubeconfig_path = kubeconfig_path or workdir / "kubeconfig"
        _write(kubeconfig_path, _kubeconfig(server, pki.ca_pem, admin_cert, admin_key, "kubernetes-admin"))
        cluster = KubeCluster(kubeconfig_path, workdir=workdir)
        cluster.processes = procs
    except BaseException:
        _stop_processes(procs)
        if not detach:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    return cluster


def _wait_controller_manager(cluster: KubeCluster, timeout: float) -> None:
    """Wait until kube-controller-manager has created the default ServiceAccount."""
    proc = cluster.processes.get("kube-controller-manager")

    def ready() -> bool:
        if proc is not None and proc.poll() is not None:
            log = cluster.workdir / "logs" / "kube-controller-manager.log" if cluster.workdir else Path()
            raise ClusterError(f"kube-controller-manager exited with {proc.returncode}:\n{_log_tail(log)}")
        cluster.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
        return True

    cluster.wait_for(ready, timeout, "kube-controller-manager (default ServiceAccount)")


def open_cluster(
    *, detach: bool = False, kubeconfig_path: Path | None = None, workdir: Path | None = None
) -> KubeCluster:
    """The test cluster: external when $ROCMTRAIN_TEST_KUBECONFIG is set, else a local one.

    The returned cluster has our and KubeRay's CRDs installed and (local, or
    external with $ROCMTRAIN_TEST_FAKE_NODES=1) fake MI300X nodes.
    """
    external = os.environ.get(EXTERNAL_KUBECONFIG_ENV)
    if external:
        path = Path(external).expanduser()
        if not path.is_file():
            raise ClusterError(f"${EXTERNAL_KUBECONFIG_ENV}={external} is not a file")
        cluster = KubeCluster(path, external=True)
        try:
            cluster.bootstrap(fake_nodes=os.environ.get(FAKE_NODES_ENV) == "1")
        except BaseException:
            cluster.stop()
            raise
        return cluster
    cluster = start_local(workdir, kubeconfig_path=kubeconfig_path, detach=detach)
    try:
        cluster.bootstrap(fake_nodes=True)
        _wait_controller_manager(cluster, 60)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _report_crd_errors(cluster: KubeCluster) -> None:
    for name, message in cluster.crd_errors.items():
        warnings.warn(f"crds/{name} rejected by kube-apiserver: {message}", stacklevel=1)


@contextlib.contextmanager
def running_cluster() -> Iterator[KubeCluster]:
    """Context manager around :func:`open_cluster`; stops it on exit and at interpreter exit."""
    cluster = open_cluster()
    atexit.register(cluster.stop)
    _report_crd_errors(cluster)
    try:
        yield cluster
    finally:
        cluster.stop()
        atexit.unregister(cluster.stop)


# --------------------------------------------------------------------------
# CLI: up / down


def _read_pids() -> list[tuple[str, int]]:
    if not PIDS_FILE.is_file():
        return []
    out = []
    for line in PIDS_FILE.read_text().splitlines():
        name, _, pid = line.partition(" ")
        if pid.strip().isdigit():
            out.append((name, int(pid)))
    return out


def _is_ours(name: str, pid: int) -> bool:
    """Whether ``pid`` still runs our ``name`` binary (guards against PID reuse)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True  # no /proc: trust the pid file
    return Path(exe.removesuffix(" (deleted)")).name == name


def down() -> int:
    """Stop the processes recorded in .cluster/pids and remove the cluster state."""
    pids = {name: pid for name, pid in _read_pids() if _is_ours(name, pid)}
    _stop_processes(pids)
    stopped = len(pids)
    PIDS_FILE.unlink(missing_ok=True)
    KUBECONFIG_FILE.unlink(missing_ok=True)
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    print(f"stopped {stopped} process(es)")
    return 0


def up() -> int:
    """Start a detached control plane for people; print the kubeconfig path."""
    running = [(n, p) for n, p in _read_pids() if _is_ours(n, p)]
    if running and KUBECONFIG_FILE.is_file():
        print(f"already running; kubeconfig: {KUBECONFIG_FILE}")
        return 0
    if running:
        down()
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    start = time.monotonic()
    cluster = start_local(STATE_DIR, kubeconfig_path=KUBECONFIG_FILE, detach=True)
    PIDS_FILE.write_text("".join(f"{name} {proc.pid}\n" for name, proc in cluster.processes.items()))
    try:
        cluster.bootstrap(fake_nodes=True)
        _wait_controller_manager(cluster, 60)
    except BaseException:
        down()
        raise
    for name, message in cluster.crd_errors.items():
        print(f"warning: crds/{name} rejected by kube-apiserver: {message}", file=sys.stderr)
    print(f"control plane up in {time.monotonic() - start:.1f}s at {cluster.server} (logs: {STATE_DIR / 'logs'})")
    print(f"export KUBECONFIG={KUBECONFIG_FILE}")
    print(KUBECONFIG_FILE)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``up`` or ``down``."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["up"]:
        return up()
    if args == ["down"]:
        return down()
    print("usage: kubecluster.py up|down", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
