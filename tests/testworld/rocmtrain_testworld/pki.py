"""Certificates and kubeconfigs for the test cluster (nothing here talks to a server)."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Iterable
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rocmtrain.progress.tls import CA_KEY_USAGE

SERVICE_CIDR = "10.96.0.0/16"
_UTC = dt.timezone(dt.timedelta(0))  # datetime.UTC needs Python 3.11

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: PrivateKey) -> bytes:
    """PEM: PKCS#8 for EC keys, PKCS#1 ("RSA PRIVATE KEY", what Go's ParsePKCS1PrivateKey reads) for RSA."""
    fmt = serialization.PrivateFormat.TraditionalOpenSSL if isinstance(key, rsa.RSAPrivateKey) else None
    return key.private_bytes(
        serialization.Encoding.PEM, fmt or serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _san(names: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for san in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(san)))
        except ValueError:
            out.append(x509.DNSName(san))
    return out


def issue(
    subject: x509.Name,
    key: PrivateKey,
    ca: tuple[x509.Certificate, PrivateKey] | None,
    *,
    sans: Iterable[str] = (),
    client: bool = False,
    days: int = 30,
) -> x509.Certificate:
    """Sign a certificate for ``key``: a self-signed CA when ``ca`` is None, else a server (or client) leaf."""
    now = dt.datetime.now(_UTC)
    issuer_name, signer = (ca[0].subject, ca[1]) if ca else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
    )
    if ca is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        builder = builder.add_extension(CA_KEY_USAGE, critical=True)
    else:
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [ExtendedKeyUsageOID.SERVER_AUTH]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if general_names := _san(sans):
        builder = builder.add_extension(x509.SubjectAlternativeName(general_names), critical=False)
    return builder.sign(signer, hashes.SHA256())


def write(path: Path, data: bytes | str, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)
    return path


def kubeconfig(server: str, ca: bytes, cert: bytes, key: bytes, user: str) -> str:
    """A kubeconfig with inline client certificate credentials."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "rocmtrain-test", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
        "contexts": [{"name": "rocmtrain-test", "context": {"cluster": "rocmtrain-test", "user": user}}],
        "current-context": "rocmtrain-test",
    }
    return yaml.safe_dump(doc, sort_keys=False)


class Pki:
    """Certificates and keys for one control plane, written under ``pki_dir``."""

    def __init__(self, pki_dir: Path) -> None:
        self.dir = pki_dir
        ca_key = new_key()
        ca = issue(name("rocmtrain-test-ca"), ca_key, None)
        self.ca_pem = cert_pem(ca)
        self.ca_crt = write(pki_dir / "ca.crt", self.ca_pem, 0o644)
        self.ca_key = write(pki_dir / "ca.key", key_pem(ca_key))

        key = new_key()
        sans = [
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            str(next(ipaddress.ip_network(SERVICE_CIDR).hosts())),
        ]
        cert = issue(name("kube-apiserver"), key, (ca, ca_key), sans=sans)
        self.apiserver_crt = write(pki_dir / "apiserver.crt", cert_pem(cert), 0o644)
        self.apiserver_key = write(pki_dir / "apiserver.key", key_pem(key))

        sa_key = new_key()
        self.sa_key = write(pki_dir / "sa.key", key_pem(sa_key))
        self.sa_pub = write(
            pki_dir / "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            0o644,
        )
        self._ca = (ca, ca_key)

    def client(self, file: str, cn: str, org: str | None = None) -> tuple[bytes, bytes, Path, Path]:
        """Issue a client certificate; return (cert PEM, key PEM, cert path, key path)."""
        key = new_key()
        cert = issue(name(cn, org), key, self._ca, client=True)
        crt, pem = cert_pem(cert), key_pem(key)
        return crt, pem, write(self.dir / f"{file}.crt", crt, 0o644), write(self.dir / f"{file}.key", pem)

    def kubeconfig(self, server: str, file: str, cn: str, org: str | None = None) -> Path:
        """Write ``<file>.kubeconfig`` for a new client certificate of ``cn`` (in group ``org``)."""
        crt, pem, *_ = self.client(file, cn, org)
        return write(self.dir.parent / f"{file}.kubeconfig", kubeconfig(server, self.ca_pem, crt, pem, cn))


def webhook_serving_pair(ca_cn: str, sans: Iterable[str], days: int) -> dict[str, bytes]:
    """A fresh RSA CA and a server certificate for ``sans`` it signed, as PEM by the usual Secret keys.

    RSA and PKCS#1 because controller webhook cert rotators (Kueue's,
    open-policy-agent/cert-controller) parse the CA key that way; the CA names
    itself in a DNS SAN because those rotators verify it against its own name.
    """
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca = issue(name(ca_cn), ca_key, None, sans=[ca_cn], days=days)
    key = new_key()
    cert = issue(name(next(iter(sans))), key, (ca, ca_key), sans=sans, days=days)
    return {
        "ca.crt": cert_pem(ca),
        "ca.key": key_pem(ca_key),
        "tls.crt": cert_pem(cert),
        "tls.key": key_pem(key),
    }
