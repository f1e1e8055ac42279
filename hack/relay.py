#!/usr/bin/env python3
"""A TCP relay: accepts on LISTEN_HOST:LISTEN_PORT, connects each client to TARGET_HOST:TARGET_PORT.

The real nodes' pods reach the API server through it (hack/realnode.py): the API server listens
on loopback only, and pods, whose only neighbour is the bridge's own address, reach it as
``kubernetes.default.svc`` on port 443 of that address. Bytes pass unchanged, TLS included.

Usage: hack/relay.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT

Imported (``hack.relay``), :class:`Partition` is the same relay in a thread of the caller's,
which a test cuts and heals: a network partition between one client and the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import threading
from dataclasses import dataclass, field


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.close()


async def main(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(serve, *listen, reuse_address=True)
    async with server:
        await server.serve_forever()


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    broken: bool = False
    """Bytes were dropped during a cut: the stream can never be whole again."""


@dataclass
class Partition:
    """A relay from 127.0.0.1 to ``target`` that the caller cuts and heals, like a network
    link: while cut, bytes are neither forwarded nor refused (requests hang, connections stay
    open, new ones are accepted and go nowhere); what was sent meanwhile is lost, never
    delivered late. Healing closes every connection that lost bytes (its client sees it reset
    and connects again) and forwards again."""

    target: tuple[str, int]
    port: int = 0
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _open: bool = True
    _links: set[_Link] = field(default_factory=set)

    def start(self) -> int:
        """Listen on an ephemeral port of 127.0.0.1 (returned) from a daemon thread."""
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            server = self._loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", 0)
            )
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, name="partition-relay", daemon=True).start()
        ready.wait(10)
        return self.port

    def cut(self) -> None:
        self._loop.call_soon_threadsafe(self._cut)

    def heal(self) -> None:
        self._loop.call_soon_threadsafe(self._heal)

    def _cut(self) -> None:
        self._open = False

    def _heal(self) -> None:
        for link in [link for link in self._links if link.broken]:
            self._close(link)
        self._open = True

    def _close(self, link: _Link) -> None:
        self._links.discard(link)
        for writer in (link.client, link.upstream):
            if writer is not None:
                with contextlib.suppress(OSError, RuntimeError):
                    writer.close()

    def _reset(self, link: _Link) -> None:
        """Close the client's connection with a reset, the nearest a relay that has already
        accepted can come to a refusal. A plain close would send FIN or RST depending on whether
        the client's first bytes had arrived yet, a race its caller would see."""
        sock = link.client.get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._close(link)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer)
        self._links.add(link)
        if not self._open:
            link.broken = True  # accepted during a cut: it hangs until healed, then closes
            await self._forward(link, reader, None)
            return
        try:
            up_reader, link.upstream = await asyncio.open_connection(*self.target)
        except OSError:  # the server is down, not cut off: its client sees that at once
            self._reset(link)
            return
        await asyncio.gather(
            self._forward(link, reader, link.upstream), self._forward(link, up_reader, writer)
        )
        self._close(link)

    async def _forward(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None
    ) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            while data := await reader.read(1 << 16):
                if not self._open or link.broken or writer is None:
                    link.broken = True  # dropped: as a cable pulled out
                    continue
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError, RuntimeError):
            if writer is not None:
                writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    _, lhost, lport, thost, tport = sys.argv
    asyncio.run(main((lhost, int(lport)), (thost, int(tport))))
