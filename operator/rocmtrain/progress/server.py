"""The progress endpoint: an HTTPS server inside the operator that records training progress.

`POST /v1/namespaces/{namespace}/rocmtrainingjobs/{name}/progress` with a
`ProgressReport` body and `Authorization: Bearer <projected SA token>` merges the
report into the job's status. Answers: 204 written; 400 malformed, non-finite or
off-schema; 401 no or bad token; 403 the token's pod is not part of this job;
404 no such job; 413 body over 16 KiB; 429 over the job's rate (Retry-After);
503 the API server did not answer. `GET /healthz` answers 200.

`make_app` builds the aiohttp application from injected parts (authenticator,
authoriser, job store, rate limiter), so it runs without kopf or a cluster.
`start_progress_server` wires the real parts and serves; the operator calls it
from a kopf startup handler and stops it on cleanup::

    config = ProgressServerConfig.from_env()  # None: the endpoint is off
    memo.progress = await start_progress_server(config, api) if config else None
    ...
    await memo.progress.publish_ca(namespace)  # before rendering a job's RayJob there
    ...
    await memo.progress.stop()  # on cleanup
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import math
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

from aiohttp import web
from kubernetes_asyncio import client

from rocmtrain.api.contract import PROGRESS_AUDIENCE, PROGRESS_BURST, PROGRESS_PATH, PROGRESS_RATE_PER_SECOND
from rocmtrain.api.models import ProgressReport
from rocmtrain.api.patterns import DNS_LABEL
from rocmtrain.kube import Kube
from rocmtrain.progress import tls
from rocmtrain.progress.auth import Identity, PodAuthoriser, TokenReviewAuthenticator
from rocmtrain.progress.errors import Conflict, Forbidden, Gone, Unauthenticated, Unavailable
from rocmtrain.progress.limits import MAX_BODY_BYTES, RateLimiter, ReportError, parse_report
from rocmtrain.progress.status_patch import progress_patch, tuning_events
from rocmtrain.progress.store import KubeJobStore
from rocmtrain.render import RenderOptions

log = logging.getLogger(__name__)

SERVICE_NAME = "rocmtrain-progress"
CONTAINER_PORT = 8443
MAX_TOKEN_BYTES = 16 * 1024
PATCH_ATTEMPTS = 3
_LABEL = re.compile(DNS_LABEL)
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
_RETRY_LATER = {"Retry-After": "5"}

Authenticate = Callable[[str], Awaitable[Identity]]
Authorise = Callable[[Identity, Mapping[str, Any]], Awaitable[None]]


class PostEvent(Protocol):
    """Posts a core/v1 Event about a job (`rocmtrain.kube.Kube.post_event`); best effort."""

    async def __call__(self, obj: Any, *, type: str, reason: str, message: str) -> None: ...


class JobStore(Protocol):
    """Where jobs are read and their status is patched."""

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job object, or None."""

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch the status subresource; raise Conflict or Gone."""


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _refuse(status: int, namespace: str, name: str, reason: str, **headers: str) -> web.HTTPException:
    """An HTTP error answer with a short reason; logged without token or body."""
    log.info("progress for %s/%s refused: %d %s", namespace, name, status, reason)
    error = web.HTTPException(
        text=json.dumps({"error": reason}), content_type="application/json", headers=headers or None
    )
    error.set_status(status)
    return error


async def _read_bounded(request: web.Request, limit: int) -> bytes | None:
    """The body, or None as soon as it proves longer than `limit` bytes."""
    body = bytearray()
    while chunk := await request.content.read(limit + 1 - len(body)):
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _bearer(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_BYTES or not token.isascii():
        return None
    return token


async def _record(
    jobs: JobStore, job: dict[str, Any], report: ProgressReport, now: Callable[[], dt.datetime]
) -> dict[str, Any]:
    """Patch `report` into the job's status, re-reading the job when it changed meanwhile; the job it patched.

    The patch carries the resourceVersion it was computed from, so a concurrent
    write (another report, the operator's own status updates) is never lost.
    Raise Gone, Unavailable, or Conflict when it keeps changing.
    """
    meta = job["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta.get("uid")
    for _ in range(PATCH_ATTEMPTS):
        patch = progress_patch(report, job.get("status"), now())
        patch["metadata"] = {"resourceVersion": job["metadata"]["resourceVersion"]}
        try:
            await jobs.patch_status(namespace, name, patch)
            return job
        except Conflict:
            fresh = await jobs.get(namespace, name)
        if fresh is None or fresh["metadata"].get("uid") != uid:
            raise Gone
        job = fresh
    raise Conflict


def make_app(
    *,
    authenticate: Authenticate,
    authorise: Authorise,
    jobs: JobStore,
    limiter: RateLimiter,
    now: Callable[[], dt.datetime] = _utcnow,
    post_event: PostEvent | None = None,
) -> web.Application:
    """The endpoint's aiohttp application, built from its parts; `post_event` announces new best trials."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def admit(request: web.Request, namespace: str, name: str) -> dict[str, Any]:
        """The job, once the request is small enough and its token may write this job."""
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            raise _refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, namespace, name, "body too large")
        token = _bearer(request)
        if token is None:
            raise _refuse(HTTPStatus.UNAUTHORIZED, namespace, name, "bearer token required", **_CHALLENGE)
        try:
            identity = await authenticate(token)
            if identity.namespace != namespace:  # before the lookup: no hint whether the job exists
                raise Forbidden("token is for another namespace")
            job = await jobs.get(namespace, name)
            if job is None:
                raise _refuse(HTTPStatus.NOT_FOUND, namespace, name, "no such job")
            await authorise(identity, job)
        except Unauthenticated as exc:
            raise _refuse(HTTPStatus.UNAUTHORIZED, namespace, name, str(exc), **_CHALLENGE) from None
        except Forbidden as exc:
            raise _refuse(HTTPStatus.FORBIDDEN, namespace, name, str(exc)) from None
        except Unavailable as exc:
            raise _refuse(HTTPStatus.SERVICE_UNAVAILABLE, namespace, name, str(exc), **_RETRY_LATER) from None
        return job

    async def progress(request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if not (_LABEL.match(namespace) and _LABEL.match(name)):
            raise _refuse(HTTPStatus.NOT_FOUND, "-", "-", "no such job")
        job = await admit(request, namespace, name)
        wait = limiter.acquire(f"{namespace}/{name}")
        if wait > 0:
            retry = str(max(1, math.ceil(wait)))
            raise _refuse(HTTPStatus.TOO_MANY_REQUESTS, namespace, name, "rate limited", **{"Retry-After": retry})
        body = await _read_bounded(request, MAX_BODY_BYTES)
        if body is None:
            raise _refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, namespace, name, "body too large")
        try:
            report = parse_report(body)
            patched = await _record(jobs, job, report, now)
        except ReportError as exc:
            raise _refuse(HTTPStatus.BAD_REQUEST, namespace, name, str(exc)) from None
        except Gone:
            raise _refuse(HTTPStatus.NOT_FOUND, namespace, name, "no such job") from None
        except Unavailable as exc:
            raise _refuse(HTTPStatus.SERVICE_UNAVAILABLE, namespace, name, str(exc), **_RETRY_LATER) from None
        except Conflict:
            raise _refuse(
                HTTPStatus.SERVICE_UNAVAILABLE, namespace, name, "job kept changing", **_RETRY_LATER
            ) from None
        if post_event is not None:
            for reason, message in tuning_events(patched.get("status"), report):
                await post_event(patched, type="Normal", reason=reason, message=message)
        return web.Response(status=204)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/healthz", healthz)
    app.router.add_post(PROGRESS_PATH, progress)
    return app


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) > 65535:
        raise ValueError(f"{name} must be a port number, not {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class ProgressServerConfig:
    """Where the endpoint listens, how jobs reach it, and its limits."""

    namespace: str
    service: str = SERVICE_NAME
    host: str = "0.0.0.0"  # noqa: S104 - a pod serves on all its interfaces
    port: int = CONTAINER_PORT
    # How training pods reach the endpoint; the Service by default.
    advertise_host: str | None = None
    advertise_port: int = 443
    audience: str = PROGRESS_AUDIENCE
    rate_per_second: float = PROGRESS_RATE_PER_SECOND
    burst: int = PROGRESS_BURST
    manage_tls: bool = True
    refresh_seconds: float = 3600.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ProgressServerConfig | None:
        """Settings from the operator Deployment's environment; None when the endpoint is off.

        `ROCMTRAIN_OPERATOR_NAMESPACE` (from the downward API) turns it on;
        `ROCMTRAIN_PROGRESS_PORT` (0 turns it off), `ROCMTRAIN_PROGRESS_ADVERTISE_HOST`
        and `ROCMTRAIN_PROGRESS_ADVERTISE_PORT` (how jobs reach it, by default the
        Service), `ROCMTRAIN_PROGRESS_MANAGE_TLS=false` (cert-manager provides the Secret).
        """
        namespace = env.get("ROCMTRAIN_OPERATOR_NAMESPACE", "").strip()
        port = _port(env, "ROCMTRAIN_PROGRESS_PORT", CONTAINER_PORT)
        if not namespace or port == 0:
            return None
        if not _LABEL.match(namespace):
            raise ValueError(f"ROCMTRAIN_OPERATOR_NAMESPACE is not a namespace name: {namespace!r}")
        return cls(
            namespace=namespace,
            port=port,
            advertise_host=env.get("ROCMTRAIN_PROGRESS_ADVERTISE_HOST", "").strip() or None,
            advertise_port=_port(env, "ROCMTRAIN_PROGRESS_ADVERTISE_PORT", 443),
            manage_tls=env.get("ROCMTRAIN_PROGRESS_MANAGE_TLS", "true").strip().lower() != "false",
        )

    @property
    def hosts(self) -> list[str]:
        """Names the serving certificate must cover."""
        names = tls.service_hosts(self.service, self.namespace)
        if self.advertise_host is None or self.advertise_host in names:
            return names
        return [*names, self.advertise_host]

    def render_options(self, base: RenderOptions) -> RenderOptions:
        """`base` with what lets a job's driver reach this endpoint: its URL, CA ConfigMap and token audience."""
        return dataclasses.replace(
            base,
            progress_base_url=self.base_url,
            progress_ca_configmap=tls.CA_CONFIGMAP,
            progress_ca_key=tls.CA_KEY,
            progress_token_audience=self.audience,
        )

    @property
    def base_url(self) -> str:
        """`https://host[:port]` of the endpoint as jobs reach it (`RenderOptions.progress_base_url`)."""
        host = self.advertise_host or f"{self.service}.{self.namespace}.svc"
        return f"https://{host}" if self.advertise_port == 443 else f"https://{host}:{self.advertise_port}"


class ProgressServer:
    """The running endpoint: its aiohttp runner, TLS material, and CA publishing."""

    def __init__(self, cfg: ProgressServerConfig, api: client.ApiClient, material: tls.TlsMaterial) -> None:
        self.config = cfg
        self._api = api
        self._material = material
        self._ssl = material.server_context()
        self._published: set[str] = set()
        self._runner: web.AppRunner | None = None
        self._refresher: asyncio.Task[None] | None = None

    @property
    def ca_crt(self) -> bytes:
        """The CA certificate (PEM) clients verify the endpoint with."""
        return self._material.ca_crt

    async def publish_ca(self, namespace: str) -> None:
        """Create or update `rocmtrain-progress-ca` in a job namespace; call before rendering a job there."""
        await tls.publish_ca(self._api, namespace, self._material.ca_crt)
        self._published.add(namespace)

    async def start(self, app: web.Application) -> None:
        """Serve `app` over TLS and start the certificate refresher."""
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.config.host, self.config.port, ssl_context=self._ssl).start()
        self._refresher = asyncio.create_task(self._refresh_forever())
        log.info("progress endpoint serving on %s:%s", self.config.host, self.config.port)

    async def refresh(self) -> None:
        """Renew or reload the serving certificate; republish the CA if it changed."""
        material = await tls.load_serving_secret(
            self._api, self.config.namespace, self.config.hosts, manage=self.config.manage_tls
        )
        if material == self._material:
            return
        material.load_into(self._ssl)
        ca_changed = material.ca_crt != self._material.ca_crt
        self._material = material
        log.info("progress endpoint certificate reloaded (CA changed: %s)", ca_changed)
        if ca_changed:
            for namespace in sorted(self._published):
                await self.publish_ca(namespace)

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.refresh_seconds)
            try:
                await self.refresh()
            except Exception:
                log.exception("progress endpoint certificate refresh failed; retrying later")

    async def stop(self) -> None:
        """Stop serving (the API client stays open: it is the caller's)."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._runner is not None:
            await self._runner.cleanup()


async def start_progress_server(cfg: ProgressServerConfig, api: client.ApiClient) -> ProgressServer:
    """Load or create the TLS Secret and serve the endpoint; stop it with `stop()`.

    `api` stays the caller's: the server uses it until stopped and never closes it.
    """
    material = await tls.load_serving_secret(api, cfg.namespace, cfg.hosts, manage=cfg.manage_tls)
    server = ProgressServer(cfg, api, material)
    app = make_app(
        authenticate=TokenReviewAuthenticator(api, cfg.audience),
        authorise=PodAuthoriser(api),
        jobs=KubeJobStore(api),
        limiter=RateLimiter(cfg.rate_per_second, cfg.burst),
        post_event=Kube(api).post_event,
    )
    await server.start(app)
    return server
