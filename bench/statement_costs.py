"""What one statement costs, apart from phasegate: the driver's side and the server's side.

    python -m bench.statement_costs [--calls 3000] [--rounds 2] [--check-rounds 5]
        [--only batches|commits|cache|schemas|loads|rows|chains|positions]

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
- **cache** (``--only cache``, not part of the full run): the commits section's statements
  on a connection in each pooler mode, the default (``transaction``: unnamed, parsed and
  planned on every call) and the statement cache (``none``: named, prepared once per
  connection), interleaved in each round; the medians, then the cache over the default as the
  median of per-round ratios: what the pooler-safe default costs on a direct connection.
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
from datetime import UTC, datetime
from typing import Any

from bench.common import ROOT, PrivateCluster, machine, write_results
from bench.measured_statements import SERVER_STATEMENTS
from bench.statement_costs_report import markdown
from bench.statement_databases import _with_setup, fresh_database
from bench.statement_schema_comparisons import chains, loads, positions, rows, rules, schemas
from bench.statement_sections import (
    batches,
    cache,
    checks,
    commits,
    driver,
    server,
    through_pool,
)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    cluster = PrivateCluster().start()
    rounds: list[dict[str, Any]] = []
    try:
        if args.only is not None:
            section = {"batches": batches, "commits": commits, "cache": cache}.get(args.only)
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


def _medians(name: str, found: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    return {f"{name}_rounds": found,
            name: {label: {k: statistics.median(r[k] for r in v) for k in v[0]}
                   for label, v in found.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--phases", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--check-rounds", type=int, default=5)
    parser.add_argument("--only", choices=["batches", "commits", "cache", "schemas", "loads",
                                           "rows", "chains", "positions"],
                        default=None,
                        help="run one section alone")
    args = parser.parse_args()
    report = asyncio.run(bench(args))
    path = write_results("statement-costs", report)
    print(markdown(report))
    print(f"\nresults: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
