"""Corrupted checkpoints fail loudly: a state row that no longer matches its state_hash marks
the run failed with reason checkpoint_corrupt, and no phase runs on it (real Postgres + SQS)."""

from __future__ import annotations

import pytest

from phasegate.workflow import Registry
from tests import workflows_room
from tests.helpers import fetch, running_worker, wait_for
from tests.integration.test_versions import a_run_left_by_release_1, release
from tests.room_helpers import (  # noqa: F401 (fixtures)
    api_fixture,
    notes,
    review_decision,
    run_row,
    settings_fixture,
    start,
    status_is,
)


@pytest.fixture
def quick_stop(settings):
    return settings.model_copy(update={"shutdown_grace_s": 0.2})


async def tamper(settings, wid: str, seq: int) -> None:
    """Someone edits the state in place; the recorded hash stays as it was."""
    await fetch(settings.database_url,
                "UPDATE checkpoints SET state = state || '{\"tampered\": true}'::jsonb "
                "WHERE workflow_id = $1 AND seq = $2 AND kind = 'phase'", wid, seq)


async def test_a_tampered_state_row_fails_the_run_as_checkpoint_corrupt(quick_stop):
    wid = await a_run_left_by_release_1(quick_stop)
    await tamper(quick_stop, wid, 0)
    async with running_worker(quick_stop, Registry([release(1)])):
        await wait_for(status_is(quick_stop, wid, "failed"), what="failed")
    run = await run_row(quick_stop, wid)
    assert run["error"] == "checkpoint_corrupt: state at seq 0 does not match its state_hash"
    assert await notes(quick_stop, wid, "publish") == ["1"]  # nothing ran on the bad state


async def test_a_tampered_input_of_a_rerun_fails_the_run_too(settings, api):
    """reject re-runs the last phase from the checkpoint before it: that one is verified."""
    wid = await start(settings, workflows_room.tier_last, {})
    async with running_worker(settings, Registry([workflows_room.tier_last])):
        await wait_for(status_is(settings, wid, "awaiting_review"), what="awaiting_review")
        await tamper(settings, wid, 0)
        await review_decision(settings, wid, "reject")
        await wait_for(status_is(settings, wid, "failed"), what="failed")
    run = await run_row(settings, wid)
    assert run["error"] == "checkpoint_corrupt: state at seq 0 does not match its state_hash"
    assert await notes(settings, wid, "final") == ["1"]
