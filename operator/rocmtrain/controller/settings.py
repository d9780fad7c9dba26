"""Operator configuration: environment variables, and the kopf settings derived from them.

| variable                                 | default   | meaning                                              |
|------------------------------------------|-----------|------------------------------------------------------|
| ROCMTRAIN_NAMESPACES                     | (all)     | comma-separated namespaces to watch; empty: all      |
| ROCMTRAIN_METRICS_PORT                   | 8080      | Prometheus `/metrics` port; 0 turns it off           |
| ROCMTRAIN_METRICS_HOST                   | 127.0.0.1 | address `/metrics` listens on                        |
| ROCMTRAIN_METRICS_SECURE                 | see below | `true`: HTTPS, scrapes authenticated and authorised  |
| ROCMTRAIN_HEALTH_PORT                    | 8081      | liveness probe port (`/healthz`); 0 turns it off     |
| ROCMTRAIN_HEALTH_HOST                    | 127.0.0.1 | address `/healthz` listens on (plain HTTP)           |
| ROCMTRAIN_STALL_SECONDS                  | 900       | a Running job without progress this long is Stalled  |
| ROCMTRAIN_RETRY_SECONDS                  | 30        | re-check interval of a held job or after a failure   |
| ROCMTRAIN_API_TIMEOUT_SECONDS            | 15        | deadline of one API request                          |
| ROCMTRAIN_WATCH_FAILING_SECONDS          | 300       | a watch failing unexpectedly this long fails /healthz|
| ROCMTRAIN_LOOP_LAG_PROBE_MS              | 100       | how often the event loop's lag is sampled            |
| ROCMTRAIN_SUBMITTER_RETRIES              | 2         | retries of a RayJob's submitter pod (submitterConfig)|
| ROCMTRAIN_ALLOWED_IMAGES                 | (any)     | comma-separated image prefixes jobs may use          |
| ROCMTRAIN_ALLOWED_PRIORITY_CLASSES       | (any)     | PriorityClass names jobs may use                     |
| ROCMTRAIN_ALLOWED_KUEUE_PRIORITY_CLASSES | (any)     | Kueue WorkloadPriorityClass names jobs may use       |
| ROCMTRAIN_MAX_WORKER_PODS                | 1024      | most worker pods of one job (workers × trials)       |
| ROCMTRAIN_MAX_JOB_GPUS                   | 4096      | most GPUs of one job, trials at once included        |
| ROCMTRAIN_PROTECTED_NAMESPACES           | see below | comma-separated namespaces where no job may run      |
| ROCMTRAIN_ALLOWED_NFS_SERVERS            | (any)     | NFS servers jobs' volumes may name                   |
| ROCMTRAIN_ALLOWED_CSI_DRIVERS            | (any)     | CSI drivers jobs' inline volumes may use             |
| ROCMTRAIN_DEFAULT_QUEUE                  | (none)    | Kueue LocalQueue of jobs that name none              |
| ROCMTRAIN_REQUIRE_QUEUE                  | false     | `true`: refuse jobs left without a Kueue queue       |
| ROCMTRAIN_JOB_NETWORK_POLICIES           | true      | `false`: no NetworkPolicy around a job's Ray pods    |
| ROCMTRAIN_METRICS_MAX_JOBS               | 500       | jobs with per-job metric series; 0 turns them off    |
| ROCMTRAIN_GPU_PRICES                     | (none)    | price per GPU-hour by product: `NAME=PRICE,default=` |
| ROCMTRAIN_COST_CURRENCY                  | USD       | ISO 4217 currency of those prices (`status.cost`)    |
| ROCMTRAIN_NOTIFY_URL                     | (none)    | default receiver of jobs without spec.notifications  |
| ROCMTRAIN_NOTIFY_SIGNING_KEY             | (none)    | its HMAC-SHA256 signing key                          |
| ROCMTRAIN_NOTIFY_EVENTS                  | (all)     | comma-separated events the default receiver gets     |
| ROCMTRAIN_NOTIFY_ALLOWED_CIDRS           | (none)    | receiver networks allowed though not public          |
| ROCMTRAIN_CLUSTER_CIDRS                  | see below | the cluster's service and pod networks               |

ROCMTRAIN_PROTECTED_NAMESPACES defaults to `kube-system` and the operator's own namespace
(`ROCMTRAIN_OPERATOR_NAMESPACE`); set it to `-` to protect none.

ROCMTRAIN_METRICS_SECURE defaults to `true` where the progress endpoint is on, whose
certificate `/metrics` then serves (`rocmtrain.metrics.server`), else to `false`: plain
HTTP, which is allowed on a loopback address only (the metrics name every team's jobs,
GPUs and cost).

Notification receivers must resolve to public addresses: loopback, link-local, private, reserved
and multicast addresses, the cluster's networks (ROCMTRAIN_CLUSTER_CIDRS, default
`10.96.0.0/12,10.244.0.0/16`: kubeadm's services, kind's and flannel's pods) and the API server
are refused, unless ROCMTRAIN_NOTIFY_ALLOWED_CIDRS (comma-separated CIDRs) holds the address; a
cluster network or the API server only by a CIDR at least as narrow
(`rocmtrain.admission.receiver_address`).

The progress endpoint is on when `ROCMTRAIN_OPERATOR_NAMESPACE` is set (the
Deployment sets it from the downward API); its other `ROCMTRAIN_PROGRESS_*`
variables are described at `rocmtrain.progress.server.ProgressServerConfig.from_env`.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import kopf

from rocmtrain.admission.policy import Policy
from rocmtrain.admission.policy_env import env_flag, env_int, env_names, policy_from_env
from rocmtrain.admission.receiver_address import DEFAULT_CLUSTER_CIDRS, Network, ReceiverRules, parse_networks
from rocmtrain.api.contract import OPERATOR_NAME
from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import NOTIFY_EVENTS
from rocmtrain.api.patterns import DNS_LABEL
from rocmtrain.controller.supervision import RestartPolicy
from rocmtrain.progress.server import ProgressServerConfig, listen_host
from rocmtrain.render import RenderOptions
from rocmtrain.render.options import MAX_SUBMITTER_RETRIES
from rocmtrain.status.accounting import Pricing, parse_currency, parse_pricing

NOTIFY_EVENTS_ALL = frozenset(NOTIFY_EVENTS)


def _pricing(env: Mapping[str, str]) -> Pricing | None:
    try:
        currency = parse_currency(env.get("ROCMTRAIN_COST_CURRENCY", ""))
    except ValueError as exc:
        raise ConfigError(f"ROCMTRAIN_COST_CURRENCY: {exc}") from None
    prices = env.get("ROCMTRAIN_GPU_PRICES", "").strip()
    try:
        return parse_pricing(prices, currency) if prices else None
    except ValueError as exc:
        raise ConfigError(f"ROCMTRAIN_GPU_PRICES: {exc}") from None


def _metrics_secure(env: Mapping[str, str], host: str, port: int, progress: ProgressServerConfig | None) -> bool:
    """Whether `/metrics` is HTTPS with authentication; plain HTTP only on loopback, HTTPS only with the
    progress endpoint's certificate."""
    secure = env_flag(env, "ROCMTRAIN_METRICS_SECURE", progress is not None)
    if port and secure and progress is None:
        raise ConfigError(
            "ROCMTRAIN_METRICS_SECURE: HTTPS /metrics serves the progress endpoint's certificate, which is off "
            "(set ROCMTRAIN_OPERATOR_NAMESPACE); or set ROCMTRAIN_METRICS_SECURE=false for plain HTTP on loopback"
        )
    if port and not secure and not ipaddress.ip_address(host).is_loopback:
        raise ConfigError(
            f"ROCMTRAIN_METRICS_HOST={host}: /metrics over plain HTTP (ROCMTRAIN_METRICS_SECURE=false, the default "
            "without ROCMTRAIN_OPERATOR_NAMESPACE) listens on loopback only, as it names every team's jobs and "
            "cost; serve it over HTTPS, or put an authenticating proxy in front of it on 127.0.0.1"
        )
    return secure


def _host(env: Mapping[str, str], variable: str) -> str:
    try:
        return listen_host(env, variable, LOOPBACK)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


# Health (and metrics without ROCMTRAIN_METRICS_SECURE) are plain HTTP: only loopback unless a Deployment says
# otherwise (which the configuration refuses for plain metrics).
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class DefaultNotification:
    """The operator's default receiver (`rocmtrain.status.notifications`); never printed (a URL may hold a token)."""

    url: str = field(repr=False)
    signing_key: bytes | None = field(default=None, repr=False)
    events: frozenset[str] = NOTIFY_EVENTS_ALL


def _notification(env: Mapping[str, str]) -> DefaultNotification | None:
    url = env.get("ROCMTRAIN_NOTIFY_URL", "").strip()
    events = env_names(env, "ROCMTRAIN_NOTIFY_EVENTS", "|".join(NOTIFY_EVENTS), "a notification event")
    key = env.get("ROCMTRAIN_NOTIFY_SIGNING_KEY", "").strip()
    if not url:
        if key or events:
            raise ConfigError("ROCMTRAIN_NOTIFY_SIGNING_KEY and ROCMTRAIN_NOTIFY_EVENTS need ROCMTRAIN_NOTIFY_URL")
        return None
    if not re.fullmatch(r"https?://[^\s]{1,2040}", url):
        raise ConfigError("ROCMTRAIN_NOTIFY_URL must be an http:// or https:// URL")  # the value is never quoted
    return DefaultNotification(url, key.encode() or None, frozenset(events) or NOTIFY_EVENTS_ALL)


def _networks(env: Mapping[str, str], variable: str, default: str = "") -> tuple[Network, ...]:
    try:
        return parse_networks(env.get(variable, "").strip() or default)
    except ValueError as exc:
        raise ConfigError(f"{variable}: {exc}") from None


def _receiver_rules(env: Mapping[str, str]) -> ReceiverRules:
    """The receiver addresses allowed besides public ones, and the cluster's networks (refused)."""
    allowed = _networks(env, "ROCMTRAIN_NOTIFY_ALLOWED_CIDRS")
    return ReceiverRules(allowed, _networks(env, "ROCMTRAIN_CLUSTER_CIDRS", DEFAULT_CLUSTER_CIDRS))


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the operator reads from its environment."""

    namespaces: tuple[str, ...] = ()
    metrics_port: int = 8080
    metrics_host: str = LOOPBACK
    metrics_secure: bool = False  # HTTPS with the progress endpoint's certificate, scrapes authenticated
    health_port: int = 8081
    health_host: str = LOOPBACK
    stall_seconds: int = 900
    queue_estimate_seconds: int = 15  # how often queued jobs' expected starts are recomputed
    retry_seconds: int = 30
    api_timeout_seconds: int = 15
    watch_failing_seconds: int = 300
    loop_lag_probe_ms: int = 100
    policy: Policy = field(default_factory=Policy)
    job_network_policies: bool = True  # a NetworkPolicy per job around its Ray pods, made before them
    metrics_max_jobs: int = 500
    pricing: Pricing | None = None  # None: no prices, no status.cost
    render_options: RenderOptions = field(default_factory=RenderOptions)
    progress: ProgressServerConfig | None = None  # None: the progress endpoint is off
    notification: DefaultNotification | None = None  # the receiver of jobs without spec.notifications
    receivers: ReceiverRules = field(default_factory=lambda: _receiver_rules({}))  # where notices may go

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> OperatorConfig:
        """Read and check the `ROCMTRAIN_*` variables."""
        progress = ProgressServerConfig.from_env(env)
        render = RenderOptions(
            submitter_retries=env_int(env, "ROCMTRAIN_SUBMITTER_RETRIES", 2, 0, MAX_SUBMITTER_RETRIES)
        )
        metrics_port = env_int(env, "ROCMTRAIN_METRICS_PORT", 8080, 0, 65535)
        metrics_host = _host(env, "ROCMTRAIN_METRICS_HOST")
        return cls(
            namespaces=env_names(env, "ROCMTRAIN_NAMESPACES", DNS_LABEL, "a namespace name"),
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            metrics_secure=_metrics_secure(env, metrics_host, metrics_port, progress),
            health_port=env_int(env, "ROCMTRAIN_HEALTH_PORT", 8081, 0, 65535),
            health_host=_host(env, "ROCMTRAIN_HEALTH_HOST"),
            stall_seconds=env_int(env, "ROCMTRAIN_STALL_SECONDS", 900, 1, 30 * 86400),
            queue_estimate_seconds=env_int(env, "ROCMTRAIN_QUEUE_ESTIMATE_SECONDS", 15, 1, 3600),
            retry_seconds=env_int(env, "ROCMTRAIN_RETRY_SECONDS", 30, 1, 3600),
            api_timeout_seconds=env_int(env, "ROCMTRAIN_API_TIMEOUT_SECONDS", 15, 1, 300),
            watch_failing_seconds=env_int(env, "ROCMTRAIN_WATCH_FAILING_SECONDS", 300, 1, 86400),
            loop_lag_probe_ms=env_int(env, "ROCMTRAIN_LOOP_LAG_PROBE_MS", 100, 1, 60_000),
            policy=policy_from_env(env),
            job_network_policies=env_flag(env, "ROCMTRAIN_JOB_NETWORK_POLICIES", True),
            metrics_max_jobs=env_int(env, "ROCMTRAIN_METRICS_MAX_JOBS", 500, 0, 100_000),
            pricing=_pricing(env),
            render_options=progress.render_options(render) if progress else render,
            progress=progress,
            notification=_notification(env),
            receivers=_receiver_rules(env),
        )

    @property
    def stall_check_seconds(self) -> float:
        """How often running jobs are checked for stalls: a quarter of the limit, 1 s to 60 s."""
        return min(60.0, max(1.0, self.stall_seconds / 4))

    @property
    def liveness_endpoint(self) -> str | None:
        """kopf's liveness endpoint URL, if enabled."""
        host = f"[{self.health_host}]" if ":" in self.health_host else self.health_host
        return f"http://{host}:{self.health_port}/healthz" if self.health_port else None

    @property
    def watch_restart(self) -> RestartPolicy:
        """How the informers start again after an unexpected error, and when they fail `/healthz` (`supervision`)."""
        return RestartPolicy(unhealthy_after=float(self.watch_failing_seconds))

    @property
    def reconcile_deadline(self) -> float:
        """How long one reconcile may hold its slot: a few request deadlines (each call gives up after one)."""
        return 4.0 * self.api_timeout_seconds


def configure_kopf(settings: kopf.OperatorSettings, *, namespaced: bool = False) -> None:
    """Tune kopf for this operator: one standalone replica; its handlers keep no state in the objects.

    `namespaced` (ROCMTRAIN_NAMESPACES is set): kopf serves exactly those namespaces and
    the resources it finds at start-up, so the operator needs no cluster-wide right to
    list namespaces (kopf would otherwise retry that for a minute before falling back).
    """
    settings.peering.standalone = True
    settings.scanning.disabled = namespaced
    # Only warnings and errors of kopf's own per-object logs become Kubernetes events;
    # the operator posts its transition events explicitly.
    settings.posting.level = logging.WARNING
    # kopf logs each handled event at INFO ("Handler 'job_event' succeeded"), a line per job change;
    # the operator logs what it does (RayJob created or updated, job refused) itself.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.posting.reporting_component = OPERATOR_NAME
    # Renew watches every 5 minutes. (RayJobs, Ray pods and Workloads are not watched by kopf: see `informer`.)
    settings.watching.reconnect_backoff = 1.0
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
