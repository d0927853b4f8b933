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
