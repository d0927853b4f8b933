"""Where Postgres' time and WAL go per transition, statement by statement.

    python -m bench.server_statements [--groups 1] [--phases 1500] [--continuation off|on]
                                      [--top 15] [--nested] [--localstack-endpoint URL]

The phasegate side of ``bench/transitions.py`` (in-process FIFO, or with
``--localstack-endpoint`` a running LocalStack) and its floor, each on a
fresh database of one private cluster started with ``pg_stat_statements``; the statistics are
reset after a warm-up run and read after the measured one. For every top-level statement the
runs sent: calls, execution time and WAL bytes per transition (``pg_stat_statements``: the
time is the server's execution of the statement, its commit's flush wait not included; a
function's inner statements count in its call; with ``--nested`` they are also listed on
their own, so a function's time minus its statements' is what the call itself costs: its
executor start-up, plan cache checks and PL/pgSQL work, which pg_stat_statements does not time
inside a statement). The end-to-end figures of
``bench/transitions.py`` say how far from the floor a transition is; this says which
statement the difference is spent in.

Results: bench/results/server-statements-<time>.json, and a table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import (
    HISTORY_RUNS,
    Databases,
    PrivateCluster,
    machine,
    write_results,
)
from phasegate.orchestrator.embedded import local_aws_env

PRELOAD = ("-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track={track} "
           "-c pg_stat_statements.track_planning=on")
READ = """
SELECT query, calls, total_exec_time, total_plan_time, plans, wal_bytes::float8, rows
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = $1 AND query NOT ILIKE '%pg_stat_statements%'
"""


class StatementsCluster(PrivateCluster):
    """A private cluster whose server tracks its top-level statements (``nested``: and the
    statements functions run)."""

    def __init__(self, nested: bool = False) -> None:
        super().__init__()
        self.options = PRELOAD.format(track="all" if nested else "top")


def _label(query: str) -> str:
    """A statement's name: the function it calls, or its first words."""
    called = re.search(r"\b(phasegate_\w+)\s*\(", query)
    if called:
        return called.group(1)
    return " ".join(query.split())[:90]


async def _measured(databases: Databases, run: Any, name: str) -> tuple[list[dict[str, Any]],
                                                                       dict[str, Any]]:
    await run(await databases.fresh())  # warm-up: connections, plans, first-use caches
    dsn = await databases.fresh()
    admin = await asyncpg.connect(databases.server_dsn)
    try:
        await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await admin.execute("SELECT pg_stat_statements_reset()")
        figures = await run(dsn)
        rows = await admin.fetch(READ, dsn.rsplit("/", 1)[1])
    finally:
        await admin.close()
    return [dict(row) for row in rows], figures


FIGURES = ("calls", "plans", "exec_us", "wal_bytes")


def _table(rows: list[dict[str, Any]], transitions: int, top: int) -> list[dict[str, Any]]:
    merged: dict[str, dict[str, float]] = {}
    for row in rows:
        entry = merged.setdefault(_label(row["query"]),
                                  {"calls": 0.0, "plans": 0.0, "exec_us": 0.0,
                                   "wal_bytes": 0.0})
        entry["calls"] += row["calls"]
        entry["plans"] += row["plans"]
        entry["exec_us"] += row["total_exec_time"] * 1000
        entry["wal_bytes"] += row["wal_bytes"]
    ranked = sorted(merged.items(), key=lambda item: -item[1]["exec_us"])
    # The figures apart from the labels, so the sums below add floats.
    table = [{k: v / transitions for k, v in entry.items()} for _, entry in ranked]
    shown: list[dict[str, Any]] = [{"statement": label, **figures} for (label, _), figures
                                   in zip(ranked[:top], table[:top], strict=True)]
    rest = table[top:]
    if rest:
        shown.append({"statement": f"({len(rest)} more)",
                      **{k: sum(r[k] for r in rest) for k in FIGURES}})
    shown.append({"statement": "all statements",
                  **{k: sum(r[k] for r in table) for k in FIGURES}})
    return shown


def markdown(title: str, table: list[dict[str, Any]]) -> str:
    # plans: how often the statement was planned; far fewer than calls for a function's
    # statements means their cached generic plan is used.
    lines = [f"| {title}, per transition | calls | plans | execution (µs) | WAL (bytes) |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['statement']} | {r['calls']:.2f} | {r['plans']:.2f} | {r['exec_us']:.0f} | "
              f"{r['wal_bytes']:.0f} |" for r in table]
    return "\n".join(lines)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from bench.transition_runs import Env, Workload, run_floor, run_phasegate
    from bench.transitions import _quiet_logs

    _quiet_logs()
    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    cluster = StatementsCluster(nested=args.nested).start()
    databases = await Databases(cluster.dsn, history=args.history).start()
    try:
        # No rehearsal (bench/transition_runs.py): the statistics are reset after the warm-up
        # run, so a rehearsal inside the measured run would be counted with it.
        env = Env(databases, continuation=args.continuation == "on", rehearsal=False)
        env.localstack_endpoint = args.localstack_endpoint
        backend = "localstack" if args.localstack_endpoint else "memory"
        workload = Workload(backend, args.groups, args.phases)
        report: dict[str, Any] = {"when": datetime.now(UTC).isoformat(), "machine": machine(),
                                  "backend": backend,
                                  "groups": args.groups, "phases": args.phases,
                                  "continuation": args.continuation,
                                  "history_runs": args.history, "nested": args.nested}
        for name, run in (("floor", lambda dsn: run_floor(dsn, workload, env)),
                          ("phasegate", lambda dsn: run_phasegate(dsn, workload, env))):
            rows, figures = await _measured(databases, run, name)
            report[name] = {"transitions_per_s": figures.get("transitions_per_s"),
                            "statements": _table(rows, workload.transitions, args.top)}
    finally:
        await databases.stop()
        cluster.stop()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--phases", type=int, default=1500)
    parser.add_argument("--continuation", choices=("on", "off"), default="off")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--nested", action="store_true",
                        help="also list the statements functions run (pg_stat_statements.track"
                        "=all); a function's figure still includes them")
    parser.add_argument("--localstack-endpoint", default=None, metavar="URL",
                        help="run both over a running LocalStack (localstack/run-without-docker"
                        ".sh) instead of the in-process FIFO")
    parser.add_argument("--history", type=int, default=HISTORY_RUNS, metavar="RUNS",
                        help="finished runs the databases start with, analyzed (0: empty)")
    args = parser.parse_args()
    report = asyncio.run(bench(args))
    path = write_results("server-statements", report,
                         f"{report['backend']}-{args.groups}g-{args.continuation}-h{args.history}"
                         + ("-nested" if args.nested else ""))
    for name in ("floor", "phasegate"):
        print(markdown(f"{name} ({args.groups} groups, continuation {args.continuation})",
                       report[name]["statements"]))
        print()
    print(f"results: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
