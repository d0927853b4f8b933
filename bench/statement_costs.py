"""What one statement costs, apart from phasegate: the driver's side and the server's side.

    python -m bench.statement_costs [--calls 3000] [--rounds 2] [--check-rounds 5]
                                    [--only batches|commits|schemas|loads|rows|chains|positions]

Several measurements on a private cluster (bench/common.py), each against its own fresh database:

- **driver**: one trivial statement (``SELECT length($1::text)``) through asyncpg, in a loop on
  one connection, with the statement cache (``statement_cache_size`` default: Bind + Execute,
  one round trip), without it (plain asyncpg: Parse + Describe, then Parse + Bind + Execute,
  two round trips), and on phasegate's pooler-safe connection (no named statements, the
  description kept: Parse + Bind + Execute, one round trip; phasegate/unnamed_statements.py).
  Client CPU (``time.process_time``) and wall time per call. The same statement through a
  pool as phasegate makes it, acquired and released per statement, and on one connection kept
  from that pool (what group commit does between back-to-back commits).
- **server**: statements run inside the server by a ``DO`` block, each in its own transaction
  (``synchronous_commit = off``, so no flush wait): the floor's one-row INSERT; phasegate's
  commit function on a continued hop; an ``UPDATE workflow_runs`` that moves only
  ``next_seq`` (HOT); the same update on a copy of ``workflow_runs`` with every index and
  CHECK constraint, on a copy with every index and no CHECK, and on a copy with only the
  primary key; the same update on ``run_positions``. Wall time per statement, with nothing
  between the statements: the server's own cost of each.
- **commits**: the statements as a worker sends them (phasegate's connection, the
  description kept), each its own transaction with ``synchronous_commit`` on, in interleaved
  rounds: the floor's INSERT; a checkpoint row inserted alone (the one write no design that
  keeps a checkpoint per phase can skip); ``commit_phase`` on a continued hop;
  ``continue_phase`` (migration 0021), the leaner statement that now commits continued hops;
  and the two statements of a hop with continuation off, ``load_for_phase`` (the check before
  the phase) and ``commit_phase`` for a plain advance (its outbox row), against
  ``advance_phase`` (migration 0027), the leaner statement that now commits a plain advance
  sent alone. Alone with ``--only commits``.
  Wall time, client CPU and the server process's CPU (``/proc/<pid>/schedstat``) per call: the
  commit alone, no framework, so ``floor wall / statement wall`` is the most a transition
  built on that statement could reach against the floor at one group.
- **batches**: continued hops committed together, as group commit sends them (four runs' hops
  per statement, about the batch 16 groups make): as rows of ``commit_phases`` and through
  ``continue_phases`` (migration 0024), interleaved rounds; wall, client CPU and server CPU per
  hop.
- **rules**: both commit functions' continued hops on a database at schema v21 and on one at
  the newest, in interleaved rounds: what migration 0022 (the row rules as functions, which
  PostgreSQL no longer re-reads from text in every statement) saves each commit.
- **checks**: the commit function's continued hops on three databases: one as migrated, one
  whose written tables have their row triggers disabled (the position, slot and row-rule
  triggers' WHEN clauses; since 0029 the rules are triggers, no table has a CHECK left), and
  one with every trigger disabled (the foreign keys' referential triggers too: 11 tables
  reference ``workflow_runs``), in interleaved rounds (the run rows back at seq 0 and the
  checkpoints deleted and vacuumed between rounds): what the triggers cost each commit.
- **schemas** (``--only schemas``, run alone): a continued hop on databases at schemas v24,
  v25 and the newest, in interleaved rounds: inside the server, and as a worker sends it,
  alone and four per statement, with the WAL each writes: what migrations 0025 (the
  checkpoints without their foreign key) and 0026 (without their history index) save.
- **loads** (``--only loads``, run alone): the check before a phase for a running run (nothing
  to claim) on databases at schema v27 and the newest, analyzed, in interleaved rounds:
  inside the server and as a worker sends it: what migration 0028 (a read first, the claim
  only when one is due) saves each message.
- **rows** (``--only rows``, run alone): the commit statements on databases at schema v28 and
  the newest, in interleaved rounds, as a worker sends them: a continued hop and a plain
  advance alone (they name no rule's column but ``next_seq``), the general commit (it names
  ``status``), and four continued hops per statement through ``continue_phases`` and as rows of
  ``commit_phases``; wall, client CPU, server CPU and WAL per hop: what migration 0029 (the
  row rules checked only by a write that can break them) saves each commit.
- **chains** (``--only chains``, run alone): a chain's continued hops on databases at schema
  v29 and the newest, inside the server, alone and four per statement as a worker sends them,
  every run's first hop taking the lease and the rest holding it: what migration 0030 (a hop
  that holds its lease leaves the position to the heartbeat) saves each hop.
- **positions** (``--only positions``, run alone): the commit statements of the rows section
  on databases at schema v30 and the newest: what migration 0031 (the position trigger by its
  column list, no flag set by the commits that own the position) saves each commit.

Results: bench/results/statement-costs-<time>.json, and a table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg

from bench.common import (
    ROOT,
    PrivateCluster,
    machine,
    process_cpu_s,
    with_database,
    write_results,
)
from phasegate.db import connect, create_pool
from phasegate.migrate import migrate
from phasegate.sql import queries

RUNS = 16
DESCRIBED_ONCE = "no named statements, the description kept (one round trip)"
STATE = '{"a": 1, "b": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

# Each body runs RUNS x phases times, $w the run (0..RUNS-1), $s the phase, then COMMIT.
COMMIT_HOP = "phasegate_commit_phase, a continued hop (chain lease)"
CONTINUE_HOP = "phasegate_continue_phase, a continued hop (migration 0021)"
# What no design that keeps a checkpoint row per phase can skip: the row itself, with the
# table's indexes, CHECKs and foreign key (which locks the run row: nothing else in the
# transaction did).
CHECKPOINT_ALONE = "checkpoint INSERT alone (no run row, no position)"
LOAD = "phasegate_load_for_phase, the check before a phase (a running run)"
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
BACK_TO_SEQ_0 = ("DELETE FROM checkpoints; DELETE FROM outbox; "
                 "UPDATE workflow_runs SET next_seq = 0, updated_at = now(); "
                 "UPDATE run_positions SET next_seq = 0, chain_holder = NULL, "
                 "chain_until = NULL")

SERVER_STATEMENTS = {
    "floor INSERT (one row, primary key)":
        f"INSERT INTO bench_floor VALUES ('r' || w, s, '{STATE}')",
    "phasegate_commit_phase, a continued hop (chain lease)":
        f"PERFORM * FROM phasegate_commit_phase('r' || w, 'main', s, 'p' || s, 1, '{STATE}', "
        "'h', 'p' || (s + 1), 'running', NULL, NULL, NULL, 'w1', NULL, 'd' || w || '-' || s, "
        "'g', '{\"v\":1}', NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'w1', 600, NULL)",
    CONTINUE_HOP:
        f"PERFORM phasegate_continue_phase('r' || w, 'main', s, 'p' || s, 1, '{STATE}', "
        "'h', 'p' || (s + 1), NULL, NULL, NULL, 'w1', NULL, NULL, NULL, NULL, NULL, 'w1', 600, "
        f"'{TRACE}')",
    "UPDATE workflow_runs SET next_seq (HOT, ten indexes, triggers on)":
        "UPDATE workflow_runs SET next_seq = s + 1, updated_at = now() "
        "WHERE workflow_id = 'r' || w AND next_seq = s AND status = 'running'",
    "the same UPDATE on a copy with every index and CHECK, no trigger":
        "UPDATE runs_indexed SET next_seq = s + 1, updated_at = now() "
        "WHERE workflow_id = 'r' || w AND next_seq = s AND status = 'running'",
    "the same UPDATE on a copy with every index, no CHECK, no trigger":
        "UPDATE runs_unchecked SET next_seq = s + 1, updated_at = now() "
        "WHERE workflow_id = 'r' || w AND next_seq = s AND status = 'running'",
    "the same UPDATE on a copy with only the primary key":
        "UPDATE runs_bare SET next_seq = s + 1, updated_at = now() "
        "WHERE workflow_id = 'r' || w AND next_seq = s AND status = 'running'",
    "UPDATE run_positions SET next_seq (HOT, primary key only)":
        "UPDATE run_positions SET next_seq = s + 1, updated_at = now() "
        "WHERE workflow_id = 'r' || w",
}

SETUP = f"""
CREATE TABLE bench_floor (workflow_id text, seq integer, state jsonb,
                          PRIMARY KEY (workflow_id, seq));
INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, current_phase,
                           schema_version, input)
SELECT 'r' || w, 'wf', 'running', 0, 'p0', 1, '{{}}' FROM generate_series(0, {RUNS - 1}) w;
CREATE TABLE runs_indexed (LIKE workflow_runs INCLUDING ALL) WITH (fillfactor = 70);
INSERT INTO runs_indexed SELECT * FROM workflow_runs;
CREATE TABLE runs_unchecked (LIKE workflow_runs INCLUDING ALL EXCLUDING CONSTRAINTS)
    WITH (fillfactor = 70);
INSERT INTO runs_unchecked SELECT * FROM workflow_runs;
CREATE TABLE runs_bare (LIKE workflow_runs INCLUDING DEFAULTS) WITH (fillfactor = 70);
ALTER TABLE runs_bare ADD PRIMARY KEY (workflow_id);
INSERT INTO runs_bare SELECT * FROM workflow_runs;
"""


async def fresh_database(server: str, target: int | None = None) -> str:
    """A new database, migrated to ``target`` (default: the newest schema)."""
    admin = await asyncpg.connect(server)
    try:
        name = f"stmt_{uuid.uuid4().hex[:10]}"
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = with_database(server, name)
    await migrate(dsn, target=target)
    return dsn


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


# The statements a worker sends for one hop, as its store sends them (sql/queries.sql).
COMMIT_CALLS: dict[str, tuple[str, Callable[[int, int], tuple[object, ...]]]] = {
    "floor INSERT (one row, primary key)":
        ("INSERT INTO bench_floor (workflow_id, seq, state) VALUES ($1, $2, $3::jsonb)",
         lambda w, s: (f"r{w}", s, STATE)),
    CHECKPOINT_ALONE:
        ("INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, "
         "state, state_hash, worker_id) VALUES ($1, 'main', $2, $3, 'phase', 1, $4::jsonb, "
         "'h', 'w1')",
         lambda w, s: (f"r{w}", s, f"p{s}", STATE)),
    COMMIT_HOP:
        (queries()["commit_phase"],
         lambda w, s: (f"r{w}", "main", s, f"p{s}", 1, STATE, "h", f"p{s + 1}", "running",
                       None, None, None, "w1", None, f"d{w}-{s}", "g",
                       '{"traceparent": "' + TRACE + '"}',
                       None, None, None, None, None, None, None, "w1", 600.0, None)),
    CONTINUE_HOP:
        (queries()["continue_phase"],
         lambda w, s: (f"r{w}", "main", s, f"p{s}", 1, STATE, "h", f"p{s + 1}", None, None,
                       None, "w1", None, None, None, None, None, "w1", 600.0, TRACE)),
    # With continuation off every hop is these two: the check before the phase, then a
    # commit that writes the successor's outbox row (which the worker then sends).
    LOAD: (queries()["load_for_phase"], lambda w, s: (f"r{w}", "main", s)),
    "phasegate_commit_phase, a plain advance (outbox row)":
        (queries()["commit_phase"],
         lambda w, s: (f"r{w}", "main", s, f"p{s}", 1, STATE, "h", f"p{s + 1}", "running",
                       None, None, None, "w1", None, f"d{w}-{s}", f"r{w}",
                       '{"v":1,"kind":"phase","workflow_id":"r' + str(w) + '","workflow":"wf",'
                       '"seq":' + str(s + 1) + ',"phase":"p' + str(s + 1) + '","traceparent":"'
                       + TRACE + '"}',
                       None, None, None, None, None, None, None, None, 0.0, None)),
    "phasegate_advance_phase, a plain advance (migration 0027)":
        (queries()["advance_phase"],
         lambda w, s: (f"r{w}", "main", s, f"p{s}", 1, STATE, "h", f"p{s + 1}", None, None,
                       None, "w1", None, None, None, None, None, f"d{w}-{s}", f"r{w}",
                       '{"v":1,"kind":"phase","workflow_id":"r' + str(w) + '","workflow":"wf",'
                       '"seq":' + str(s + 1) + ',"phase":"p' + str(s + 1) + '","traceparent":"'
                       + TRACE + '"}')),
}
# The private cluster serves nothing else, so the insert position moves with the calls only.
WAL_POSITION = "SELECT pg_current_wal_insert_lsn()"
WAL_SINCE = "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)::float8"
# Hops per statement in the batches section (16 groups batch about four to five).
BATCH = 4


def _commit_phases_hops(ws: list[int], s: int) -> tuple[Any, ...]:
    n = len(ws)
    return ([f"r{w}" for w in ws], ["main"] * n, [s] * n, [f"p{s}"] * n, [1] * n,
            [STATE] * n, ["h"] * n, [f"p{s + 1}"] * n, ["running"] * n, [None] * n,
            [None] * n, [None] * n, ["w1"] * n, [None] * n, [f"d{w}-{s}" for w in ws],
            [f"r{w}" for w in ws], ['{"traceparent": "' + TRACE + '"}'] * n, [None] * n,
            [None] * n, [None] * n, [None] * n, [None] * n, [None] * n, [None] * n,
            ["w1"] * n, [600.0] * n, [None] * n)


def _continue_phases_hops(ws: list[int], s: int) -> tuple[Any, ...]:
    n = len(ws)
    return ([f"r{w}" for w in ws], ["main"] * n, [s] * n, [f"p{s}"] * n, [1] * n,
            [STATE] * n, ["h"] * n, [f"p{s + 1}"] * n, [None] * n, [None] * n, [None] * n,
            ["w1"] * n, [None] * n, [None] * n, [None] * n, [None] * n, [None] * n,
            ["w1"] * n, [600.0] * n, [TRACE] * n)


CONTINUE_BATCH = "continued hops through phasegate_continue_phases (migration 0024)"

BATCH_CALLS = {
    "continued hops as rows of phasegate_commit_phases":
        (queries()["commit_phases"], _commit_phases_hops),
    CONTINUE_BATCH: (queries()["continue_phases"], _continue_phases_hops),
}


def _process_cpu_s(pid: int) -> float:
    seconds = process_cpu_s(pid)
    if seconds is None:
        raise RuntimeError(f"no CPU time for the server process {pid}: not on this host?")
    return seconds


async def _calls(dsn: str, label: str, phases: int, *, batch: int = 1) -> dict[str, float]:
    """Per hop of ``label``'s statement, RUNS x phases hops from seq 0, ``batch`` runs' hops
    per call (the batches section's statements): wall, client CPU and the server process's
    CPU, µs."""
    await _from_seq_0(dsn)
    connection = await connect(dsn)
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


async def commits(dsn: str, phases: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    """The floor's INSERT and phasegate's two commit statements for a continued hop, as a
    worker sends them, in interleaved rounds on one database."""
    found: dict[str, list[dict[str, float]]] = {label: [] for label in COMMIT_CALLS}
    for _ in range(rounds):
        for label in COMMIT_CALLS:
            found[label].append(await _calls(dsn, label, phases))
    return found


async def batches(dsn: str, phases: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    """Continued hops committed BATCH at a time, through both multi-row statements, in
    interleaved rounds on one database."""
    found: dict[str, list[dict[str, float]]] = {label: [] for label in BATCH_CALLS}
    for _ in range(rounds):
        for label in BATCH_CALLS:
            found[label].append(await _calls(dsn, label, phases, batch=BATCH))
    return found


async def _from_seq_0(dsn: str, *, analyze: bool = False) -> None:
    """Every run back at seq 0, no checkpoint, no outbox or floor row, the written tables
    vacuumed (and analyzed, with ``analyze``): each round starts from the same pages."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(BACK_TO_SEQ_0 + "; DELETE FROM bench_floor")
        for table in ("workflow_runs", "run_positions", "checkpoints", "outbox", "bench_floor"):
            await connection.execute(f"VACUUM {'ANALYZE ' if analyze else ''}{table}")
    finally:
        await connection.close()


# The schema before migration 0022 (its row rules re-read from text by every statement).
RULES_BEFORE = 21
# The schemas the schemas section compares with the newest: before migration 0025 (the
# checkpoints' foreign key checked by every insert) and before 0026 (their history index
# written by every phase).
SCHEMAS_BEFORE = (24, 25)


async def _at_schemas(server_dsn: str, *before: int) -> dict[str, str]:
    """Fresh databases with the setup: one at each schema of ``before``, one at the newest."""
    databases = {}
    targets: list[tuple[str, int | None]] = [(f"v{b}", b) for b in before]
    for schema, target in [*targets, ("newest", None)]:
        databases[schema] = dsn = await fresh_database(server_dsn, target)
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(SETUP)
        finally:
            await connection.close()
    return databases


async def rules(server_dsn: str, phases: int, rounds: int) -> dict[str, list[float]]:
    """The two commit functions' continued hops on a database at schema v21 and on one at the
    newest, in interleaved rounds: what migration 0022's row rules save each commit."""
    databases = await _at_schemas(server_dsn, RULES_BEFORE)
    found: dict[str, list[float]] = {}
    for _ in range(rounds):
        for statement in (COMMIT_HOP, CONTINUE_HOP):
            for schema, dsn in databases.items():
                await _from_seq_0(dsn)
                found.setdefault(f"{statement}, schema {schema}", []).append(
                    await _hops(dsn, SERVER_STATEMENTS[statement], phases))
    return found


async def schemas(server_dsn: str, phases: int, rounds: int
                  ) -> dict[str, list[dict[str, float]]]:
    """A continued hop on databases at schemas v24, v25 and the newest, in interleaved rounds:
    inside the server (wall), as a worker sends it alone and BATCH per statement (wall, client
    CPU, server CPU, WAL): what the checkpoints' foreign key (0025) and their history index
    (0026) cost each hop."""
    databases = await _at_schemas(server_dsn, *SCHEMAS_BEFORE)
    found: dict[str, list[dict[str, float]]] = {}
    for _ in range(rounds):
        for schema, dsn in databases.items():
            await _from_seq_0(dsn)
            found.setdefault(f"inside the server, schema {schema}", []).append(
                {"wall_us": await _hops(dsn, SERVER_STATEMENTS[CONTINUE_HOP], phases)})
            found.setdefault(f"alone, as sent, schema {schema}", []).append(
                await _calls(dsn, CONTINUE_HOP, phases))
            found.setdefault(f"{BATCH} per statement, as sent, schema {schema}", []).append(
                await _calls(dsn, CONTINUE_BATCH, phases, batch=BATCH))
    return found


# The schema the loads section compares with the newest: before migration 0028 (the claim's
# UPDATEs prepared for every message).
LOADS_BEFORE = 27


async def loads(server_dsn: str, phases: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    """The check before a phase of a running run on databases at schema v27 and the newest
    (analyzed, as a database in use is), in interleaved rounds: inside the server (wall) and
    as a worker sends it (wall, client CPU, server CPU)."""
    databases = await _at_schemas(server_dsn, LOADS_BEFORE)
    inside = "PERFORM * FROM phasegate_load_for_phase('r' || w, 'main', s)"
    found: dict[str, list[dict[str, float]]] = {}
    for _ in range(rounds):
        for schema, dsn in databases.items():
            await _from_seq_0(dsn, analyze=True)
            found.setdefault(f"inside the server, schema {schema}", []).append(
                {"wall_us": await _hops(dsn, inside, phases)})
            found.setdefault(f"alone, as sent, schema {schema}", []).append(
                await _calls(dsn, LOAD, phases))
    return found


# The schema the rows section compares with the newest: before migration 0029 (the row rules'
# functions called by every write, through one CHECK per table).
ROWS_BEFORE = 28
# What the rows section sends: the commits that name no rule's column but next_seq (a
# continued hop, a plain advance), and those that name status unchanged (the general commit,
# group commit's rows).
ROWS_CALLS = (CONTINUE_HOP, "phasegate_advance_phase, a plain advance (migration 0027)",
              COMMIT_HOP)
ROWS_BATCHES = (CONTINUE_BATCH, "continued hops as rows of phasegate_commit_phases")


ADVANCE_INSIDE = (
    f"PERFORM * FROM phasegate_advance_phase('r' || w, 'main', s, 'p' || s, 1, '{STATE}', 'h', "
    "'p' || (s + 1), NULL, NULL, NULL, 'w1', NULL, NULL, NULL, NULL, NULL, "
    "'d' || w || '-' || s, 'g', '{\"v\":1}')")
ROWS_INSIDE = {CONTINUE_HOP: SERVER_STATEMENTS[CONTINUE_HOP],
               "phasegate_advance_phase, a plain advance (migration 0027)": ADVANCE_INSIDE,
               COMMIT_HOP: SERVER_STATEMENTS[COMMIT_HOP]}


async def _against(server_dsn: str, phases: int, rounds: int, before: int,
                   inside: dict[str, str], calls: tuple[str, ...],
                   batches: tuple[str, ...]) -> dict[str, list[dict[str, float]]]:
    """Statements on databases at schema ``before`` and the newest, in interleaved rounds:
    ``inside`` run in the server (wall, the WAL flush off: the steadier figure), ``calls`` and
    ``batches`` as a worker sends them (wall, client CPU, server CPU, WAL per hop)."""
    databases = await _at_schemas(server_dsn, before)
    found: dict[str, list[dict[str, float]]] = {}
    for _ in range(rounds):
        for label, body in inside.items():
            for schema, dsn in databases.items():
                await _from_seq_0(dsn)
                found.setdefault(f"{label}, inside the server, schema {schema}", []).append(
                    {"wall_us": await _hops(dsn, body, phases)})
        for label in (*calls, *batches):
            for schema, dsn in databases.items():
                batch = BATCH if label in batches else 1
                found.setdefault(f"{label}, schema {schema}", []).append(
                    await _calls(dsn, label, phases, batch=batch))
    return found


async def rows(server_dsn: str, phases: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    """The commit statements at schema v28 and the newest: what migration 0029 (the row rules
    checked only by a write that can break them) saves each commit."""
    return await _against(server_dsn, phases, rounds, ROWS_BEFORE, ROWS_INSIDE, ROWS_CALLS,
                          ROWS_BATCHES)


# The schema before migration 0030 (every continued hop wrote its run's position).
CHAINS_BEFORE = 29


async def chains(server_dsn: str, phases: int,
                 rounds: int) -> dict[str, list[dict[str, float]]]:
    """A chain's continued hops at schema v29 and the newest, alone and four per statement:
    each run's first hop takes the lease, the others hold it (``phases`` hops a run), so this
    is a chain's steady state: what migration 0030 (the position left to the heartbeat while
    the lease lives) saves each hop."""
    return await _against(server_dsn, phases, rounds, CHAINS_BEFORE,
                          {CONTINUE_HOP: SERVER_STATEMENTS[CONTINUE_HOP]}, (CONTINUE_HOP,),
                          (CONTINUE_BATCH,))


# The schema before migration 0031 (the position trigger on every update, stood down by a
# flag the hot commits set on and off).
POSITIONS_BEFORE = 30


async def positions(server_dsn: str, phases: int,
                    rounds: int) -> dict[str, list[dict[str, float]]]:
    """The commit statements at schema v30 and the newest: a continued hop and a plain advance
    (which set the flag at v30 and pass the trigger by its columns since), and the general
    commit (which names status and keeps the flag), alone and four per statement."""
    return await _against(server_dsn, phases, rounds, POSITIONS_BEFORE, ROWS_INSIDE,
                          ROWS_CALLS, ROWS_BATCHES)


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


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    cluster = PrivateCluster().start()
    rounds: list[dict[str, Any]] = []
    try:
        if args.only is not None:
            section = {"batches": batches, "commits": commits}.get(args.only)
            by_schema = {"schemas": schemas, "loads": loads, "rows": rows,
                         "chains": chains, "positions": positions}.get(args.only, schemas)
            found = (await section(await _with_setup(cluster.dsn), args.phases,
                                   args.check_rounds) if section is not None
                     else await by_schema(cluster.dsn, args.phases, args.check_rounds))
            return {"when": datetime.now(UTC).isoformat(timespec="seconds"),
                    "machine": machine(),
                    "command": "python -m bench.statement_costs " + " ".join(sys.argv[1:]),
                    **_medians(args.only, found)}
        for _ in range(args.rounds):
            dsn = await fresh_database(cluster.dsn)
            rounds.append({"driver": {**await driver(dsn, args.calls),
                                      **await through_pool(dsn, args.calls)},
                           "server": await server(dsn, args.phases)})
        check_rounds = await checks(cluster.dsn, args.phases, args.check_rounds)
        rule_rounds = await rules(cluster.dsn, args.phases, args.check_rounds)
        commit_rounds = await commits(await _with_setup(cluster.dsn), args.phases,
                                      args.check_rounds)
        batch_rounds = await batches(await _with_setup(cluster.dsn), args.phases,
                                     args.check_rounds)
    finally:
        cluster.stop()
    driver_med = {label: {k: statistics.median(r["driver"][label][k] for r in rounds)
                          for k in ("client_cpu_us", "wall_us")}
                  for label in rounds[0]["driver"]}
    server_med = {label: statistics.median(r["server"][label] for r in rounds)
                  for label in SERVER_STATEMENTS}
    return {"when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
            "command": "python -m bench.statement_costs " + " ".join(sys.argv[1:]),
            "rounds": rounds, "driver": driver_med, "server": server_med,
            "checks_rounds": check_rounds,
            "checks": {label: statistics.median(v) for label, v in check_rounds.items()},
            "rules_rounds": rule_rounds,
            "rules": {label: statistics.median(v) for label, v in rule_rounds.items()},
            **_medians("commits", commit_rounds), **_medians("batches", batch_rounds)}


async def _with_setup(server_dsn: str) -> str:
    dsn = await fresh_database(server_dsn)
    setup = await asyncpg.connect(dsn)
    try:
        await setup.execute(SETUP)
    finally:
        await setup.close()
    return dsn


def _medians(name: str, found: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    return {f"{name}_rounds": found,
            name: {label: {k: statistics.median(r[k] for r in v) for k in v[0]}
                   for label, v in found.items()}}


def _paired(found: dict[str, list[dict[str, float]]], before: str) -> str:
    """Each figure of the newest schema over the same figure at ``before`` in the same round,
    median over rounds: on a machine whose speed drifts between minutes, the rounds' own
    ratios hold steadier than the ratio of two medians."""
    lines = [f"| statement (newest ÷ {before}, median of per-round ratios) | wall | "
             "client CPU | server CPU | WAL | rounds |", "|---|---:|---:|---:|---:|---:|"]
    suffix = f", schema {before}"
    for label, old in found.items():
        if not label.endswith(suffix):
            continue
        new = found[label[:-len(suffix)] + ", schema newest"]
        cells = []
        for key in ("wall_us", "client_cpu_us", "server_cpu_us", "wal_bytes"):
            ratios = [n[key] / o[key] for o, n in zip(old, new, strict=True) if o.get(key)]
            cells.append(f"{statistics.median(ratios):.3f}" if ratios else "")
        lines.append(f"| {label[:-len(suffix)]} | {' | '.join(cells)} | {len(old)} |")
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    if "commits" in report and "driver" not in report:
        floor = report["commits"][next(iter(COMMIT_CALLS))]["wall_us"]
        lines = ["| one statement as a worker sends it, with its commit (interleaved rounds) "
                 "| wall (µs) | client CPU (µs) | server CPU (µs) | WAL (bytes) |",
                 "|---|---:|---:|---:|---:|"]
        lines += [f"| {label} | {v['wall_us']:.0f} | {v['client_cpu_us']:.0f} | "
                  f"{v['server_cpu_us']:.0f} | {v['wal_bytes']:.0f} |"
                  for label, v in report["commits"].items()]
        return "\n".join([*lines, "", f"floor wall: {floor:.0f} µs"])
    if "rows" in report:
        return _paired(report["rows_rounds"], f"v{ROWS_BEFORE}")
    if "chains" in report:
        return _paired(report["chains_rounds"], f"v{CHAINS_BEFORE}")
    if "positions" in report:
        return _paired(report["positions_rounds"], f"v{POSITIONS_BEFORE}")
    for section, what in (("schemas", CONTINUE_HOP), ("loads", LOAD)):
        if section not in report:
            continue
        lines = [f"| {what}, by schema (interleaved rounds) | wall per call (µs) | "
                 "client CPU per call (µs) | server CPU per call (µs) | WAL per call (bytes) |",
                 "|---|---:|---:|---:|---:|"]
        lines += [f"| {label} | {v['wall_us']:.0f} | {v.get('client_cpu_us', 0):.0f} | "
                  f"{v.get('server_cpu_us', 0):.0f} | {v.get('wal_bytes', 0):.0f} |"
                  for label, v in report[section].items()]
        return "\n".join(lines)
    batched = ["", f"| continued hops committed {BATCH} per statement (interleaved rounds) "
               "| wall per hop (µs) | client CPU per hop (µs) | server CPU per hop (µs) |",
               "|---|---:|---:|---:|"]
    batched += [f"| {label} | {v['wall_us']:.0f} | {v['client_cpu_us']:.0f} | "
                f"{v['server_cpu_us']:.0f} |" for label, v in report["batches"].items()]
    if "driver" not in report:
        return "\n".join(batched[1:])
    lines = ["| one `SELECT length($1::text)` through asyncpg | client CPU (µs) | wall (µs) |",
             "|---|---:|---:|"]
    lines += [f"| {label} | {v['client_cpu_us']:.0f} | {v['wall_us']:.0f} |"
              for label, v in report["driver"].items()]
    lines += ["", "| statement, inside the server, each in its own transaction | µs |",
              "|---|---:|"]
    lines += [f"| {label} | {us:.0f} |" for label, us in report["server"].items()]
    lines += ["", f"| {COMMIT_HOP}, interleaved rounds | µs (median) |", "|---|---:|"]
    lines += [f"| {label} | {us:.0f} |" for label, us in report["checks"].items()]
    lines += ["", "| a continued hop inside the server, by schema (interleaved rounds) "
              "| µs (median) |", "|---|---:|"]
    lines += [f"| {label} | {us:.0f} |" for label, us in report["rules"].items()]
    floor = report["commits"][next(iter(COMMIT_CALLS))]["wall_us"]
    lines += ["", "| one hop's commit as a worker sends it, with its commit (interleaved rounds) "
              "| wall (µs) | client CPU (µs) | server CPU (µs) | floor wall ÷ wall |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| {label} | {v['wall_us']:.0f} | {v['client_cpu_us']:.0f} | "
              f"{v['server_cpu_us']:.0f} | {floor / v['wall_us']:.2f} |"
              for label, v in report["commits"].items()]
    return "\n".join(lines + batched)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--phases", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--check-rounds", type=int, default=5)
    parser.add_argument("--only", choices=["batches", "commits", "schemas", "loads", "rows",
                                           "chains", "positions"],
                        default=None,
                        help="run one section alone")
    args = parser.parse_args()
    report = asyncio.run(bench(args))
    path = write_results("statement-costs", report)
    print(markdown(report))
    print(f"\nresults: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
