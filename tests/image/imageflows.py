"""A workflow module mounted into the image for the container tests
(``PHASEGATE_WORKFLOW_MODULES=imageflows`` with ``PYTHONPATH`` at its directory).

``heap.grow`` allocates ``target_mb`` MiB of touched heap a little at a time, publishing how far
it got with ``ctx.progress`` after every step. Under a smaller ``docker run --memory`` limit the
kernel OOM-kills the worker; before that, the watchdog's headroom flush should have persisted
the progress, and a restarted phase continues from ``ctx.resumed_progress``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from phasegate import Context, Workflow

STEP_MB = 2
CHUNK = 1 << 20

heap = Workflow("heap", schema_version=1)


@heap.phase("grow")
async def grow(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    start = int((ctx.resumed_progress or {}).get("mb", 0))
    held: list[bytes] = []
    mb = start
    while mb < int(state["target_mb"]):
        held.extend(b"\x01" * CHUNK for _ in range(STEP_MB))  # touched pages, not a mapping
        mb += STEP_MB
        ctx.progress({"mb": mb})
        # A real phase awaits I/O between allocations; the flush runs in between.
        await asyncio.sleep(float(state.get("pause_s", 0.05)))
    return {"target_mb": state["target_mb"], "resumed_from_mb": start, "reached_mb": mb}
