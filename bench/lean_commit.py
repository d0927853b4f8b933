"""WAL bytes and HOT updates per plain transition: the lean commit, before and after.

    python -m bench.lean_commit            # 0017's dropped indexes back, and the newest schema
    python -m bench.lean_commit --runs 16 --phases 100 --schemas after --paths group
    python -m bench.lean_commit --schemas v19,after --paths continued   # migration 0020
    python -m bench.lean_commit --schemas after --paths continued,group --input-bytes 1000

The ``continued`` path is local continuation's: each commit leases the successor to the
worker and spends the row of the hop it ran (schema v19: a leased outbox row, written and
deleted again; from v20 a chain lease on the run's position and no row), nothing marked sent;
from v21 each hop alone through its own statement (``continue_phase``), and with
``continued-group`` every run's hop of a round in one ``commit_phases``.

Runs plain transitions (a phase that advances: checkpoint, run position, successor row, then
the successor marked sent) through phasegate's own commit path, ``Store.commit_phase``: the
single-row ``commit_phase`` one commit at a time, and group commit's ``commit_phases`` with
every run committing at once. Each (schema, path) gets a fresh database on a private
PostgreSQL cluster (fsync and full page writes on, as in production), so the WAL position
moves only with these writes. Per transition it reports the WAL written
(``pg_current_wal_lsn()`` deltas, the commit and the mark-sent apart) and, per table, how many
updates were HOT (``pg_stat_user_tables.n_tup_upd`` / ``n_tup_hot_upd``). Neither figure
depends on machine load. It also names the run-row columns a plain transition changes and the
indexes that name one of them: each such index makes the update non-HOT. Results:
bench/results/lean-commit-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg

from bench.common import ROOT, PrivateCluster, machine, with_database, write_results
from bench.workload import PAYLOAD
from phasegate.envelope import canonical_json, phase_message, state_hash
from phasegate.migrate import migrate
from phasegate.sql import queries
from phasegate.store import Lease, PhaseCommit, Store, create_pool

# What 0017 dropped, as 0003 created it: the indexes that named columns a commit changes.
BLOCKING_INDEXES = (
    "CREATE INDEX IF NOT EXISTS workflow_runs_phase_created_idx"
    " ON workflow_runs (current_phase, created_at DESC, workflow_id DESC)",
    "CREATE INDEX IF NOT EXISTS workflow_runs_stall_idx ON workflow_runs (updated_at)"
    " INCLUDE (workflow, current_phase, tier, tier_label, status)"
    " WHERE status IN ('pending', 'running', 'awaiting_review')",
)


async def migrate_before(dsn: str) -> None:
    """The newest schema with 0017's dropped indexes put back: what kept every commit from
    being HOT before it. (The hot path's statements are server functions since 0018, which
    need the newest schema; the indexes are the whole difference that matters here.)"""
    await migrate(dsn)
    connection = await asyncpg.connect(dsn)
    try:
        for statement in BLOCKING_INDEXES:
            await connection.execute(statement)
    finally:
        await connection.close()
WORKFLOW = "bench-lean"
TABLES = ("workflow_runs", "run_positions", "checkpoints", "outbox")
STATS_DEADLINE_S = 30.0
GROUP_WINDOW_S = 0.002  # PHASEGATE_COMMIT_BATCH_WINDOW_MS's default

# Every column an index of the table names: key and INCLUDE columns (indkey), and the columns
# of expressions and partial-index predicates (recorded as dependencies of the index).
INDEXED_COLUMNS = """
SELECT i.relname AS index, a.attname AS column
  FROM pg_index x
  JOIN pg_class i ON i.oid = x.indexrelid
  JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE x.indrelid = $1::regclass
   AND (a.attnum = ANY (x.indkey::int2[])
        OR EXISTS (SELECT 1 FROM pg_depend d
                    WHERE d.classid = 'pg_class'::regclass AND d.objid = x.indexrelid
                      AND d.refclassid = 'pg_class'::regclass AND d.refobjid = x.indrelid
                      AND d.refobjsubid = a.attnum))
 ORDER BY 1, 2
"""


def plain_commit(workflow_id: str, seq: int) -> PhaseCommit:
    """A phase that advances, graded (the tier moves too), with its successor."""
    canonical = canonical_json({**PAYLOAD, "n": seq})
    tier = 1 + seq % 3
    return PhaseCommit(
        workflow_id=workflow_id, branch="main", seq=seq, phase=f"p{seq}", schema_version=1,
        state_json=canonical, state_hash=state_hash(canonical), next_phase=f"p{seq + 1}",
        status="running", worker_id="bench-lean", tier=tier, tier_label=f"tier-{tier}",
        successor=phase_message(workflow_id, WORKFLOW, seq + 1, f"p{seq + 1}"))


def run_input(size: int) -> str:
    """A run's input of about ``size`` bytes of JSON (random hex: it does not compress)."""
    if size <= len('{"n": 0}'):
        return '{"n": 0}'
    return canonical_json({"n": 0, "doc": secrets.token_hex(size // 2)[:size - 20]})


async def seed(pool: asyncpg.Pool, ids: list[str], input_json: str = '{"n": 0}') -> None:
    """Each run created by its start and claimed (pending -> running), as a worker does."""
    q = queries()
    for workflow_id in ids:
        await pool.execute(q["ensure_run"], workflow_id, WORKFLOW, 1, input_json, "p0",
                           "internal", None)
        await pool.fetchrow(q["load_for_phase"], workflow_id, "main", 0)


async def table_stats(connection: asyncpg.Connection) -> dict[str, dict[str, int]]:
    rows = await connection.fetch(
        "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE relname = ANY($1::text[])", list(TABLES))
    return {r["relname"]: {"updates": r["n_tup_upd"], "hot_updates": r["n_tup_hot_upd"]}
            for r in rows}


async def stats_reaching(connection: asyncpg.Connection, updates: int) -> dict[str, Any]:
    """The counters once workflow_runs shows ``updates`` updates. A backend publishes its
    counters when it goes idle (forced by pg_stat_force_next_flush(), else within seconds),
    so poll with a deadline."""
    deadline = time.monotonic() + STATS_DEADLINE_S
    while True:
        await connection.execute("SELECT pg_stat_clear_snapshot()")
        stats = await table_stats(connection)
        if stats.get("workflow_runs", {}).get("updates", 0) >= updates:
            return stats
        if time.monotonic() > deadline:
            raise TimeoutError(f"workflow_runs never showed {updates} updates in "
                               "pg_stat_user_tables")
        await asyncio.sleep(0.05)


async def lsn(connection: asyncpg.Connection) -> str:
    return str(await connection.fetchval("SELECT pg_current_wal_lsn()::text"))


async def wal_since(connection: asyncpg.Connection, start: str) -> int:
    return int(await connection.fetchval(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)", start))


async def wal_records(connection: asyncpg.Connection, start: str,
                      transitions: int) -> dict[str, dict[str, float]]:
    """WAL since ``start`` by record type (pg_walinspect, PostgreSQL 15; superuser), per
    transition: what the bytes are. Empty where the extension cannot be created."""
    try:
        await connection.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except asyncpg.PostgresError:
        return {}
    rows = await connection.fetch(
        "SELECT \"resource_manager/record_type\" AS kind, count, record_size, fpi_size "
        "FROM pg_get_wal_stats($1::text::pg_lsn, pg_current_wal_lsn(), true) "
        "WHERE count > 0 ORDER BY record_size + fpi_size DESC", start)
    return {r["kind"]: {"records": round(r["count"] / transitions, 2),
                        "bytes": round((r["record_size"] + r["fpi_size"]) / transitions)}
            for r in rows}


async def index_columns(connection: asyncpg.Connection) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for row in await connection.fetch(INDEXED_COLUMNS, "workflow_runs"):
        found.setdefault(row["index"], []).append(row["column"])
    return found


async def run_row(connection: asyncpg.Connection, workflow_id: str) -> dict[str, Any]:
    text = await connection.fetchval(
        "SELECT to_jsonb(r)::text FROM workflow_runs r WHERE workflow_id = $1", workflow_id)
    loaded: dict[str, Any] = json.loads(text)
    return loaded


async def continued_hops(store: Store, ids: list[str], phases: int,
                         admin: asyncpg.Connection) -> dict[str, int]:
    """``phases`` rounds of continued hops: each leases its successor to the worker. From
    schema v21 through the worker's own path (``Store.commit_phase`` with a lease: a hop alone
    is ``continue_phase``; under group commit, every run's hop of a round goes at once, rows of
    ``commit_phases``). Before, one at a time, as a worker of that release committed
    (queries.sql commit_phase), spending the row the previous hop was given, if any (schema
    v19; from v20 the commit returns no row)."""
    q = queries()
    wal = {"commit": 0, "mark_sent": 0, "won": 0}
    if await admin.fetchval("SELECT to_regproc('phasegate_continue_phase') IS NOT NULL"):
        lease = Lease("bench-lean", 600.0)
        for seq in range(phases):
            start = await lsn(admin)
            results = await asyncio.gather(*(
                store.commit_phase(plain_commit(workflow_id, seq), lease=lease)
                for workflow_id in ids))
            assert all(result is not None for result in results)
            wal["won"] += len(results)
            wal["commit"] += await wal_since(admin, start)
        return wal
    spent: dict[str, int | None] = dict.fromkeys(ids)
    for seq in range(phases):
        start = await lsn(admin)
        for workflow_id in ids:
            c = plain_commit(workflow_id, seq)
            assert c.successor is not None
            row = await store.pool.fetchrow(
                q["commit_phase"], c.workflow_id, c.branch, c.seq, c.phase, c.schema_version,
                c.state_json, c.state_hash, c.next_phase, c.status, c.tier, c.tier_label, None,
                c.worker_id, None, c.successor.dedup_id, c.successor.group_id,
                c.successor.to_json(), None, None, None, None, None, None, None,
                "bench-lean", 600.0, spent[workflow_id])
            assert row is not None and row["committed_at"] is not None
            spent[workflow_id] = row["outbox_id"]
            wal["won"] += 1
        wal["commit"] += await wal_since(admin, start)
    return wal


async def transitions(store: Store, ids: list[str], phases: int, grouped: bool,
                      admin: asyncpg.Connection) -> dict[str, int]:
    """``phases`` rounds: every run commits its next seq, then the round's successors are
    marked sent in one statement (the worker's mark-sent batcher). WAL of each part."""
    wal = {"commit": 0, "mark_sent": 0, "won": 0}
    for seq in range(phases):
        commits = [plain_commit(workflow_id, seq) for workflow_id in ids]
        start = await lsn(admin)
        if grouped:
            results = await asyncio.gather(*(store.commit_phase(c) for c in commits))
        else:
            results = [await store.commit_phase(c) for c in commits]
        wal["commit"] += await wal_since(admin, start)
        sent = [r[1] for r in results if r is not None and r[1] is not None]
        wal["won"] += sum(r is not None for r in results)
        start = await lsn(admin)
        await store.mark_sent(sent)
        wal["mark_sent"] += await wal_since(admin, start)
    return wal


async def measure(dsn: str, *, runs: int, phases: int, grouped: bool,
                  continued: bool = False, input_bytes: int = 0) -> dict[str, Any]:
    """``runs`` x ``phases`` plain transitions on the (fresh, migrated) database at ``dsn``,
    each run with an input of about ``input_bytes`` bytes (0: a few)."""
    prefix = uuid.uuid4().hex[:8]
    ids = [f"lean-{prefix}-{i:03d}" for i in range(runs)]
    admin = await asyncpg.connect(dsn)
    # One connection: the counters it publishes are forced out before each read.
    pool = await create_pool(dsn, min_size=1, max_size=1)
    store = Store(pool, commit_window_s=GROUP_WINDOW_S if grouped else 0.0)
    try:
        base = (await table_stats(admin)).get("workflow_runs", {}).get("updates", 0)
        await seed(pool, ids, run_input(input_bytes))
        await pool.execute("SELECT pg_stat_force_next_flush()")
        before = await stats_reaching(admin, base + runs)
        first = await run_row(admin, ids[0])
        window = await lsn(admin)
        wal = (await continued_hops(store, ids, phases, admin) if continued
               else await transitions(store, ids, phases, grouped, admin))
        records = await wal_records(admin, window, runs * phases)
        await pool.execute("SELECT pg_stat_force_next_flush()")
        after = await stats_reaching(admin, before["workflow_runs"]["updates"] + runs * phases)
        last = await run_row(admin, ids[0])
        indexes = await index_columns(admin)
        statements = store.group_commit.statements if store.group_commit else 0
    finally:
        await pool.close()
        await admin.close()
    count = runs * phases
    changed = sorted(k for k in first if first[k] != last.get(k))
    tables = {}
    for table, now in after.items():
        was = before.get(table, {"updates": 0, "hot_updates": 0})
        updates = now["updates"] - was["updates"]
        hot = now["hot_updates"] - was["hot_updates"]
        tables[table] = {"updates": updates, "hot_updates": hot,
                         "hot_ratio": round(hot / updates, 3) if updates else None}
    return {
        "runs": runs, "phases": phases, "input_bytes": input_bytes, "transitions": count,
        "committed": wal["won"],
        "grouped_statements": statements,
        "wal_bytes_per_transition": {
            "commit": round(wal["commit"] / count), "mark_sent": round(wal["mark_sent"] / count),
            "total": round((wal["commit"] + wal["mark_sent"]) / count)},
        "tables": tables,
        "wal_records_per_transition": records,
        "changed_columns": changed,
        "blocking_indexes": {name: sorted(set(columns) & set(changed))
                             for name, columns in indexes.items()
                             if set(columns) & set(changed)},
        "indexes": indexes,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    cluster = None if args.dsn else PrivateCluster().start()
    server = args.dsn or (cluster.dsn if cluster else "")
    results = []
    try:
        admin = await asyncpg.connect(server)
        try:
            settings = {r["name"]: r["setting"] for r in await admin.fetch(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1)",
                ["server_version", "fsync", "full_page_writes", "synchronous_commit"])}
            for schema in args.schemas.split(","):
                for path in args.paths.split(","):
                    name = f"lean_{uuid.uuid4().hex[:10]}"
                    await admin.execute(f'CREATE DATABASE "{name}"')
                    dsn = with_database(server, name)
                    try:
                        if schema == "before":
                            await migrate_before(dsn)
                        elif schema.startswith("v"):
                            await migrate(dsn, target=int(schema[1:]))
                        else:
                            await migrate(dsn)
                        figures = await measure(dsn, runs=args.runs, phases=args.phases,
                                                grouped=path in ("group", "continued-group"),
                                                continued=path.startswith("continued"),
                                                input_bytes=args.input_bytes)
                    finally:
                        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    results.append({"schema": schema, "path": path, **figures})
                    print(row(results[-1]), file=sys.stderr)
        finally:
            await admin.close()
    finally:
        if cluster is not None:
            cluster.stop()
    return {"when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
            "postgres": settings, "private_cluster": cluster is not None,
            "command": "python -m bench.lean_commit " + " ".join(sys.argv[1:]),
            "results": results}


def _hot(figures: dict[str, Any], table: str) -> str:
    found = figures["tables"].get(table)
    if not found or not found["updates"]:
        return "—"
    return f"{found['hot_updates']} / {found['updates']}"


def row(r: dict[str, Any]) -> str:
    wal = r["wal_bytes_per_transition"]
    return (f"| {r['schema']} | {r['path']} | {r['transitions']} | {wal['commit']} | "
            f"{wal['mark_sent']} | {wal['total']} | {_hot(r, 'workflow_runs')} | "
            f"{_hot(r, 'run_positions')} | {_hot(r, 'outbox')} |")


def markdown(report: dict[str, Any]) -> str:
    lines = ["| schema | commit path | transitions | WAL B/transition: commit | mark sent | "
             "total | run row: HOT / updates | run_positions: HOT / updates | "
             "outbox: HOT / updates |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [row(r) for r in report["results"]]
    for schema in dict.fromkeys(r["schema"] for r in report["results"]):
        first = next(r for r in report["results"] if r["schema"] == schema)
        blocking = "; ".join(f"{name} ({', '.join(cols)})"
                             for name, cols in first["blocking_indexes"].items()) or "none"
        lines.append(f"\n{schema}: a plain transition changes "
                     f"{', '.join(first['changed_columns'])}; indexes naming one: {blocking}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--phases", type=int, default=100)
    parser.add_argument("--schemas", default="before,after",
                        help="before (the indexes 0017 dropped put back), after (all), "
                        "vN (migrated up to N)")
    parser.add_argument("--paths", default="single,group",
                        help="single, group, continued (local continuation's hops, one at a "
                             "time), continued-group (every run's hop of a round at once)")
    parser.add_argument("--dsn", help="a server DSN instead of a private cluster (WAL then "
                        "includes other clients' writes)")
    parser.add_argument("--input-bytes", type=int, default=0,
                        help="each run's input, about this many bytes of JSON (default: a few; "
                             "the transitions benchmark's runs carry ~1 KB)")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    report = asyncio.run(bench(args))
    path = write_results("lean-commit", report, args.label)
    print(markdown(report))
    print(f"\nresults: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
