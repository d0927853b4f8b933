"""The staleness envelope against real PostgreSQL and SQS: a resumed run whose observed
resources changed (or cannot be checked) stops at awaiting_review; the orchestrator's approve
continues it, reject re-runs the phase that relied on them."""

from __future__ import annotations

import json

import pytest

from phasegate.workflow import Registry
from tests import workflows_room
from tests.helpers import all_done, running_worker, wait_for
from tests.room_helpers import (  # noqa: F401 (fixtures)
    api_fixture,
    checkpoints,
    notes,
    review_decision,
    run_row,
    settings_fixture,
    start,
    status_is,
)

REGISTRY = Registry([workflows_room.watcher])


@pytest.fixture
def always_old(settings):
    """Every checkpoint counts as old: the check runs on every resume."""
    return settings.model_copy(update={"stale_after_s": 0.0})


async def stop_for_staleness(settings, api, input):
    wid = await start(settings, workflows_room.watcher, input)
    await wait_for(status_is(settings, wid, "awaiting_review"), what="awaiting_review")
    return wid


async def test_a_changed_resource_stops_the_run_and_approve_continues_it(always_old, api):
    async with running_worker(always_old, REGISTRY):
        wid = await stop_for_staleness(always_old, api,
                                       {"ticket": "d-1", "changes_after_read": True})
        run = await run_row(always_old, wid)
        assert run["error"] == "stale_resources: ticket:d-1 (recorded v1, now v2)"
        review = json.loads(run["review"])
        assert (review["kind"], review["seq"], review["phase"]) == ("stale", 1, "write")
        assert review["stale"] == [{"type": "ticket", "id": "d-1", "recorded": "v1",
                                    "current": "v2", "error": None}]
        assert await notes(always_old, wid, "write") == []  # never silently continued
        await review_decision(always_old, wid, "approve")
        await wait_for(lambda: all_done(always_old.database_url, [wid]), what="completed")
    rows = await checkpoints(always_old, wid)
    assert [r["phase"] for r in rows] == ["research", "write"]
    assert rows[1]["state"]["written_from"] == "v1"  # approved: the recorded state went on
    # The approved envelope took the version the review saw, so it does not stop again.
    assert rows[1]["resources"] == [{"type": "ticket", "id": "d-1", "version": "v2"}]
    assert api.stats()["version_checks"] == {"d-1": 1}


async def test_reject_reruns_the_phase_that_relied_on_the_stale_resource(always_old, api):
    async with running_worker(always_old, REGISTRY):
        wid = await stop_for_staleness(always_old, api,
                                       {"ticket": "d-2", "changes_after_read": True})
        await review_decision(always_old, wid, "reject")
        await wait_for(lambda: all_done(always_old.database_url, [wid]), what="completed")
    assert await notes(always_old, wid, "research") == ["1", "2"]
    rows = await checkpoints(always_old, wid)
    assert [(r["seq"], r["phase"], r["rerun_of"]) for r in rows] == [
        (0, "research", None), (1, "research", 0), (2, "write", None)]
    assert rows[2]["state"]["written_from"] == "v2"
    # Checked before the review and again after the re-run (now unchanged).
    assert api.stats()["version_checks"] == {"d-2": 2}


async def test_a_fetcher_failure_is_unknown_and_goes_to_review(always_old, api):
    async with running_worker(always_old, REGISTRY):
        wid = await stop_for_staleness(always_old, api,
                                       {"ticket": "d-3", "break_versions": True})
    run = await run_row(always_old, wid)
    assert run["error"].startswith("stale_resources: ticket:d-3 (recorded v1, unknown: "
                                   "HTTPStatusError")
    assert json.loads(run["review"])["stale"][0]["current"] is None
    assert await notes(always_old, wid, "write") == []


async def test_unchanged_resources_pass_the_check(always_old, api):
    wid = await start(always_old, workflows_room.watcher, {"ticket": "d-4"})
    async with running_worker(always_old, REGISTRY):
        await wait_for(lambda: all_done(always_old.database_url, [wid]), what="completed")
    assert api.stats()["version_checks"] == {"d-4": 1}


async def test_a_fresh_checkpoint_is_not_checked(settings, api):
    """Below the configured age (an hour by default, database time) nothing is fetched."""
    wid = await start(settings, workflows_room.watcher,
                      {"ticket": "d-5", "changes_after_read": True})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="completed")
    assert api.stats()["version_checks"] == {}
    rows = await checkpoints(settings, wid)
    assert rows[0]["resources"] == [{"type": "ticket", "id": "d-5", "version": "v1"}]
    assert rows[1]["resources"] == rows[0]["resources"]  # the envelope is carried forward
