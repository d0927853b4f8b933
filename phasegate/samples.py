"""Sample workflows shipped with phasegate, used by ``phasegate demo`` and the docs.

Load them in a worker with ``PHASEGATE_WORKFLOW_MODULES=phasegate.samples``.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from phasegate import Context, Workflow

pipeline = Workflow("document-pipeline", schema_version=1)


def _work_seconds(workflow_id: str, phase: str) -> float:
    """50-250 ms of simulated work, deterministic per run and phase."""
    digest = hashlib.sha256(f"{workflow_id}:{phase}".encode()).digest()
    return 0.05 + digest[0] / 255 * 0.2


@pipeline.phase("ingest")
async def ingest(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(_work_seconds(ctx.workflow_id, ctx.phase))
    pages = int(state.get("pages", 3))
    return {"source": state.get("source", "inbox"), "pages": pages,
            "chunks": [f"chunk-{i}" for i in range(pages)]}


@pipeline.phase("enrich")
async def enrich(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(_work_seconds(ctx.workflow_id, ctx.phase))
    return {**state, "entities": len(state["chunks"]) * 2}


@pipeline.phase("summarize")
async def summarize(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(_work_seconds(ctx.workflow_id, ctx.phase))
    return {**state, "summary": f"{state['pages']} pages, {state['entities']} entities"}


@pipeline.phase("publish")
async def publish(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(_work_seconds(ctx.workflow_id, ctx.phase))
    return {**state, "published": True}
