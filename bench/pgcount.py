"""A PostgreSQL wire-protocol proxy that counts round trips, run as its own process.

``python -m bench.pgcount LISTEN_PORT UPSTREAM_PORT CONTROL_PORT``. Every frontend message that
makes the client wait for the server's answer is one round trip: ``Sync`` (extended protocol: a
prepared-statement execution, a prepare), ``Query`` (simple protocol, e.g. asyncpg's pool
reset) and ``Flush`` (asyncpg's Parse + Describe of a statement whose types it does not know
yet: it waits for the description before it sends the Bind, counted as ``describe:<query>``).
Connecting to CONTROL_PORT returns the counts so far as JSON.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
import sys
from collections import Counter
from contextlib import suppress

UNTYPED_CODES = {80877103, 80877104}  # SSLRequest, GSSENCRequest: a startup message follows
_WS = re.compile(r"\s+")

counts: Counter[str] = Counter()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with suppress(ConnectionError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def _frontend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Client -> server: parse message boundaries and count the ones that wait for a reply."""
    with suppress(ConnectionError, asyncio.IncompleteReadError):
        while True:  # startup phase: untyped messages
            header = await reader.readexactly(8)
            length, code = struct.unpack("!ii", header)
            body = await reader.readexactly(length - 8)
            writer.write(header + body)
            await writer.drain()
            if code not in UNTYPED_CODES:
                counts["connections"] += 1
                break
        statements: dict[bytes, str] = {}
        bound: str | None = None
        parsed: str | None = None
        while True:
            header = await reader.readexactly(5)
            kind, length = header[:1], struct.unpack("!i", header[1:])[0]
            body = await reader.readexactly(length - 4)
            if kind == b"P":  # Parse: name \0 query \0 ...
                name, query = body.split(b"\0", 2)[:2]
                parsed = statements[name] = _label(query)
            elif kind == b"B":  # Bind: portal \0 statement \0 ...
                bound = statements.get(body.split(b"\0", 2)[1], "?")
            elif kind == b"S":
                counts["round_trips"] += 1
                counts[f"exec:{bound}" if bound else f"prepare:{parsed}"] += 1
                bound = parsed = None
            elif kind == b"H":
                counts["round_trips"] += 1
                counts[f"describe:{parsed}"] += 1
            elif kind == b"Q":
                counts["round_trips"] += 1
                text = _label(body.rstrip(b"\0"))
                counts[f"simple:{text}"] += 1
            writer.write(header + body)
            await writer.drain()
    writer.close()


def _label(query: bytes) -> str:
    return _WS.sub(" ", query.decode(errors="replace").strip())[:60]


async def main(port: int, upstream: int, control: int) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(_frontend(reader, up_writer), _pump(up_reader, writer))

    async def report(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(json.dumps(dict(counts)).encode())
        await writer.drain()
        writer.close()

    proxy = await asyncio.start_server(serve, "127.0.0.1", port)
    reporter = await asyncio.start_server(report, "127.0.0.1", control)
    async with proxy, reporter:
        await asyncio.gather(proxy.serve_forever(), reporter.serve_forever())


if __name__ == "__main__":
    asyncio.run(main(*(int(a) for a in sys.argv[1:4])))
