"""The check before a phase reads first (migration 0028) against real PostgreSQL: for runs in
every state a message can find, ``load_for_phase`` returns what it returned at schema v27 and
claims exactly what it claimed then (run rows, waits' outbox rows); a load that has nothing
to claim only reads."""

from __future__ import annotations

from typing import Any

import pytest

from phasegate.db import connect
from phasegate.migrate import migrate
from phasegate.sql import queries
from tests.helpers import fetch, fetchval

# Each run: (workflow_id, status, next_seq). A checkpoint at next_seq - 1 on main and on
# branch b1, progress at next_seq, and a signal delivered to next_seq, for every run. The
# waiting run's wait is due and its row sent, so its message claims it at v27 and now alike
# (since 0036 a message that comes before the due time does not: tests/integration/
# test_waits.py).
RUNS = [("running", "running", 3), ("pending", "pending", 0), ("waiting", "waiting", 3),
        ("completed", "completed", 5), ("cancelled", "cancelled", 2),
        ("review", "awaiting_review", 4)]
FIXTURE = """
INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, current_phase,
                           schema_version, input, due_at, waiting_for)
SELECT id, 'wf', status, seq, 'p' || seq, 1, '{"in": 1}',
       CASE WHEN status = 'waiting' THEN now() - interval '1 second' END,
       CASE WHEN status = 'waiting' THEN 'timer' END
  FROM unnest($1::text[], $2::text[], $3::integer[]) AS r(id, status, seq);
INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                         state_hash, worker_id)
SELECT workflow_id, branch, next_seq - 1, 'p', 'phase', 1,
       jsonb_build_object('at', next_seq - 1, 'branch', branch), 'h', 'w'
  FROM workflow_runs, (VALUES ('main'), ('b1')) AS b(branch) WHERE next_seq > 0;
INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                         state_hash, worker_id)
SELECT workflow_id, 'main', next_seq, 'p', 'emergency', 1, '{"progress": 1}', 'h', 'w'
  FROM workflow_runs;
INSERT INTO signals (workflow_id, name, payload, consumed_seq)
SELECT workflow_id, 'go', '{"signal": 1}', next_seq FROM workflow_runs;
INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body, due_at, sent_at)
SELECT workflow_id, 'main', next_seq, 'wait-' || workflow_id, workflow_id, '{}',
       now() - interval '1 second', now()
  FROM workflow_runs WHERE status = 'waiting';
"""
STATE = ("SELECT workflow_id, status, due_at IS NULL AS due_cleared, waiting_for, "
         "(SELECT count(*) FROM outbox o WHERE o.workflow_id = r.workflow_id "
         "AND o.resumed_at IS NOT NULL) AS resumed FROM workflow_runs r ORDER BY workflow_id")
# Every message a run can meet: its next seq, an older one (a duplicate), a newer one, on the
# main branch and on a branch; and a run that does not exist.
MESSAGES = [(workflow_id, branch, next_seq + delta) for workflow_id, _, next_seq in RUNS
            for branch in ("main", "b1") for delta in (0, -1, 1) if next_seq + delta >= 0]
MESSAGES.append(("missing", "main", 0))


async def _database(url: str, target: int | None) -> str:
    if target is not None:
        await migrate(url, target=target)
    connection = await connect(url)
    try:
        await connection.execute(FIXTURE.split(";\n")[0], *zip(*RUNS, strict=True))
        for statement in FIXTURE.split(";\n")[1:]:
            if statement.strip():
                await connection.execute(statement)
    finally:
        await connection.close()
    return url


def _rows(records: list[Any]) -> list[dict[str, Any]]:
    return sorted((dict(record) for record in records), key=lambda r: (r.get("i") or 0, str(r)))


async def _single(url: str, message: tuple[str, str, int]) -> tuple[Any, ...]:
    returned = _rows(await fetch(url, queries()["load_for_phase"], *message))
    return returned, [tuple(r) for r in await fetch(url, STATE)]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: f"{m[0]}-{m[1]}-{m[2]}")
async def test_one_message_gets_what_it_got_at_v27(database_url, empty_database_url, message):
    """The same runs on a database at v27 and on one at the newest schema: the load returns
    the same row and leaves the same runs and wait rows behind (a pending run and a run
    waiting for this very message claimed, nothing else touched)."""
    before = await _single(await _database(empty_database_url, 27), message)
    after = await _single(await _database(database_url, None), message)
    assert after == before
    if message == ("pending", "main", 0) or message == ("waiting", "main", 3):
        assert after[0][0]["status"] == "running"


async def _scans_of_runs(url: str, sql: str, *args: Any) -> int:
    """How many times one load scans workflow_runs (this transaction's own statistics)."""
    connection = await connect(url)
    try:
        async with connection.transaction():
            assert await connection.fetch(sql, *args)
            return int(await connection.fetchval(
                "SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables "
                "WHERE relname = 'workflow_runs'"))
    finally:
        await connection.close()


async def test_a_load_with_nothing_to_claim_only_reads(database_url, empty_database_url):
    """A running run's check before its phase (nearly every message) looks its run up once;
    at v27 the claim's UPDATE looked for it first, then the read did."""
    message = ("running", "main", 3)
    old = await _database(empty_database_url, 27)
    new = await _database(database_url, None)
    assert await _scans_of_runs(new, queries()["load_for_phase"], *message) == 1
    assert await _scans_of_runs(old, queries()["load_for_phase"], *message) == 2
    assert await fetchval(new, "SELECT status FROM workflow_runs WHERE workflow_id = 'running'") \
        == "running"
