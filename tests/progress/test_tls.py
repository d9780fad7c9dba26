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
    assert data is not None and set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
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


def test_serving_certificate_is_renewed_before_expiry_under_the_same_ca():
    data = tls.plan_secret(None, HOSTS, NOW)
    renewed = tls.plan_secret(data, HOSTS, NOW + tls.SERVING_LIFETIME - tls.SERVING_RENEW_BEFORE + dt.timedelta(days=1))
    assert renewed is not None
    assert renewed["ca.crt"] == data["ca.crt"] and renewed["ca.key"] == data["ca.key"]
    assert renewed["tls.crt"] != data["tls.crt"]


def test_serving_certificate_is_reissued_for_new_names():
    data = tls.plan_secret(None, HOSTS, NOW)
    renewed = tls.plan_secret(data, [*HOSTS, "127.0.0.1"], NOW)
    assert renewed is not None and renewed["ca.crt"] == data["ca.crt"]
    cert = x509.load_pem_x509_certificate(renewed["tls.crt"])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_ca_is_rotated_before_expiry_and_broken_data_is_replaced():
    data = tls.plan_secret(None, HOSTS, NOW)
    later = NOW + tls.CA_LIFETIME - tls.CA_RENEW_BEFORE + dt.timedelta(days=1)
    rotated = tls.plan_secret(data, HOSTS, later)
    assert rotated is not None and rotated["ca.crt"] != data["ca.crt"]
    broken = tls.plan_secret({**data, "ca.crt": b"not a certificate"}, HOSTS, NOW)
    assert broken is not None and broken["ca.crt"] != b"not a certificate"
