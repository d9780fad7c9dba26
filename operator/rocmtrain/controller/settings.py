"""Operator configuration: environment variables, and the kopf settings derived from them.

| variable                   | default | meaning                                                      |
|----------------------------|---------|--------------------------------------------------------------|
| ROCMTRAIN_NAMESPACES       | (all)   | comma-separated namespaces to watch; empty watches all       |
| ROCMTRAIN_METRICS_PORT     | 8080    | Prometheus `/metrics` port; 0 turns the endpoint off         |
| ROCMTRAIN_HEALTH_PORT      | 8081    | liveness probe port (`/healthz`); 0 turns it off             |
| ROCMTRAIN_STALL_SECONDS    | 900     | a Running job without progress for this long is Stalled      |
| ROCMTRAIN_RETRY_SECONDS    | 30      | re-check interval of a held job (KubeRay, nodes) or failure  |
| ROCMTRAIN_BIND_ADDRESS     | 0.0.0.0 | address the metrics, liveness and progress servers listen on |

The progress endpoint is on when `ROCMTRAIN_OPERATOR_NAMESPACE` is set (the
Deployment sets it from the downward API); its other `ROCMTRAIN_PROGRESS_*`
variables are described at `rocmtrain.progress.server.ProgressServerConfig.from_env`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import kopf

from rocmtrain.api.contract import OPERATOR_NAME
from rocmtrain.api.patterns import DNS_LABEL
from rocmtrain.progress.server import ProgressServerConfig, bind_address
from rocmtrain.render import RenderOptions


class ConfigError(ValueError):
    """An environment variable has an unusable value."""


def _int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ConfigError(f"{name} must be an integer from {low} to {high}, not {raw!r}")
    return int(raw)


def _namespaces(env: Mapping[str, str]) -> tuple[str, ...]:
    names = tuple(n.strip() for n in env.get("ROCMTRAIN_NAMESPACES", "").split(",") if n.strip())
    for name in names:
        if not re.fullmatch(DNS_LABEL, name):
            raise ConfigError(f"ROCMTRAIN_NAMESPACES: {name!r} is not a namespace name")
    return names


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the operator reads from its environment."""

    namespaces: tuple[str, ...] = ()
    bind_address: str = "0.0.0.0"  # noqa: S104 - a pod serves on all its interfaces
    metrics_port: int = 8080
    health_port: int = 8081
    stall_seconds: int = 900
    retry_seconds: int = 30
    render_options: RenderOptions = field(default_factory=RenderOptions)
    progress: ProgressServerConfig | None = None  # None: the progress endpoint is off

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> OperatorConfig:
        """Read and check the `ROCMTRAIN_*` variables."""
        progress = ProgressServerConfig.from_env(env)
        return cls(
            namespaces=_namespaces(env),
            bind_address=bind_address(env),
            metrics_port=_int(env, "ROCMTRAIN_METRICS_PORT", 8080, 0, 65535),
            health_port=_int(env, "ROCMTRAIN_HEALTH_PORT", 8081, 0, 65535),
            stall_seconds=_int(env, "ROCMTRAIN_STALL_SECONDS", 900, 1, 30 * 86400),
            retry_seconds=_int(env, "ROCMTRAIN_RETRY_SECONDS", 30, 1, 3600),
            render_options=progress.render_options(RenderOptions()) if progress else RenderOptions(),
            progress=progress,
        )

    @property
    def stall_check_seconds(self) -> float:
        """How often running jobs are checked for stalls: a quarter of the limit, 1 s to 60 s."""
        return min(60.0, max(1.0, self.stall_seconds / 4))

    @property
    def liveness_endpoint(self) -> str | None:
        """kopf's liveness endpoint URL, if enabled."""
        return f"http://{self.bind_address}:{self.health_port}/healthz" if self.health_port else None


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    """Tune kopf for this operator: one standalone replica; its handlers keep no state in the objects."""
    settings.peering.standalone = True
    # Only warnings and errors of kopf's own per-object logs become Kubernetes events;
    # the operator posts its transition events explicitly.
    settings.posting.level = logging.WARNING
    # kopf logs each handled event at INFO ("Handler 'job_event' succeeded"), a line per job change;
    # the operator logs what it does (RayJob created or updated, job refused) itself.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.posting.reporting_component = OPERATOR_NAME
    # Renew watches every 5 minutes. (RayJobs are not watched by kopf: see `rayjob_watch`.)
    settings.watching.reconnect_backoff = 1.0
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
