"""A TCP proxy that adds a fixed one-way delay, run as its own process: a queue server on
loopback answers in a few hundred microseconds, real SQS in a few milliseconds.

    python -m bench.latency_proxy LISTEN_PORT UPSTREAM_HOST:PORT DELAY_MS

Every chunk is forwarded DELAY_MS after it arrived, in order, in each direction, so a request
and its answer take 2 x DELAY_MS longer. Point ``bench.transitions --localstack-endpoint`` at
it to measure what a phase waits when each SQS call costs a network round trip, as it does in
production, instead of only CPU on a shared machine (docs/benchmarks-rounds.md).
"""

from __future__ import annotations

import asyncio
import sys
from contextlib import suppress


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await chunks.get()
            if not data:
                break
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)  # the link's delay itself
            writer.write(data)
            await writer.drain()

    delivering = asyncio.ensure_future(deliver())
    with suppress(ConnectionError):
        while data := await reader.read(65536):
            chunks.put_nowait((loop.time() + delay_s, data))
    chunks.put_nowait((loop.time() + delay_s, b""))
    with suppress(ConnectionError):
        await delivering
    writer.close()


async def main(listen_port: int, host: str, port: int, delay_s: float) -> None:
    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer, delay_s),
                             _pipe(upstream_reader, writer, delay_s))

    server = await asyncio.start_server(accept, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    listen, upstream, delay_ms = sys.argv[1], sys.argv[2], sys.argv[3]
    upstream_host, _, upstream_port = upstream.rpartition(":")
    asyncio.run(main(int(listen), upstream_host, int(upstream_port), float(delay_ms) / 1000))
