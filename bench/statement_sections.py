"""The sections of the full run measured on the newest schema: a trivial statement through
asyncpg and through phasegate's pool (driver), single statements inside the server (server),
the commit function with and without its tables' triggers (checks), and each hop's commit as a
worker sends it, alone (commits), a batch per statement (batches), and alone in both pooler
modes (cache).
"""

from __future__ import annotations

import time

import asyncpg

from bench.measured_statements import (
    BACK_TO_SEQ_0,
    BATCH,
    BATCH_CALLS,
    COMMIT_CALLS,
    COMMIT_HOP,
    SERVER_STATEMENTS,
    SETUP,
    STATE,
)
from bench.statement_databases import _from_seq_0, fresh_database
from bench.statement_timing import _calls, _hops
from phasegate.db import Pooler, connect, create_pool

# The cache section's modes: the default first, the statement cache second (its numerator).
POOLER_MODES: tuple[Pooler, ...] = ("transaction", "pgbouncer", "none")
DESCRIBED_ONCE = "no named statements, the description kept (one round trip)"
# Superuser only (a private cluster's): ALL takes the foreign keys' internal triggers too.
NO_TRIGGERS = [f"ALTER TABLE {table} DISABLE TRIGGER ALL"
               for table in ("workflow_runs", "run_positions", "checkpoints")]
NO_ROW_TRIGGERS = [f"ALTER TABLE {table} DISABLE TRIGGER USER"
                   for table in ("workflow_runs", "run_positions", "checkpoints")]
CHECK_VARIANTS = {
    "as migrated": [],
    "without the row triggers (foreign keys kept)": NO_ROW_TRIGGERS,
    "without triggers (row triggers and foreign keys)": NO_TRIGGERS,
}


async def driver(dsn: str, calls: int) -> dict[str, dict[str, float]]:
    """Per call: client CPU and wall time, µs, with and without asyncpg's statement cache."""
    found = {}
    for label, cache in (("statement cache (one round trip)", 100),
                         ("no statement cache (two round trips)", 0),
                         (DESCRIBED_ONCE, None)):
        connection = await (connect(dsn) if cache is None
                            else asyncpg.connect(dsn, statement_cache_size=cache))
        try:
            for _ in range(200):  # warm-up
                await connection.fetchval("SELECT length($1::text)", STATE)
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                await connection.fetchval("SELECT length($1::text)", STATE)
            found[label] = {"client_cpu_us": (time.process_time() - cpu) / calls * 1e6,
                            "wall_us": (time.perf_counter() - wall) / calls * 1e6}
        finally:
            await connection.close()
    return found


async def through_pool(dsn: str, calls: int) -> dict[str, dict[str, float]]:
    """The pooler-safe statement through phasegate's pool: acquired and released per call,
    and on one kept connection."""
    found = {}
    pool = await create_pool(dsn, min_size=2, max_size=2)
    try:
        kept = await pool.acquire()
        try:
            for label, run in (
                    ("phasegate's pool, a pool connection per statement", pool.fetchval),
                    ("phasegate's pool, one kept pool connection", kept.fetchval)):
                for _ in range(200):
                    await run("SELECT length($1::text)", STATE)
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(calls):
                    await run("SELECT length($1::text)", STATE)
                found[label] = {"client_cpu_us": (time.process_time() - cpu) / calls * 1e6,
                                "wall_us": (time.perf_counter() - wall) / calls * 1e6}
        finally:
            await pool.release(kept)
    finally:
        await pool.close()
    return found


async def commits(dsn: str, phases: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    """The floor's INSERT and phasegate's two commit statements for a continued hop, as a
    worker sends them, in interleaved rounds on one database."""
    found: dict[str, list[dict[str, float]]] = {label: [] for label in COMMIT_CALLS}
    for _ in range(rounds):
        for label in COMMIT_CALLS:
            found[label].append(await _calls(dsn, label, phases))
    return found


async def cache(dsn: str, phases: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    """The commits section's statements in each pooler mode, interleaved in each round: what
    the pooler-safe default (each statement unnamed, parsed and planned on every call) costs
    against statements named by their text (``pgbouncer``) and against the statement cache a
    direct connection may use (``none``; ``PHASEGATE_DATABASE_POOLER``)."""
    found: dict[str, list[dict[str, float]]] = {}
    for _ in range(rounds):
        for label in COMMIT_CALLS:
            for pooler in POOLER_MODES:
                found.setdefault(f"{label}, pooler {pooler}", []).append(
                    await _calls(dsn, label, phases, pooler=pooler))
    return found


async def batches(dsn: str, phases: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    """Continued hops committed BATCH at a time, through both multi-row statements, in
    interleaved rounds on one database."""
    found: dict[str, list[dict[str, float]]] = {label: [] for label in BATCH_CALLS}
    for _ in range(rounds):
        for label in BATCH_CALLS:
            found[label].append(await _calls(dsn, label, phases, batch=BATCH))
    return found


async def checks(server_dsn: str, phases: int, rounds: int) -> dict[str, list[float]]:
    """The commit function's continued hop with and without the triggers of the tables it
    writes (the foreign keys' among them)."""
    databases = {}
    for label, changes in CHECK_VARIANTS.items():
        dsn = await fresh_database(server_dsn)
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(SETUP)
            for change in changes:
                await connection.execute(change)
        finally:
            await connection.close()
        databases[label] = dsn
    found: dict[str, list[float]] = {label: [] for label in databases}
    for _ in range(rounds):
        for label, dsn in databases.items():
            await _from_seq_0(dsn)
            found[label].append(await _hops(dsn, SERVER_STATEMENTS[COMMIT_HOP], phases))
    return found


async def server(dsn: str, phases: int) -> dict[str, float]:
    """Per statement, µs of wall time inside the server (each in its own transaction)."""
    setup = await asyncpg.connect(dsn)
    try:
        await setup.execute(SETUP)
    finally:
        await setup.close()
    found = {}
    for label, body in SERVER_STATEMENTS.items():
        # Every run back at seq 0 and no checkpoint (the commit functions' loops wrote them):
        # each statement's condition then holds on every call.
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(BACK_TO_SEQ_0)
        finally:
            await connection.close()
        found[label] = await _hops(dsn, body, phases)
    return found
