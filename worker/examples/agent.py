"""An agent-style workflow: the worked example of docs/concepts/inside-a-phase.md.

A support agent reads a ticket (a read step, observed for staleness), posts a reply to an
external API (a write step: the API deduplicates on the idempotency key phasegate passes),
and delivers a report once per batch (the receipt ledger). Tiers say how far each run got.

Run it against the fake API (``worker/examples/fake_api.py``)::

    AGENT_API_URL=http://127.0.0.1:8765 \\
    PHASEGATE_WORKFLOW_MODULES=phasegate.worker.examples.agent phasegate worker
"""

from __future__ import annotations

import os
from typing import Any

from phasegate import Context, Workflow
from phasegate.worker.examples.fake_api import ApiClient


def api() -> ApiClient:
    return ApiClient(os.environ.get("AGENT_API_URL", "http://127.0.0.1:8765"))


# -- tiers: graders look only at the state ------------------------------------------------------

def understood(state: dict[str, Any]) -> bool:
    return bool(state.get("plan", {}).get("customer"))


def replied(state: dict[str, Any]) -> bool:
    return bool(state.get("reply", {}).get("accepted"))


def reported(state: dict[str, Any]) -> bool:
    return bool(state.get("report"))


agent = Workflow("support-agent", schema_version=1, tiers=[
    ("understood", understood), ("replied", replied), ("reported", reported)])


@agent.version_fetcher("ticket")
async def ticket_version(ticket_id: str) -> str:
    return await api().ticket_version(ticket_id)


# -- phases -----------------------------------------------------------------------------------

@agent.phase("triage", expect_tier="understood", below_tier="retry", max_tier_retries=2)
async def triage(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    ticket = await ctx.step("read_ticket", api().get_ticket, state["ticket_id"])
    ctx.observe(ticket["id"], "ticket", ticket["version"])
    # A cheap plan first; a retry (ctx.tier_attempt > 1) reads the whole ticket.
    thorough = ctx.tier_attempt > 1 or not state.get("skim", False)
    plan = {"summary": ticket["subject"][:40],
            "customer": ticket["customer"] if thorough else None}
    return {**state, "ticket": ticket, "plan": plan}


@agent.phase("reply", expect_tier="replied", below_tier="escalate")
async def reply(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    text = f"Hello {state['plan']['customer']}, we are on it: {state['plan']['summary']}"
    posted = await ctx.step("post_reply", api().post_reply, state["ticket_id"], text,
                            category="write")
    return {**state, "reply": posted}


@agent.phase("report", expect_tier="reported", below_tier="advance")
async def report(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    receipt = state.get("report")
    for batch in await ctx.pending([state["batch"]]):
        receipt = await ctx.deliver(batch, state["ticket_id"], api().send_report,
                                    {"ticket": state["ticket_id"], "reply": state["reply"]["id"]})
        await ctx.batch_done(batch)
    return {**state, "report": receipt}
