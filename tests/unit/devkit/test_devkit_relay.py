"""hack/relay.py's Partition, the link the leader-election tests cut: while cut, requests hang
(neither answered nor refused) and nothing sent meanwhile arrives later; healed, what lost bytes
is closed and new connections pass; a server that is down is refused at once."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from hack.relay import Partition

pytestmark = pytest.mark.unit


class Echo:
    """A TCP server that echoes and records what it received."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.received = bytearray()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.server.accept()
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(1 << 16):
                self.received.extend(data)
                conn.sendall(data)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=1)
    sock.settimeout(1)
    return sock


def test_cut_hangs_and_loses_heal_closes_the_broken_and_passes_the_new() -> None:
    echo = Echo()
    relay = Partition(("127.0.0.1", echo.port))
    port = relay.start()
    before = connect(port)
    before.sendall(b"one")
    assert before.recv(16) == b"one"
    relay.cut()
    time.sleep(0.1)
    before.sendall(b"two")
    with pytest.raises(TimeoutError):
        before.recv(16)  # hangs: neither an answer nor a refusal
    during = connect(port)  # accepted, goes nowhere
    during.sendall(b"three")
    with pytest.raises(TimeoutError):
        during.recv(16)
    relay.heal()
    time.sleep(0.1)
    assert before.recv(16) == b""  # closed: its stream lost bytes
    assert during.recv(16) == b""
    after = connect(port)
    after.sendall(b"four")
    assert after.recv(16) == b"four"
    assert bytes(echo.received) == b"onefour"  # nothing sent during the cut ever arrived


def test_a_server_that_is_down_is_refused_at_once() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down = closed.getsockname()[1]
    relay = Partition(("127.0.0.1", down))
    port = relay.start()
    # Reset at once, as near a refusal as a relay that accepted gets: the reset may even beat
    # the end of connect(), which then reports it.
    with pytest.raises(ConnectionResetError):
        connect(port).recv(16)
