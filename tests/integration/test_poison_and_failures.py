"""Bad input never crashes a worker or blocks a group; failing phases retry, then fail."""

from __future__ import annotations

import json

import pytest

from phasegate.envelope import canonical_json, phase_message, start_message, state_hash
from phasegate.orchestrator.starter import start_workflow
from phasegate.workflow import Registry, Workflow
from tests import workflows
from tests.helpers import (
    all_done,
    fetch,
    fetchval,
    make_settings,
    queue_for,
    running_worker,
    send_raw,
    store_for,
    wait_for,
)

REGISTRY = Registry([workflows.chain, workflows.flaky, workflows.broken])


@pytest.fixture
def settings(database_url, queue_pair, sqs_endpoint):
    workflows.LEDGER_DSN = database_url
    return make_settings(database_url, queue_pair, sqs_endpoint, max_message_bytes=2048)


POISON = {
    "not_json": "{this is not json",
    "invalid_envelope": json.dumps({"v": 1, "kind": "start", "workflow_id": "has spaces@x.com",
                                    "workflow": "chain"}),
    "wrong_version": json.dumps({"v": 2, "kind": "start", "workflow_id": "p-2",
                                 "workflow": "chain"}),
    "unknown_workflow": json.dumps({"v": 1, "kind": "start", "workflow_id": "p-3",
                                    "workflow": "nope"}),
    "unknown_phase": json.dumps({"v": 1, "kind": "phase", "workflow_id": "p-4",
                                 "workflow": "chain", "seq": 1, "phase": "nope"}),
    "oversized": json.dumps({"v": 1, "kind": "start", "workflow_id": "p-5", "workflow": "chain",
                             "input": {"blob": "secret-ish " * 400}}),
    "no_run": json.dumps({"v": 1, "kind": "phase", "workflow_id": "p-6", "workflow": "chain",
                          "seq": 1, "phase": "transform"}),
}
EXPECTED_CODE = {"not_json": "not_json", "invalid_envelope": "invalid_envelope",
                 "wrong_version": "invalid_envelope", "unknown_workflow": "unknown_workflow",
                 "unknown_phase": "unknown_phase", "oversized": "oversized", "no_run": "no_run"}


async def test_every_kind_of_poison_is_quarantined_and_work_continues(settings):
    # A healthy run shares a message group with the poison messages: the group must go on.
    # (A message that parses must carry its own run's group, else it is group_mismatch.)
    for name, body in POISON.items():
        await send_raw(settings, body, group="p-6" if name == "no_run" else "good-1",
                       dedup=f"{name:0<64}"[:64])
    good = start_message("good-1", "chain", {"n": 1})
    await send_raw(settings, good.to_json(), group="good-1", dedup="g" * 64)
    async with running_worker(settings, REGISTRY) as worker:
        await wait_for(lambda: all_done(settings.database_url, ["good-1"]), what="good run")
        await wait_for(lambda: _quarantined(settings, len(POISON)), what="all quarantined")
        assert worker.ready  # never crashed
    rows = await fetch(settings.database_url, "SELECT reason, body_bytes FROM quarantine")
    codes = sorted(r["reason"].split(":")[0] for r in rows)
    assert codes == sorted(EXPECTED_CODE.values())
    for row in rows:
        assert "secret-ish" not in row["reason"] and "@x.com" not in row["reason"]
        assert row["body_bytes"] > 0
    async with queue_for(settings, settings.dlq_url) as dlq:
        bodies = []
        while True:
            batch = await dlq.receive(10, 1, 30)
            if not batch:
                break
            bodies += [m.body for m in batch]
    # The DLQ gets the routing fields only; input and unparseable bodies are digested
    # (phasegate/redact.py).
    assert len(bodies) == len(POISON)
    for body in bodies:
        assert "secret-ish" not in body and "@x.com" not in body
        assert "phasegate_quarantined" in json.loads(body)
    depth = await _depth(settings)
    assert depth == (0, 0)


async def _quarantined(settings, n: int) -> bool:
    return int(await fetchval(settings.database_url, "SELECT count(*) FROM quarantine")) >= n


async def _depth(settings) -> tuple[int, int]:
    async with queue_for(settings) as queue:
        depth = await queue.depth()
    return depth.visible, depth.inflight


async def test_failing_phase_retries_with_backoff_then_succeeds(settings):
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        wid = (await start_workflow(store, queue, workflow=workflows.flaky,
                                    input={"fail_times": 2})).workflow_id
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="flaky run done")
    state = await fetchval(settings.database_url, "SELECT state::text FROM checkpoints "
                           "WHERE seq = 0 AND kind = 'phase'")
    assert json.loads(state)["succeeded_on"] == 3
    assert await fetchval(settings.database_url, "SELECT attempts FROM workflow_runs") == 0


async def test_phase_that_keeps_failing_ends_failed_with_error_and_no_traceback(settings):
    settings = settings.model_copy(update={"max_attempts": 3})
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        wid = (await start_workflow(store, queue, workflow=workflows.broken,
                                    input={})).workflow_id
        fatal = (await start_workflow(store, queue, workflow=workflows.broken,
                                      input={"fatal": True})).workflow_id
        bad = (await start_workflow(store, queue, workflow=workflows.broken,
                                    input={"bad_state": True})).workflow_id
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid, fatal, bad], "failed"),
                       what="runs failed")
    rows = {r["workflow_id"]: r for r in await fetch(
        settings.database_url, "SELECT workflow_id, attempts, error FROM workflow_runs")}
    assert rows[wid]["attempts"] == 3
    # Type + fingerprint of the message, never the message (it may echo state).
    assert rows[wid]["error"].startswith("RuntimeError (message withheld: 12 chars, sha256 ")
    assert rows[fatal]["attempts"] == 1  # NonRetryableError skips the retry budget
    assert rows[fatal]["error"].startswith("NonRetryableError (message withheld")
    assert rows[bad]["attempts"] == 1 and rows[bad]["error"].startswith(
        "UnstorableValue: state.not_json: object is not a JSON type")
    assert all("Traceback" not in r["error"] for r in rows.values())
    assert await fetchval(settings.database_url, "SELECT count(*) FROM checkpoints") == 0


async def test_schema_version_mismatch_marks_needs_restart(settings):
    """Code deployed with schema_version 2 meets a checkpoint written by version 1."""
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        wid = (await start_workflow(store, queue, workflow=workflows.chain,
                                    input={"n": 1})).workflow_id
        # Version 1 commits seq 0 by hand, as the old release would have.
        state = canonical_json({"n": 1})
        await fetch(settings.database_url,
                    "UPDATE workflow_runs SET status='running', next_seq=1, "
                    "current_phase='transform' WHERE workflow_id=$1", wid)
        await fetch(settings.database_url,
                    "INSERT INTO checkpoints (workflow_id, seq, phase, kind, schema_version, "
                    "state, state_hash) VALUES ($1, 0, 'fetch', 'phase', 1, $2::jsonb, $3)",
                    wid, state, state_hash(state))
        v2 = Workflow("chain", schema_version=2)
        for phase in workflows.chain.phases:
            v2.phase(phase.name)(phase.fn)
        message = phase_message(wid, "chain", 1, "transform")
        await send_raw(settings, message.to_json(), group=message.group_id)
    async with running_worker(settings, Registry([v2])):
        await wait_for(lambda: all_done(settings.database_url, [wid], "needs_restart"),
                       what="needs_restart")
    error = await fetchval(settings.database_url, "SELECT error FROM workflow_runs")
    assert "version 1" in error and "has 2" in error
    assert await fetchval(settings.database_url,
                          "SELECT count(*) FROM checkpoints WHERE seq > 0") == 0


async def test_tampered_checkpoint_fails_loudly(settings):
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        wid = (await start_workflow(store, queue, workflow=workflows.chain,
                                    input={"n": 1})).workflow_id
        state = canonical_json({"n": 1, "trail": ["fetch"]})
        await fetch(settings.database_url,
                    "UPDATE workflow_runs SET status='running', next_seq=1, "
                    "current_phase='transform' WHERE workflow_id=$1", wid)
        await fetch(settings.database_url,
                    "INSERT INTO checkpoints (workflow_id, seq, phase, kind, schema_version, "
                    "state, state_hash) VALUES ($1, 0, 'fetch', 'phase', 1, $2::jsonb, $3)",
                    wid, '{"n": 666, "trail": ["fetch"]}', state_hash(state))
        message = phase_message(wid, "chain", 1, "transform")
        await send_raw(settings, message.to_json(), group=message.group_id)
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid], "failed"),
                       what="corrupt run failed")
    assert (await fetchval(settings.database_url, "SELECT error FROM workflow_runs")
            ).startswith("checkpoint_corrupt")
