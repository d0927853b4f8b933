"""``bench/commit_parts.sql`` (docs/benchmarks-rounds.md, "Inside a continued hop's commit")
runs on a migrated database as its header says, times every part (the two hops raise, failing the
script, on a call that writes nothing: each round starts every run and its position at seq 0),
and leaves the position trigger it turns off for one part on again."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import asyncpg

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "commit_parts.sql"
PARTS = ("continue_phase, the whole statement", "a position-only hop (not built)", "the run row",
         "the run row, two columns, no trigger", "the position and its chain lease",
         "the checkpoint", "the floor INSERT", "an empty transaction")


async def test_every_part_is_timed_and_the_trigger_is_on_again(database_url: str) -> None:
    psql = shutil.which("psql")
    assert psql is not None, "psql (postgresql-client) is installed with the server"
    process = await asyncio.create_subprocess_exec(
        psql, database_url, "-At", "-f", str(SCRIPT),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout=600)
    assert process.returncode == 0, err.decode()
    timed = {}
    for line in out.decode().splitlines():
        if line.startswith("round "):
            label, _, value = line.rpartition(": ")
            timed[label] = float(value)
    assert set(timed) == {f"round {r}, {part}" for r in (1, 2) for part in PARTS}
    assert all(value > 0 for value in timed.values()), timed
    connection = await asyncpg.connect(database_url)
    try:
        assert await connection.fetchval(
            "SELECT tgenabled::text FROM pg_trigger"
            " WHERE tgname = 'workflow_runs_position_update'"
        ) == "O"
    finally:
        await connection.close()
