"""Workflows for the inside-the-room tests, in-process and in worker subprocesses
(``PHASEGATE_WORKFLOW_MODULES=tests.workflows_room``).

They talk to the fake external API (``worker/examples/fake_api.py``) at ``ROOM_API_URL``
(or ``API_URL`` set by an in-process test); the API counts calls by idempotency key across
processes. Phases also record invocations in ``test_invocations`` (tests/workflows.py).
"""

from __future__ import annotations

import os
from typing import Any

from phasegate import Context, NonRetryableError, Workflow
from phasegate.worker.examples.fake_api import ApiClient
from tests.workflows import record

API_URL: str | None = None


def api() -> ApiClient:
    return ApiClient(API_URL or os.environ["ROOM_API_URL"])


# -- steps: reads, a cached read, a write; optionally fail once after all of them ------------

writer = Workflow("room-writer", schema_version=1)


@writer.phase("act")
async def act(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    ticket = await ctx.step("read_ticket", api().get_ticket, state["ticket"])
    cached = await ctx.step("read_cached", api().get_ticket, state["ticket"] + "-cached",
                            cache=True)
    reply = await ctx.step("post_reply", api().post_reply, state["ticket"],
                           f"re: {ticket['subject']}", category="write")
    if state.get("fail_once") and ctx.attempt == 1:
        raise RuntimeError("the phase fails after its steps, once")
    return {**state, "ticket_version": ticket["version"], "cached": cached["id"],
            "reply": reply}


@writer.phase("done")
async def writer_done(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return state


# -- a step whose output is not JSON ------------------------------------------------------------

bad_step = Workflow("room-bad-step", schema_version=1)


@bad_step.phase("only")
async def only(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await ctx.step("make_set", lambda: {1, 2, 3})
    return state


# -- deliveries -------------------------------------------------------------------------------

deliverer = Workflow("room-deliver", schema_version=1)


@deliverer.phase("ship")
async def ship(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    pending = await ctx.pending(state["batches"])
    await record(ctx, ",".join(pending))
    receipts = []
    for batch in pending:
        for artifact in state["artifacts"]:
            receipt = await ctx.deliver(batch, artifact, api().send_report,
                                        {"batch": batch, "artifact": artifact})
            receipts.append(receipt["id"])
            if [batch, artifact] == state.get("crash_at") and ctx.attempt == 1:
                raise RuntimeError("crash in the middle of a batch")
        await ctx.batch_done(batch)
    return {**state, "receipts": receipts}


# -- tiers: `level` is what the graders read ----------------------------------------------------

def at_least(level: int) -> Any:
    async def grader(state: dict[str, Any]) -> bool:
        return int(state.get("level", 0)) >= level
    return grader


TIERS = [("found", at_least(1)), ("confirmed", at_least(2)), ("polished", at_least(3))]


def tiered(name: str, below: str) -> Workflow:
    wf = Workflow(name, schema_version=1, tiers=TIERS)

    @wf.phase("work", expect_tier="confirmed", below_tier=below, max_tier_retries=2)
    async def work(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
        await record(ctx, str(ctx.tier_attempt))
        # A write step per attempt: every attempt has its own idempotency keys.
        await ctx.step("note_attempt", api().send_report,
                       {"run": ctx.workflow_id, "attempt": ctx.tier_attempt}, category="write")
        level = 2 if ctx.tier_attempt >= state["pass_on"] else 1
        return {**state, "level": level, "attempt_seen": ctx.tier_attempt}

    @wf.phase("finish")
    async def finish(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
        await record(ctx)
        return {**state, "finished": True}

    return wf


tier_retry = tiered("tier-retry", "retry")
tier_escalate = tiered("tier-escalate", "escalate")
tier_advance = tiered("tier-advance", "advance")

tier_last = Workflow("tier-last", schema_version=1, tiers=TIERS)


@tier_last.phase("prepare")
async def prepare(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "level": 1}


@tier_last.phase("final", expect_tier="polished", below_tier="escalate")
async def final(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, str(ctx.tier_attempt))
    return {**state, "level": 3 if ctx.tier_attempt > 1 else 2}


# -- staleness --------------------------------------------------------------------------------

watcher = Workflow("room-stale", schema_version=1)


@watcher.version_fetcher("ticket")
async def ticket_version(ticket_id: str) -> str:
    return await api().ticket_version(ticket_id)


@watcher.phase("research")
async def research(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, str(ctx.tier_attempt))
    ticket = await ctx.step("read_ticket", api().get_ticket, state["ticket"])
    ctx.observe(ticket["id"], "ticket", ticket["version"])
    if state.get("changes_after_read") and ctx.tier_attempt == 1:
        await api().bump(state["ticket"])  # the world moves on after we looked
    if state.get("break_versions"):
        await api().break_versions(state["ticket"])  # the version service goes down
    return {**state, "seen_version": ticket["version"]}


@watcher.phase("write")
async def write(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    if state.get("fatal"):
        raise NonRetryableError("not reached in these tests")
    return {**state, "written_from": state["seen_version"]}


# -- versions: the code about to be rolled out is at version 3 and upcasts only from 2 ---------

versioned = Workflow("room-versioned", schema_version=3)


@versioned.upcast(from_version=2)
def two_to_three(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "v3": True}


@versioned.phase("only")
async def versioned_only(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return state
