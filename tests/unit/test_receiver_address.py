"""Which addresses a notification may go to (`rocmtrain.admission.receiver_address`), pure."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from rocmtrain.admission.receiver_address import (
    DEFAULT_CLUSTER_CIDRS,
    ReceiverRules,
    first_refusal,
    parse_networks,
    refusal,
)

DEFAULT = ReceiverRules(cluster=parse_networks(DEFAULT_CLUSTER_CIDRS)).with_api_server(
    [ipaddress.ip_address("10.96.0.1")]
)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
        ("::ffff:8.8.8.8", None),  # IPv4-mapped: the IPv4 address it reaches
        ("64:ff9b::808:808", None),  # NAT64 of a public address
        ("2002:808:808::1", None),  # 6to4 of a public address
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:7f00:1", "loopback"),
        ("0.0.0.0", "unspecified"),  # noqa: S104 (an address checked, not bound)
        ("::", "unspecified"),
        ("169.254.169.254", "link-local"),  # the cloud's metadata service
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("::ffff:169.254.169.254", "link-local"),
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of the metadata service
        ("2002:a9fe:a9fe::1", "link-local"),  # 6to4 of it
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "private"),  # Teredo
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("fec0::1", "private"),  # site-local
        ("::ffff:10.1.2.3", "private"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("100.64.0.1", "reserved"),  # shared address space (carrier NAT)
        ("240.0.0.1", "private"),
        ("::127.0.0.1", "reserved"),  # IPv4-compatible (deprecated)
        ("10.96.0.1", "API server"),
        ("10.96.0.10", "cluster network"),
        ("10.244.3.4", "cluster network"),
    ],
)
def test_only_public_addresses_are_reached_by_default(address: str, why: str | None) -> None:
    assert refusal(address, DEFAULT) == why


@pytest.mark.parametrize(
    ("allowed", "address", "why"),
    [
        ("127.0.0.0/8", "127.0.0.1", None),
        ("127.0.0.0/8", "::ffff:127.0.0.1", None),  # the same address, spelled in IPv6
        ("127.0.0.1/32", "127.0.0.2", "loopback"),
        ("10.0.0.0/8", "10.1.2.3", None),
        ("10.0.0.0/8", "10.96.0.10", "cluster network"),  # a wider allowance leaves the cluster's networks closed
        ("10.0.0.0/8", "10.96.0.1", "API server"),
        ("10.96.0.0/12", "10.96.0.10", None),  # as narrow as the service range: opens it
        ("10.96.0.0/12", "10.96.0.1", "API server"),  # but not the API server
        ("10.96.0.1/32", "10.96.0.1", None),
        ("fd00::/8", "fd12::1", None),
        ("fd00::/8", "10.1.2.3", "private"),
    ],
)
def test_the_admin_allows_networks_and_a_cluster_network_only_as_narrowly(
    allowed: str, address: str, why: str | None
) -> None:
    rules = ReceiverRules(parse_networks(allowed), DEFAULT.cluster, DEFAULT.api_server)
    assert refusal(address, rules) == why


@pytest.mark.parametrize(
    "spelling", ["2130706433", "0177.0.0.1", "0x7f.0.0.1", "0x7f000001", "127.1", "017700000001", "0177.1"]
)
def test_decimal_octal_and_hex_spellings_are_checked_as_the_address_they_resolve_to(spelling: str) -> None:
    """The check takes the resolved address, never the URL's spelling: these all resolve to 127.0.0.1."""
    resolved = {info[4][0] for info in socket.getaddrinfo(spelling, 80, type=socket.SOCK_STREAM)}
    assert resolved == {"127.0.0.1"}
    assert first_refusal(resolved, DEFAULT) == ("127.0.0.1", "loopback")


def test_a_name_with_one_refused_answer_among_public_ones_is_refused() -> None:
    """DNS rebinding's first step: a name that answers a public address and an internal one (or answers the
    internal one the second time) never reaches the internal one: every answer is checked, and the notifier
    connects only to the answers it checked."""
    assert first_refusal(["8.8.8.8", "1.1.1.1"], DEFAULT) is None
    assert first_refusal(["8.8.8.8", "169.254.169.254"], DEFAULT) == ("169.254.169.254", "link-local")
    assert first_refusal(["2606:4700::1", "::ffff:10.96.0.1"], DEFAULT) == ("::ffff:10.96.0.1", "API server")


@pytest.mark.parametrize("text", ["10.0.0.0/33", "example.com", "10.0.0.0/8,nope", "::1/129"])
def test_a_network_that_is_not_a_cidr_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="is not a CIDR"):
        parse_networks(text)


def test_networks_parse_with_spaces_and_host_bits() -> None:
    assert parse_networks(" 10.0.0.1/8 , 2001:db8::/32,, 192.0.2.7") == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("2001:db8::/32"),
        ipaddress.ip_network("192.0.2.7/32"),
    )
