"""The progress endpoint: an HTTPS server inside the operator that records training progress.

`POST /v1/namespaces/{namespace}/rocmtrainingjobs/{name}/progress` with a
`ProgressReport` body and `Authorization: Bearer <projected SA token>` merges the
report into the job's status, with the pod its token names (`status.reportingPods`:
two pods that take turns are two rank 0s), and posts an event on the job when the report
counts a new worker failure that training recovered from.
`POST .../rocmtrainingjobs/{name}/trainerstatus` takes Kubeflow Trainer's KEP-2779
body (`{"trainerStatus": ...}`, as transformers' KubeflowCallback sends it) the same
way, with the same authentication and limits, mapped onto a `ProgressReport`
(`rocmtrain.api.trainer_status`). Answers: 204 written;
400 malformed, non-finite or off-schema; 401 no or bad token; 403 the token's pod
is not this job's Ray head; 404 no such job; 413 body over 16 KiB; 429 over the
job's rate, the source's rate or the endpoint's TokenReview budget (Retry-After);
503 the API server did not answer. `GET /healthz` answers 200.

Anyone who reaches the port can send requests before proving anything, so what a
request without a valid token may cost is bounded, in this order: at most
`max_connections` connections, each closed when its request headers do not arrive
within `header_timeout` (aiohttp's keep-alive timer, which also runs before the
first request) or its TLS handshake within `handshake_timeout`; a token bucket per
source address; a token that is not a well-formed, unexpired JWT for our audience
is refused without a TokenReview; TokenReviews are rate-limited and bounded in
number at once, and their answers cached, refusals included (`auth`). A handler
is cancelled when its client goes away. The endpoint talks to the API server
through a small client of its own, with request deadlines.

`make_app` builds the aiohttp application from injected parts (authenticator,
authoriser, job store, rate limiter), so it runs without kopf or a cluster.
`start_progress_server` wires the real parts and serves; the operator's runtime
(`rocmtrain.controller.runtime`) starts it at startup and stops it on cleanup::

    config = ProgressServerConfig.from_env()  # None: the endpoint is off
    progress = await start_progress_server(config) if config else None
    ...
    await progress.publish_ca(namespace, api)  # before rendering a job's RayJob there
    ...
    await progress.stop()  # on cleanup
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import ipaddress
import json
import logging
import os
import re
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler
from kubernetes_asyncio import client

from rocmtrain.api.contract import (
    PROGRESS_AUDIENCE,
    PROGRESS_BURST,
    PROGRESS_PATH,
    PROGRESS_RATE_PER_SECOND,
    TRAINER_STATUS_PATH,
)
from rocmtrain.api.errors import Conflict
from rocmtrain.api.models import ProgressReport
from rocmtrain.api.patterns import DNS_LABEL
from rocmtrain.kube.client import new_api_client
from rocmtrain.metrics import prometheus
from rocmtrain.progress import tls
from rocmtrain.progress.auth import Identity, PodAuthoriser, TokenReviewAuthenticator
from rocmtrain.progress.limits import MAX_BODY_BYTES, parse_report, parse_trainer_status
from rocmtrain.progress.store import KubeJobStore
from rocmtrain.render import RenderOptions
from rocmtrain.serving.errors import (
    BodyTimeout,
    Ended,
    Forbidden,
    Gone,
    JobNotFound,
    Refusal,
    TooLarge,
    TooManyRequests,
    Unauthenticated,
    Unavailable,
)
from rocmtrain.serving.rate import RateLimiter
from rocmtrain.serving.reviews import bearer_token
from rocmtrain.serving.site import Bounds, TlsSite
from rocmtrain.status.progress_patch import progress_patch, report_events, takes_reports

log = logging.getLogger(__name__)

SERVICE_NAME = "rocmtrain-progress"
# The operator's metrics Service: its names are on the same certificate, which `/metrics` serves too.
METRICS_SERVICE_NAME = "rocm-train-operator-metrics"
CONTAINER_PORT = 8443
ALL_ADDRESSES = "0.0.0.0"  # noqa: S104 - TLS and authenticated: a pod serves it on all its interfaces
PATCH_ATTEMPTS = 3
# Requests per second from one source address before any authentication (a driver sends one per 10 s).
SOURCE_RATE_PER_SECOND = 5.0
SOURCE_BURST = 20
_LABEL = re.compile(DNS_LABEL)

Authenticate = Callable[[str], Awaitable[Identity]]
Authorise = Callable[[Identity, Mapping[str, Any]], Awaitable[None]]
# notify(job, old status, new status): queue the job's notifications (`rocmtrain.controller.notifier`).
Notify = Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]], object]


class JobStore(Protocol):
    """Where jobs are read and their status is patched."""

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job object, or None."""

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch the status subresource; raise Conflict or Gone."""

    async def post_event(self, obj: Any, *, type: str, reason: str, message: str) -> None:
        """Post an event about the job (best effort)."""


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# Refusals anyone can cause without a token: logged at DEBUG, so that a flood does not become a log flood.
_UNAUTHENTICATED = frozenset({HTTPStatus.UNAUTHORIZED, HTTPStatus.TOO_MANY_REQUESTS})


def _answer(refusal: Refusal, namespace: str, name: str) -> web.Response:
    """The HTTP answer to a refusal, with its short reason; logged without token or body."""
    status, reason = refusal.status, str(refusal)
    level = logging.DEBUG if status in _UNAUTHENTICATED else logging.INFO
    log.log(level, "progress for %s/%s refused: %d %s", namespace, name, status, reason)
    prometheus.PROGRESS_REFUSALS.labels(str(int(status))).inc()
    return web.Response(
        status=status,
        text=json.dumps({"error": reason}),
        content_type="application/json",
        headers=refusal.answer_headers() or None,
    )


@web.middleware
async def _refusals(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Any `Refusal` a handler raises, as its HTTP answer."""
    try:
        return await handler(request)
    except Refusal as refusal:
        namespace, name = request.match_info.get("namespace", ""), request.match_info.get("name", "")
        if not (_LABEL.match(namespace) and _LABEL.match(name)):
            namespace = name = "-"
        return _answer(refusal, namespace, name)


async def _read_bounded(request: web.Request, limit: int, timeout: float) -> bytes:
    """The body; TooLarge as soon as it proves longer than `limit` bytes, BodyTimeout after `timeout` s."""
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            while chunk := await request.content.read(limit + 1 - len(body)):
                body += chunk
                if len(body) > limit:
                    raise TooLarge
    except TimeoutError:
        raise BodyTimeout from None
    return bytes(body)


async def _record(
    jobs: JobStore, job: dict[str, Any], report: ProgressReport, now: Callable[[], dt.datetime], pod: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Patch `report`, sent by `pod`, into the job's status, re-reading the job when it changed meanwhile; the
    job as it was before the patch, and the status fields the patch wrote.

    The patch carries the resourceVersion it was computed from, so a concurrent
    write (another report, the operator's own status updates) is never lost.
    Raise Ended once the job has ended, Gone, or Unavailable (also when it keeps changing).
    """
    meta = job["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta.get("uid")
    for _ in range(PATCH_ATTEMPTS):
        if not takes_reports(job.get("status")):
            raise Ended
        patch = progress_patch(report, job.get("status"), now(), pod)
        patch["metadata"] = {"resourceVersion": job["metadata"]["resourceVersion"]}
        try:
            await jobs.patch_status(namespace, name, patch)
            return job, patch["status"]
        except Conflict:
            fresh = await jobs.get(namespace, name)
        if fresh is None or fresh["metadata"].get("uid") != uid:
            raise Gone
        job = fresh
    raise Unavailable("job kept changing")


# Events that reports bring (a new best trial, a recovered worker), per job and reason: a few at once,
# then one a minute, however often a run's reports change their mind.
EVENT_BURST = 5
EVENT_RATE_PER_SECOND = 1 / 60


def make_app(
    *,
    authenticate: Authenticate,
    authorise: Authorise,
    jobs: JobStore,
    limiter: RateLimiter,
    sources: RateLimiter | None = None,
    events: RateLimiter | None = None,
    body_timeout: float = 10.0,
    now: Callable[[], dt.datetime] = _utcnow,
    notify: Notify | None = None,
) -> web.Application:
    """The endpoint's aiohttp application, built from its parts (`sources`: the per-address limit;
    `events`: the limit of the events reports bring, per job and reason; `notify(job, old status,
    new status)`: queues the job's notifications, a new best trial's, never waiting).

    Handlers refuse a request by raising a `Refusal`; one middleware turns it into the answer.
    """
    sources = sources or RateLimiter(SOURCE_RATE_PER_SECOND, SOURCE_BURST)
    events = events or RateLimiter(EVENT_RATE_PER_SECOND, EVENT_BURST)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def admit(request: web.Request, namespace: str, name: str) -> tuple[Identity, dict[str, Any]]:
        """The sender and the job, once the request is small enough, within its source's rate, and its token may
        write it."""
        wait = sources.acquire(request.remote or "")
        if wait > 0:
            raise TooManyRequests(wait, "source rate limited")
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            raise TooLarge
        token = bearer_token(request.headers.get("Authorization", ""))
        if token is None:
            raise Unauthenticated("bearer token required")
        identity = await authenticate(token)
        if identity.namespace != namespace:  # before the lookup: no hint whether the job exists
            raise Forbidden("token is for another namespace")
        job = await jobs.get(namespace, name)
        if job is None:
            raise JobNotFound
        await authorise(identity, job)
        return identity, job

    def receiver(parse: Callable[[bytes], ProgressReport]) -> Handler:
        """The handler of one protocol: its body, once admitted, read by `parse` into a ProgressReport."""

        async def receive(request: web.Request) -> web.Response:
            namespace, name = request.match_info["namespace"], request.match_info["name"]
            if not (_LABEL.match(namespace) and _LABEL.match(name)):
                raise JobNotFound
            identity, job = await admit(request, namespace, name)
            wait = limiter.acquire(f"{namespace}/{name}")
            if wait > 0:
                raise TooManyRequests(wait)
            report = parse(await _read_bounded(request, MAX_BODY_BYTES, body_timeout))
            before, written = await _record(jobs, job, report, now, identity.pod_name)
            if notify is not None:
                status = before.get("status") or {}
                notify(before, status, {**status, **written})
            for event in report_events(report, before):
                if events.acquire(f"{namespace}/{name}/{event.reason}") == 0:
                    await jobs.post_event(before, type=event.type, reason=event.reason, message=event.message)
            prometheus.PROGRESS_REPORTS.inc()
            return web.Response(status=204)

        return receive

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_refusals])
    app.router.add_get("/healthz", healthz)
    app.router.add_post(PROGRESS_PATH, receiver(parse_report))
    app.router.add_post(TRAINER_STATUS_PATH, receiver(parse_trainer_status))
    return app


def listen_host(env: Mapping[str, str], variable: str, default: str) -> str:
    """The IP address a server of the operator listens on, from ``variable`` (``default`` when unset)."""
    raw = env.get(variable, "").strip() or default
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        raise ValueError(f"{variable} must be an IP address to listen on, not {raw!r}") from None
    return raw


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) > 65535:
        raise ValueError(f"{name} must be a port number, not {raw!r}")
    return int(raw)


def _number(env: Mapping[str, str], name: str, default: float, high: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= high:
        raise ValueError(f"{name} must be an integer from 1 to {int(high)}, not {raw!r}")
    return float(raw)


@dataclass(frozen=True)
class ProgressServerConfig:
    """Where the endpoint listens, how jobs reach it, and its limits."""

    namespace: str
    service: str = SERVICE_NAME
    metrics_service: str = METRICS_SERVICE_NAME
    host: str = ALL_ADDRESSES
    port: int = CONTAINER_PORT
    # How training pods reach the endpoint; the Service by default.
    advertise_host: str | None = None
    advertise_port: int = 443
    audience: str = PROGRESS_AUDIENCE
    rate_per_second: float = PROGRESS_RATE_PER_SECOND
    burst: int = PROGRESS_BURST
    manage_tls: bool = True
    refresh_seconds: float = 3600.0
    # How long a new CA is trusted (published) before the certificate it signed is served.
    ca_overlap_seconds: float = tls.CA_OVERLAP.total_seconds()
    # Bounds on what unauthenticated clients may hold (see the module docstring).
    max_connections: int = 256
    header_timeout: float = 15.0
    handshake_timeout: float = 10.0
    body_timeout: float = 10.0
    source_rate_per_second: float = SOURCE_RATE_PER_SECOND
    source_burst: int = SOURCE_BURST
    # The endpoint's own API client: its connections and each request's deadline.
    api_connections: int = 12
    api_timeout: float = 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ProgressServerConfig | None:
        """Settings from the operator Deployment's environment; None when the endpoint is off.

        `ROCMTRAIN_OPERATOR_NAMESPACE` (from the downward API) turns it on;
        `ROCMTRAIN_PROGRESS_HOST` (the address it listens on; all by default: it is TLS
        and authenticated),
        `ROCMTRAIN_PROGRESS_PORT` (0 turns it off), `ROCMTRAIN_PROGRESS_ADVERTISE_HOST`
        and `ROCMTRAIN_PROGRESS_ADVERTISE_PORT` (how jobs reach it, by default the
        Service), `ROCMTRAIN_PROGRESS_MANAGE_TLS=false` (cert-manager provides the Secret),
        `ROCMTRAIN_PROGRESS_CA_OVERLAP_SECONDS` (how long a new CA is published before it is
        served; default 3600) and `ROCMTRAIN_PROGRESS_MAX_CONNECTIONS` (default 256).
        """
        namespace = env.get("ROCMTRAIN_OPERATOR_NAMESPACE", "").strip()
        port = _port(env, "ROCMTRAIN_PROGRESS_PORT", CONTAINER_PORT)
        if not namespace or port == 0:
            return None
        if not _LABEL.match(namespace):
            raise ValueError(f"ROCMTRAIN_OPERATOR_NAMESPACE is not a namespace name: {namespace!r}")
        return cls(
            namespace=namespace,
            host=listen_host(env, "ROCMTRAIN_PROGRESS_HOST", ALL_ADDRESSES),
            port=port,
            advertise_host=env.get("ROCMTRAIN_PROGRESS_ADVERTISE_HOST", "").strip() or None,
            advertise_port=_port(env, "ROCMTRAIN_PROGRESS_ADVERTISE_PORT", 443),
            manage_tls=env.get("ROCMTRAIN_PROGRESS_MANAGE_TLS", "true").strip().lower() != "false",
            ca_overlap_seconds=_number(
                env, "ROCMTRAIN_PROGRESS_CA_OVERLAP_SECONDS", cls.ca_overlap_seconds, 86400 * 30
            ),
            max_connections=int(_number(env, "ROCMTRAIN_PROGRESS_MAX_CONNECTIONS", cls.max_connections, 100000)),
        )

    @property
    def bounds(self) -> Bounds:
        """The endpoint's bounds on connections."""
        return Bounds(self.max_connections, self.header_timeout, self.handshake_timeout)

    @property
    def hosts(self) -> list[str]:
        """Names the serving certificate must cover: the progress and metrics Services', and the advertised host."""
        services = (self.service, self.metrics_service)
        names = [host for service in services for host in tls.service_hosts(service, self.namespace)]
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
    """The running endpoint: its listener, TLS material, CA publishing, and its own API client."""

    def __init__(
        self, cfg: ProgressServerConfig, api: client.ApiClient, material: tls.TlsMaterial, *, own_api: bool
    ) -> None:
        self.config = cfg
        self._api = api
        self._own_api = own_api
        self._material = material
        self._ssl = material.server_context()
        self._published: set[str] = set()
        self._site: TlsSite | None = None
        self._refresher: asyncio.Task[None] | None = None

    @property
    def ca_crt(self) -> bytes:
        """The CA bundle (PEM) clients verify the endpoint with."""
        return self._material.ca_crt

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """The server context, which `refresh` keeps serving the current certificate (`/metrics` shares it)."""
        return self._ssl

    @property
    def api(self) -> client.ApiClient:
        """The endpoint's API client (its TokenReviews; `/metrics`' reviews too)."""
        return self._api

    async def publish_ca(self, namespace: str, api: client.ApiClient | None = None) -> None:
        """Create or update `rocmtrain-progress-ca` in a job namespace; call before rendering a job there.

        `api`: the client to write with (the reconciler's own), by default the endpoint's.
        Raise `tls.ConfigMapTaken` when a ConfigMap of that name is not the operator's.
        """
        await tls.publish_ca(api or self._api, namespace, self._material.ca_crt)
        self._published.add(namespace)

    async def start(self, app: web.Application) -> None:
        """Serve `app` over TLS within the connection bounds, and start the certificate refresher."""
        cfg = self.config
        self._site = await TlsSite.start(app, cfg.host, cfg.port, self._ssl, cfg.bounds)
        self._refresher = asyncio.create_task(self._refresh_forever())
        log.info("progress endpoint serving on %s:%s", cfg.host, cfg.port)

    async def refresh(self, now: dt.datetime | None = None) -> None:
        """Renew, promote or reload the serving certificate; republish the CA bundle if it changed."""
        material = await tls.load_serving_secret(
            self._api,
            self.config.namespace,
            self.config.hosts,
            manage=self.config.manage_tls,
            now=now,
            overlap=dt.timedelta(seconds=self.config.ca_overlap_seconds),
        )
        if material == self._material:
            return
        ca_changed = material.ca_crt != self._material.ca_crt
        if material.tls_crt != self._material.tls_crt:
            material.load_into(self._ssl)
        self._material = material
        log.info("progress endpoint certificate reloaded (CA bundle changed: %s)", ca_changed)
        if ca_changed:
            for namespace in sorted(self._published):
                try:
                    await self.publish_ca(namespace)
                except tls.ConfigMapTaken as exc:
                    log.warning("%s", exc)

    def _next_refresh(self) -> float:
        """Seconds until the next refresh: the refresh interval, or sooner when a successor is due."""
        due = self._material.promote_at
        if due is None:
            return self.config.refresh_seconds
        return min(self.config.refresh_seconds, max(0.5, (due - _utcnow()).total_seconds()))

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._next_refresh())
            try:
                await self.refresh()
            except Exception:
                log.exception("progress endpoint certificate refresh failed; retrying later")

    async def stop(self) -> None:
        """Stop serving; close the API client if it is the endpoint's own."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._site is not None:
            await self._site.stop()
        if self._own_api:
            await self._api.close()


async def start_progress_server(
    cfg: ProgressServerConfig, api: client.ApiClient | None = None, notify: Notify | None = None
) -> ProgressServer:
    """Load or create the TLS Secret and serve the endpoint; stop it with `stop()`. `notify`: see `make_app`.

    Without `api`, the endpoint makes a small client of its own (closed by `stop()`);
    a given `api` stays the caller's.
    """
    own = api is None
    api = api or await new_api_client(cfg.api_connections, cfg.api_timeout)
    try:
        material = await tls.load_serving_secret(
            api, cfg.namespace, cfg.hosts, manage=cfg.manage_tls, overlap=dt.timedelta(seconds=cfg.ca_overlap_seconds)
        )
    except BaseException:
        if own:
            await api.close()
        raise
    server = ProgressServer(cfg, api, material, own_api=own)
    app = make_app(
        authenticate=TokenReviewAuthenticator(api, cfg.audience),
        authorise=PodAuthoriser(api),
        jobs=KubeJobStore(api),
        limiter=RateLimiter(cfg.rate_per_second, cfg.burst),
        sources=RateLimiter(cfg.source_rate_per_second, cfg.source_burst),
        body_timeout=cfg.body_timeout,
        notify=notify,
    )
    await server.start(app)
    return server
