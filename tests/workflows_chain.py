"""A twelve-phase workflow for local continuation (tests/integration/test_continuation.py).

Every phase records its invocation (``test_invocations``) and adds one to ``n``, so a phase
applied twice would show in the final state. ``input["gate"]`` names a phase that waits for the
test to open the gate named after the run (``test_gates``) before it returns.
"""

from __future__ import annotations

from typing import Any

from phasegate import Context, Workflow
from tests.workflows import record, wait_gate

PHASES = [f"p{i:02d}" for i in range(12)]

hops = Workflow("hops", schema_version=1)


async def step(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    if state.get("gate") == ctx.phase:
        await wait_gate(ctx.workflow_id)
    return {**state, "n": state.get("n", 0) + 1}


for name in PHASES:
    hops.phase(name)(step)


# What each phase saw of its context, kept in the state: a run with local continuation on and
# one with it off must keep the same views (tests/integration/test_continuation.py).
CONTEXT_PHASES = ("c0", "c1", "c2", "c3")
context_views = Workflow("context_views", schema_version=2)


def _view(ctx: Context) -> dict[str, Any]:
    return {"phase": ctx.phase, "seq": ctx.seq, "branch": ctx.branch, "attempt": ctx.attempt,
            "schema_version": ctx.schema_version, "tier_attempt": ctx.tier_attempt,
            "resumed_progress": ctx.resumed_progress, "signal": ctx.signal,
            "merged": len(ctx.merged), "fork_scope": ctx.fork_scope is not None,
            "workflow": ctx.workflow}


def _context_phase(name: str) -> Any:
    async def phase(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
        ctx.progress({"in": name})  # kept for this seq only, never the next phase's
        return {**state, "views": [*state.get("views", []), _view(ctx)]}
    phase.__name__ = f"context_{name}"
    return phase


for _name in CONTEXT_PHASES:
    context_views.phase(_name)(_context_phase(_name))
