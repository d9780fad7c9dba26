"""Name resolution that cannot leave this machine, for the processes that dial names.

`LoopbackNames` owns a hosts file and a resolv.conf. ``wrap(argv)`` runs a
command in a private mount namespace (`unshare --mount`) in which those two
files are bind-mounted over /etc/hosts and /etc/resolv.conf:

- names in the hosts file resolve to what the harness wrote there (``add``);
  the file is rewritten in place, so running processes see changes (Go's
  resolver re-reads it within 5 s);
- every other lookup goes to the resolver address below, on loopback, where
  nothing answers (checked before each start), so it fails at once instead of
  reaching the machine's real resolver.

KubeRay, for example, polls `<cluster>-head-svc.<ns>.svc.cluster.local:8265`;
a later process runtime can map such names to the addresses of its pods.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import threading
from pathlib import Path

from cluster.processes import ClusterError

# A loopback address of its own, so a DNS server some other program runs on
# 127.0.0.1 or 127.0.0.53 is never asked; `check_resolver_unused` makes sure.
RESOLVER = "127.53.0.53"
_MOUNT = 'mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && shift 2 && exec "$@"'


def _listeners_on_port_53() -> list[str]:
    """Local addresses with a UDP or TCP socket bound to port 53 (from /proc/net)."""
    found = []
    for table in ("udp", "tcp", "udp6", "tcp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local = line.split()[1]
            address, port = local.rsplit(":", 1)
            if int(port, 16) != 53:
                continue
            raw = bytes.fromhex(address)
            if len(raw) == 4:
                found.append(str(ipaddress.IPv4Address(raw[::-1])))
            else:  # four little-endian 32-bit words
                words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
                found.append(str(ipaddress.IPv6Address(b"".join(words))))
    return found


def check_resolver_unused() -> None:
    """Refuse to start when a DNS server could receive the sandbox's lookups (and forward them)."""
    catching = {RESOLVER, "0.0.0.0", "::"}  # noqa: S104 (a listener on any address receives them)
    if hits := sorted(set(_listeners_on_port_53()) & catching):
        raise ClusterError(
            f"a DNS server listens on {', '.join(hits)} port 53: the test cluster's lookups would reach it; "
            "stop it or change sandbox.RESOLVER"
        )


class LoopbackNames:
    """A hosts file and a resolv.conf under ``folder``, and the command prefix that puts them in place."""

    def __init__(self, folder: Path) -> None:
        if shutil.which("unshare") is None or shutil.which("mount") is None:
            raise ClusterError("the test cluster needs unshare and mount (util-linux) to contain name lookups")
        folder.mkdir(parents=True, exist_ok=True)
        self.hosts = folder / "hosts"
        self.resolv_conf = folder / "resolv.conf"
        self._entries: dict[str, str] = {}
        self._lock = threading.Lock()
        self.resolv_conf.write_text(f"nameserver {RESOLVER}\noptions timeout:1 attempts:1\n")
        self._write()

    def add(self, name: str, address: str) -> None:
        """Resolve ``name`` to ``address`` (an IP) inside the sandbox from now on."""
        ipaddress.ip_address(address)
        with self._lock:
            self._entries[name] = address
            self._write()

    def remove(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)
            self._write()

    def _write(self) -> None:
        lines = [f"{address} {name}\n" for name, address in sorted(self._entries.items())]
        # In place (same inode): a bind mount pins the inode, so a rename would go unseen.
        base = f"127.0.0.1 localhost {socket.gethostname()}\n::1 localhost ip6-localhost ip6-loopback\n"
        with open(self.hosts, "w") as f:
            f.write(base + "".join(lines))

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run in a private mount namespace that sees these files as /etc/hosts and /etc/resolv.conf."""
        check_resolver_unused()
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:  # an unprivileged user namespace, where the kernel allows one
            unshare[1:1] = ["--user", "--map-root-user"]
        return [*unshare, "sh", "-c", _MOUNT, "sh", str(self.hosts), str(self.resolv_conf), *argv]
