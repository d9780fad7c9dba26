"""An aiohttp application served over TLS within bounds: the listener both servers share (progress, `/metrics`)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web


class _Refused(asyncio.Protocol):
    """A connection over the cap: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def capped(factory: web.Server, limit: int) -> Callable[[], asyncio.BaseProtocol]:
    """`factory` (aiohttp's protocol factory) refusing connections beyond `limit` open ones."""

    def make() -> asyncio.BaseProtocol:
        return _Refused() if len(factory.connections) >= limit else factory()

    return make


@dataclass(frozen=True)
class Bounds:
    """What connections may hold before they prove anything: how many are open at once, and how long
    each has for its TLS handshake and for each request's headers (also before the first)."""

    max_connections: int
    header_timeout: float
    handshake_timeout: float


class TlsSite:
    """An aiohttp application served over TLS within `Bounds` (`start`); `stop` closes it."""

    def __init__(self, runner: web.AppRunner, listener: asyncio.Server) -> None:
        self._runner, self._listener = runner, listener

    @classmethod
    async def start(
        cls, app: web.Application, host: str, port: int, context: ssl.SSLContext, bounds: Bounds
    ) -> TlsSite:
        """Serve `app` on `host`:`port`; a handler is cancelled when its client goes away."""
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, keepalive_timeout=bounds.header_timeout)
        await runner.setup()
        assert runner.server is not None
        try:
            listener = await asyncio.get_running_loop().create_server(
                capped(runner.server, bounds.max_connections),
                host,
                port,
                ssl=context,
                ssl_handshake_timeout=bounds.handshake_timeout,
                reuse_address=True,
            )
        except BaseException:
            await runner.cleanup()
            raise
        return cls(runner, listener)

    async def stop(self) -> None:
        """Stop listening and close the open connections."""
        self._listener.close()
        await self._runner.cleanup()
