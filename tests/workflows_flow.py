"""Workflows with flow control, for the concurrency and schedule tests (in-process and in
worker subprocesses: ``PHASEGATE_WORKFLOW_MODULES=tests.workflows_flow``).

``limited`` records, in its own state, when its first phase began and its last phase ended
(``t0``/``t1``, this host's clock): the tests measure overlap from those times.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from phasegate import Context, Workflow


def tenant(input: Any) -> str:
    return str(input["tenant"])  # KeyError/TypeError on a start without one: refused


# -- at most two runs per tenant: begin -> finish --------------------------------------------

limited = Workflow("limited", concurrency_key=tenant, max_concurrency=2)


@limited.phase("begin")
async def begin(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "t0": time.time()}


@limited.phase("finish")
async def finish(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    # Work that takes a moment, so that runs of one tenant would overlap without the limit.
    await asyncio.sleep(float(state.get("work_s", 0.3)))
    return {**state, "t1": time.time()}


# -- one run at a time per tenant (the held-lock races) ----------------------------------------

single = Workflow("single", concurrency_key=tenant, max_concurrency=1)


@single.phase("only")
async def only(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return state


# -- at most two admissions per tenant in any three seconds, no cap on runs at once ----------

paced = Workflow("paced", concurrency_key=tenant, rate=(2, 3.0))


@paced.phase("go")
async def go(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return state


# The same with a window long enough that no load on the test machine lets it pass between
# two steps of a test that needs runs to stay queued.
paced_slowly = Workflow("paced_slowly", concurrency_key=tenant, rate=(2, 15.0))


@paced_slowly.phase("go")
async def go_slowly(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return state


# -- a scheduled workflow (its schedule is the SDK's; the tests scan with injected times) ----

nightly = Workflow("nightly", schedule="0 3 * * *", schedule_input={"report": "daily"})


@nightly.phase("report")
async def report(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return state
