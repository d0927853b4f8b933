"""Migration 0002 (steps, deliveries, tiers/review columns) applies to a database of the
previous release with runs in flight, and leaves those runs as they were."""

from __future__ import annotations

from phasegate.envelope import canonical_json, state_hash
from phasegate.migrate import migrate
from tests.helpers import fetch, fetchval


async def test_0002_applies_over_a_v1_database_with_a_run_in_flight(empty_database_url):
    dsn = empty_database_url
    assert (await migrate(dsn, target=1)).current_version == 1
    state = canonical_json({"n": 1})
    await fetch(dsn, "INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, "
                "current_phase, schema_version) VALUES ('w1', 'chain', 'running', 1, 'b', 1)")
    await fetch(dsn, "INSERT INTO checkpoints (workflow_id, seq, phase, kind, schema_version, "
                "state, state_hash) VALUES ('w1', 0, 'a', 'phase', 1, $1::jsonb, $2)",
                state, state_hash(state))
    report = await migrate(dsn, target=2)
    assert report.applied == ["0002_steps"]
    row = (await fetch(dsn, "SELECT c.outcome, c.rerun_of, r.review, r.status FROM checkpoints "
                       "c JOIN workflow_runs r USING (workflow_id)"))[0]
    assert tuple(row) == (None, None, None, "running")
    await fetch(dsn, "INSERT INTO step_records (workflow_id, seq, step_seq, step_name, "
                "category, idempotency_key, input_hash, status) VALUES "
                "('w1', 1, 1, 's', 'write', 'k', 'h', 'pre_execution')")
    await fetch(dsn, "INSERT INTO deliveries (workflow_id, batch_id, artifact_id, "
                "idempotency_key, seq) VALUES ('w1', 'b', 'a', 'k', 1)")
    await fetch(dsn, "DELETE FROM workflow_runs WHERE workflow_id = 'w1'")
    assert await fetchval(dsn, "SELECT count(*) FROM step_records") == 0  # purge cascades
    assert await fetchval(dsn, "SELECT count(*) FROM deliveries") == 0
