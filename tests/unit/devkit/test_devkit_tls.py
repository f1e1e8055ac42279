"""The dev tooling's one certificate helper (hack/tls.py), checked by real TLS handshakes."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from pathlib import Path

import pytest

from hack import tls

pytestmark = pytest.mark.unit


def handshake(
    tmp_path: Path,
    server: tls.Pair,
    trusted: tls.Pair,
    client: tls.Pair,
    client_ca: tls.Pair,
    hostname: str = "127.0.0.1",
) -> str:
    """One TLS handshake on loopback: the server presents ``server`` and asks for a client
    certificate signed by ``client_ca``; the client trusts ``trusted`` and presents ``client``.
    Returns what the server read (or why it refused); raises the client's SSL error."""
    server.write(tmp_path / "server.crt", tmp_path / "server.key")
    (tmp_path / "client-ca.crt").write_bytes(client_ca.cert_pem)
    (tmp_path / "trusted.crt").write_bytes(trusted.cert_pem)
    srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    srv.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    srv.load_verify_locations(tmp_path / "client-ca.crt")
    srv.verify_mode = ssl.CERT_REQUIRED
    cli = ssl.create_default_context(cafile=str(tmp_path / "trusted.crt"))
    client.write(tmp_path / "client.crt", tmp_path / "client.key")
    cli.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    got: list[str] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with srv.wrap_socket(conn, server_side=True) as s:
                    got.append(s.recv(16).decode())
            except (ssl.SSLError, OSError) as e:
                got.append(f"refused: {e.__class__.__name__}")

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            # Under TLS 1.3 the client's handshake ends before the server has checked the
            # client's certificate: that refusal shows on the server's side, not here.
            with (
                socket.create_connection(("127.0.0.1", port)) as raw,
                cli.wrap_socket(raw, server_hostname=hostname) as s,
                contextlib.suppress(ConnectionError, ssl.SSLError),
            ):
                s.sendall(b"hello")
        finally:
            thread.join(timeout=10)
    return got[0]


def test_a_server_certificate_from_a_ca_passes_mutual_tls_on_loopback(tmp_path: Path) -> None:
    ca = tls.certificate("test-ca", usage="ca")
    server = tls.certificate("127.0.0.1", issuer=ca, usage="server", names=tls.LOOPBACK)
    client = tls.certificate("kube-apiserver", issuer=ca, usage="client")
    assert handshake(tmp_path, server, ca, client, ca) == "hello"


def test_a_client_trusting_another_ca_refuses_the_server(tmp_path: Path) -> None:
    ca, other = tls.certificate("test-ca", usage="ca"), tls.certificate("other", usage="ca")
    server = tls.certificate("127.0.0.1", issuer=ca, usage="server", names=tls.LOOPBACK)
    client = tls.certificate("kube-apiserver", issuer=ca, usage="client")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tmp_path, server, other, client, ca)


def test_a_client_certificate_from_another_ca_is_refused(tmp_path: Path) -> None:
    ca, other = tls.certificate("test-ca", usage="ca"), tls.certificate("other", usage="ca")
    server = tls.certificate("127.0.0.1", issuer=ca, usage="server", names=tls.LOOPBACK)
    stranger = tls.certificate("someone", issuer=other, usage="client")
    assert handshake(tmp_path, server, ca, stranger, ca).startswith("refused: SSL")


def test_a_self_signed_server_certificate_is_its_own_bundle_for_the_service(
    tmp_path: Path,
) -> None:
    names = tls.service_names("mpi-operator", "webhook")
    server = tls.certificate(names[-1], usage="server", names=names)
    ca = tls.certificate("client-ca", usage="ca")
    client = tls.certificate("kube-apiserver", issuer=ca, usage="client")
    for name in names:
        assert handshake(tmp_path, server, server, client, ca, hostname=name) == "hello"
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tmp_path, server, server, client, ca, hostname="webhook.other.svc")


def test_the_private_key_is_written_for_its_owner_only(tmp_path: Path) -> None:
    pair = tls.certificate("x", usage="ca")
    pair.write(tmp_path / "a" / "tls.crt", tmp_path / "a" / "tls.key")
    assert (tmp_path / "a" / "tls.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "a" / "tls.crt").read_bytes() == pair.cert_pem
