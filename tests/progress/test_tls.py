"""The operator-managed CA and serving certificate (no cluster)."""

from __future__ import annotations

import datetime as dt
import ssl

import pytest
from cryptography import x509

from rocmtrain.progress import tls

NOW = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
HOSTS = tls.service_hosts("rocmtrain-progress", "rocmtrain-system")


def handshake(server: ssl.SSLContext, ca_crt: bytes, hostname: str) -> None:
    """Run a TLS handshake in memory: a client trusting `ca_crt` against `server`."""
    client = ssl.create_default_context(cadata=ca_crt.decode())
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname=hostname)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(10):
        for name, side in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")


def test_new_secret_serves_the_service_names_and_verifies_with_the_ca():
    data = tls.plan_secret(None, HOSTS, dt.datetime.now(dt.UTC))
    assert data is not None and set(data) == {"ca.crt", "tls.crt", "tls.key"}, "no CA key is ever stored"
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "rocmtrain-progress.rocmtrain-system.svc" in sans.get_values_for_type(x509.DNSName)
    assert "rocmtrain-progress.rocmtrain-system.svc.cluster.local" in sans.get_values_for_type(x509.DNSName)
    material = tls.TlsMaterial(data["ca.crt"], data["tls.crt"], data["tls.key"])
    handshake(material.server_context(), data["ca.crt"], "rocmtrain-progress.rocmtrain-system.svc")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(material.server_context(), data["ca.crt"], "rocmtrain-progress.elsewhere.svc")
    other_ca, _ = tls.new_ca(dt.datetime.now(dt.UTC))
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(material.server_context(), other_ca, "rocmtrain-progress.rocmtrain-system.svc")


def test_valid_secret_is_reused():
    data = tls.plan_secret(None, HOSTS, NOW)
    assert tls.plan_secret(data, HOSTS, NOW + dt.timedelta(days=300)) is None


def _serves(data: dict[str, bytes], trusted: bytes) -> None:
    handshake(tls.TlsMaterial(data["ca.crt"], data["tls.crt"], data["tls.key"]).server_context(), trusted, HOSTS[2])


def test_renewal_publishes_the_new_ca_first_and_serves_it_after_the_overlap():
    """The driver's mounted bundle trusts the successor before it is served: no report fails."""
    renew_at = dt.datetime.now(dt.UTC).replace(microsecond=0)  # the handshakes below check validity at the real time
    issued_at = renew_at - tls.SERVING_LIFETIME + tls.SERVING_RENEW_BEFORE - dt.timedelta(days=1)
    old = tls.plan_secret(None, HOSTS, issued_at)
    assert old is not None
    overlap = dt.timedelta(minutes=10)
    pending = tls.plan_secret(old, HOSTS, renew_at, overlap)
    assert pending is not None
    assert pending["tls.crt"] == old["tls.crt"], "still serving the current certificate"
    assert pending["ca.crt"] == old["ca.crt"] + pending["next-ca.crt"], "the bundle trusts both"
    assert tls.plan_secret(pending, HOSTS, renew_at + overlap / 2, overlap) is None, "waiting out the overlap"
    assert tls._material(pending).promote_at == renew_at + overlap
    _serves(pending, old["ca.crt"])  # a driver that has not seen the bundle yet
    _serves(pending, pending["ca.crt"])
    promoted = tls.plan_secret(pending, HOSTS, renew_at + overlap, overlap)
    assert promoted is not None and set(promoted) == {"ca.crt", "tls.crt", "tls.key"}
    assert promoted["tls.crt"] == pending["next.crt"] and promoted["ca.crt"] == pending["next-ca.crt"]
    _serves(promoted, pending["ca.crt"])  # a driver with the overlap bundle
    with pytest.raises(ssl.SSLCertVerificationError):
        _serves(promoted, old["ca.crt"])


def test_serving_certificate_is_reissued_for_new_names_after_the_overlap():
    data = tls.plan_secret(None, HOSTS, NOW)
    pending = tls.plan_secret(data, [*HOSTS, "127.0.0.1"], NOW, dt.timedelta(0))
    assert pending is not None
    renewed = tls.plan_secret(pending, [*HOSTS, "127.0.0.1"], NOW)
    assert renewed is not None
    cert = x509.load_pem_x509_certificate(renewed["tls.crt"])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_an_older_operators_ca_key_is_dropped_and_broken_data_replaced():
    data = tls.plan_secret(None, HOSTS, NOW)
    assert data is not None
    legacy = {**data, "ca.key": b"-----BEGIN PRIVATE KEY-----..."}
    migrated = tls.plan_secret(legacy, HOSTS, NOW)
    assert migrated == data, "same certificate, without the CA key"
    broken = tls.plan_secret({**data, "tls.crt": b"not a certificate"}, HOSTS, NOW)
    assert broken is not None and broken["tls.crt"] != b"not a certificate" and broken["ca.crt"] != data["ca.crt"]
    expired = tls.plan_secret(data, HOSTS, NOW + tls.SERVING_LIFETIME + dt.timedelta(days=1))
    assert expired is not None and "next.crt" not in expired, "nothing valid is served: no overlap to keep"
