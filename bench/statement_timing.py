"""The two ways a statement is timed: ``_hops``, a ``DO`` loop inside the server (wall time per
statement, nothing between them), and ``_calls``, the statement as a worker sends it (wall,
client CPU, the server process's CPU and WAL per hop).
"""

from __future__ import annotations

import time

import asyncpg

from bench.common import process_cpu_s
from bench.measured_statements import BATCH_CALLS, COMMIT_CALLS, RUNS
from bench.statement_databases import _from_seq_0
from phasegate.db import Pooler, connect


async def _hops(dsn: str, body: str, phases: int) -> float:
    """µs per statement of ``body`` run RUNS x phases times in a DO loop, from seq 0."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("SET synchronous_commit = off")
        block = (f"DO $$ DECLARE s integer; w integer; BEGIN "
                 f"FOR s IN 0..{phases - 1} LOOP FOR w IN 0..{RUNS - 1} LOOP "
                 f"{body}; COMMIT; END LOOP; END LOOP; END $$")
        started = time.perf_counter()
        await connection.execute(block)
        return (time.perf_counter() - started) / (phases * RUNS) * 1e6
    finally:
        await connection.close()


# The private cluster serves nothing else, so the insert position moves with the calls only.
WAL_POSITION = "SELECT pg_current_wal_insert_lsn()"
WAL_SINCE = "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)::float8"


def _process_cpu_s(pid: int) -> float:
    seconds = process_cpu_s(pid)
    if seconds is None:
        raise RuntimeError(f"no CPU time for the server process {pid}: not on this host?")
    return seconds


async def _calls(dsn: str, label: str, phases: int, *, batch: int = 1,
                 pooler: Pooler = "transaction") -> dict[str, float]:
    """Per hop of ``label``'s statement, RUNS x phases hops from seq 0, ``batch`` runs' hops
    per call (the batches section's statements), on a connection in ``pooler``'s mode (the
    default's unnamed statements, ``pgbouncer``'s named by their text, or ``none``'s statement
    cache): wall, client CPU and the server process's CPU, µs."""
    await _from_seq_0(dsn)
    connection = await connect(dsn, pooler=pooler)
    try:
        pid = connection.get_server_pid()
        wal = await connection.fetchval(WAL_POSITION)
        server, cpu, wall = _process_cpu_s(pid), time.process_time(), time.perf_counter()
        if batch == 1:  # a loop each: a hop's arguments are one run's, a batch's a list's
            sql, make_hop = COMMIT_CALLS[label]
            for s in range(phases):
                for w in range(RUNS):
                    await connection.fetchrow(sql, *make_hop(w, s))
        else:
            sql, make_hops = BATCH_CALLS[label]
            for s in range(phases):
                for w in range(0, RUNS, batch):
                    rows = await connection.fetch(sql, *make_hops(list(range(w, w + batch)), s))
                    assert len(rows) == batch, f"{label}: {len(rows)} of {batch} hops committed"
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        server = _process_cpu_s(pid) - server
        wal = await connection.fetchval(WAL_SINCE, wal)
    finally:
        await connection.close()
    hops = phases * RUNS
    return {"wall_us": wall / hops * 1e6, "client_cpu_us": cpu / hops * 1e6,
            "server_cpu_us": server / hops * 1e6, "wal_bytes": wal / hops}
