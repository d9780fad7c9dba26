"""TEST-ONLY: the pod network of the process runtime, made of network namespaces on this machine.

One runtime owns one small network::

    this machine's netns ── veth <host_ifname>: 10.244.N.1/24 (the process nodes' address, hostIP)
                                 │
    netns <prefix>-net ──── bridge br0: 10.244.N.254/24 (the pods' gateway; forwards nothing)
                                 │ one veth port per pod
    netns <prefix>-p<k> ─── eth0: 10.244.N.k/24, default route via .254

Every pod has an address of its own (Ray's "which IP am I" finds it through the
default route), pods reach each other and this machine's 10.244.N.1, and this
machine reaches them; nothing reaches further: the gateway's namespace has IP
forwarding off and no other interface, and containers run without NET_ADMIN, so
they cannot change their routes. The /24 is the first 10.244.N.0/24 that no route
or address of this machine overlaps, chosen under a lock, so that runtimes of
parallel sessions each get their own. Namespace names carry the runtime's pid:
`sweep_stale` removes those of runtimes that are gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rocmtrain_testworld.processes import ClusterError

NETNS_DIR = Path("/run/netns")
NAME_PREFIX = "rocmtrain-"
LOCK_FILE = Path("/run/lock/rocmtrain-pod-network.lock")
SUPERNET = ipaddress.ip_network("10.244.0.0/16")
HOST_INDEX = 1
GATEWAY_INDEX = 254
_STALE = re.compile(rf"^{NAME_PREFIX}(\d+)-")


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip [-n netns] args...`; raise ClusterError with its message on failure."""
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done


def available() -> str | None:
    """Why network namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "the process runtime makes network namespaces: it needs root"
    for tool in ("ip", "unshare", "nsenter", "setpriv", "mount"):
        if subprocess.run(["which", tool], capture_output=True, check=False).returncode != 0:
            return f"the process runtime needs `{tool}` (iproute2, util-linux)"
    return None


def _in_use() -> list[ipaddress.IPv4Network]:
    """Networks this machine already routes or holds an address in."""
    found = []
    routes = json.loads(ip("-j", "-4", "route", "show", "table", "all").stdout or "[]")
    for route in routes:
        dst = route.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                found.append(ipaddress.ip_network(dst, strict=False))
    for link in json.loads(ip("-j", "-4", "addr").stdout or "[]"):
        for addr in link.get("addr_info", []):
            found.append(ipaddress.ip_network(f"{addr['local']}/{addr.get('prefixlen', 32)}", strict=False))
    return [n for n in found if isinstance(n, ipaddress.IPv4Network)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_pids(name: str) -> list[int]:
    """The processes in network namespace `name`."""
    done = ip("netns", "pids", name, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def delete_netns(name: str) -> None:
    """SIGKILL whatever still runs in the namespace, then delete it (its veths go with it)."""
    for _ in range(50):
        pids = netns_pids(name)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    ip("netns", "delete", name, check=False)


def sweep_stale() -> list[str]:
    """Delete the namespaces of runtimes that no longer run (a runtime killed outright); their names."""
    gone = []
    for path in sorted(NETNS_DIR.glob(f"{NAME_PREFIX}*")) if NETNS_DIR.is_dir() else []:
        match = _STALE.match(path.name)
        if match and not _pid_alive(int(match.group(1))):
            delete_netns(path.name)
            gone.append(path.name)
    return gone


@dataclass(frozen=True)
class PodNetwork:
    """One pod's namespace and address."""

    netns: str
    address: str
    inode: int  # identifies the namespace: /proc/<pid>/ns/net of its processes points at this inode


class Network:
    """The runtime's bridge namespace, its link to this machine, and the pods' namespaces."""

    def __init__(self, owner_pid: int | None = None) -> None:
        self.prefix = f"{NAME_PREFIX}{owner_pid or os.getpid()}"
        self.bridge_netns = f"{self.prefix}-net"
        self.host_ifname = f"rtp{owner_pid or os.getpid()}"[:15]
        self.subnet: ipaddress.IPv4Network | None = None
        self._next = HOST_INDEX + 1
        self._used: set[int] = set()
        self._lock = threading.Lock()

    @property
    def host_address(self) -> str:
        """This machine's address on the pod network (the process nodes' InternalIP)."""
        assert self.subnet is not None, "the network is not up"
        return str(self.subnet.network_address + HOST_INDEX)

    @property
    def gateway(self) -> str:
        assert self.subnet is not None, "the network is not up"
        return str(self.subnet.network_address + GATEWAY_INDEX)

    def up(self) -> Network:
        """Make the bridge namespace and the link to this machine on a /24 nobody else uses."""
        sweep_stale()
        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK_FILE, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            used = _in_use()
            self.subnet = next(
                (s for s in SUPERNET.subnets(new_prefix=24) if not any(s.overlaps(u) for u in used)), None
            )
            if self.subnet is None:
                raise ClusterError(f"no free /24 left in {SUPERNET} for the pod network")
            try:
                self._make_bridge()
            except BaseException:
                self.down()
                raise
        return self

    def _make_bridge(self) -> None:
        ns, length = self.bridge_netns, self.subnet.prefixlen if self.subnet else 24
        ip("netns", "add", ns)
        ip("link", "set", "lo", "up", netns=ns)
        ip("link", "add", "br0", "type", "bridge", netns=ns)
        ip("addr", "add", f"{self.gateway}/{length}", "dev", "br0", netns=ns)
        ip("link", "set", "br0", "up", netns=ns)
        # A new namespace starts with forwarding off; written anyway, so that nothing is routed onward.
        subprocess.run(
            ["ip", "netns", "exec", ns, "sh", "-c", "echo 0 > /proc/sys/net/ipv4/ip_forward"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        ip("link", "add", self.host_ifname, "type", "veth", "peer", "name", "host", "netns", ns)
        ip("link", "set", "host", "master", "br0", "up", netns=ns)
        ip("addr", "add", f"{self.host_address}/{length}", "dev", self.host_ifname)
        ip("link", "set", self.host_ifname, "up")

    def add_pod(self) -> PodNetwork:
        """A new namespace with its own address, wired to the bridge."""
        assert self.subnet is not None, "the network is not up"
        with self._lock:
            index = self._allocate()
        netns = f"{self.prefix}-p{index}"
        address = str(self.subnet.network_address + index)
        try:
            ip("netns", "add", netns)
            ip(*f"link add p{index} type veth peer name eth0 netns {netns}".split(), netns=self.bridge_netns)
            ip("link", "set", f"p{index}", "master", "br0", "up", netns=self.bridge_netns)
            ip("link", "set", "lo", "up", netns=netns)
            ip("addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0", netns=netns)
            ip("link", "set", "eth0", "up", netns=netns)
            ip("route", "add", "default", "via", self.gateway, netns=netns)
        except BaseException:
            self.remove_pod(PodNetwork(netns, address, 0))
            raise
        return PodNetwork(netns, address, (NETNS_DIR / netns).stat().st_ino)

    def _allocate(self) -> int:
        """The next free host index, round robin (a freed address is not handed out again at once)."""
        for _ in range(GATEWAY_INDEX):
            index = self._next
            self._next = self._next + 1 if self._next + 1 < GATEWAY_INDEX else HOST_INDEX + 1
            if index not in self._used:
                self._used.add(index)
                return index
        raise ClusterError(f"the pod network {self.subnet} is full")

    def remove_pod(self, pod: PodNetwork) -> None:
        """Kill what still runs in the pod's namespace and delete it; its address is free again."""
        delete_netns(pod.netns)
        index = int(pod.netns.rsplit("-p", 1)[1])
        with self._lock:
            self._used.discard(index)

    def down(self) -> None:
        """Delete every namespace of this runtime (the link to this machine goes with the bridge's)."""
        for path in sorted(NETNS_DIR.glob(f"{self.prefix}-*")):
            delete_netns(path.name)
