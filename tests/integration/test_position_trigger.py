"""The position trigger by its column list (migration 0031) against real PostgreSQL: it fires
for an update that names a run's status or updated_at, which every writer that does not write
the position itself names; the commits that own the position name neither and set no flag;
what the position shows after each kind of write."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg

import phasegate.sql
from tests.helpers import fetch
from tests.integration.test_row_rules import hop_then_advance

SQL_DIR = Path(phasegate.sql.__file__).parent
# The commits that write the position themselves (or leave it to a live chain's heartbeat,
# 0030) and name neither status nor updated_at: the trigger passes them by its column list.
POSITION_OWNERS = {"phasegate_continue_phase", "phasegate_continue_phases",
                   "phasegate_advance_phase"}
# Named by the trigger (0031): an update naming one of them is seen by the position.
TRACKED = {"workflow", "status", "updated_at"}
UPDATE_RUNS = re.compile(r"UPDATE\s+workflow_runs(?:\s+\w+)?\s+SET\s+(.*?)\s+(?:WHERE|FROM)\b",
                         re.IGNORECASE | re.DOTALL)
ASSIGNED = re.compile(r"(?:^|,)\s*(?:\w+\.)?(\w+)\s*=(?!=)")

INSERT_RUN = ("INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, current_phase, "
              "schema_version, input) VALUES ($1, 'wf', 'running', 0, 'p0', 1, '{}')")
POSITION = "SELECT status, next_seq, current_phase FROM run_positions WHERE workflow_id = $1"


async def _position(database_url: str, workflow_id: str) -> dict[str, object] | None:
    rows = await fetch(database_url, POSITION, workflow_id)
    return dict(rows[0]) if rows else None


def _assigned(set_clause: str) -> set[str]:
    """The columns a SET list assigns (top level of each item: `col = ...`)."""
    return {name.lower() for name in ASSIGNED.findall(set_clause)}


def _untracked(source: str) -> list[str]:
    return [" ".join(found.group(0).split())[:120] for found in UPDATE_RUNS.finditer(source)
            if not _assigned(found.group(1)) & TRACKED]


def test_every_query_file_update_of_a_run_names_status_or_updated_at():
    """The queries the worker and the control plane send (phasegate/sql/*.sql) own no
    position: each UPDATE of workflow_runs names a column the trigger fires on."""
    files = sorted(SQL_DIR.glob("*.sql"))
    assert files, f"no query files under {SQL_DIR}"
    untracked = {path.name: found for path in files if (found := _untracked(path.read_text()))}
    assert untracked == {}


async def test_every_function_that_updates_a_run_names_status_or_updated_at(database_url):
    """The functions the migrations leave: each UPDATE of workflow_runs names status or
    updated_at, except in the commits that own the position, each of which writes
    run_positions itself."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT p.proname, p.prosrc FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'public' AND p.prosrc ~* 'update\\s+workflow_runs'")
    finally:
        await connection.close()
    sources = {row["proname"]: row["prosrc"] for row in rows}
    assert set(sources) >= POSITION_OWNERS
    untracked = {name: found for name, source in sources.items()
                 if name not in POSITION_OWNERS and (found := _untracked(source))}
    assert untracked == {}
    for name in POSITION_OWNERS:
        assert _untracked(sources[name]), f"{name} names a tracked column: not an owner"
        assert re.search(r"UPDATE\s+run_positions", sources[name], re.IGNORECASE), name
        assert "own_position" not in sources[name], f"{name} still sets the flag"


async def test_the_owning_commits_pass_the_trigger_and_set_no_flag(database_url):
    """A continued hop and a plain advance neither call the trigger's function nor set
    phasegate.own_position; their positions read as they wrote them."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(INSERT_RUN, "pt-hot")
        async with connection.transaction():
            await connection.execute("SET LOCAL track_functions = 'pl'")
            await hop_then_advance(connection, "pt-hot")
            assert await connection.fetchval(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions "
                "WHERE funcname = 'phasegate_track_position'") == 0
            assert await connection.fetchval(
                "SELECT current_setting('phasegate.own_position', true)") is None
    finally:
        await connection.close()
    assert await _position(database_url, "pt-hot") == {
        "status": "running", "next_seq": 2, "current_phase": "p2"}


async def test_a_writer_naming_status_or_updated_at_moves_the_position(database_url):
    """What the rule means for a writer: naming status or updated_at is what makes the
    position follow. A cancel (status) ends it; a rewind that sets updated_at moves it; the
    group commit's general form (status, under the flag) writes it itself."""
    connection = await asyncpg.connect(database_url)
    try:
        for workflow_id in ("pt-cancel", "pt-rewind"):
            await connection.execute(INSERT_RUN, workflow_id)
        await connection.execute("UPDATE workflow_runs SET status = 'cancelled', "
                                 "finished_at = now() WHERE workflow_id = 'pt-cancel'")
        await connection.execute("UPDATE workflow_runs SET next_seq = 7, current_phase = 'p7', "
                                 "updated_at = now() WHERE workflow_id = 'pt-rewind'")
    finally:
        await connection.close()
    assert await _position(database_url, "pt-cancel") is None
    assert await _position(database_url, "pt-rewind") == {
        "status": "running", "next_seq": 7, "current_phase": "p7"}


async def test_a_write_naming_neither_leaves_the_position_to_the_next_tracked_one(database_url):
    """The other side of the rule, as docs/reference/tables.md states it: hand-written SQL that
    moves a run without naming status or updated_at leaves its position as it was (the
    position is what the stall readers show; every gate reads the run row). The next write
    that names one of them brings the position up to the run row."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(INSERT_RUN, "pt-hand")
        await connection.execute("UPDATE workflow_runs SET next_seq = 4, current_phase = 'p4' "
                                 "WHERE workflow_id = 'pt-hand'")
        assert await _position(database_url, "pt-hand") == {
            "status": "running", "next_seq": 0, "current_phase": "p0"}
        await connection.execute("UPDATE workflow_runs SET updated_at = now() "
                                 "WHERE workflow_id = 'pt-hand'")
    finally:
        await connection.close()
    assert await _position(database_url, "pt-hand") == {
        "status": "running", "next_seq": 4, "current_phase": "p4"}
