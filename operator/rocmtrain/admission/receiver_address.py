"""Whether the operator may connect to a notification receiver's address (pure).

The notifier (`rocmtrain.controller.notifier`) resolves a receiver's host, sends only when every address
it resolved to is allowed here, and connects to those addresses only. Refused, unless an allowed network
(`ROCMTRAIN_NOTIFY_ALLOWED_CIDRS`) holds the address:

- every address that is not public: unspecified, loopback, link-local, multicast, private (RFC 1918,
  unique local, shared 100.64.0.0/10), reserved and documentation ranges;
- the cluster's networks (`ROCMTRAIN_CLUSTER_CIDRS`) and the API server's addresses, which an allowed
  network opens only when it is at least as narrow: allowing 10.0.0.0/8 leaves a 10.96.0.0/12 service
  range closed, allowing 10.96.0.0/12 (or narrower) opens it.

An IPv6 address that carries an IPv4 one (6to4, Teredo) is refused when either is; an IPv4-mapped or
NAT64 (64:ff9b::/96) one is checked as the IPv4 address it reaches. The address checked is the resolved
one, never the URL's spelling: `2130706433` and `0177.0.0.1` resolve to 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# The service range kubeadm gives by default and the pod range of kind, flannel and kubeadm guides.
DEFAULT_CLUSTER_CIDRS = "10.96.0.0/12,10.244.0.0/16"
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"),)


@dataclass(frozen=True)
class ReceiverRules:
    """The networks the admin allows, and those refused even inside an allowed one that is wider."""

    allowed: tuple[Network, ...] = ()
    cluster: tuple[Network, ...] = ()
    api_server: tuple[Network, ...] = ()  # one host network per address of the API server

    def with_api_server(self, addresses: Iterable[Address]) -> ReceiverRules:
        """These rules with `addresses` refused as the API server's."""
        hosts = tuple(ipaddress.ip_network(address) for address in addresses)
        return ReceiverRules(self.allowed, self.cluster, tuple(dict.fromkeys((*self.api_server, *hosts))))


def parse_networks(text: str) -> tuple[Network, ...]:
    """Comma-separated CIDRs (or single addresses); ValueError names the first that is not one."""
    networks = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not a CIDR such as 203.0.113.0/24 or 2001:db8::/32") from None
    return tuple(networks)


def _reached(address: Address) -> Address:
    """The IPv4 address an IPv4-mapped or NAT64 one reaches; any other as it is."""
    if not isinstance(address, ipaddress.IPv6Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if any(address in network for network in _NAT64):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _embedded(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 one carries: 6to4, Teredo (server and client)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    carried = [address.sixtofour] if address.sixtofour is not None else []
    return carried + list(address.teredo or ())


def _special(address: Address) -> str | None:
    """The class of an address that is not public; None for a public one."""
    checks = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private or getattr(address, "is_site_local", False)),
        ("reserved", address.is_reserved or not address.is_global),
    )
    return next((name for name, hit in checks if hit), None)


def _narrowest(address: Address, networks: Iterable[Network]) -> int:
    """The longest prefix among `networks` that holds `address`; -1 when none does."""
    return max((n.prefixlen for n in networks if address in n), default=-1)


def _refusal_of_one(address: Address, rules: ReceiverRules) -> str | None:
    allowed = _narrowest(address, rules.allowed)
    for name, networks in (("API server", rules.api_server), ("cluster network", rules.cluster)):
        refused = _narrowest(address, networks)
        if refused >= 0 and allowed < refused:
            return name
    return None if allowed >= 0 else _special(address)


def refusal(address: str | Address, rules: ReceiverRules) -> str | None:
    """Why the operator may not connect to `address` (its class: loopback, private, cluster network, API
    server, ...); None when it may. `address` is a resolved address, never a host name."""
    ip = _reached(ipaddress.ip_address(address) if isinstance(address, str) else address)
    return next((why for one in (ip, *_embedded(ip)) if (why := _refusal_of_one(one, rules)) is not None), None)


def first_refusal(addresses: Iterable[str | Address], rules: ReceiverRules) -> tuple[str, str] | None:
    """The first of a host's resolved `addresses` that is refused, with why; None when all may be reached.
    A name that resolves to one refused address among public ones is refused: the connection may go to any."""
    for address in addresses:
        if (why := refusal(address, rules)) is not None:
            return str(address), why
    return None
