"""The engine end to end against real PostgreSQL and a real SQS server over HTTP.

This module is also run once against LocalStack (scripts/localstack-e2e.sh)."""

from __future__ import annotations

import hashlib
import json

from phasegate.envelope import canonical_json
from phasegate.orchestrator.starter import start_workflow
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import (
    all_done,
    fetch,
    queue_for,
    running_worker,
    send_raw,
    store_for,
    wait_for,
)

REGISTRY = Registry([workflows.chain])


async def test_three_phases_complete_with_chained_states_and_hashes(settings):
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        ids = [(await start_workflow(store, queue, workflow=workflows.chain,
                                     input={"n": i})).workflow_id for i in range(3)]
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, ids), what="3 runs completed")

    for i, wid in enumerate(ids):
        rows = await fetch(settings.database_url,
                           "SELECT seq, phase, kind, state::text, state_hash, schema_version "
                           "FROM checkpoints WHERE workflow_id = $1 ORDER BY seq", wid)
        assert [(r["seq"], r["phase"], r["kind"]) for r in rows] == [
            (0, "fetch", "phase"), (1, "transform", "phase"), (2, "publish", "phase")]
        states = [json.loads(r["state"]) for r in rows]
        assert states[0] == {"n": i + 1, "trail": ["fetch"]}
        assert states[1] == {"n": (i + 1) * 10, "trail": ["fetch", "transform"]}
        assert states[2] == {"n": (i + 1) * 10 + 1, "trail": ["fetch", "transform", "publish"]}
        for row, state in zip(rows, states, strict=True):
            expected = hashlib.sha256(json.dumps(
                state, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
            assert row["state_hash"] == expected.hexdigest()
            assert canonical_json(state)  # round-trips
            assert row["schema_version"] == 1
    runs = await fetch(settings.database_url, "SELECT status, next_seq, finished_at, error "
                       "FROM workflow_runs WHERE workflow_id = ANY($1)", ids)
    assert all(r["status"] == "completed" and r["next_seq"] == 3 and r["finished_at"]
               and r["error"] is None for r in runs)
    unsent = await fetch(settings.database_url, "SELECT * FROM outbox WHERE sent_at IS NULL")
    assert unsent == []


async def test_start_message_from_any_producer_creates_the_run(settings):
    """A raw envelope (as `aws sqs send-message` would send it) starts a run."""
    body = {"v": 1, "kind": "start", "workflow_id": "ext-0001", "workflow": "chain",
            "input": {"n": 5}}
    await send_raw(settings, body, group="ext-0001")
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, ["ext-0001"]), what="run done")
    rows = await fetch(settings.database_url, "SELECT input::text FROM workflow_runs")
    assert [json.loads(r["input"]) for r in rows] == [{"n": 5}]
