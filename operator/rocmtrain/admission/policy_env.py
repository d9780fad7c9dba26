"""The admission policy as the operator's environment variables set it (pure: it reads a mapping).

The operator reads its `Policy` here (`rocmtrain.controller.settings`), and so does
`rocmtrain validate --policy`, so both apply the same limits and allow-lists from the same
variables. `env_int`, `env_names` and `env_flag` read every `ROCMTRAIN_*` setting of the
operator; each refuses a value it cannot use with a `ConfigError` that names the variable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from rocmtrain.admission.policy import DEFAULT_MAX_GPUS, DEFAULT_MAX_WORKER_PODS, Policy
from rocmtrain.api.errors import ConfigError
from rocmtrain.api.patterns import DNS_LABEL, DNS_SUBDOMAIN, IMAGE


def env_int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """The integer `name` sets, from `low` to `high`; `default` where it is unset or empty."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ConfigError(f"{name} must be an integer from {low} to {high}, not {raw!r}")
    return int(raw)


def env_names(env: Mapping[str, str], variable: str, pattern: str, what: str) -> tuple[str, ...]:
    """A comma-separated list of names, each matching `pattern`."""
    names = tuple(n.strip() for n in env.get(variable, "").split(",") if n.strip())
    for name in names:
        if not re.fullmatch(pattern, name):
            raise ConfigError(f"{variable}: {name!r} is not {what}")
    return names


def env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """`true` or `false`; `default` where unset or empty."""
    raw = env.get(name, "").strip().lower()
    if raw not in ("", "true", "false"):
        raise ConfigError(f"{name} must be true or false, not {raw!r}")
    return default if not raw else raw == "true"


def _protected(env: Mapping[str, str]) -> tuple[str, ...]:
    raw = env.get("ROCMTRAIN_PROTECTED_NAMESPACES", "").strip()
    if raw == "-":
        return ()
    if raw:
        return env_names(env, "ROCMTRAIN_PROTECTED_NAMESPACES", DNS_LABEL, "a namespace name")
    own = env.get("ROCMTRAIN_OPERATOR_NAMESPACE", "").strip()
    return ("kube-system", own) if own and own != "kube-system" else ("kube-system",)


def _default_queue(env: Mapping[str, str]) -> str | None:
    queue = env.get("ROCMTRAIN_DEFAULT_QUEUE", "").strip()
    if queue and (len(queue) > 63 or not re.fullmatch(DNS_SUBDOMAIN, queue)):
        raise ConfigError(f"ROCMTRAIN_DEFAULT_QUEUE: {queue!r} is not a LocalQueue name of at most 63 characters")
    return queue or None


def policy_from_env(env: Mapping[str, str]) -> Policy:
    """The operator's admission policy: its `ROCMTRAIN_*` variables, each unset one at its default."""
    image_prefix = IMAGE.removesuffix("$") + "[/:@]?$"  # a reference, or a registry or repository path
    return Policy(
        images=env_names(env, "ROCMTRAIN_ALLOWED_IMAGES", image_prefix, "an image prefix"),
        priority_classes=env_names(env, "ROCMTRAIN_ALLOWED_PRIORITY_CLASSES", DNS_SUBDOMAIN, "a class name"),
        kueue_priority_classes=env_names(
            env, "ROCMTRAIN_ALLOWED_KUEUE_PRIORITY_CLASSES", DNS_SUBDOMAIN, "a class name"
        ),
        max_worker_pods=env_int(env, "ROCMTRAIN_MAX_WORKER_PODS", DEFAULT_MAX_WORKER_PODS, 1, 1_000_000),
        max_gpus=env_int(env, "ROCMTRAIN_MAX_JOB_GPUS", DEFAULT_MAX_GPUS, 1, 1_000_000),
        protected_namespaces=_protected(env),
        nfs_servers=env_names(env, "ROCMTRAIN_ALLOWED_NFS_SERVERS", DNS_SUBDOMAIN, "a host name or IPv4 address"),
        csi_drivers=env_names(env, "ROCMTRAIN_ALLOWED_CSI_DRIVERS", DNS_SUBDOMAIN, "a CSI driver name"),
        default_queue=_default_queue(env),
        require_queue=env_flag(env, "ROCMTRAIN_REQUIRE_QUEUE", False),
    )
