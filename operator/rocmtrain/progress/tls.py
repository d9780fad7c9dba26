"""TLS for the progress endpoint: an operator-managed CA and serving certificate.

The operator keeps a self-signed CA and a serving certificate for the Service
names (`rocmtrain-progress.<ns>.svc`, `….svc.cluster.local`) in one Secret of
its own namespace (`rocmtrain-progress-tls`: `ca.crt`, `ca.key`, `tls.crt`,
`tls.key`). The Secret is created when absent, reused across restarts and
replicas, and renewed when a certificate nears expiry (the CA after 9 of its 10
years, the serving certificate 30 days before its year ends) or when the
Service names change. Training namespaces get the CA certificate (never the
key) as the ConfigMap `rocmtrain-progress-ca`, key `ca.crt`, which the Ray head
pod mounts to verify the endpoint.

cert-manager instead: with `ProgressServerConfig.manage_tls` off, the operator
only reads the Secret and publishes its `ca.crt`. Create it with a cert-manager
`Certificate` (`secretName: rocmtrain-progress-tls`, `dnsNames` as above,
`privateKey.algorithm: ECDSA`) issued by a CA `Issuer`, so that cert-manager
writes `ca.crt` next to `tls.crt` and `tls.key`; cert-manager then rotates it and
the server reloads the new certificate on its next refresh.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rocmtrain.api.contract import MANAGED_LABELS

SECRET_NAME = "rocmtrain-progress-tls"  # noqa: S105 - a name, not a password
CA_CONFIGMAP = "rocmtrain-progress-ca"
CA_KEY = "ca.crt"

CA_LIFETIME = dt.timedelta(days=3650)
CA_RENEW_BEFORE = dt.timedelta(days=365)
SERVING_LIFETIME = dt.timedelta(days=365)
SERVING_RENEW_BEFORE = dt.timedelta(days=30)
CLOCK_SKEW = dt.timedelta(minutes=5)
_WRITE_ATTEMPTS = 3


@dataclass(frozen=True)
class TlsMaterial:
    """PEM-encoded CA certificate and serving certificate + key."""

    ca_crt: bytes
    tls_crt: bytes
    tls_key: bytes

    def server_context(self) -> ssl.SSLContext:
        """A TLS 1.2+ server context serving this certificate."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self.load_into(ctx)
        return ctx

    def load_into(self, ctx: ssl.SSLContext) -> None:
        """Replace the certificate a server context serves (new connections pick it up)."""
        with tempfile.TemporaryDirectory(prefix="rocmtrain-tls-") as tmp:
            cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
            cert.write_bytes(self.tls_crt)
            key.touch(mode=0o600)
            key.write_bytes(self.tls_key)
            ctx.load_cert_chain(cert, key)


def service_hosts(service: str, namespace: str) -> list[str]:
    """The names clients use for a Service, short to fully qualified."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _builder(
    subject: str, public_key: ec.EllipticCurvePublicKey, now: dt.datetime, lifetime: dt.timedelta
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + lifetime)
    )


# What a CA key may do: sign certificates and CRLs (and its own signatures).
CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


def new_ca(now: dt.datetime) -> tuple[bytes, bytes]:
    """A self-signed CA certificate and its key (PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder("rocmtrain-progress-ca", key.public_key(), now, CA_LIFETIME)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rocmtrain-progress-ca")]))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def new_serving_cert(ca_crt: bytes, ca_key: bytes, hosts: Sequence[str], now: dt.datetime) -> tuple[bytes, bytes]:
    """A serving certificate for `hosts`, signed by the CA, and its key (PEM)."""
    ca = x509.load_pem_x509_certificate(ca_crt)
    signer = serialization.load_pem_private_key(ca_key, password=None)
    if not isinstance(signer, ec.EllipticCurvePrivateKey):
        raise ValueError("the progress CA key must be an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder("rocmtrain-progress", key.public_key(), now, SERVING_LIFETIME)
        .issuer_name(ca.subject)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in hosts]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
            critical=False,
        )
        .sign(signer, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _valid_until(pem: bytes) -> dt.datetime | None:
    try:
        return x509.load_pem_x509_certificate(pem).not_valid_after_utc
    except ValueError:
        return None


def _covers(tls_crt: bytes, hosts: Sequence[str]) -> bool:
    cert = x509.load_pem_x509_certificate(tls_crt)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return {_general_name(n) for n in hosts} <= set(sans)


def plan_secret(data: Mapping[str, bytes] | None, hosts: Sequence[str], now: dt.datetime) -> dict[str, bytes] | None:
    """The Secret data to write, or None when `data` is still good (pure apart from key generation)."""
    data = data or {}
    ca_crt, ca_key = data.get("ca.crt", b""), data.get("ca.key", b"")
    ca_until = _valid_until(ca_crt) if ca_crt and ca_key else None
    if ca_until is None or ca_until - now < CA_RENEW_BEFORE:
        ca_crt, ca_key = new_ca(now)
    elif (tls_until := _valid_until(data.get("tls.crt", b""))) is not None and (
        tls_until - now >= SERVING_RENEW_BEFORE and data.get("tls.key") and _covers(data["tls.crt"], hosts)
    ):
        return None
    tls_crt, tls_key = new_serving_cert(ca_crt, ca_key, hosts, now)
    return {"ca.crt": ca_crt, "ca.key": ca_key, "tls.crt": tls_crt, "tls.key": tls_key}


def _material(data: Mapping[str, bytes]) -> TlsMaterial:
    missing = [k for k in ("ca.crt", "tls.crt", "tls.key") if not data.get(k)]
    if missing:
        raise ValueError(f"Secret {SECRET_NAME} lacks {', '.join(missing)}")
    return TlsMaterial(ca_crt=data["ca.crt"], tls_crt=data["tls.crt"], tls_key=data["tls.key"])


def _decode(secret: client.V1Secret | None) -> dict[str, bytes] | None:
    if secret is None:
        return None
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


async def _read_secret(core: client.CoreV1Api, namespace: str) -> client.V1Secret | None:
    try:
        return await core.read_namespaced_secret(SECRET_NAME, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


async def load_serving_secret(
    api: client.ApiClient,
    namespace: str,
    hosts: Sequence[str],
    *,
    manage: bool = True,
    now: dt.datetime | None = None,
) -> TlsMaterial:
    """The serving material from the Secret, first creating or renewing it when `manage` is on."""
    core = client.CoreV1Api(api)
    for _ in range(_WRITE_ATTEMPTS):
        secret = await _read_secret(core, namespace)
        data = _decode(secret)
        if not manage:
            if data is None:
                raise ValueError(f"Secret {namespace}/{SECRET_NAME} does not exist")
            return _material(data)
        planned = plan_secret(data, hosts, now or dt.datetime.now(dt.UTC))
        if planned is None:
            return _material(data or {})
        body: Any = {  # the client takes plain dicts as well as its model classes
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": SECRET_NAME, "namespace": namespace, "labels": dict(MANAGED_LABELS)},
            "data": {k: base64.b64encode(v).decode() for k, v in planned.items()},
        }
        try:
            if secret is None:
                await core.create_namespaced_secret(namespace, body)
            else:
                body["metadata"]["resourceVersion"] = secret.metadata.resource_version
                await core.replace_namespaced_secret(SECRET_NAME, namespace, body)
        except ApiException as exc:
            if exc.status == 409:  # another replica wrote first: use what it wrote
                continue
            raise
        return _material(planned)
    raise RuntimeError(f"Secret {namespace}/{SECRET_NAME} kept changing while being written")


async def publish_ca(api: client.ApiClient, namespace: str, ca_crt: bytes) -> None:
    """Create or update the ConfigMap `rocmtrain-progress-ca` (key `ca.crt`) in a job namespace."""
    core = client.CoreV1Api(api)
    body: Any = {  # the client takes plain dicts as well as its model classes
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CA_CONFIGMAP, "namespace": namespace, "labels": dict(MANAGED_LABELS)},
        "data": {CA_KEY: ca_crt.decode()},
    }
    for _ in range(_WRITE_ATTEMPTS):
        try:
            current = await core.read_namespaced_config_map(CA_CONFIGMAP, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            current = None
        try:
            if current is None:
                await core.create_namespaced_config_map(namespace, body)
            elif (current.data or {}).get(CA_KEY) != body["data"][CA_KEY]:
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                await core.replace_namespaced_config_map(CA_CONFIGMAP, namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                continue
            raise
        return
    raise RuntimeError(f"ConfigMap {namespace}/{CA_CONFIGMAP} kept changing while being written")
