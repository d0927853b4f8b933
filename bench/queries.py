"""Control-plane query benchmark: 100k runs / 500k checkpoints, p50/p99 of each read.

    .venv/bin/python bench/queries.py [--runs 100000] [--checkpoints-per-run 5]
                                      [--iterations 2000] [--dsn postgresql://...]

Fills a throwaway database (created on the server at --dsn, $PHASEGATE_BENCH_DATABASE_URL,
127.0.0.1:5432 if it answers, else a local cluster started here), migrates it, then times the
orchestrator's own code paths (``phasegate.orchestrator.views.Views``: query + asyncpg +
response model) one call at a time on one connection. Writes
bench/results/queries-<timestamp>.json and prints a Markdown table. Each read must stay under
5 ms p50.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from phasegate.migrate import migrate  # noqa: E402
from phasegate.orchestrator.embedded import EmbeddedPostgres  # noqa: E402  (after the path tweak)
from phasegate.orchestrator.views import Views  # noqa: E402

TARGET_P50_MS = 5.0
WORKFLOWS = ["storm-intel", "ingest", "agent-run", "report", "backfill"]
PHASES = ["fetch", "extract", "enrich", "review", "publish"]

# Status mix of a long-lived installation: mostly finished runs, a few percent in flight, a
# slice of those stalled (untouched for hours).
FILL = """
INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, current_phase,
                           schema_version, tier, tier_label, input, created_at, updated_at,
                           finished_at)
SELECT 'wf_' || md5(i::text), w.name, s.status, $2, CASE WHEN s.status <> 'completed'
       THEN (ARRAY['fetch','extract','enrich','review','publish'])[1 + i % 5] END,
       1, i % 4, (ARRAY['none','draft','found','verified'])[1 + i % 4],
       jsonb_build_object('query', 'q' || i, 'limit', 100),
       t.created, t.created + make_interval(secs => CASE WHEN s.status IN
            ('running', 'pending', 'awaiting_review') AND i % 3 = 0 THEN 60 ELSE 3600 END),
       CASE WHEN s.status IN ('completed', 'failed', 'cancelled')
            THEN t.created + interval '1 hour' END
  FROM generate_series(1, $1) AS i
 CROSS JOIN LATERAL (SELECT (ARRAY['storm-intel','ingest','agent-run','report','backfill'])
                            [1 + i % 5] AS name) w
 CROSS JOIN LATERAL (SELECT CASE
        WHEN i % 100 < 85 THEN 'completed' WHEN i % 100 < 90 THEN 'failed'
        WHEN i % 100 < 92 THEN 'cancelled' WHEN i % 100 < 98 THEN 'running'
        WHEN i % 100 < 99 THEN 'pending' ELSE 'awaiting_review' END AS status) s
 CROSS JOIN LATERAL (SELECT now() - make_interval(secs => ($1 - i) * 26.0) AS created) t
"""

CHECKPOINTS = """
INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                         state_hash, tier, tier_label, worker_id, created_at)
SELECT r.workflow_id, 'main', g.seq, (ARRAY['fetch','extract','enrich','review','publish'])
       [1 + g.seq % 5], 'phase', 1,
       jsonb_build_object('seq', g.seq, 'items', jsonb_build_array(1, 2, 3),
                          'note', repeat('x', 120)),
       md5(r.workflow_id || g.seq) || md5(g.seq || r.workflow_id), g.seq % 4, 'tier',
       'worker-1', r.created_at + make_interval(secs => g.seq * 60)
  FROM workflow_runs r CROSS JOIN generate_series(0, $1 - 1) AS g(seq)
"""


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def timed(fn: Callable[[], Awaitable[Any]], iterations: int) -> dict[str, float]:
    for _ in range(min(50, iterations)):  # warm the plan and the statement cache
        await fn()
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": round(percentile(samples, 0.50), 3),
            "p99_ms": round(percentile(samples, 0.99), 3),
            "mean_ms": round(statistics.fmean(samples), 3), "iterations": iterations}


async def fill(dsn: str, runs: int, per_run: int) -> dict[str, Any]:
    started = time.perf_counter()
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(FILL, runs, per_run)
        await connection.execute(CHECKPOINTS, per_run)
        await connection.execute("VACUUM ANALYZE")
        counts = {"runs": await connection.fetchval("SELECT count(*) FROM workflow_runs"),
                  "checkpoints": await connection.fetchval("SELECT count(*) FROM checkpoints"),
                  "unfinished": await connection.fetchval(
                      "SELECT count(*) FROM workflow_runs WHERE status IN "
                      "('pending', 'running', 'awaiting_review')")}
    finally:
        await connection.close()
    counts["fill_s"] = round(time.perf_counter() - started, 1)
    return counts


async def plans(pool: asyncpg.Pool, sample_id: str) -> dict[str, str]:
    from phasegate.sql import queries

    q = queries("control.sql")
    statements: dict[str, tuple[str, list[object]]] = {
        "status": (q["get_run"], [sample_id]),
        "list": (q["list_runs"].replace("/*filters*/", ""), [50]),
        "list_status": (q["list_runs"].replace("/*filters*/", "AND status = $2"),
                        [50, "running"]),
        "stalls": (q["stalls"], [600.0, 200]),
        "checkpoints": (q["checkpoints"], [sample_id, False, 0, 1001]),
    }
    found = {}
    async with pool.acquire() as connection:
        for name, (sql, args) in statements.items():
            rows = await connection.fetch(f"EXPLAIN {sql}", *args)
            found[name] = " | ".join(r[0].strip() for r in rows[:3])
    return found


async def bench(dsn: str, iterations: int) -> dict[str, Any]:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    try:
        views = Views(pool)
        ids = [r["workflow_id"] for r in await pool.fetch(
            "SELECT workflow_id FROM workflow_runs TABLESAMPLE SYSTEM (5) LIMIT 2000")]
        rng = random.Random(7)
        first = await views.list_runs(limit=50)
        cursor = first.next_cursor
        deep = await views.list_runs(limit=50, status="completed")
        results = {
            "status (GET /v1/workflows/{id})": await timed(
                lambda: views.get_run(rng.choice(ids)), iterations),
            "list, first page (GET /v1/workflows?limit=50)": await timed(
                lambda: views.list_runs(limit=50), iterations),
            "list, next page by cursor": await timed(
                lambda: views.list_runs(limit=50, cursor=cursor), iterations),
            "list by status=running": await timed(
                lambda: views.list_runs(limit=50, status="running"), iterations),
            "list by status=completed, page 2": await timed(
                lambda: views.list_runs(limit=50, status="completed",
                                        cursor=deep.next_cursor), iterations),
            "list by workflow + phase": await timed(
                lambda: views.list_runs(limit=50, workflow="ingest", phase="extract"),
                iterations),
            "stalls (GET /v1/stalls, older than 10 min)": await timed(
                lambda: views.stalls(600.0), iterations),
            "checkpoints (GET /v1/workflows/{id}/checkpoints)": await timed(
                lambda: views.checkpoints(rng.choice(ids)), iterations),
            "oldest unfinished age (exporter)": await timed(
                views.oldest_unfinished_age_s, iterations),
            "summary (phasegate status)": await timed(views.summary, max(50, iterations // 10)),
        }
        return {"results": results, "plans": await plans(pool, ids[0])}
    finally:
        await pool.close()


async def server_dsn(explicit: str | None) -> tuple[str, EmbeddedPostgres | None]:
    candidate = explicit or os.environ.get("PHASEGATE_BENCH_DATABASE_URL")
    if candidate:
        return candidate, None
    local = "postgresql://postgres@127.0.0.1:5432/postgres"
    try:
        connection = await asyncpg.connect(local, timeout=3)
        await connection.close()
        return local, None
    except (OSError, asyncpg.PostgresError):
        server = EmbeddedPostgres().start()
        return server.dsn, server


def with_database(dsn: str, name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


async def main(args: argparse.Namespace) -> dict[str, Any]:
    admin_dsn, embedded = await server_dsn(args.dsn)
    name = f"phasegate_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    dsn = with_database(admin_dsn, name)
    try:
        await migrate(dsn)
        print(f"filling {args.runs} runs x {args.checkpoints_per_run} checkpoints ...",
              file=sys.stderr)
        data = await fill(dsn, args.runs, args.checkpoints_per_run)
        print(f"filled in {data['fill_s']} s; timing {args.iterations} calls per query ...",
              file=sys.stderr)
        measured = await bench(dsn, args.iterations)
        version = await admin.fetchval("SHOW server_version")
    finally:
        if not args.keep:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        if embedded is not None:
            embedded.stop()
    return {"when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"python": platform.python_version(), "postgres": version,
                        "cpus": os.cpu_count(), "platform": platform.platform()},
            "data": data, "iterations": args.iterations, **measured,
            "target_p50_ms": TARGET_P50_MS}


def markdown(report: dict[str, Any]) -> str:
    lines = ["| query | p50 ms | p99 ms | mean ms |", "|---|---:|---:|---:|"]
    for name, r in report["results"].items():
        lines.append(f"| {name} | {r['p50_ms']} | {r['p99_ms']} | {r['mean_ms']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--checkpoints-per-run", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--dsn", help="A server DSN (a database is created and dropped there).")
    parser.add_argument("--keep", action="store_true", help="Keep the filled database.")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    report = asyncio.run(main(parser.parse_args()))
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"queries-{report['when'][:19].replace(':', '')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    slow = [n for n, r in report["results"].items()
            if r["p50_ms"] > TARGET_P50_MS and not n.startswith("summary")]
    print(f"\nresults: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    if slow:
        print(f"OVER {TARGET_P50_MS} ms p50: {slow}")
        sys.exit(1)
