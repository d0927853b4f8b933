"""Progress tiers and the three below-tier policies, against real PostgreSQL and SQS; reviews
are decided through the orchestrator's control plane (approve / reject)."""

from __future__ import annotations

import pytest

from phasegate.signals import NotUnderReview, SignalError, send_decision
from phasegate.steps import idempotency_key
from phasegate.workflow import Registry
from tests import workflows_room
from tests.helpers import all_done, fetch, queue_for, running_worker, store_for, wait_for
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

REGISTRY = Registry([workflows_room.tier_retry, workflows_room.tier_escalate,
                     workflows_room.tier_advance, workflows_room.tier_last])


def shape(rows):
    return [(r["seq"], r["phase"], r["tier"], r["tier_label"], r["outcome"], r["rerun_of"])
            for r in rows]


async def test_tiers_are_stored_on_checkpoints_and_on_the_run(settings, api):
    passing = await start(settings, workflows_room.tier_advance, {"pass_on": 1})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [passing]), what="completed")
    assert shape(await checkpoints(settings, passing)) == [
        (0, "work", 2, "confirmed", None, None), (1, "finish", 2, "confirmed", None, None)]
    run = await run_row(settings, passing)
    assert (run["tier"], run["tier_label"]) == (2, "confirmed")


async def test_below_tier_advance_records_the_lower_tier_and_goes_on(settings, api):
    wid = await start(settings, workflows_room.tier_advance, {"pass_on": 99})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="completed")
    assert shape(await checkpoints(settings, wid)) == [
        (0, "work", 1, "found", None, None), (1, "finish", 1, "found", None, None)]
    assert await notes(settings, wid, "work") == ["1"]


async def test_below_tier_retry_reruns_the_phase_from_its_input_with_an_attempt_counter(
        settings, api):
    wid = await start(settings, workflows_room.tier_retry, {"pass_on": 3})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="completed")
    assert await notes(settings, wid, "work") == ["1", "2", "3"]
    rows = await checkpoints(settings, wid)
    assert shape(rows) == [
        (0, "work", 1, "found", "retry", None), (1, "work", 1, "found", "retry", 0),
        (2, "work", 2, "confirmed", None, 0), (3, "finish", 2, "confirmed", None, None)]
    # Every attempt started from the run's input, not from the attempt before it.
    assert rows[2]["state"] == {"pass_on": 3, "level": 2, "attempt_seen": 3}
    # Every attempt is its own seq, so its write step had its own idempotency key.
    assert set(api.stats()["calls_by_key"]) == {idempotency_key(wid, "main", s, 1)
                                                for s in (0, 1, 2)}


async def test_below_tier_retry_escalates_when_the_retries_are_spent(settings, api):
    wid = await start(settings, workflows_room.tier_retry, {"pass_on": 99})
    async with running_worker(settings, REGISTRY):
        await wait_for(status_is(settings, wid, "awaiting_review"), what="awaiting_review")
    run = await run_row(settings, wid)
    assert run["error"] == ("below_tier: phase work reached tier 1 (found) after 3 attempts, "
                            "expected tier 2 (confirmed)")
    assert (run["next_seq"], run["current_phase"]) == (3, "finish")
    assert [r["outcome"] for r in await checkpoints(settings, wid)] == [
        "retry", "retry", "review"]


async def test_below_tier_escalate_then_approve_continues_with_the_result(settings, api):
    wid = await start(settings, workflows_room.tier_escalate, {"pass_on": 2})
    async with running_worker(settings, REGISTRY):
        await wait_for(status_is(settings, wid, "awaiting_review"), what="awaiting_review")
        run = await run_row(settings, wid)
        assert run["error"].startswith("below_tier: phase work reached tier 1 (found)")
        assert shape(await checkpoints(settings, wid)) == [(0, "work", 1, "found", "review",
                                                            None)]
        await review_decision(settings, wid, "approve")
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="completed")
    assert await notes(settings, wid, "work") == ["1"]  # the result was kept
    rows = await checkpoints(settings, wid)
    assert shape(rows)[1] == (1, "finish", 1, "found", None, None)


async def test_below_tier_escalate_then_reject_reruns_the_phase(settings, api):
    wid = await start(settings, workflows_room.tier_escalate, {"pass_on": 2})
    async with running_worker(settings, REGISTRY):
        await wait_for(status_is(settings, wid, "awaiting_review"), what="awaiting_review")
        await review_decision(settings, wid, "reject")
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="completed")
    assert await notes(settings, wid, "work") == ["1", "2"]
    assert shape(await checkpoints(settings, wid)) == [
        (0, "work", 1, "found", "review", None), (1, "work", 2, "confirmed", None, 0),
        (2, "finish", 2, "confirmed", None, None)]


async def test_a_review_of_the_last_phase_completes_on_approve_and_reruns_on_reject(
        settings, api):
    kept = await start(settings, workflows_room.tier_last, {})
    redone = await start(settings, workflows_room.tier_last, {})
    async with running_worker(settings, REGISTRY):
        for wid in (kept, redone):
            await wait_for(status_is(settings, wid, "awaiting_review"), what="awaiting_review")
        await review_decision(settings, kept, "approve")
        await review_decision(settings, redone, "reject")
        await wait_for(lambda: all_done(settings.database_url, [kept, redone]),
                       what="both completed")
    assert await notes(settings, kept, "final") == ["1"]
    assert [r["tier"] for r in await checkpoints(settings, kept)] == [1, 2]
    assert await notes(settings, redone, "final") == ["1", "2"]
    assert [r["tier"] for r in await checkpoints(settings, redone)] == [1, 2, 3]


async def test_a_review_decision_is_a_signal_that_the_door_follows(settings, api):
    """approve/reject deliver a reserved signal (its payload the reason) to the run's next seq
    under the new epoch, once per idempotency key; the door follows that signal, not the
    audit row next to it."""
    dsn = settings.database_url
    wid = await start(settings, workflows_room.tier_escalate, {"pass_on": 2})
    async with running_worker(settings, REGISTRY):
        await wait_for(status_is(settings, wid, "awaiting_review"), what="awaiting_review")
    async with store_for(dsn) as store, queue_for(settings) as queue:
        for action, reason in (("maybe", None), ("approve", "nul \u0000")):
            with pytest.raises(SignalError) as refused:  # nothing is stored for either
                await send_decision(store.pool, wid, action, reason, queue=queue)
            assert refused.value.status_code == 422
        first = await send_decision(store.pool, wid, "reject", "draft again",
                                    idempotency_key="ticket-1", queue=queue, actor="test")
        again = await send_decision(store.pool, wid, "reject", "draft again",
                                    idempotency_key="ticket-1", queue=queue, actor="test")
        assert first.delivered and first.sent and not first.duplicate
        assert again.duplicate and again.signal_id == first.signal_id
        with pytest.raises(NotUnderReview):  # no key: a second decision finds it running
            await send_decision(store.pool, wid, "approve", queue=queue)
    signals = await fetch(dsn, "SELECT name, payload::text, consumed_seq, consumed_epoch, "
                          "actor FROM signals WHERE workflow_id = $1", wid)
    assert [tuple(r) for r in signals] == [
        ("phasegate.reject", '{"reason": "draft again"}', 1, 1, "test")]
    actions = await fetch(dsn, "SELECT action, from_status, seq, epoch, reason FROM "
                          "control_actions WHERE workflow_id = $1", wid)
    assert [tuple(a) for a in actions] == [("reject", "awaiting_review", 1, 1, "draft again")]
    # The door reads the signal: an audit row saying otherwise changes nothing.
    await fetch(dsn, "UPDATE control_actions SET action = 'approve' WHERE workflow_id = $1", wid)
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(dsn, [wid]), what="completed")
    assert await notes(settings, wid, "work") == ["1", "2"]  # rejected: the phase ran again


async def test_a_decision_of_the_previous_release_is_still_followed(settings, api):
    """An orchestrator of the previous release (0013) recorded decisions only in
    control_actions; a run resumed that way during an upgrade is still decided right."""
    from phasegate.orchestrator.control import RULES, Control

    dsn = settings.database_url
    wid = await start(settings, workflows_room.tier_escalate, {"pass_on": 2})
    async with running_worker(settings, REGISTRY):
        await wait_for(status_is(settings, wid, "awaiting_review"), what="awaiting_review")
        async with store_for(dsn) as store, queue_for(settings) as queue:
            # The previous release's approve/reject: the generic resume, no signal.
            await Control(store.pool, queue, None)._resume(RULES["reject"], wid, "old")
        await wait_for(lambda: all_done(dsn, [wid]), what="completed")
    assert await fetch(dsn, "SELECT 1 FROM signals WHERE workflow_id = $1", wid) == []
    assert await notes(settings, wid, "work") == ["1", "2"]
