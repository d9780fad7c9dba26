"""The operator's `/metrics` server: HTTPS with every scrape authenticated and authorised, or plain HTTP on loopback.

Secure (`serve(..., secure=Secure(...))`, the default wherever the progress endpoint
runs): the endpoint's TLS context, which its refresher keeps serving the current
certificate (which names the metrics Service too), within connection bounds, and a
`MetricsAccess` deciding each scrape before anything is collected: 401 without a token
the API server accepts, 403 for a user who may not `get` `/metrics`, 429 over the review
budget, 503 when the API server does not answer. Plain: HTTP for an operator run by hand
or behind an authenticating proxy beside it; the configuration allows it on loopback only.
Either way the metrics are collected in a thread (`prometheus.exposition`).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from rocmtrain.metrics.access import METRICS_PATH
from rocmtrain.metrics.prometheus import exposition
from rocmtrain.serving.errors import Refusal
from rocmtrain.serving.site import Bounds, TlsSite

log = logging.getLogger(__name__)

# A scraper keeps one connection or two: a few dozen is plenty.
BOUNDS = Bounds(max_connections=64, header_timeout=15.0, handshake_timeout=10.0)

# access(Authorization header, source address): returns when the scrape may read the metrics, else raises a Refusal.
Access = Callable[[str, str], Awaitable[None]]
Stop = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Secure:
    """What HTTPS serving takes: the server's TLS context and who decides each scrape."""

    context: ssl.SSLContext
    access: Access


def metrics_app(access: Access | None) -> web.Application:
    """The application serving `/metrics`, each scrape first put to `access` when given."""

    async def scrape(request: web.Request) -> web.Response:
        if access is not None:
            try:
                await access(request.headers.get("Authorization", ""), request.remote or "")
            except Refusal as refusal:
                level = logging.INFO if refusal.status == HTTPStatus.FORBIDDEN else logging.DEBUG
                log.log(level, "metrics scrape refused: %d %s", refusal.status, refusal)
                return web.Response(status=refusal.status, text=f"{refusal}\n", headers=refusal.answer_headers())
        return web.Response(body=await exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get(METRICS_PATH, scrape)
    return app


async def serve(host: str, port: int, secure: Secure | None) -> Stop:
    """Serve `/metrics` on `host`:`port`, over HTTPS when `secure` is given; what stops it."""
    if secure is not None:
        site = await TlsSite.start(metrics_app(secure.access), host, port, secure.context, BOUNDS)
        log.info("metrics served over HTTPS on %s:%s, each scrape authenticated", host, port)
        return site.stop
    runner = web.AppRunner(metrics_app(None), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("metrics served over plain HTTP on %s:%s", host, port)
    return runner.cleanup
