"""The serving certificate of the share webhook: made fresh at every start, or mounted.

Nothing secret is stored in the cluster: a fresh key and a self-signed certificate are made at
start and the webhook configurations re-applied with the new CA bundle; a certificate mounted
from a Secret serves every replica alike.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServingCertificate:
    """The webhook server's key and self-signed certificate, as files and as a CA bundle."""

    certfile: Path
    keyfile: Path
    ca_bundle: str
    """Base64 of the certificate PEM, the ``caBundle`` of the webhook configurations."""


def serving_certificate(
    service_namespace: str,
    service_name: str,
    directory: Path | None = None,
    *,
    url: str = "",
) -> ServingCertificate:
    """A fresh P-256 key and a one-year self-signed certificate for the Service's DNS names
    (and the host of ``url``, when the API server calls a URL instead).

    Made at every start, so nothing secret is stored in the cluster; the configurations are
    re-applied with the new bundle at the same start.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    names = [
        service_name,
        f"{service_name}.{service_namespace}",
        f"{service_name}.{service_namespace}.svc",
    ]
    alternatives: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    host = urllib.parse.urlsplit(url).hostname if url else None
    if host:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alternatives.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[-1])])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    where = directory or Path(tempfile.mkdtemp(prefix="mpijob-webhook-"))
    certfile, keyfile = where / "tls.crt", where / "tls.key"
    pem = cert.public_bytes(serialization.Encoding.PEM)
    certfile.write_bytes(pem)
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    keyfile.chmod(0o600)
    return ServingCertificate(certfile, keyfile, base64.b64encode(pem).decode("ascii"))


def mounted_certificate(directory: Path) -> ServingCertificate:
    """The serving certificate in ``directory`` (``tls.crt``, ``tls.key``, optional ``ca.crt``,
    as a ``kubernetes.io/tls`` Secret or cert-manager mounts it). Every replica serves it, so the
    one CA bundle the configurations carry verifies whichever replica the Service picks."""
    certfile, keyfile, cafile = directory / "tls.crt", directory / "tls.key", directory / "ca.crt"
    bundle = cafile.read_bytes() if cafile.exists() else certfile.read_bytes()
    return ServingCertificate(certfile, keyfile, base64.b64encode(bundle).decode("ascii"))
