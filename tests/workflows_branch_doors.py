"""Workflows for the race-deadline and branch-door tests (in-process and in worker
subprocesses: ``PHASEGATE_WORKFLOW_MODULES=tests.workflows_branch_doors``).

Phases record their invocations (``test_invocations``, note = the branch). A document's
version is ``v1`` until a test (or a phase) opens the gate ``changed-<doc>``: then ``v2``.
"""

from __future__ import annotations

from typing import Any

from phasegate import Context, Retry, Workflow
from phasegate.db import connect
from tests.workflows import branch_gate, ledger_dsn, record, wait_gate

# -- a race with a deadline: launch -> search x N (held at a gate unless fast) -> settle ------

timed_race = Workflow("timed-race", schema_version=1)


@timed_race.phase("launch")
async def launch(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    ctx.fork({f"s{i}": {"i": i, "fast": state.get("fast"), "gate": state["gate"]}
              for i in range(state["n"])},
             merge="settle", mode="race", deadline_s=state["deadline_s"])
    return {"launched": True}


@timed_race.phase("search")
async def search(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    if state["i"] != state["fast"]:
        await wait_gate(branch_gate(state["gate"], state["i"]))
    return {**state, "found": True}


@timed_race.merge("settle")
async def settle(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {**state, "winners": [r.branch for r in ctx.merged if r.ok]}


# -- doors in branches: plan -> (read -> use) x N -> decide ------------------------------------


async def doc_version(doc: str) -> str:
    connection = await connect(ledger_dsn())
    try:
        changed = await connection.fetchval("SELECT 1 FROM test_gates WHERE name = $1",
                                            f"changed-{doc}")
    finally:
        await connection.close()
    return "v2" if changed else "v1"


async def change(doc: str) -> None:
    connection = await connect(ledger_dsn())
    try:
        await connection.execute("INSERT INTO test_gates VALUES ($1) ON CONFLICT DO NOTHING",
                                 f"changed-{doc}")
    finally:
        await connection.close()


def _found(state: Any) -> bool:
    return isinstance(state, dict) and bool(state.get("found"))


scout = Workflow("scout", schema_version=1, tiers=[("found", _found)])


@scout.version_fetcher("doc")
async def fetch_doc_version(resource_id: str) -> str:
    return await doc_version(resource_id)


@scout.phase("plan")
async def scout_plan(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    ctx.fork(state["branches"], merge="decide", mode=state.get("mode", "all"),
             require=state.get("require"))
    return {"planned": True, "retry_stale": state.get("retry_stale", False)}


@scout.phase("read", expect_tier="found", below_tier="retry", max_tier_retries=2)
async def read(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    ctx.observe(state["doc"], "doc", await doc_version(state["doc"]))
    if state.get("change_after_read"):
        await change(state["doc"])
    return {**state, "found": ctx.tier_attempt >= state.get("found_on", 1),
            "read_attempt": ctx.tier_attempt}


@scout.phase("use")
async def use(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {**state, "used": True}


@scout.merge("decide")
async def decide(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    """With ``retry_stale``, a first round sends every stale branch round again, told not to
    change its document this time."""
    await record(ctx, ctx.branch)
    stale = {r.branch: Retry(input={**r.input, "change_after_read": False})
             for r in ctx.merged if r.status == "stale"}
    if state.get("retry_stale") and stale and not state.get("rounds"):
        ctx.review_branches(stale)
        return {**state, "rounds": 1}
    return {**state, "seen": {
        r.branch: {"status": r.status, "error_type": r.error_type,
                   "read_attempt": r.state["read_attempt"] if r.ok else None}
        for r in ctx.merged}}


# -- a race of two-phase branches with a deadline, for the supervisor merge after it ----------

drafts = Workflow("timed-drafts", schema_version=1)


@drafts.phase("assign")
async def assign(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    ctx.fork({f"s{i}": {"i": i, "gate": state["gate"]} for i in range(state["n"])},
             merge="choose", mode="race", deadline_s=state["deadline_s"])
    return {"assigned": True}


@drafts.phase("draft")
async def draft(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {**state, "draft": f"draft {state['i']}"}


@drafts.phase("proofread")
async def proofread(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    await wait_gate(branch_gate(state["gate"], state["i"]))
    return {**state, "proofread": True}


@drafts.merge("choose")
async def choose(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return ctx.merged[0].state


@drafts.phase("publish")
async def publish(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {**state, "published": True}
