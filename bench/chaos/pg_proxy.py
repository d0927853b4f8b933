"""A TCP proxy in front of PostgreSQL that can make a commit whose result the worker never hears.

It follows the frontend/backend protocol just far enough: the untyped startup packets
(answering SSLRequest/GSSENCRequest with 'N' itself), then typed messages both ways. It
remembers the SQL of every prepared statement (Parse), so when a Bind executes the phase
commit (or a write step's record) it can arm a cut: the client's messages up to Sync are
forwarded, the server executes and commits, the proxy swallows the server's answer up to
ReadyForQuery and then closes both sockets. The worker sees a dropped connection for a
commit that happened.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from typing import Any

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104


# Every statement that commits a phase (phasegate/sql/queries.sql): the general commit, a
# plain advance alone (0027), a continued hop or a leased send alone (0021), and their
# multi-row forms (commit_phases, continue_phases: a group commit, whose lost answer reaches
# every caller of the batch). A substring covers a function and its multi-row form.
PHASE_COMMITS = ("phasegate_commit_phase", "phasegate_advance_phase",
                 "phasegate_continue_phase")


def classify(sql: str) -> str | None:
    """Which write a statement is, for the statements whose lost answer matters most: a phase
    commit (``PHASE_COMMITS``) and a write step's two records."""
    if any(name in sql for name in PHASE_COMMITS):
        return "phase_commit"
    if "INSERT INTO step_records" in sql and "'pre_execution'" in sql:
        return "step_claim"
    if "UPDATE step_records SET status = 'completed'" in sql:
        return "step_complete"
    return None


class PgCommitCutProxy:
    def __init__(self, upstream_port: int, *, seed: int, probability: float = 0.0,
                 classifier: Callable[[str], str | None] = classify) -> None:
        self.upstream_port = upstream_port
        self.rng = random.Random(seed)
        self.probability = probability
        self.classifier = classifier
        self.forced = 0
        self.cuts: Counter[str] = Counter()
        self.connections = 0
        self.enabled = True
        self._window = (0.0, 0.0)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}?sslmode=disable"

    def force_next(self) -> None:
        self.forced += 1

    def open_window(self, duration_s: float, probability: float) -> None:
        """A flaky path to the database: for ``duration_s`` seconds, cut this share of the
        matched writes after the server committed them."""
        self._window = (time.monotonic() + duration_s, probability)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            with suppress(Exception):
                await self._server.wait_closed()

    def _decide(self, label: str) -> bool:
        if not self.enabled:
            return False
        if self.forced and label == "phase_commit":
            self.forced -= 1
            return True
        until, flaky = self._window
        probability = flaky if time.monotonic() < until else self.probability
        return self.rng.random() < probability

    async def _client(self, c_reader: asyncio.StreamReader,
                      c_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            s_reader, s_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            c_writer.close()
            return
        self._writers.update((c_writer, s_writer))
        state: dict[str, Any] = {"cut_armed": False, "swallow": False, "label": None}
        upstream = asyncio.create_task(self._from_client(c_reader, c_writer, s_writer, state))
        downstream = asyncio.create_task(self._from_server(s_reader, c_writer, state))
        try:
            await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (upstream, downstream):
                task.cancel()
            await asyncio.gather(upstream, downstream, return_exceptions=True)
            for writer in (c_writer, s_writer):
                self._writers.discard(writer)
                writer.close()

    async def _from_client(self, reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter,
                           s_writer: asyncio.StreamWriter, state: dict[str, Any]) -> None:
        with suppress(ConnectionError, asyncio.IncompleteReadError):
            # Startup: untyped packets; answer SSL/GSS requests ourselves with "no".
            while True:
                header = await reader.readexactly(8)
                length, code = struct.unpack("!ii", header)
                rest = await reader.readexactly(length - 8)
                if code in (SSL_REQUEST, GSSENC_REQUEST):
                    c_writer.write(b"N")
                    await c_writer.drain()
                    continue
                s_writer.write(header + rest)
                await s_writer.drain()
                break
            statements: dict[str, str] = {}
            while True:
                kind = await reader.readexactly(1)
                length = struct.unpack("!i", await reader.readexactly(4))[0]
                body = await reader.readexactly(length - 4)
                if kind == b"P":
                    name, _, after = body.partition(b"\0")
                    sql = after.partition(b"\0")[0].decode(errors="replace")
                    statements[name.decode()] = sql
                elif kind == b"B":
                    statement = body.split(b"\0", 2)[1].decode()
                    label = self.classifier(statements.get(statement, ""))
                    if label is not None and self._decide(label):
                        state["cut_armed"] = state["swallow"] = True
                        state["label"] = label
                s_writer.write(kind + struct.pack("!i", length) + body)
                await s_writer.drain()
                if kind == b"S" and state["cut_armed"]:
                    # Keep reading nothing more from the client: the answer never comes.
                    await asyncio.Event().wait()

    async def _from_server(self, reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter,
                           state: dict[str, Any]) -> None:
        with suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                kind = await reader.readexactly(1)
                length = struct.unpack("!i", await reader.readexactly(4))[0]
                body = await reader.readexactly(length - 4)
                if state["swallow"]:
                    if kind == b"Z":  # the server finished (and committed): cut now
                        self.cuts[state["label"]] += 1
                        return
                    continue
                c_writer.write(kind + struct.pack("!i", length) + body)
                await c_writer.drain()
