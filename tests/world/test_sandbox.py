"""The name sandbox: names the harness adds resolve, every other lookup dies on loopback."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest

from rocmtrain_testworld.processes import ClusterError
from rocmtrain_testworld.sandbox import RESOLVER, LoopbackNames

pytestmark = pytest.mark.cluster  # needs unshare and mount, as root or in a user namespace


def _lookup(names: LoopbackNames, host: str) -> subprocess.CompletedProcess[str]:
    """`getent hosts` inside the sandbox (glibc's resolver: /etc/hosts, then resolv.conf)."""
    return subprocess.run(names.wrap(["getent", "hosts", host]), capture_output=True, text=True, timeout=30)


def test_added_names_resolve_inside_only_and_changes_apply_to_running_sandboxes(tmp_path: Path) -> None:
    names = LoopbackNames(tmp_path)
    host = "head-svc.team-a.svc.cluster.test"  # .test/.invalid (RFC 6761): no real resolver knows them
    names.add(host, "127.40.1.7")
    found = _lookup(names, host)
    assert found.returncode == 0 and found.stdout.split()[0] == "127.40.1.7", found
    # Not on the machine itself: the mount is private to the sandbox.
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(host, 8265)
    names.remove(host)
    assert _lookup(names, host).returncode != 0
    # The files are rewritten in place, so a sandbox started earlier sees later entries.
    waiting = subprocess.Popen(
        names.wrap(["sh", "-c", "read _; getent hosts late.example.test"]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    names.add("late.example.test", "127.40.1.8")
    out, _ = waiting.communicate("go\n", timeout=30)
    assert out.split()[:1] == ["127.40.1.8"]


def test_other_names_go_to_the_dead_resolver_only(tmp_path: Path) -> None:
    names = LoopbackNames(tmp_path)
    inside = subprocess.run(names.wrap(["cat", "/etc/resolv.conf"]), capture_output=True, text=True, check=True)
    assert inside.stdout.splitlines()[0] == f"nameserver {RESOLVER}"
    assert _lookup(names, "rocmtrain-sandbox-check.invalid").returncode != 0


def test_refuses_to_start_when_something_serves_dns_on_its_resolver_address(tmp_path: Path) -> None:
    names = LoopbackNames(tmp_path)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as dns:
        try:
            dns.bind((RESOLVER, 53))
        except PermissionError:
            pytest.skip("binding port 53 needs root")
        with pytest.raises(ClusterError, match=f"DNS server listens on {re.escape(RESOLVER)}"):
            names.wrap(["true"])


def test_views_get_their_own_names_and_every_change_in_place(tmp_path: Path) -> None:
    names = LoopbackNames(tmp_path / "names")
    view = names.add_view(tmp_path / "pod-hosts", {"head-abcde": "10.244.0.2"})
    inode = view.stat().st_ino
    assert names.replace({"head-svc.ns.svc.cluster.local": ["10.244.0.2"], "gone.ns.svc": []})
    for path in (names.hosts, view):
        assert "10.244.0.2 head-svc.ns.svc.cluster.local\n" in path.read_text()
        assert "gone.ns.svc" not in path.read_text()
    assert view.read_text().splitlines()[2] == "10.244.0.2 head-abcde", "the pod's own name, after localhost"
    assert "head-abcde" not in names.hosts.read_text()
    assert not names.replace({"head-svc.ns.svc.cluster.local": ["10.244.0.2"]}), "nothing changed, nothing written"
    names.replace({})
    assert "head-svc" not in view.read_text() and view.stat().st_ino == inode
    names.remove_view(view)
    names.replace({"later.ns.svc": ["10.244.0.3"]})
    assert "later" not in view.read_text(), "a removed view is no longer written"
