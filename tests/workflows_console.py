"""Workflows for the console and client tests: one that stops for a person's review."""

from __future__ import annotations

from typing import Any

from phasegate import Context, Workflow


async def drafted(state: dict[str, Any]) -> bool:
    return int(state.get("level", 0)) >= 1


async def good(state: dict[str, Any]) -> bool:
    return int(state.get("level", 0)) >= 2


# ``draft`` always ends at tier "draft", below the "good" it expects: the run waits in
# awaiting_review until an operator approves (publish runs) or rejects (draft runs again).
review = Workflow("review", schema_version=1, tiers=[("draft", drafted), ("good", good)])


@review.phase("draft", expect_tier="good", below_tier="escalate")
async def draft(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "level": 1, "drafts": int(state.get("drafts", 0)) + 1}


@review.phase("publish")
async def publish(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "published": True}
