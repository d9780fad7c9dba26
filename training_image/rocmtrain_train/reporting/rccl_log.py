"""Which network RCCL chose, from its own log (pure, but for `raise_debug_level`, `read_transport` and
`TransportLog`).

RCCL (ROCm's NCCL) has no API that says which network it uses between nodes; its log does, at
`NCCL_DEBUG=INFO` with the INIT and NET subsystems. The formats, from ROCm/rccl's sources (as
NVIDIA/nccl prints them): every INFO line starts `host:pid:tid [device] NCCL INFO ` (src/debug.cc),
and a communicator's init prints

    Using network IB                                    (src/init.cc: "Using network %s", the net's name)
    NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.5<0>
                                                        (src/transport/net_ib.cc: " [%d]%s:%d/%s" per device,
                                                         " [%d]={[%d] %s:%d/%s, ...}" per merged device)
    NET/Socket : Using [0]eth0:10.244.1.5<0>            (src/transport/net_socket.cc: " [%d]%s:%s")

A net plugin prints `Using network <its name>` (`AWS Libfabric`) and its devices its own way.

Rank 0 of a GPU run (the RCCL backend) sends RCCL's INFO lines of INIT and NET to a file of its own
(`debug_env`), reads it once after its first collective (`read_transport`) and hands the result to
the driver in its reports, which logs it (`TransportLog`) and passes it to the operator (`status.network`).
A search's trials report it the same way (`search.trial_status.search_network`), and so does rank 0 of a
job's own code (`rocmtrain_train.sdk`, whose `run_config` has rank 0 raise the level). With
`NCCL_DEBUG_FILE`, RCCL writes its WARN lines to that file too: `read_transport` logs those it
finds on the rank's log, and the other ranks keep the pod's `NCCL_DEBUG=WARN` on their output.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

from rocmtrain.api.models import RCCL_DEVICES_LIMIT, NetworkTransport
from rocmtrain.api.patterns import HCA_NAME, RCCL_NETWORK

# Where rank 0 of a run has RCCL write its INIT and NET lines, in the run's log folder.
RCCL_LOG_NAME = "rccl-rank-0.log"
# The levels at which rank 0 may raise RCCL's output into its file: none set, or the operator's default.
RAISABLE_LEVELS = frozenset({"", "WARN"})
# RCCL's longest line (its debug buffer); a longer "line" is not RCCL's.
MAX_LINE = 4096
# How much of the file is read: the lines of a communicator's init come first.
MAX_READ_BYTES = 1024 * 1024

_INFO = " NCCL INFO "
_WARN = " NCCL WARN "
_USING_NETWORK = re.compile(r"^Using network (?P<name>.+?)\s*$")
_NET_LINE = re.compile(r"^NET/(?P<net>IB|Socket) : Using(?P<devices>.*)$")
_IB_DEVICE = re.compile(r"\[\d+\] ?(?P<name>[^\s:\[\]{},]+):(?P<port>\d+)/(?P<link>IB|RoCE)")
_SOCKET_DEVICE = re.compile(r"\[\d+\](?P<name>[^\s:\[\]]+):")
_LINKS = {frozenset({"IB"}): "InfiniBand", frozenset({"RoCE"}): "RoCE", frozenset({"IB", "RoCE"}): "mixed"}


def _messages(text: str, marker: str) -> list[str]:
    """The messages of RCCL's lines of one kind (`marker`), without their `host:pid:tid [device]` prefix."""
    return [line.split(marker, 1)[1].strip() for line in text.splitlines() if marker in line and len(line) <= MAX_LINE]


def parse_transport(text: str) -> NetworkTransport | None:
    """The network RCCL's log `text` says it chose, with the devices it names; None where it does not tell."""
    infos = _messages(text, _INFO)
    chosen = next((m["name"] for line in infos if (m := _USING_NETWORK.match(line))), None)
    if chosen is None or not re.match(RCCL_NETWORK, chosen):
        return None
    devices: list[str] = []
    links: set[str] = set()
    found = next((m for line in infos if (m := _NET_LINE.match(line)) and m["net"] == chosen), None)
    if found is not None and chosen == "IB":
        listed = list(_IB_DEVICE.finditer(found["devices"]))
        devices = [f"{d['name']}:{d['port']}" for d in listed]
        links = {d["link"] for d in listed}
    elif found is not None:
        devices = [d["name"] for d in _SOCKET_DEVICE.finditer(found["devices"])]
    named = [d for d in dict.fromkeys(devices) if re.match(HCA_NAME, d)][:RCCL_DEVICES_LIMIT]
    return NetworkTransport(transport=chosen, devices=named, link=_LINKS.get(frozenset(links)))


def warning_messages(text: str) -> list[str]:
    """RCCL's WARN messages in its log `text`."""
    return [message for message in _messages(text, _WARN) if message]


def debug_env(environ: Mapping[str, str], log_dir: str) -> tuple[dict[str, str], str | None]:
    """The variables rank 0 sets before its first collective, and the file (RCCL's NCCL_DEBUG_FILE, `%h`
    and `%p` unexpanded) that will tell its network.

    The user's own settings win: with their NCCL_DEBUG_FILE nothing is set and their file is read (it
    tells where their level and subsystems include INFO, INIT and NET); with their NCCL_DEBUG other than
    WARN, or their NCCL_DEBUG_SUBSYS, RCCL writes to the output, where nothing reads it.
    """
    if own := environ.get("NCCL_DEBUG_FILE"):
        return {}, own
    if environ.get("NCCL_DEBUG", "").strip().upper() not in RAISABLE_LEVELS or "NCCL_DEBUG_SUBSYS" in environ:
        return {}, None
    path = str(Path(log_dir) / RCCL_LOG_NAME).replace("%", "%%")  # RCCL expands %h, %p and %%
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": path}, path


def raise_debug_level(log_dir: str) -> str | None:
    """Set `debug_env`'s variables in this process, before its first collective creates a communicator (where
    RCCL reads NCCL_DEBUG*); the file that will tell its network."""
    env, template = debug_env(os.environ, log_dir)
    os.environ.update(env)
    return template


def debug_file(template: str, host: str, pid: int) -> str:
    """The file RCCL opens for NCCL_DEBUG_FILE `template`: `%h` the host name up to its first '.', `%p` the
    process id, `%%` a '%' (src/debug.cc)."""
    short_host = host.split(".", 1)[0]
    return re.sub(r"%(.)", lambda m: {"h": short_host, "p": str(pid), "%": "%"}.get(m[1], m[0]), template)


def read_transport(template: str | None, host: str, pid: int, log: logging.Logger) -> NetworkTransport | None:
    """The network this process's RCCL log tells (None: no log, or it does not tell); its warnings go to `log`."""
    if template is None:
        return None
    try:
        with open(debug_file(template, host, pid), encoding="utf-8", errors="replace") as file:
            text = file.read(MAX_READ_BYTES)
    except OSError:
        return None
    for message in warning_messages(text):
        log.warning("RCCL: %s", message)
    return parse_transport(text)


class TransportLog:
    """Logs the network RCCL chose once: when a report first names it, or names another."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._last: NetworkTransport | None = None

    def seen(self, network: NetworkTransport | None) -> None:
        if network is not None and network != self._last:
            self._last = network
            self._log.info("RCCL transport: %s", network.summary)
