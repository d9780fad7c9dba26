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
the process runtime (runtime/) maps such names to the addresses of its pods
(``replace``), and keeps a hosts file per pod (``add_view``): the same names,
plus the pod's own hostname, as a kubelet writes a pod's /etc/hosts.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from rocmtrain_testworld.processes import ClusterError

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
    """A hosts file and a resolv.conf under ``folder``, and the command prefix that puts them in place.

    Views are more hosts files (one per pod of the process runtime): each holds its own
    first lines, then the same names as the main file, and is rewritten with it.
    """

    def __init__(self, folder: Path) -> None:
        if shutil.which("unshare") is None or shutil.which("mount") is None:
            raise ClusterError("the test cluster needs unshare and mount (util-linux) to contain name lookups")
        folder.mkdir(parents=True, exist_ok=True)
        self.hosts = folder / "hosts"
        self.resolv_conf = folder / "resolv.conf"
        self._entries: dict[str, tuple[str, ...]] = {}
        self._views: dict[Path, str] = {}
        self._lock = threading.Lock()
        self.resolv_conf.write_text(f"nameserver {RESOLVER}\noptions timeout:1 attempts:1\n")
        base = f"127.0.0.1 localhost {socket.gethostname()}\n::1 localhost ip6-localhost ip6-loopback\n"
        self._views[self.hosts] = base
        self._write()

    def add(self, name: str, address: str) -> None:
        """Resolve ``name`` to ``address`` (an IP) inside the sandbox from now on."""
        ipaddress.ip_address(address)
        with self._lock:
            self._entries[name] = (address,)
            self._write()

    def remove(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)
            self._write()

    def replace(self, entries: Mapping[str, Iterable[str]]) -> bool:
        """Make ``entries`` (name -> addresses) all the names there are; whether anything changed."""
        new = {name: tuple(sorted(addresses)) for name, addresses in entries.items() if addresses}
        for addresses in new.values():
            for address in addresses:
                ipaddress.ip_address(address)
        with self._lock:
            if new == self._entries:
                return False
            self._entries = new
            self._write()
        return True

    def add_view(self, path: Path, own: Mapping[str, str]) -> Path:
        """A hosts file at ``path``: localhost, ``own`` (name -> IP, such as a pod's hostname), then every name."""
        head = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
        head += "".join(f"{address} {name}\n" for name, address in own.items())
        with self._lock:
            self._views[path] = head
            self._write_one(path, head, self._lines())
        return path

    def remove_view(self, path: Path) -> None:
        with self._lock:
            self._views.pop(path, None)

    def _lines(self) -> str:
        return "".join(
            f"{address} {name}\n" for name, addresses in sorted(self._entries.items()) for address in addresses
        )

    def _write(self) -> None:
        lines = self._lines()
        for path, head in self._views.items():
            self._write_one(path, head, lines)

    @staticmethod
    def _write_one(path: Path, head: str, lines: str) -> None:
        # In place (same inode): a bind mount pins the inode, so a rename would go unseen.
        with open(path, "w") as f:
            f.write(head + lines)

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run in a private mount namespace that sees these files as /etc/hosts and /etc/resolv.conf."""
        check_resolver_unused()
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:  # an unprivileged user namespace, where the kernel allows one
            unshare[1:1] = ["--user", "--map-root-user"]
        return [*unshare, "sh", "-c", _MOUNT, "sh", str(self.hosts), str(self.resolv_conf), *argv]
