"""X.509 for the project: the one certificate builder, and a webhook server's serving
certificate, made fresh at every start or mounted.

Nothing secret is stored in the cluster: a fresh key and a self-signed certificate are made at
start and the webhook configurations re-applied with the new CA bundle; a certificate mounted
from a Secret serves every replica alike. The local cluster's certificates (the API server's
webhook client certificate, Kueue's webhook) come from the same :func:`issue`.
"""

from __future__ import annotations

import atexit
import base64
import datetime as dt
import ipaddress
import shutil
import tempfile
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec


@dataclass(frozen=True)
class Issued:
    """A P-256 key and the certificate issued for it."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    def cert_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


def issue(
    common_name: str,
    *,
    issuer: Issued | None = None,
    ca: bool = False,
    path_length: int | None = None,
    hosts: Sequence[str] = (),
    usage: Literal["server", "client"] | None = None,
    days: int = 365,
) -> Issued:
    """A fresh P-256 key and a certificate for it, signed by ``issuer`` (self-signed without
    one), valid from five minutes ago (clocks drift) for ``days``.

    ``hosts`` become subject alternative names (IP addresses as such, the rest as DNS names);
    ``usage`` adds the extended key usage a TLS peer checks.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length), critical=True)
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if usage is not None:
        oid = (
            ExtendedKeyUsageOID.SERVER_AUTH
            if usage == "server"
            else ExtendedKeyUsageOID.CLIENT_AUTH
        )
        builder = builder.add_extension(x509.ExtendedKeyUsage([oid]), critical=False)
    return Issued(key, builder.sign(issuer.key if issuer else key, hashes.SHA256()))


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
    re-applied with the new bundle at the same start. Without ``directory`` the files go to a
    directory of their own, removed when the interpreter exits: each start's key is worthless
    after it, and a machine that runs the operator many times would keep them all. A process
    ended at once (killed, or :func:`~mpijob.platform.manager.exit_at_once`, which runs no exit
    handler) leaves it.
    """
    names = [
        service_name,
        f"{service_name}.{service_namespace}",
        f"{service_name}.{service_namespace}.svc",
    ]
    host = urllib.parse.urlsplit(url).hostname if url else None
    made = issue(names[-1], ca=True, hosts=[*names, *([host] if host else [])])
    where = directory
    if where is None:
        where = Path(tempfile.mkdtemp(prefix="mpijob-webhook-"))
        atexit.register(shutil.rmtree, where, ignore_errors=True)
    certfile, keyfile = where / "tls.crt", where / "tls.key"
    pem = made.cert_pem()
    certfile.write_bytes(pem)
    keyfile.write_bytes(made.key_pem())
    keyfile.chmod(0o600)
    return ServingCertificate(certfile, keyfile, base64.b64encode(pem).decode("ascii"))


def mounted_certificate(directory: Path) -> ServingCertificate:
    """The serving certificate in ``directory`` (``tls.crt``, ``tls.key``, optional ``ca.crt``,
    as a ``kubernetes.io/tls`` Secret or cert-manager mounts it). Every replica serves it, so the
    one CA bundle the configurations carry verifies whichever replica the Service picks."""
    certfile, keyfile, cafile = directory / "tls.crt", directory / "tls.key", directory / "ca.crt"
    bundle = cafile.read_bytes() if cafile.exists() else certfile.read_bytes()
    return ServingCertificate(certfile, keyfile, base64.b64encode(bundle).decode("ascii"))
