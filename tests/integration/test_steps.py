"""Steps and deliveries against real PostgreSQL, a real SQS server and a fake external API
that counts calls by idempotency key (across worker processes)."""

from __future__ import annotations

import json
import signal

import pytest

from phasegate.steps import delivery_key, idempotency_key
from phasegate.workflow import Registry
from tests import workflows_room
from tests.helpers import all_done, fetch, running_worker, spawn_worker, stop_process, wait_for
from tests.room_helpers import (  # noqa: F401 (fixtures)
    api_fixture,
    exited,
    notes,
    settings_fixture,
    start,
    status_is,
)

REGISTRY = Registry([workflows_room.writer, workflows_room.deliverer, workflows_room.bad_step])


async def steps_of(settings, wid):
    return await fetch(settings.database_url,
                       "SELECT seq, step_seq, step_name, category, status, idempotency_key, "
                       "output::text AS output FROM step_records WHERE workflow_id = $1 "
                       "ORDER BY seq, step_seq", wid)


@pytest.mark.slow
async def test_a_write_step_has_one_effect_across_a_sigkill_after_its_pre_execution_record(
        settings, api):
    wid = await start(settings, workflows_room.writer, {"ticket": "t-1"})
    key = idempotency_key(wid, "main", 0, 3)
    env = {"ROOM_API_URL": api.url}
    # The fault fires inside the write step: the API has acted, the step is not recorded yet.
    doomed = spawn_worker(settings, modules="tests.workflows_room",
                          extra_env={**env, "PHASEGATE_FAULTS": "mid_phase"})
    try:
        await wait_for(exited(doomed), timeout=60, what="the worker SIGKILLed mid-step")
    finally:
        stop_process(doomed)
    assert doomed.returncode == -signal.SIGKILL
    rows = await steps_of(settings, wid)
    assert [(r["step_seq"], r["step_name"], r["status"]) for r in rows] == [
        (2, "read_cached", "completed"), (3, "post_reply", "pre_execution")]
    assert rows[1]["idempotency_key"] == key and rows[1]["category"] == "write"
    assert api.stats()["calls_by_key"] == {key: 1}

    survivor = spawn_worker(settings, modules="tests.workflows_room", extra_env=env)
    try:
        await wait_for(lambda: all_done(settings.database_url, [wid]), timeout=90,
                       what="the run completed by a second worker")
    finally:
        stop_process(survivor)

    stats = api.stats()
    assert stats["calls_by_key"] == {key: 2}  # called again, with the same key ...
    assert [e["key"] for e in stats["effects"]] == [key]  # ... and exactly one effect
    assert stats["reads"] == {"t-1": 2, "t-1-cached": 1}  # reads re-ran; the cached one not
    write = (await steps_of(settings, wid))[1]
    assert write["status"] == "completed"
    assert json.loads(write["output"]) == {"id": "reply-1", "kind": "reply", "accepted": True,
                                           "replayed": True}
    final = await fetch(settings.database_url, "SELECT state::text AS s FROM checkpoints "
                        "WHERE workflow_id = $1 AND seq = 0", wid)
    assert json.loads(final[0]["s"])["reply"]["id"] == "reply-1"


async def test_completed_steps_are_replayed_and_read_steps_run_again(settings, api):
    wid = await start(settings, workflows_room.writer, {"ticket": "t-2", "fail_once": True})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="run completed")
    assert len(await notes(settings, wid, "act")) == 2  # the phase ran twice
    key = idempotency_key(wid, "main", 0, 3)
    stats = api.stats()
    assert stats["calls_by_key"] == {key: 1}  # the completed write was not called again
    assert stats["reads"] == {"t-2": 2, "t-2-cached": 1}
    rows = await steps_of(settings, wid)
    assert [(r["step_name"], r["status"]) for r in rows] == [
        ("read_cached", "completed"), ("post_reply", "completed")]
    state = await fetch(settings.database_url, "SELECT state::text AS s FROM checkpoints "
                        "WHERE workflow_id = $1 AND seq = 0", wid)
    assert json.loads(state[0]["s"])["reply"] == json.loads(rows[1]["output"])


async def test_deliveries_are_not_repeated_after_a_resume(settings, api):
    wid = await start(settings, workflows_room.deliverer, {
        "batches": ["b1", "b2", "b3"], "artifacts": ["x", "y"], "crash_at": ["b2", "x"]})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="run completed")
    # The first attempt saw every batch; the resumed one only those not yet processed.
    assert await notes(settings, wid, "ship") == ["b1,b2,b3", "b2,b3"]
    stats = api.stats()
    expected = {delivery_key(wid, b, a) for b in ("b1", "b2", "b3") for a in ("x", "y")}
    assert stats["calls_by_key"] == dict.fromkeys(expected, 1)
    assert len(stats["effects"]) == 6
    ledger = await fetch(settings.database_url, "SELECT batch_id, artifact_id, seq FROM "
                         "deliveries WHERE workflow_id = $1 ORDER BY 1, 2", wid)
    assert [(r["batch_id"], r["artifact_id"]) for r in ledger] == [
        ("b1", ""), ("b1", "x"), ("b1", "y"), ("b2", ""), ("b2", "x"), ("b2", "y"),
        ("b3", ""), ("b3", "x"), ("b3", "y")]


async def test_a_step_output_that_is_not_json_fails_the_run_naming_the_step(settings, api):
    wid = await start(settings, workflows_room.bad_step, {})
    async with running_worker(settings, REGISTRY):
        await wait_for(status_is(settings, wid, "failed"), what="run failed")
    error = (await fetch(settings.database_url,
                         "SELECT error FROM workflow_runs WHERE workflow_id = $1", wid))[0][0]
    assert error.startswith("StepOutputError: step 'make_set' (step_seq 1) returned set")
