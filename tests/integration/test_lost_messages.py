"""A message SQS lost after it was sent ("a lost message must never lose work"), against real
Postgres, SQS (moto over HTTP), the relay and a real worker: the relay's stalled-run check
sends it again under a new deduplication id, for a run's main chain and for a branch chain
alike, and leaves alone a chain that moved recently and a branch whose run has ended."""

from __future__ import annotations

from phasegate.branches import ForkPlan, plan_fork
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.relay import Relay
from phasegate.store import Store
from phasegate.workflow import Registry
from tests.branch_helpers import (  # noqa: F401 (fixtures)
    commit_a_fork,
    settings_fixture,
    started_run,
)
from tests.helpers import (
    all_done,
    fetch,
    fetchval,
    queue_for,
    running_worker,
    store_for,
    wait_for,
)
from tests.workflows_branches import pair

REGISTRY = Registry([pair])
STALL_S = 60.0
# What a send SQS acknowledged and then lost looks like in the database: sent long ago, and
# the chain it should have moved has not moved since.
LOST = ("UPDATE outbox SET sent_at = now() - interval '10 minutes' "
        "WHERE workflow_id = $1 AND sent_at IS NULL")
IDLE_BRANCHES = ("UPDATE branches SET updated_at = now() - interval '10 minutes' "
                 "WHERE workflow_id = $1")
IDLE_RUN = ("UPDATE workflow_runs SET updated_at = now() - interval '10 minutes' "
            "WHERE workflow_id = $1")
# The relay reads a run's last move from its position, whose time never goes back by itself
# (migration 0022): a run idle for 10 minutes has both.
IDLE_POSITION = ("UPDATE run_positions SET updated_at = now() - interval '10 minutes' "
                 "WHERE workflow_id = $1")


async def forked(store: Store, workflow_id: str) -> ForkPlan:
    """A `pair` run whose `fork` phase committed: two branches, each with its first message
    in the outbox (not sent yet)."""
    await started_run(store, pair, workflow_id, "fork", {"x": 1})
    plan = plan_fork(pair, "fork", 0, "main", [{"i": 0}, {"i": 1}], "join", "all", None)
    done = await commit_a_fork(store, pair, plan, workflow_id, 0, "fork", {"x": 1}, "join")
    assert done.committed and len(done.outbox) == 2
    return plan


async def test_lost_branch_messages_are_sent_again_and_the_run_completes(settings):
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        await forked(store, "lost-branches")
        await fetch(settings.database_url, LOST, "lost-branches")
        await fetch(settings.database_url, IDLE_BRANCHES, "lost-branches")
        relay = Relay(store=store, queue=queue, after_s=0, stall_after_s=STALL_S)
        assert await relay.requeue_stalled() == 2
        rows = await fetch(settings.database_url, "SELECT branch, dedup_id, sent_at FROM outbox "
                           "WHERE workflow_id = 'lost-branches' AND branch <> 'main' "
                           "ORDER BY branch")
        assert [r["branch"] for r in rows] == ["f0.b0", "f0.b1"]
        # Unsent again, under a new deduplication id: SQS would drop the old one as a repeat.
        assert all(r["sent_at"] is None and ":r" in r["dedup_id"] for r in rows)
        assert await relay.requeue_stalled() == 0  # nothing sent and lost any more
        await relay.relay_once()
        assert relay.relayed == 2
    async with running_worker(settings, REGISTRY):
        await _completed(settings, "lost-branches")
    legs = await fetchval(settings.database_url, "SELECT count(*) FROM checkpoints WHERE "
                          "workflow_id = 'lost-branches' AND phase = 'leg'")
    assert legs == 2


async def test_a_lost_main_message_is_sent_again(settings):
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        await started_run(store, pair, "lost-main", "fork", {"x": 1})
        await fetch(settings.database_url, LOST, "lost-main")
        await fetch(settings.database_url, IDLE_RUN, "lost-main")
        await fetch(settings.database_url, IDLE_POSITION, "lost-main")
        relay = Relay(store=store, queue=queue, after_s=0, stall_after_s=STALL_S)
        assert await relay.requeue_stalled() == 1
        await relay.relay_once()
        assert relay.relayed == 1
    async with running_worker(settings, REGISTRY):
        await _completed(settings, "lost-main")


async def test_recent_chains_and_ended_runs_are_left_alone(settings):
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        # Sent long ago, but the branches moved since (a phase running long, heartbeated).
        await forked(store, "moving")
        await fetch(settings.database_url, LOST, "moving")
        # Sent long ago and never moved, but the run was cancelled: nothing to wake.
        await forked(store, "cancelled")
        await fetch(settings.database_url, LOST, "cancelled")
        await fetch(settings.database_url, IDLE_BRANCHES, "cancelled")
        await Control(store.pool, None, REGISTRY, actor="test").cancel("cancelled", "enough")
        relay = Relay(store=store, queue=queue, after_s=0, stall_after_s=STALL_S)
        assert await relay.requeue_stalled() == 0
    assert await fetchval(settings.database_url,
                          "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0


async def _completed(settings, workflow_id: str) -> None:
    await wait_for(lambda: all_done(settings.database_url, [workflow_id]),
                   what=f"{workflow_id} completed")
