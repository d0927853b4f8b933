"""Schema versions across deploys against real PostgreSQL and SQS: a checkpoint written by
version 1 is upcast by version 2 code and the run goes on; without an upcaster chain the run
stops at needs_restart; `phasegate versions` counts what a rollout would do."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from click.testing import CliRunner

from phasegate import Context, Workflow
from phasegate.cli import main
from phasegate.envelope import canonical_json, state_hash
from phasegate.workflow import Registry
from tests import workflows_room
from tests.helpers import all_done, fetch, running_worker, wait_for
from tests.room_helpers import (  # noqa: F401 (fixtures)
    checkpoints,
    notes,
    run_row,
    settings_fixture,
    start,
    status_is,
)
from tests.workflows import record, wait_gate


def release(version: int, *, upcasts_from: tuple[int, ...] = (), hold: bool = False) -> Workflow:
    """The `doc` workflow as one release shipped it. v1 state has `title`; v2+ has `name`."""
    wf = Workflow("doc", schema_version=version)
    for old in upcasts_from:
        wf.upcast(from_version=old)(
            lambda s: {"name": s.pop("title"), **s} if "title" in s else s)

    @wf.phase("draft")
    async def draft(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
        await record(ctx)
        return {"title": state["title"]} if version == 1 else {"name": state["title"]}

    @wf.phase("publish")
    async def publish(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
        await record(ctx, str(version))
        if hold:
            await wait_gate("never")  # the old release is replaced while this phase runs
        return {**state, "published": state["name"].upper()}

    return wf


@pytest.fixture
def quick_stop(settings):
    return settings.model_copy(update={"shutdown_grace_s": 0.2})


async def a_run_left_by_release_1(settings) -> str:
    """Release 1 commits `draft`; it is replaced (its publish cancelled, the message handed
    back) before it commits `publish`."""
    old = release(1, hold=True)
    wid = await start(settings, old, {"title": "storm report"})
    async with running_worker(settings, Registry([old])):
        async def publishing() -> bool:
            return await notes(settings, wid, "publish") == ["1"]
        await wait_for(publishing, what="release 1 inside publish")
    return wid


async def test_an_upcaster_brings_an_old_checkpoint_forward_and_the_run_continues(quick_stop):
    wid = await a_run_left_by_release_1(quick_stop)
    async with running_worker(quick_stop, Registry([release(2, upcasts_from=(1,))])):
        await wait_for(lambda: all_done(quick_stop.database_url, [wid]), what="completed")
    rows = await checkpoints(quick_stop, wid)
    assert [(r["phase"], r["schema_version"]) for r in rows] == [("draft", 1), ("publish", 2)]
    assert rows[0]["state"] == {"title": "storm report"}
    assert rows[1]["state"] == {"name": "storm report", "published": "STORM REPORT"}
    assert await notes(quick_stop, wid, "publish") == ["1", "2"]


async def test_without_an_upcaster_chain_the_run_needs_a_restart(quick_stop):
    wid = await a_run_left_by_release_1(quick_stop)
    async with running_worker(quick_stop, Registry([release(3, upcasts_from=(2,))])):
        await wait_for(status_is(quick_stop, wid, "needs_restart"), what="needs_restart")
    run = await run_row(quick_stop, wid)
    assert run["error"] == ("schema_version: checkpoint at seq 0 has version 1, the loaded "
                            "code has 3 (no upcaster from version 1)")
    assert await notes(quick_stop, wid, "publish") == ["1"]  # release 3 never ran it


async def insert_run(dsn: str, wid: str, workflow: str, status: str,
                     checkpoint_version: int | None) -> None:
    """A run as some release left it: at its input, or after a checkpoint of a version."""
    state = canonical_json({"k": 1})
    await fetch(dsn, "INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, "
                "current_phase, schema_version) VALUES ($1, $2, $3, $4, 'only', 1)",
                wid, workflow, status, 0 if checkpoint_version is None else 1)
    if checkpoint_version is not None:
        await fetch(dsn, "INSERT INTO checkpoints (workflow_id, seq, phase, kind, "
                    "schema_version, state, state_hash) VALUES ($1, 0, 'only', 'phase', $2, "
                    "$3::jsonb, $4)", wid, checkpoint_version, state, state_hash(state))


def test_phasegate_versions_counts_what_a_rollout_would_do(settings):
    """Sync: the command runs its own event loop, as it does in a shell."""
    dsn = settings.database_url

    async def arrange() -> None:
        for wid, workflow, status, version in [
                ("a", "room-versioned", "pending", None), ("b", "room-versioned", "running", 3),
                ("c", "room-versioned", "awaiting_review", 3),
                ("d", "room-versioned", "running", 2), ("e", "room-versioned", "running", 1),
                ("f", "room-versioned", "completed", 1), ("g", "retired", "running", 1)]:
            await insert_run(dsn, wid, workflow, status, version)

    asyncio.run(arrange())
    env = {"PHASEGATE_DATABASE_URL": dsn, "PHASEGATE_LOG_FORMAT": "console"}
    result = CliRunner().invoke(main, ["versions", "--modules", "tests.workflows_room",
                                       "--json"], env=env)
    assert result.exit_code == 0, result.output
    report = {row["workflow"]: row for row in map(json.loads, result.output.splitlines())}
    assert {name: (r["in_flight"], r["recoverable"], r["upcastable"], r["needs_restart"])
            for name, r in report.items()} == {"room-versioned": (5, 3, 1, 1),
                                               "retired": (1, 0, 0, 1)}
    assert report["room-versioned"]["by_version"] == {"input": 1, "v1": 1, "v2": 1, "v3": 2}
    assert report["retired"]["note"] == "not in the loaded workflow modules"
    assert report["room-versioned"]["code_version"] == workflows_room.versioned.schema_version
    table = CliRunner().invoke(main, ["versions", "--modules", "tests.workflows_room"], env=env)
    assert table.exit_code == 0
    assert table.output.splitlines()[0].split()[:6] == [
        "workflow", "code", "in-flight", "recoverable", "upcastable", "needs_restart"]


def test_versions_needs_the_workflow_modules(settings):
    result = CliRunner().invoke(main, ["versions"], env={
        "PHASEGATE_DATABASE_URL": settings.database_url, "PHASEGATE_WORKFLOW_MODULES": ""})
    assert result.exit_code == 2 and "PHASEGATE_WORKFLOW_MODULES" in result.output

