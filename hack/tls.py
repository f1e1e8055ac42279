"""The local cluster's keys and certificates, made in one place.

Every certificate the dev tooling needs is one of three shapes: a CA, a server certificate for
loopback or a Service's DNS names, and a client certificate; all P-256, signed by a CA made here
or by themselves. The API server's service-account signing key is the one RSA key (what
kube-apiserver's ``--service-account-signing-key-file`` is documented with).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Pair:
    """A private key and its certificate."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write(self, cert: Path, key: Path) -> None:
        """Both files, each replaced atomically (a certificate watcher never reads half a file);
        the key readable by its owner only."""
        for path, data, mode in ((cert, self.cert_pem, 0o644), (key, self.key_pem, 0o600)):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_bytes(data)
            tmp.chmod(mode)
            tmp.replace(path)


def certificate(
    common_name: str,
    *,
    issuer: Pair | None = None,
    usage: Literal["ca", "server", "client"],
    names: tuple[str, ...] = (),
    days: int = 365,
) -> Pair:
    """A fresh key and its certificate, signed by ``issuer`` (self-signed without one).

    ``names`` are the server's DNS names and IP addresses (subject alternative names).
    """
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
        # A self-signed certificate is also its own CA: clients are given it as their bundle.
        .add_extension(
            x509.BasicConstraints(
                ca=usage == "ca" or issuer is None, path_length=0 if usage == "ca" else None
            ),
            critical=True,
        )
    )
    if usage != "ca":
        purpose = (
            ExtendedKeyUsageOID.SERVER_AUTH
            if usage == "server"
            else ExtendedKeyUsageOID.CLIENT_AUTH
        )
        builder = builder.add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
    if names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False
        )
    return Pair(key, builder.sign(issuer.key if issuer else key, hashes.SHA256()))


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def service_names(namespace: str, service: str) -> tuple[str, ...]:
    """The DNS names the API server uses for a Service (a webhook behind it)."""
    return (service, f"{service}.{namespace}", f"{service}.{namespace}.svc")


def write_signing_key(private: Path, public: Path) -> None:
    """An RSA key pair for signing service-account tokens."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private.parent.mkdir(parents=True, exist_ok=True)
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    private.chmod(0o600)
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
