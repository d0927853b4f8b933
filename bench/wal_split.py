"""What a transition writes to the WAL, by relation and record: ``pg_waldump`` over one run.

    python -m bench.wal_split [--groups 1] [--phases 600] [--continuation off|on|both]
                              [--leased-send on|off|both] [--top 20]

One in-process phasegate run (the FIFO in memory, as ``bench.transitions``' memory rows) per
setting, on a private cluster (bench/common.py) whose WAL moves only with the run: a
``CHECKPOINT`` first (so full-page images count as they do after any checkpoint), the WAL
position before and after the run, then ``pg_waldump`` over that range. Each record's total
length (header, data and full-page images) is added to its (resource manager, relation,
record type), divided by the run's transitions. The worker's start and clean stop are in the
range; over a few hundred transitions they weigh a few bytes each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import asyncpg

from bench.common import HISTORY_RUNS, Databases
from phasegate.orchestrator.embedded import find_pg_bin, local_aws_env

_LENGTH = re.compile(r"len \(rec/tot\):\s*\d+/\s*(\d+)")
_RMGR = re.compile(r"rmgr: (\w+)")
_RELATION = re.compile(r"rel \d+/\d+/(\d+)")
_DESC = re.compile(r"desc: (\w+)")

Key = tuple[str, str, str]


def pg_waldump() -> Path:
    """Beside the server binaries (initdb may be a symlink into them)."""
    return Path(os.path.realpath(find_pg_bin() / "initdb")).parent / "pg_waldump"


def split(dump: str, relations: dict[str, str]) -> Counter[Key]:
    """Bytes by (resource manager, relation name or filenode, record type) from
    ``pg_waldump``'s text; ``-`` for a record that names no relation (a commit)."""
    out: Counter[Key] = Counter()
    for line in dump.splitlines():
        length = _LENGTH.search(line)
        rmgr = _RMGR.search(line)
        if not length or not rmgr:
            continue
        relation = _RELATION.search(line)
        name = relations.get(relation.group(1), relation.group(1)) if relation else "-"
        desc = _DESC.search(line)
        out[(rmgr.group(1), name, desc.group(1) if desc else "")] += int(length.group(1))
    return out


async def measure(databases: Databases, groups: int, phases: int, continuation: bool,
                  leased_send: bool) -> tuple[Counter[Key], int]:
    from bench.transition_runs import Env, Workload, run_phasegate

    env = Env(databases, rehearsal=False, continuation=continuation)
    workload = Workload("memory", groups, phases)
    dsn = await databases.fresh()
    connection = await asyncpg.connect(dsn)
    try:
        relations = {str(row["f"]): row["n"] for row in await connection.fetch(
            "SELECT pg_relation_filenode(oid) AS f, relname AS n FROM pg_class "
            "WHERE pg_relation_filenode(oid) IS NOT NULL")}
        await connection.execute("CHECKPOINT")
        start = await connection.fetchval("SELECT pg_current_wal_insert_lsn()::text")
    finally:
        await connection.close()
    os.environ["PHASEGATE_LEASED_SEND"] = "true" if leased_send else "false"
    try:
        await run_phasegate(dsn, workload, env)
    finally:
        del os.environ["PHASEGATE_LEASED_SEND"]
    connection = await asyncpg.connect(dsn)
    try:
        end = await connection.fetchval("SELECT pg_current_wal_insert_lsn()::text")
    finally:
        await connection.close()
    assert databases.data_dir is not None
    dump = await asyncio.to_thread(_dump, databases.data_dir / "pg_wal", start, end)
    return split(dump, relations), workload.transitions


def _dump(wal: Path, start: str, end: str) -> str:
    return subprocess.run([str(pg_waldump()), "-p", str(wal), "-s", start, "-e", end],
                          capture_output=True, text=True, check=True).stdout


def table(title: str, bytes_by: Counter[Key], transitions: int, top: int) -> str:
    total = sum(bytes_by.values())
    lines = [f"{title}: {total / transitions:,.0f} bytes per transition", "",
             "| resource manager | relation | record | bytes per transition | share |",
             "|---|---|---|---:|---:|"]
    for (rmgr, relation, desc), size in bytes_by.most_common(top):
        lines.append(f"| {rmgr} | {relation} | {desc} | {size / transitions:,.1f} | "
                     f"{size / total:.1%} |")
    by_relation: Counter[str] = Counter()
    for (_, relation, _), size in bytes_by.items():
        by_relation[_table_of(relation)] += size
    lines += ["", "| table (with its indexes) | bytes per transition | share |", "|---|---:|---:|"]
    lines += [f"| {name} | {size / transitions:,.1f} | {size / total:.1%} |"
              for name, size in by_relation.most_common(8)]
    return "\n".join(lines)


def _table_of(relation: str) -> str:
    """An index's table by phasegate's naming (``<table>_..._idx``, ``_pkey``, ``_key``)."""
    for table_name in ("workflow_runs", "run_positions", "checkpoints", "outbox"):
        if relation.startswith(table_name):
            return table_name
    return relation


def _settings(value: str) -> list[bool]:
    return {"on": [True], "off": [False], "both": [False, True]}[value]


async def bench(args: argparse.Namespace) -> str:
    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    databases = await Databases(private=True, history=HISTORY_RUNS).start()
    reports = []
    try:
        for continuation in _settings(args.continuation):
            for leased_send in _settings(args.leased_send):
                bytes_by, transitions = await measure(databases, args.groups, args.phases,
                                                      continuation, leased_send)
                title = (f"{args.groups} group(s) x {args.phases} phases, continuation "
                         f"{'on' if continuation else 'off'}, leased send "
                         f"{'on' if leased_send else 'off'}")
                reports.append(table(title, bytes_by, transitions, args.top))
    finally:
        await databases.stop()
    return "\n\n".join(reports)


def main() -> None:
    from bench.transitions import _quiet_logs

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--phases", type=int, default=600)
    parser.add_argument("--continuation", choices=["on", "off", "both"], default="off")
    parser.add_argument("--leased-send", choices=["on", "off", "both"], default="both")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    _quiet_logs()
    print(asyncio.run(bench(args)))


if __name__ == "__main__":
    main()
