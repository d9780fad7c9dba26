"""A fault-injecting TLS proxy in front of kube-apiserver, on 127.0.0.1.

The proxy terminates TLS with a certificate the test cluster's CA signs (the harness
keeps the CA key in its pki folder), so a kubeconfig pointing at it verifies as
usual, and forwards each request to the API server with the client's own bearer
token. `fault` decides per request (method and path with query) what happens:
None forwards it; `Fault.status(code)` answers with a Kubernetes Status of that code;
`Fault.hang()` never answers (the request stays hung until the proxy stops, even
after the faults are switched off); `Fault.delay(s)` forwards after `s` seconds;
`Fault.drop()` closes the connection without an answer. `drop_connections` breaks
every open connection at once (watches included). Every request is recorded.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from progress.endpoint import LoopThread
from rocmtrain_testworld.kubecluster import KubeCluster, free_port

# Hop-by-hop headers, and those aiohttp sets itself.
_SKIP_REQUEST = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}
_SKIP_RESPONSE = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}


@dataclass(frozen=True)
class Fault:
    """What the proxy does with one request instead of forwarding it at once."""

    kind: str  # "status", "hang", "delay" or "drop"
    value: float = 0

    @classmethod
    def status(cls, code: int) -> Fault:
        return cls("status", code)

    @classmethod
    def hang(cls) -> Fault:
        return cls("hang")

    @classmethod
    def delay(cls, seconds: float) -> Fault:
        return cls("delay", seconds)

    @classmethod
    def drop(cls) -> Fault:
        return cls("drop")


Decide = Callable[[str, str], Fault | None]


@dataclass
class Seen:
    """One request through the proxy."""

    method: str
    path: str
    outcome: str  # "forwarded", or the fault's kind (and code)
    at: float = field(default=0.0)


def _serving_cert(kube: KubeCluster, folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, signed by the test cluster's CA."""
    assert kube.workdir is not None, "the proxy needs the local control plane's CA key"
    pki = kube.workdir / "pki"
    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fault-proxy")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    crt, pem = folder / "proxy.crt", folder / "proxy.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return crt, pem


class FaultProxy(LoopThread):
    """The proxy, serving from its own event loop thread; `fault` may be swapped at any time."""

    def __init__(self, kube: KubeCluster, folder: Path) -> None:
        super().__init__()
        assert kube.workdir is not None
        self.kube = kube
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.fault: Decide = lambda method, path: None
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._crt, self._key = _serving_cert(kube, folder)
        self._ca = kube.workdir / "pki" / "ca.crt"
        self._released: asyncio.Event | None = None
        self._transports: set[asyncio.Transport] = set()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.run(self._start())

    # ---- control (from the test's thread) ---------------------------------------------

    def kubeconfig(self, source: Path, path: Path) -> Path:
        """`source` (a kubeconfig of the test cluster) with its server pointed at the proxy."""
        config = yaml.safe_load(source.read_text())
        for entry in config["clusters"]:
            entry["cluster"]["server"] = self.url
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def requests(self, method: str, path_part: str, since: float = 0.0) -> list[Seen]:
        """The recorded requests of `method` whose path contains `path_part`, from `since` (monotonic) on."""
        with self._lock:
            return [s for s in self.seen if s.method == method and path_part in s.path and s.at >= since]

    def drop_connections(self) -> None:
        """Break every open client connection (watches and hung requests alike)."""
        self.loop.call_soon_threadsafe(self._drop_all)

    def stop(self) -> None:
        self.run(self._stop())
        self.close()

    # ---- the loop's side ----------------------------------------------------------------

    async def _start(self) -> None:
        self._released = asyncio.Event()
        upstream = ssl.create_default_context(cafile=str(self._ca))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ssl=upstream), timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # Cancel a handler whose client went (a forwarded watch would wait for its upstream otherwise).
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=2)
        await self._runner.setup()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self._crt, self._key)
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=context).start()

    async def _stop(self) -> None:
        assert self._released is not None and self._runner is not None and self._session is not None
        self._released.set()
        self._drop_all()
        await self._session.close()  # ends the forwarded watches
        await self._runner.cleanup()

    def _drop_all(self) -> None:
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()

    def _record(self, method: str, path: str, outcome: str) -> None:
        with self._lock:
            self.seen.append(Seen(method, path, outcome, self.loop.time()))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._released is not None and self._session is not None
        transport = request.transport
        if transport is not None:
            self._transports.add(transport)  # type: ignore[arg-type]
        try:
            fault = self.fault(request.method, request.path_qs)
            self._record(request.method, request.path_qs, "forwarded" if fault is None else f"{fault.kind}")
            if fault is not None and fault.kind == "status":
                code = int(fault.value)
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "message": "fault"}
                return web.json_response(status, status=code, headers={"Retry-After": "1"} if code == 429 else None)
            if fault is not None and fault.kind == "hang":
                await self._released.wait()
                raise ConnectionResetError("the proxy stopped")
            if fault is not None and fault.kind == "drop":
                if transport is not None:
                    transport.abort()
                raise ConnectionResetError("dropped")
            if fault is not None and fault.kind == "delay":
                await asyncio.sleep(fault.value)
            return await self._forward(request)
        finally:
            if transport is not None:
                self._transports.discard(transport)  # type: ignore[arg-type]

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _SKIP_REQUEST}
        headers["Accept-Encoding"] = "identity"
        body = await request.read()
        async with self._session.request(
            request.method, self.kube.server + request.path_qs, headers=headers, data=body or None
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _SKIP_RESPONSE},
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
