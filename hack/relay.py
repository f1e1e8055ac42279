#!/usr/bin/env python3
"""A TCP relay: accepts on LISTEN_HOST:LISTEN_PORT, connects each client to TARGET_HOST:TARGET_PORT.

The real nodes' pods reach the API server through it (hack/realnode.py): the API server listens
on loopback only, and pods, whose only neighbour is the bridge's own address, reach it as
``kubernetes.default.svc`` on port 443 of that address. Bytes pass unchanged, TLS included.

Usage: hack/relay.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


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


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    _, lhost, lport, thost, tport = sys.argv
    asyncio.run(main((lhost, int(lport)), (thost, int(tport))))
