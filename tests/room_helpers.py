"""Helpers shared by the inside-the-room integration tests.

Test modules import the fixtures ``api_fixture`` and ``settings_fixture``; tests ask for them
as ``api`` and ``settings``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from phasegate.orchestrator.starter import start_workflow
from phasegate.settings import Settings
from phasegate.worker.examples.fake_api import FakeApi
from phasegate.workflow import Workflow
from tests import workflows, workflows_room
from tests.helpers import fetch, fetchval, make_settings, queue_for, store_for


@pytest.fixture(name="api")
def api_fixture() -> Iterator[FakeApi]:
    with FakeApi() as server:
        workflows_room.API_URL = server.url
        yield server
    workflows_room.API_URL = None


@pytest.fixture(name="settings")
def settings_fixture(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str) -> Settings:
    workflows.LEDGER_DSN = database_url
    return make_settings(database_url, queue_pair, sqs_endpoint)


async def start(settings: Settings, workflow: Workflow, input: Any) -> str:
    async with store_for(settings.database_url or "") as store, queue_for(settings) as queue:
        return (await start_workflow(store, queue, workflow=workflow, input=input)).workflow_id


async def status_of(settings: Settings, wid: str) -> str:
    return str(await fetchval(settings.database_url or "",
                              "SELECT status FROM workflow_runs WHERE workflow_id = $1", wid))


def status_is(settings: Settings, wid: str, status: str) -> Any:
    async def check() -> bool:
        return await status_of(settings, wid) == status
    return check


def exited(process: subprocess.Popen[bytes]) -> Any:
    async def check() -> bool:
        return process.poll() is not None
    return check


async def run_row(settings: Settings, wid: str) -> Any:
    rows = await fetch(settings.database_url or "",
                       "SELECT status, next_seq, current_phase, tier, tier_label, error, "
                       "review::text AS review, epoch FROM workflow_runs "
                       "WHERE workflow_id = $1", wid)
    return rows[0]


async def checkpoints(settings: Settings, wid: str) -> list[dict[str, Any]]:
    rows = await fetch(settings.database_url or "",
                       "SELECT seq, phase, schema_version, state::text AS state, tier, "
                       "tier_label, outcome, rerun_of, resource_versions::text AS resources "
                       "FROM checkpoints WHERE workflow_id = $1 AND kind = 'phase' "
                       "ORDER BY seq", wid)
    out = []
    for row in rows:
        item = dict(row)
        item["state"] = json.loads(item["state"])
        item["resources"] = json.loads(item["resources"]) if item["resources"] else None
        out.append(item)
    return out


async def notes(settings: Settings, wid: str, phase: str) -> list[str]:
    rows = await fetch(settings.database_url or "",
                       "SELECT note FROM test_invocations WHERE workflow_id = $1 AND phase = $2 "
                       "ORDER BY id", wid, phase)
    return [r["note"] for r in rows]


async def review_decision(settings: Settings, wid: str, action: str) -> None:
    """approve/reject through the orchestrator's control plane (what the API and CLI call)."""
    from phasegate.orchestrator.control import Control

    async with store_for(settings.database_url or "") as store, queue_for(settings) as queue:
        control = Control(store.pool, queue, None, actor="test")
        await getattr(control, action)(wid, f"{action} from the test")
