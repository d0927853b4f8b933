"""Where the server's CPU goes for one commit statement: ``perf record -g`` on the PostgreSQL
backend that serves it, against the floor's INSERT.

    python -m bench.backend_profile [--calls-per-run 240] [--statements floor,continue]

On a private cluster (bench/common.py) set up as ``bench.statement_costs`` sets up its
commits section (16 running runs, the floor's table), each statement of ``--statements``
(``bench.measured_statements.COMMIT_CALLS``, by short name: ``floor``, ``continue``, ``advance``,
``commit``, ``load``, ``checkpoint``) is sent as a worker sends it (phasegate's connection: no
named statements, each query's description kept), each call its own transaction with
``synchronous_commit`` on, while ``perf`` samples that connection's backend. The floor's
INSERT goes on a plain asyncpg connection, named and prepared, as ``bench/floor.py`` sends it.

Printed per statement: perf's on-CPU samples per 1,000 calls, split into the kernel, the
postgres binary and PL/pgSQL, and the samples under each of a fixed list of server functions
(inclusive: the function and what it calls), per 1,000 calls. Compare rows between statements
of one run only (the sampling rate and the machine's speed set the scale). Needs ``perf``
(Debian's ``linux-perf``) and the right to profile the backend (root, or
``kernel.perf_event_paranoid`` at 1 or lower).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import ROOT, PrivateCluster, machine, write_results
from bench.measured_statements import (
    CHECKPOINT_ALONE,
    COMMIT_CALLS,
    COMMIT_HOP,
    CONTINUE_HOP,
    LOAD,
    RUNS,
)
from bench.statement_databases import _from_seq_0, _with_setup
from phasegate.db import connect

STATEMENTS = {
    "floor": "floor INSERT (one row, primary key)",
    "continue": CONTINUE_HOP,
    "advance": "phasegate_advance_phase, a plain advance (migration 0027)",
    "commit": COMMIT_HOP,
    "load": LOAD,
    "checkpoint": CHECKPOINT_ALONE,
}
# Inclusive figures worth reading side by side: the commit's WAL flush, the reply's send, the
# unnamed statement's parse, analysis and plan, the function and the statements it runs, the
# executor's start (each table's indexes opened), the row triggers' WHEN clauses.
FUNCTIONS = ("XLogFlush", "__send", "pg_parse_query", "parse_analyze_varparams",
             "pg_plan_queries", "GetCachedPlan", "fmgr_security_definer",
             "plpgsql_exec_function", "SPI_execute_plan_with_paramlist",
             "standard_ExecutorStart", "ExecInsertIndexTuples", "stringToNode",
             "AtEOXact_GUC")
SAMPLE_HZ = 4000


def _perf() -> str:
    path = shutil.which("perf")
    if path is None:
        raise SystemExit("bench.backend_profile needs perf (Debian: apt-get install linux-perf)")
    return path


async def _profile(dsn: str, label: str, calls_per_run: int, out: Path) -> int:
    """``label``'s statement, RUNS x ``calls_per_run`` calls from seq 0 (after a few
    unsampled ones) under ``perf record`` on its backend; returns the calls sampled."""
    sql, make_args = COMMIT_CALLS[label]
    await _from_seq_0(dsn)
    named = label == STATEMENTS["floor"]
    connection = await (asyncpg.connect(dsn) if named else connect(dsn))
    try:
        for s in range(3):  # described (or prepared), plans cached: outside the samples
            for w in range(RUNS):
                await connection.fetchrow(sql, *make_args(w, s))
        perf = await asyncio.create_subprocess_exec(
            _perf(), "record", "-g", "-F", str(SAMPLE_HZ), "-p",
            str(connection.get_server_pid()), "-o", str(out),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # perf has no readiness signal; its first samples land within a few ms of the start.
        await asyncio.sleep(0.5)
        calls = 0
        for s in range(3, 3 + calls_per_run):
            for w in range(RUNS):
                await connection.fetchrow(sql, *make_args(w, s))
                calls += 1
        perf.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(perf.communicate(), timeout=60)
        if perf.returncode not in (0, -signal.SIGINT):
            raise SystemExit(f"perf record failed: {err.decode(errors='replace')[-400:]}")
    finally:
        await connection.close()
    return calls


def _read(data: Path) -> tuple[Counter[str], Counter[str]]:
    """(samples by object: kernel, postgres, plpgsql, other; inclusive samples of each of
    ``FUNCTIONS``) from ``perf script``."""
    script = subprocess.run([_perf(), "script", "-i", str(data), "-F", "ip,sym,dso"],
                            capture_output=True, text=True, check=True).stdout
    by_object: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for sample in script.split("\n\n"):
        frames = [line.split() for line in sample.strip().splitlines() if line.strip()]
        if not frames:
            continue
        leaf = frames[0][-1]
        by_object["kernel" if "kernel" in leaf else "postgres" if leaf.endswith("postgres)")
                  else "plpgsql" if "plpgsql" in leaf else "other"] += 1
        names = {frame[1] for frame in frames if len(frame) > 2}
        for name in FUNCTIONS:
            if name in names:
                inclusive[name] += 1
    return by_object, inclusive


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    cluster = PrivateCluster().start()
    found: dict[str, Any] = {}
    try:
        dsn = await _with_setup(cluster.dsn)
        with tempfile.TemporaryDirectory() as scratch:
            for short in args.statements.split(","):
                label = STATEMENTS[short]
                data = Path(scratch) / f"{short}.data"
                calls = await _profile(dsn, label, args.calls_per_run, data)
                by_object, inclusive = _read(data)
                per = 1000 / calls
                found[short] = {"statement": label, "calls": calls,
                                "samples_per_1000_calls": sum(by_object.values()) * per,
                                "by_object": {k: v * per for k, v in by_object.items()},
                                "inclusive": {k: inclusive[k] * per for k in FUNCTIONS}}
    finally:
        cluster.stop()
    return {"when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
            "sample_hz": SAMPLE_HZ,
            "command": "python -m bench.backend_profile " + " ".join(sys.argv[1:]),
            "statements": found}


def markdown(report: dict[str, Any]) -> str:
    found = report["statements"]
    names = list(found)
    lines = [f"perf samples per 1,000 calls at {report['sample_hz']} Hz (inclusive below the "
             "line)", "", "| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines.append("| all | " + " | ".join(f"{found[n]['samples_per_1000_calls']:.0f}"
                                          for n in names) + " |")
    for part in ("kernel", "postgres", "plpgsql", "other"):
        lines.append(f"| {part} | " + " | ".join(
            f"{found[n]['by_object'].get(part, 0):.0f}" for n in names) + " |")
    for function in FUNCTIONS:
        lines.append(f"| `{function}` | " + " | ".join(
            f"{found[n]['inclusive'][function]:.0f}" for n in names) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls-per-run", type=int, default=240,
                        help="phases per run sampled (16 runs: 16 x this many calls)")
    parser.add_argument("--statements", default="floor,continue",
                        help=f"comma-separated, of {', '.join(STATEMENTS)}")
    args = parser.parse_args()
    unknown = set(args.statements.split(",")) - set(STATEMENTS)
    if unknown:
        parser.error(f"unknown statements {sorted(unknown)}; known: {', '.join(STATEMENTS)}")
    _perf()
    report = asyncio.run(bench(args))
    path = write_results("backend-profile", report)
    print(markdown(report))
    print(f"\nresults: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
