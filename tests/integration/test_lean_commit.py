"""The phase commit updates the run row in place (HOT): no index on workflow_runs names a column
the commit changes, no row trigger fires on it, and Postgres' own counters say the updates
were HOT (migration 0009)."""

from __future__ import annotations

import asyncpg

from phasegate.envelope import phase_message, start_message, state_hash
from phasegate.store import PhaseCommit, Store, create_pool

# What commit_phase SETs on every commit (phasegate/sql/queries.sql).
COMMIT_CHANGES = ("next_seq", "current_phase", "attempts", "error", "tier", "tier_label",
                  "review", "updated_at")
PHASES = 12


async def test_no_index_or_row_trigger_of_workflow_runs_touches_what_the_commit_changes(
        database_url: str) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        # Key, INCLUDE, expression and predicate columns all block a HOT update.
        columns = {r["attname"] for r in await connection.fetch(
            """SELECT DISTINCT a.attname
                 FROM pg_index i
                 JOIN pg_attribute a ON a.attrelid = i.indrelid
                WHERE i.indrelid = 'workflow_runs'::regclass
                  AND (a.attnum = ANY(i.indkey)
                       OR pg_get_expr(i.indpred, i.indrelid) ~ ('\\m' || a.attname || '\\M')
                       OR pg_get_expr(i.indexprs, i.indrelid) ~ ('\\m' || a.attname || '\\M'))
                  AND a.attnum > 0""")}
        assert columns, "workflow_runs has indexes"
        assert not columns & set(COMMIT_CHANGES), columns & set(COMMIT_CHANGES)
        row_triggers = await connection.fetch(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'workflow_runs'::regclass "
            "AND NOT tgisinternal AND (tgtype & 1) = 1")  # TRIGGER_TYPE_ROW
        assert row_triggers == []
    finally:
        await connection.close()


async def test_phase_commits_are_hot_updates(database_url: str) -> None:
    # One connection: its own statistics are flushed on demand before they are read.
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        store = Store(pool)
        workflow_id = "lean-1"
        start = start_message(workflow_id, "lean", {"doc": "x" * 900})
        await store.start_run(workflow_id=workflow_id, workflow="lean", schema_version=1,
                              input={"doc": "x" * 900}, first_phase="p0", message=start)
        assert await store.load_for_phase(workflow_id) is not None  # pending -> running
        before = await _updates(pool)
        for seq in range(PHASES):
            state = f'{{"seq": {seq}}}'
            successor = phase_message(workflow_id, "lean", seq + 1, f"p{seq + 1}")
            result = await store.commit_phase(PhaseCommit(
                workflow_id=workflow_id, branch="main", seq=seq, phase=f"p{seq}",
                schema_version=1, state_json=state, state_hash=state_hash(state),
                next_phase=f"p{seq + 1}", status="running", worker_id="t", successor=successor,
                tier=seq % 3, tier_label=f"t{seq % 3}"))
            assert result is not None
        updates, hot = (a - b for a, b in zip(await _updates(pool), before, strict=True))
        assert updates == PHASES
        # Every commit that found room on its page stayed there (fillfactor leaves room; a
        # page is pruned as it fills), so nearly all are HOT; before 0009 none were.
        assert hot >= PHASES - 1, (updates, hot)
    finally:
        await pool.close()


async def test_a_statement_setting_residency_is_refused_whatever_it_touches(
        database_url: str) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("INSERT INTO workflow_runs (workflow_id, workflow, "
                                 "schema_version, region) VALUES ('r', 'w', 1, 'eu')")
        for sql in ("UPDATE workflow_runs SET region = region",
                    "UPDATE workflow_runs SET classification = 'public' WHERE false"):
            try:
                await connection.execute(sql)
            except asyncpg.IntegrityConstraintViolationError as exc:
                assert "fixed at start" in str(exc)
            else:
                raise AssertionError(f"not refused: {sql}")
        # A commit-style update of the same row is not refused.
        await connection.execute("UPDATE workflow_runs SET next_seq = 1, updated_at = now()")
    finally:
        await connection.close()


async def _updates(pool: asyncpg.Pool) -> tuple[int, int]:
    async with pool.acquire() as connection:
        await connection.execute("SELECT pg_stat_force_next_flush()")
        await connection.execute("SELECT pg_stat_clear_snapshot()")
        row = await connection.fetchrow(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relname = 'workflow_runs'")
    assert row is not None
    return int(row["n_tup_upd"]), int(row["n_tup_hot_upd"])
