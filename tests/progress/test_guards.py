"""What a client without a valid token can hold: connections, time, handlers (the real listener, no cluster).

The endpoint runs as `ProgressServer` serves it (TLS, the connection cap, the header
timeout, handler cancellation), with an in-memory authenticator that waits until
told, so that a request stays in its handler as long as the test wants.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio import client

from rocmtrain.api.contract import progress_path
from rocmtrain.progress import tls
from rocmtrain.progress.auth import Identity
from rocmtrain.progress.server import ProgressServer, ProgressServerConfig, make_app
from rocmtrain.serving.errors import Unauthenticated
from rocmtrain.serving.rate import RateLimiter
from rocmtrain_testworld.kubecluster import free_port

HEADER_TIMEOUT = 1.5
MAX_CONNECTIONS = 4


@dataclass
class SlowAuth:
    """An authenticator that waits for `release`; records whether its wait was cancelled."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, token: str) -> Identity:
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise Unauthenticated("token not accepted")


class NoJobs:
    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        raise AssertionError("nothing is written")


async def _authorise(identity: Identity, job: Mapping[str, Any]) -> None:
    return None


@pytest.fixture
async def served() -> AsyncIterator[tuple[ProgressServer, SlowAuth, ssl.SSLContext]]:
    cfg = ProgressServerConfig(
        namespace="rocm-train-system",
        host="127.0.0.1",
        port=free_port(),
        advertise_host="localhost",
        header_timeout=HEADER_TIMEOUT,
        handshake_timeout=HEADER_TIMEOUT,
        max_connections=MAX_CONNECTIONS,
    )
    data = tls.plan_secret(None, cfg.hosts, dt.datetime.now(dt.UTC))
    assert data is not None
    material = tls.TlsMaterial(data["ca.crt"], data["tls.crt"], data["tls.key"])
    api = client.ApiClient(client.Configuration())  # never used: no refresh within the test
    server = ProgressServer(cfg, api, material, own_api=True)
    auth = SlowAuth()
    app = make_app(
        authenticate=auth, authorise=_authorise, jobs=NoJobs(), limiter=RateLimiter(), sources=RateLimiter(100, 100)
    )
    await server.start(app)
    try:
        yield server, auth, ssl.create_default_context(cadata=data["ca.crt"].decode())
    finally:
        auth.release.set()
        await server.stop()


async def _open(server: ProgressServer, context: ssl.SSLContext) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.config.port, ssl=context, server_hostname="localhost")


def _request(token: str) -> bytes:
    body = json.dumps({"progress": {"step": 1}}).encode()
    head = (
        f"POST {progress_path('team-a', 'job1')} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def test_headers_that_never_finish_lose_their_connection(served):
    server, _, context = served
    reader, writer = await _open(server, context)
    writer.write(b"POST /v1/namespaces/a/rocmtrainingjobs/b/progress HTTP/1.1\r\nHost: localhost\r\n")
    await writer.drain()
    start = time.monotonic()
    assert await asyncio.wait_for(reader.read(), timeout=HEADER_TIMEOUT + 5) == b"", "closed without an answer"
    assert time.monotonic() - start < HEADER_TIMEOUT + 2
    writer.close()


async def test_connections_beyond_the_cap_are_closed_at_once(served):
    server, auth, context = served
    auth.release.set()
    held = [await _open(server, context) for _ in range(MAX_CONNECTIONS)]
    await asyncio.sleep(0.1)
    reader, writer = await _open(server, context)
    assert await asyncio.wait_for(reader.read(), timeout=2) == b"", "the fifth connection is refused"
    writer.close()
    for _, held_writer in held:
        held_writer.close()
    await asyncio.sleep(0.2)
    reader, writer = await _open(server, context)
    writer.write(_request("x.y.z"))
    await writer.drain()
    assert (await asyncio.wait_for(reader.readline(), timeout=5)).startswith(b"HTTP/1.1 401"), "room again"
    writer.close()


async def test_a_handler_stops_when_its_client_goes(served):
    """A client that hangs up does not keep a TokenReview (or any work) running for it."""
    server, auth, context = served
    _, writer = await _open(server, context)
    writer.write(_request("x.y.z"))
    await writer.drain()
    await asyncio.wait_for(auth.entered.wait(), timeout=5)
    writer.transport.abort()
    await asyncio.wait_for(auth.cancelled.wait(), timeout=5)


async def test_a_client_that_never_handshakes_is_dropped(served):
    server, _, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", server.config.port)  # TCP, no TLS hello
    start = time.monotonic()
    assert await asyncio.wait_for(reader.read(), timeout=HEADER_TIMEOUT + 5) == b""
    assert time.monotonic() - start < HEADER_TIMEOUT + 2
    writer.close()
