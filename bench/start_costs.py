"""What a start message costs before its first phase runs: the run created (if a producer only
enqueued it) and loaded, as two statements (``ensure_run`` then ``load_for_phase``, the
release before migration 0032) and as one (``start_and_load``, since 0032); for a workflow
with a concurrency key, created, its slot taken and loaded, as two (``start_keyed`` then
``load_for_phase``, migration 0033) and as one (``start_keyed_and_load``, since 0034).

    python -m bench.start_costs [--starts 200] [--rounds 7]

On a private cluster (bench/common.py), one fresh database at the newest schema, on
phasegate's own connection (no named statements, each query's description kept: as a worker
sends them, each its own transaction with ``synchronous_commit`` on), in interleaved rounds,
for both ways a run starts:

- **producer**: a bare start message; no run row yet, so the insert creates it and the load
  claims it;
- **API**: the run row written beforehand (outside the timing: pending, as ``start_run``
  leaves it; for a keyed start since 0034, with its slot taken, as ``start_keyed_run``
  leaves it), so the insert does nothing and the load claims it. A keyed start of such a
  run read its input first until 0034 (the key is computed from it); since, it sends no key
  and the run's own is used.

Per start: wall, client CPU, the server process's CPU (``/proc/<pid>/schedstat``), WAL bytes
and round trips (statements sent). Results: bench/results/start-costs-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

from bench.common import ROOT, PrivateCluster, machine, write_results
from bench.statement_databases import fresh_database
from bench.statement_timing import WAL_POSITION, WAL_SINCE, _process_cpu_s
from phasegate.db import connect
from phasegate.sql import queries

INPUT = '{"a": 1, "b": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'
TWO = "ensure_run, then load_for_phase (two round trips)"
ONE = "start_and_load (one round trip, migration 0032)"
KEYED_TWO = "keyed: start_keyed, then load_for_phase (the API's run: its input read first)"
KEYED_ONE = "keyed: start_keyed_and_load (migration 0034; the API's run: keyed by the API)"
PAIRS = ((ONE, TWO), (KEYED_ONE, KEYED_TWO))
PRE_CREATE_IDS = ("INSERT INTO workflow_runs (workflow_id, workflow, schema_version, input, "
                  "current_phase) SELECT w, 'wf', 1, $2::jsonb, 'p0' FROM unnest($1::text[]) w")

def _statements(how: str, workflow_id: str, q: dict[str, str],
                way: str = "producer") -> list[tuple[str, tuple[Any, ...]]]:
    """What a worker sends for one start, ``how``: (query, arguments) in order; ``q`` the
    named queries (queries.sql's and flow.sql's), read once by the caller, outside the
    timing. A keyed start of a run the API created: before 0034 its input was read first (the
    key is computed from it); since 0034 the API keyed the run and the worker sends no key."""
    run = (workflow_id, "wf", 1, INPUT, "p0", "internal", None)
    # Its own key per run and no limit: every start is admitted, as most are.
    slot = (f"k-{workflow_id}", None, f"d-{workflow_id}", workflow_id, "{}", None, None)
    load = (q["load_for_phase"], (workflow_id, "main", 0))
    if way == "API" and how == KEYED_TWO:
        return [(q["run_input"], (workflow_id,)), (q["start_keyed"], (*run, *slot)), load]
    if way == "API" and how == KEYED_ONE:
        return [(q["start_keyed_and_load"], (*run, None, *slot[1:], 0))]
    starts: dict[str, list[tuple[str, tuple[Any, ...]]]] = {
        TWO: [(q["ensure_run"], run), load],
        ONE: [(q["start_and_load"], (*run, 0))],
        KEYED_TWO: [(q["start_keyed"], (*run, *slot)), load],
        KEYED_ONE: [(q["start_keyed_and_load"], (*run, *slot, 0))],
    }
    return starts[how]


async def _api_created(connection: Any, how: str, q: dict[str, str], ids: list[str]) -> None:
    """The runs as the API leaves them: since 0034 a keyed run with its slot taken
    (``start_keyed_run``), else the row alone (``start_run``'s, without its message)."""
    if how != KEYED_ONE:
        await connection.execute(PRE_CREATE_IDS, ids, INPUT)
        return
    for workflow_id in ids:
        await connection.fetchrow(q["start_keyed_run"], workflow_id, "wf", 1, INPUT, "p0",
                                  f"s-{workflow_id}", workflow_id, "{}", "internal", None,
                                  f"k-{workflow_id}", None, f"d-{workflow_id}", workflow_id,
                                  "{}", None, None)


async def _starts(dsn: str, way: str, how: str, starts: int, prefix: str) -> dict[str, float]:
    """``starts`` starts of new runs ``prefix0..``, sent ``how``; per start: wall, client
    CPU, server CPU (µs), WAL bytes, round trips."""
    q = {**queries(), **queries("flow.sql")}
    connection = await connect(dsn)
    try:
        if way == "API":
            await _api_created(connection, how, q,
                               [f"warm-{prefix}", *(f"{prefix}{i}" for i in range(starts))])
        # Described outside the timing, as a worker's connection has them after its first
        # start (a run id no start below uses).
        for query, args in _statements(how, f"warm-{prefix}", q, way):
            await connection.fetchrow(query, *args)
        pid = connection.get_server_pid()
        wal = await connection.fetchval(WAL_POSITION)
        server, cpu, wall = _process_cpu_s(pid), time.process_time(), time.perf_counter()
        for i in range(starts):
            for query, args in _statements(how, f"{prefix}{i}", q, way):
                row = await connection.fetchrow(query, *args)
            assert row is not None and row["status"] == "running", (how, way, row)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        server = _process_cpu_s(pid) - server
        wal = await connection.fetchval(WAL_SINCE, wal)
    finally:
        await connection.close()
    return {"wall_us": wall / starts * 1e6, "client_cpu_us": cpu / starts * 1e6,
            "server_cpu_us": server / starts * 1e6, "wal_bytes": wal / starts,
            "round_trips": float(len(_statements(how, "x", q, way)))}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    cluster = PrivateCluster().start()
    found: dict[str, list[dict[str, float]]] = {}
    try:
        dsn = await fresh_database(cluster.dsn)
        for r in range(args.rounds):
            for way in ("producer", "API"):
                for k, (one, two) in enumerate(PAIRS):
                    # Alternate which goes first, so a drift within a round hits both.
                    for how in ((two, one) if r % 2 == 0 else (one, two)):
                        prefix = f"r{r}-{way[0]}-{k}-{'1' if how == one else '2'}-"
                        found.setdefault(f"{way}: {how}", []).append(
                            await _starts(dsn, way, how, args.starts, prefix))
    finally:
        cluster.stop()
    return {"when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
            "command": "python -m bench.start_costs " + " ".join(sys.argv[1:]),
            "rounds": found,
            "medians": {label: {k: statistics.median(r[k] for r in v) for k in v[0]}
                        for label, v in found.items()},
            "paired": _paired(found)}


def _paired(found: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """One statement over two, per round, median over rounds, for each way a run starts."""
    paired = {}
    for way in ("producer", "API"):
        for one_how, two_how in PAIRS:
            one, two = found[f"{way}: {one_how}"], found[f"{way}: {two_how}"]
            paired[f"{way}: {one_how.split(' (')[0]}"] = {
                key: statistics.median(o[key] / t[key] for o, t in zip(one, two, strict=True))
                for key in ("wall_us", "client_cpu_us", "server_cpu_us", "wal_bytes")}
    return paired


def markdown(report: dict[str, Any]) -> str:
    lines = ["| a start, as a worker sends it (median of rounds) | wall (µs) | client CPU (µs) "
             "| server CPU (µs) | WAL (bytes) | round trips |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {label} | {v['wall_us']:.0f} | {v['client_cpu_us']:.0f} | "
              f"{v['server_cpu_us']:.0f} | {v['wal_bytes']:.0f} | {v['round_trips']:.0f} |"
              for label, v in report["medians"].items()]
    lines += ["", "| one statement ÷ two, median of per-round ratios | wall | client CPU | "
              "server CPU | WAL |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {way} | {v['wall_us']:.3f} | {v['client_cpu_us']:.3f} | "
              f"{v['server_cpu_us']:.3f} | {v['wal_bytes']:.3f} |"
              for way, v in report["paired"].items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    report = asyncio.run(bench(args))
    path = write_results("start-costs", report)
    print(markdown(report))
    print(f"\nresults: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
