"""TEST-ONLY: what a kubelet reads from a pod spec, as pure functions (no processes, no API calls).

- the stand-in image: the checkout's Python environment, with the training image's
  command, working directory and variables (training_image/Dockerfile);
- a container's environment: the image's, then `env` and `envFrom` in order, with
  downward-API fields and resource limits resolved and `$(VAR)` references expanded;
- its command line: `command` and `args` (with `$(VAR)` expanded) over the image's;
- its capabilities: the container runtime's default set, plus `add`, less `drop`
  (never more than that default set: pods may not change the network they run in).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rocmtrain.api.quantity import parse_quantity

CLUSTER_DOMAIN = "cluster.local"
# The training image's command and variables (training_image/Dockerfile).
IMAGE_CMD = ("python", "-m", "rocmtrain_train")
IMAGE_ENV = {
    "PIP_NO_CACHE_DIR": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PYTHONUNBUFFERED": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
}
# What this machine needs of the stand-in on top:
# - nothing may leave it: no usage reports, no model hub;
# - there is no DNS server, only hosts files: gRPC's own DNS client (c-ares, which Ray's GCS
#   clients use) reads none, the native resolver (getaddrinfo) does;
# - no memory cgroup per pod: Ray's memory monitor would watch the whole shared machine and kill
#   workers for other programs' memory (the kernel's OOM killer still guards the machine);
# - a UTF-8 locale for the `ray` command line (no host variables reach a pod).
TEST_ENV = {
    "LANG": "C.UTF-8",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "GRPC_DNS_RESOLVER": "native",
    "RAY_memory_monitor_refresh_ms": "0",
}
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# containerd's default capabilities (what a container gets unless it drops them).
DEFAULT_CAPABILITIES = (
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
)
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_LABEL_FIELD = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class ConfigError(ValueError):
    """A container that cannot be created as specified (a kubelet's CreateContainerConfigError)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known names are replaced, `$$` is a literal `$`, the rest stays."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _REFERENCE.sub(one, text)


def image_env(path_prefix: str, home: str) -> dict[str, str]:
    """The stand-in image's variables: the checkout's Python first on PATH, a home of the pod's own."""
    return {"PATH": f"{path_prefix}:{SYSTEM_PATH}", "HOME": home, **IMAGE_ENV, **TEST_ENV}


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """A downward-API `fieldRef.fieldPath` of ``pod``."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    simple: dict[str, Callable[[], Any]] = {
        "metadata.name": lambda: meta["name"],
        "metadata.namespace": lambda: meta["namespace"],
        "metadata.uid": lambda: meta["uid"],
        "spec.nodeName": lambda: spec.get("nodeName", ""),
        "spec.serviceAccountName": lambda: spec.get("serviceAccountName", ""),
        "status.hostIP": lambda: status.get("hostIP", ""),
        "status.hostIPs": lambda: ",".join(a["ip"] for a in status.get("hostIPs", [])),
        "status.podIP": lambda: status.get("podIP", ""),
        "status.podIPs": lambda: ",".join(a["ip"] for a in status.get("podIPs", [])),
    }
    if path in simple:
        return str(simple[path]())
    if match := _LABEL_FIELD.match(path):
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        values = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{key}="{value}"' for key, value in sorted(values.items()))
    raise ConfigError(f"unsupported fieldRef {path!r}")


def resource_value(container: Mapping[str, Any], selector: Mapping[str, Any], allocatable: Mapping[str, str]) -> str:
    """A downward-API `resourceFieldRef`: the container's limit (the node's allocatable without one)."""
    kind, _, name = selector["resource"].partition(".")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(name)
    if raw is None:
        raw = (resources.get("limits") or {}).get(name) if kind == "requests" else None
    if raw is None:
        raw = allocatable.get(name, "0")
    divisor = parse_quantity(str(selector.get("divisor") or "1")) or 1  # the API server defaults it to 0
    return str(math.ceil(parse_quantity(str(raw)) / divisor))


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    base: Mapping[str, str],
    *,
    lookup: Callable[[str, str, str, bool], str | None],
    keys: Callable[[str, str, bool], Mapping[str, str]],
    allocatable: Mapping[str, str],
) -> dict[str, str]:
    """The container's environment over ``base`` (the image's).

    ``lookup(kind, name, key, optional)`` reads one key of a ConfigMap or Secret
    (None: optional and absent); ``keys(kind, name, optional)`` all of them.
    Both raise ConfigError for what must exist and does not.
    """
    env = dict(base)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind in ("configMapRef", "secretRef"):
            if ref := source.get(kind):
                for key, value in keys(kind, ref["name"], bool(ref.get("optional"))).items():
                    env[prefix + key] = value
    for var in container.get("env") or []:
        name = var["name"]
        if "value" in var or "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[name] = resource_value(container, source["resourceFieldRef"], allocatable)
        else:
            kind = "configMapKeyRef" if "configMapKeyRef" in source else "secretKeyRef"
            ref = source[kind]
            value = lookup(kind, ref["name"], ref["key"], bool(ref.get("optional")))
            if value is not None:
                env[name] = value
    return env


def command_line(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """`command` + `args` over the stand-in image's (no entrypoint; CMD `python -m rocmtrain_train`)."""
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    argv = command + args if command else (args or list(IMAGE_CMD))
    return [expand(part, env) for part in argv]


def capabilities(container: Mapping[str, Any]) -> list[str]:
    """The container's capabilities (lower case, as setpriv names them); ConfigError beyond the default set."""
    context = container.get("securityContext") or {}
    if context.get("privileged"):
        raise ConfigError("privileged containers are not run by the process runtime")
    requested = context.get("capabilities") or {}
    added = {c.upper().removeprefix("CAP_") for c in requested.get("add") or []}
    beyond = sorted(added - set(DEFAULT_CAPABILITIES) - {"ALL"})
    if beyond or "ALL" in added:
        raise ConfigError(f"capabilities beyond the container runtime's default set: {beyond or ['ALL']}")
    dropped = {c.upper().removeprefix("CAP_") for c in requested.get("drop") or []}
    if "ALL" in dropped:
        return sorted(c.lower() for c in added)
    return sorted(c.lower() for c in (set(DEFAULT_CAPABILITIES) | added) - dropped)


def no_new_privileges(container: Mapping[str, Any]) -> bool:
    return (container.get("securityContext") or {}).get("allowPrivilegeEscalation") is False


def grace_seconds(pod: Mapping[str, Any]) -> float:
    """How long stopping the pod may take: the deletion's grace period, else the pod's."""
    meta = pod["metadata"]
    value = meta.get("deletionGracePeriodSeconds")
    if value is None:
        value = pod["spec"].get("terminationGracePeriodSeconds", 30)
    return float(value)


@dataclass(frozen=True)
class HttpGet:
    """An httpGet probe's request: the kubelet asks the pod's address; 200 to 399 pass."""

    port: int
    path: str
    scheme: str
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Probe:
    """An exec or httpGet probe (KubeRay's kinds: exec wget up to v1.5, httpGet to the Ray agent's health endpoint
    from v1.6 for the Ray versions that have it): what it runs, and its timing, as the kubelet reads them."""

    command: Sequence[str] | None
    http: HttpGet | None
    initial_delay: float
    period: float
    timeout: float
    success_threshold: int
    failure_threshold: int

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None, ports: Mapping[str, int]) -> Probe | None:
        """The probe, or None without one (``ports``: the container's named ports); other kinds are refused
        (ConfigError)."""
        if not spec:
            return None
        command, http = None, None
        if "exec" in spec:
            command = tuple(spec["exec"]["command"])
        elif "httpGet" in spec:
            get = spec["httpGet"]
            port = get["port"]
            if isinstance(port, str) and not port.isdigit():
                if port not in ports:
                    raise ConfigError(f"the httpGet probe's port {port!r} is not a port of the container")
                port = ports[port]
            headers = tuple((h["name"], h["value"]) for h in get.get("httpHeaders") or ())
            http = HttpGet(int(port), get.get("path") or "/", get.get("scheme", "HTTP"), headers)
        else:
            raise ConfigError(f"only exec and httpGet probes are run by the process runtime, not {sorted(spec)}")
        return cls(
            command=command,
            http=http,
            initial_delay=float(spec.get("initialDelaySeconds", 0)),
            period=float(spec.get("periodSeconds", 10)),
            timeout=float(spec.get("timeoutSeconds", 1)),
            success_threshold=int(spec.get("successThreshold", 1)),
            failure_threshold=int(spec.get("failureThreshold", 3)),
        )
