"""TLS for the progress endpoint (and `/metrics`): an operator-managed serving certificate, rotated with an overlap.

The operator keeps the serving certificate for the Service names
(`rocmtrain-progress.<ns>.svc`, `….svc.cluster.local`, and the metrics Service's) in one Secret of its own
namespace (`rocmtrain-progress-tls`). Each serving certificate is signed by a CA
made for it alone, whose key is thrown away once it has signed: no CA key is ever
stored, so the network-facing process never holds one. The Secret's `ca.crt` is
the bundle that training pods trust, published to job namespaces as the ConfigMap
`rocmtrain-progress-ca` (key `ca.crt`), which the Ray head pod mounts.

Rotation keeps an overlap (`plan_secret`): 30 days before the serving certificate
(one year) ends, or when the Service names change, a successor certificate and its
CA are made and stored beside the current one (`next.crt`, `next.key`,
`next-ca.crt`, and `next.after`), and the bundle becomes both CAs; the server
republishes it and keeps serving the current certificate. After the overlap
(`ProgressServerConfig.ca_overlap_seconds`, long enough for the kubelet to refresh
the mounted ConfigMap) the successor is promoted: served, and the bundle is its CA
alone. A running job's driver thus trusts the new certificate before it is served.
A Secret written by an older operator (with a long-lived CA and `ca.key`) keeps
serving; its `ca.key` is deleted.

The CA ConfigMap is written only when absent or when it already carries the
operator's labels: one of that name made by someone else is left alone
(`ConfigMapTaken`), and the job waits with a `Blocked` condition.

cert-manager instead: with `ProgressServerConfig.manage_tls` off, the operator
only reads the Secret and publishes its `ca.crt`. Create it with a cert-manager
`Certificate` (`secretName: rocmtrain-progress-tls`, `dnsNames` as above,
`privateKey.algorithm: ECDSA`) issued by a CA `Issuer`, so that cert-manager
writes `ca.crt` next to `tls.crt` and `tls.key`; cert-manager then rotates the
serving certificate under the same CA, and the server reloads it on its next refresh.
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

from rocmtrain.api.contract import MANAGED_BY_LABEL, MANAGED_LABELS, OPERATOR_NAME, PROGRESS_CA_CONFIGMAP
from rocmtrain.api.errors import Conflict
from rocmtrain.api.timestamps import parse_time, rfc3339

SECRET_NAME = "rocmtrain-progress-tls"  # noqa: S105 - a name, not a password
CA_CONFIGMAP = PROGRESS_CA_CONFIGMAP
CA_KEY = "ca.crt"

SERVING_LIFETIME = dt.timedelta(days=365)
SERVING_RENEW_BEFORE = dt.timedelta(days=30)
CA_OVERLAP = dt.timedelta(hours=1)
CLOCK_SKEW = dt.timedelta(minutes=5)
_WRITE_ATTEMPTS = 3
# The Secret's keys: what is served and trusted, and the successor waiting for its overlap to pass.
SERVING_KEYS = ("ca.crt", "tls.crt", "tls.key")
NEXT_KEYS = ("next-ca.crt", "next.crt", "next.key", "next.after")


class ConfigMapTaken(Conflict):
    """A ConfigMap of the CA bundle's name exists in a job namespace and is not the operator's."""

    def __init__(self, namespace: str) -> None:
        super().__init__(
            f"ConfigMap {namespace}/{CA_CONFIGMAP} exists and is not the operator's (no label "
            f"{MANAGED_BY_LABEL}={OPERATOR_NAME}); the operator will not overwrite it: rename or delete it"
        )


@dataclass(frozen=True)
class TlsMaterial:
    """PEM-encoded CA bundle and serving certificate + key; when the successor is due, if one waits."""

    ca_crt: bytes
    tls_crt: bytes
    tls_key: bytes
    promote_at: dt.datetime | None = None

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


def new_ca(now: dt.datetime, lifetime: dt.timedelta = SERVING_LIFETIME) -> tuple[bytes, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate (PEM) and its key, which the caller uses once and drops."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder("rocmtrain-progress-ca", key.public_key(), now, lifetime)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rocmtrain-progress-ca")]))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), key


def new_serving_cert(hosts: Sequence[str], now: dt.datetime) -> tuple[bytes, bytes, bytes]:
    """A serving certificate for `hosts` and its key, and the CA that signed it (PEM: CA, certificate, key).

    The CA's key signs this one certificate and is then dropped.
    """
    ca_crt, signer = new_ca(now)
    ca = x509.load_pem_x509_certificate(ca_crt)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder("rocmtrain-progress", key.public_key(), now, SERVING_LIFETIME)
        .issuer_name(ca.subject)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in hosts]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False)
        .sign(signer, hashes.SHA256())
    )
    return ca_crt, cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


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


def _fresh(hosts: Sequence[str], now: dt.datetime) -> dict[str, bytes]:
    ca_crt, tls_crt, tls_key = new_serving_cert(hosts, now)
    return {"ca.crt": ca_crt, "tls.crt": tls_crt, "tls.key": tls_key}


def _next_after(data: Mapping[str, bytes]) -> dt.datetime | None:
    """When the stored successor may be served; None when there is no usable successor."""
    if not (data.get("next.key") and data.get("next-ca.crt") and _valid_until(data.get("next.crt", b""))):
        return None
    try:
        return parse_time(data.get("next.after", b"").decode())
    except UnicodeDecodeError:
        return None


def plan_secret(
    data: Mapping[str, bytes] | None, hosts: Sequence[str], now: dt.datetime, overlap: dt.timedelta = CA_OVERLAP
) -> dict[str, bytes] | None:
    """The Secret data to write, or None when `data` is still good (pure apart from key generation).

    Nothing valid served: a new certificate at once (there is no trust to keep).
    A successor whose overlap has passed: promoted. A certificate that nears its end
    or no longer covers `hosts`: a successor, trusted from now on, served after `overlap`.
    """
    data = data or {}
    until = _valid_until(data.get("tls.crt", b"")) if data.get("tls.key") and data.get("ca.crt") else None
    if until is None or until <= now:
        return _fresh(hosts, now)
    planned = {key: data[key] for key in SERVING_KEYS}  # an older operator's ca.key is dropped
    promote_at = _next_after(data)
    if promote_at is not None:
        if now >= promote_at:
            return {"ca.crt": data["next-ca.crt"], "tls.crt": data["next.crt"], "tls.key": data["next.key"]}
        planned |= {key: data[key] for key in NEXT_KEYS}
    elif until - now < SERVING_RENEW_BEFORE or not _covers(data["tls.crt"], hosts):
        next_ca, next_crt, next_key = new_serving_cert(hosts, now)
        planned |= {
            "ca.crt": data["ca.crt"] + next_ca,
            "next-ca.crt": next_ca,
            "next.crt": next_crt,
            "next.key": next_key,
            "next.after": rfc3339(now + overlap).encode(),
        }
    return None if planned == dict(data) else planned


def _material(data: Mapping[str, bytes]) -> TlsMaterial:
    missing = [k for k in SERVING_KEYS if not data.get(k)]
    if missing:
        raise ValueError(f"Secret {SECRET_NAME} lacks {', '.join(missing)}")
    return TlsMaterial(
        ca_crt=data["ca.crt"], tls_crt=data["tls.crt"], tls_key=data["tls.key"], promote_at=_next_after(data)
    )


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
    overlap: dt.timedelta = CA_OVERLAP,
) -> TlsMaterial:
    """The serving material from the Secret, first creating, renewing or promoting it when `manage` is on."""
    core = client.CoreV1Api(api)
    for _ in range(_WRITE_ATTEMPTS):
        secret = await _read_secret(core, namespace)
        data = _decode(secret)
        if not manage:
            if data is None:
                raise ValueError(f"Secret {namespace}/{SECRET_NAME} does not exist")
            return _material(data)
        planned = plan_secret(data, hosts, now or dt.datetime.now(dt.UTC), overlap)
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


def is_operators(labels: Mapping[str, str] | None) -> bool:
    """Whether an object's labels say the operator made it."""
    return (labels or {}).get(MANAGED_BY_LABEL) == OPERATOR_NAME


async def publish_ca(api: client.ApiClient, namespace: str, ca_crt: bytes) -> None:
    """Create or update the ConfigMap `rocmtrain-progress-ca` (key `ca.crt`) in a job namespace.

    Raise ConfigMapTaken when a ConfigMap of that name exists without the operator's label.
    """
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
        if current is not None and not is_operators(current.metadata.labels):
            raise ConfigMapTaken(namespace)
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
