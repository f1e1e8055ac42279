"""The local cluster's keys and certificates, made in one place.

Every certificate the dev tooling needs is one of three shapes: a CA, a server certificate for
loopback or a Service's DNS names, and a client certificate; all P-256, signed by a CA made here
or by themselves. The API server's service-account signing key is the one RSA key (what
kube-apiserver's ``--service-account-signing-key-file`` is documented with).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from mpijob.platform.tls import Issued, issue

LOOPBACK = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Pair:
    """A private key and its certificate, as the tooling writes them."""

    issued: Issued

    @property
    def cert(self) -> x509.Certificate:
        return self.issued.cert

    @property
    def cert_pem(self) -> bytes:
        return self.issued.cert_pem()

    @property
    def key_pem(self) -> bytes:
        return self.issued.key_pem()

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
    """A fresh key and its certificate, signed by ``issuer`` (self-signed without one), built by
    the operator's one X.509 builder (:func:`mpijob.platform.tls.issue`).

    ``names`` are the server's DNS names and IP addresses (subject alternative names).
    """
    return Pair(
        issue(
            common_name,
            issuer=issuer.issued if issuer else None,
            # A self-signed certificate is also its own CA: clients are given it as their bundle.
            ca=usage == "ca" or issuer is None,
            path_length=0 if usage == "ca" else None,
            hosts=names,
            usage=None if usage == "ca" else usage,
            days=days,
        )
    )


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
