"""What statement handling costs, direct and through PgBouncer (transaction mode).

    python -m bench.poolers --transitions 4000 --concurrency 8 --rounds 3 [--current]

An in-process worker (the real transition and the store a worker makes from its settings, with
group commit and group load at their default windows; ``InMemoryFifoQueue`` as the queue, so
Postgres is the only server) runs ``--transitions`` no-op transitions of 1 KB state per mode;
modes alternate each round on a fresh database, figures are medians. Until 2026-12-07 the
store had neither (every commit its own statement), so older figures are of that store. Modes:

- ``direct/cache`` — direct, asyncpg's statement cache on (PHASEGATE_DATABASE_POOLER=none);
- ``direct/nocache`` — direct, no named statements (the default, transaction);
- ``pgbouncer/nocache`` — through PgBouncer 1.18, transaction mode, 6 server connections;
- ``pgbouncer/named`` — the same PgBouncer, statements named by their text
  (PHASEGATE_DATABASE_POOLER=pgbouncer, phasegate/named_statements.py);
- ``direct/named`` — that mode on a direct connection;
- ``pgbouncer/cache`` — the cache through PgBouncer 1.18: expected to fail (named statements
  do not survive a transaction pooler that does not track them);
- with ``--current``, ``current/nocache``, ``current/named`` and ``current/cache``: the same
  three through a current PgBouncer (1.24, ``max_prepared_statements`` at its default 200,
  scripts/pgbouncer-current.sh), which tracks each client's named statements itself.

Also per transition: commits and WAL bytes, the inputs of the capacity model
(bench/capacity.py). Commits are the commit records in the run's WAL (``pg_walinspect``): each
is a transaction that wrote and, with ``synchronous_commit`` on, one WAL flush; a read-only
transaction writes none. (``pg_stat_database.xact_commit`` would count every transaction, but a
backend reports it lazily, and the server connections PgBouncer keeps open may not report it
before the run is read.) The private cluster's WAL moves only with the run's own writes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

from bench.common import Databases, machine
from bench.pgbouncer import PgBouncer, current_root
from bench.workload import noop_workflow, seed_runs, stopping_worker
from phasegate.db import Pooler, create_pool
from phasegate.orchestrator.embedded import local_aws_env
from phasegate.residency import RegionalStore
from phasegate.settings import Settings
from phasegate.worker.fake_queue import InMemoryFifoQueue

MODES: tuple[tuple[str, Pooler], ...] = (("direct", "none"), ("direct", "transaction"),
                                         ("direct", "pgbouncer"), ("pgbouncer", "transaction"),
                                         ("pgbouncer", "pgbouncer"), ("pgbouncer", "none"))
CURRENT_MODES: tuple[tuple[str, Pooler], ...] = (("current", "transaction"),
                                                 ("current", "pgbouncer"), ("current", "none"))
PHASES = 10
FAIL_AFTER_S = 60.0


def mode_name(route: str, pooler: Pooler) -> str:
    return f"{route}/{ {'none': 'cache', 'pgbouncer': 'named'}.get(pooler, 'nocache')}"


async def one_run(dsn: str, admin_dsn: str, *, pooler: Pooler, transitions: int,
                  concurrency: int) -> dict[str, Any]:
    workflow = noop_workflow(PHASES)
    groups = max(1, transitions // PHASES)
    pool = await create_pool(dsn, min_size=concurrency, max_size=concurrency, pooler=pooler)
    admin = await create_pool(admin_dsn, min_size=1, max_size=1, pooler="none")
    settings = Settings(concurrency=concurrency, wait_time_s=1, visibility_timeout_s=30,
                        heartbeat_s=10, metrics_port=0, metrics_host="127.0.0.1",
                        worker_id="bench", db_pool_max=concurrency, database_pooler=pooler)
    # The store a worker makes from these settings: group commit and group load at their
    # default windows, as deployed.
    store = RegionalStore(pool, commit_window_s=settings.commit_batch_window_ms / 1000,
                          load_window_s=settings.load_batch_window_ms / 1000)
    queue, dlq = InMemoryFifoQueue(), InMemoryFifoQueue()
    try:
        await seed_runs(store, queue, workflow, groups, "p")
        worker = stopping_worker(settings, workflow, groups, queue=queue, dlq=dlq, store=store)
        await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        before = await wal_position(admin)
        began = time.perf_counter()
        task = asyncio.create_task(worker.run())
        done, _ = await asyncio.wait({task}, timeout=FAIL_AFTER_S)
        wall = time.perf_counter() - began
        after = await wal_commits_since(admin, before)
        committed = await admin.fetchval("SELECT count(*) FROM checkpoints")
        if not done:
            worker.stop()
            await asyncio.wait_for(task, timeout=60)
            return {"ok": False, "committed": committed, "expected": groups * PHASES,
                    "note": f"not done after {FAIL_AFTER_S:g}s"}
        task.result()
        n = groups * PHASES
        return {"ok": committed == n, "transitions": n, "wall_s": round(wall, 3),
                "transitions_per_s": round(n / wall, 1),
                "commits_per_transition": round(after["commits"] / n, 3),
                "wal_bytes_per_transition": round(after["wal"] / n)}
    finally:
        await pool.close()
        await admin.close()


async def wal_position(admin: Any) -> str:
    return str(await admin.fetchval("SELECT pg_current_wal_lsn()::text"))


async def wal_commits_since(admin: Any, since: str) -> dict[str, int]:
    """Commit records and WAL bytes written since the WAL position ``since``."""
    row = await admin.fetchrow(
        "SELECT pg_current_wal_lsn() - $1::text::pg_lsn AS wal, coalesce((SELECT sum(count) "
        "FROM pg_get_wal_stats($1::text::pg_lsn, pg_current_wal_lsn(), true) "
        "WHERE \"resource_manager/record_type\" = 'Transaction/COMMIT'), 0) AS commits",
        since)
    return {"commits": int(row["commits"]), "wal": int(row["wal"])}


async def bench(*, transitions: int, concurrency: int, rounds: int,
                current: bool = False) -> dict[str, Any]:
    databases = await Databases().start()
    bouncers = {"pgbouncer": PgBouncer.in_front_of(databases.server_dsn).start()}
    modes = MODES
    if current:
        bouncers["current"] = PgBouncer.in_front_of(databases.server_dsn,
                                                    root=current_root()).start()
        modes = MODES + CURRENT_MODES
    versions = {route: bouncer.version() for route, bouncer in bouncers.items()}
    runs: dict[str, list[dict[str, Any]]] = {mode_name(r, p): [] for r, p in modes}
    try:
        for round_ in range(rounds):
            order = modes if round_ % 2 == 0 else tuple(reversed(modes))
            for route, pooler in order:
                direct = await databases.fresh()
                dsn = bouncers[route].route(direct) if route in bouncers else direct
                try:
                    result = await one_run(dsn, direct, pooler=pooler,
                                           transitions=transitions, concurrency=concurrency)
                except Exception as exc:  # the mode failed outright: record why
                    result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:200]}
                finally:
                    await databases.drop(direct)
                runs[mode_name(route, pooler)].append(result)
                print(mode_name(route, pooler), json.dumps(result), flush=True)
    finally:
        for bouncer in bouncers.values():
            bouncer.stop()
        await databases.stop()
    summary: dict[str, Any] = {}
    for name, results in runs.items():
        good = [r for r in results if r.get("ok")]
        if len(good) != len(results):
            summary[name] = {"ok": False, "failures": [r for r in results if not r.get("ok")][:1]}
            continue
        summary[name] = {"ok": True, "transitions_per_s": statistics.median(
            r["transitions_per_s"] for r in good), "commits_per_transition": statistics.median(
            r["commits_per_transition"] for r in good), "wal_bytes_per_transition":
            statistics.median(r["wal_bytes_per_transition"] for r in good)}
    base = summary["direct/cache"].get("transitions_per_s")
    for figures in summary.values():
        if base and figures.get("ok"):
            figures["ratio_to_direct_cache"] = round(figures["transitions_per_s"] / base, 2)
    return {"machine": machine(), "transitions": transitions, "concurrency": concurrency,
            "rounds": rounds, "pgbouncers": versions, "modes": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.poolers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transitions", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--current", action="store_true",
                        help="also through a current PgBouncer (1.24, tracking named "
                             "statements; scripts/pgbouncer-current.sh)")
    args = parser.parse_args(argv)
    import logging
    import os

    import structlog

    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    result = asyncio.run(bench(transitions=args.transitions, concurrency=args.concurrency,
                               rounds=args.rounds, current=args.current))
    print(json.dumps({"pgbouncers": result["pgbouncers"], "modes": result["modes"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
