"""phasegate.client, `phasegate start --api`, `phasegate list` and the client how-to's example
against a real orchestrator (uvicorn on a port), a real worker, PostgreSQL and the SQS server.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from phasegate.client import (
    AsyncClient,
    Client,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    Unauthenticated,
    Unavailable,
    WaitTimeout,
)
from phasegate.orchestrator.embedded import free_port
from phasegate.orchestrator.server import OrchestratorOptions, running_orchestrator
from phasegate.settings import Settings
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import (
    ROOT,
    fetch,
    fetchval,
    make_settings,
    running_worker,
    settings_env,
    wait_for,
    write_tokens,
)
from tests.integration.test_docs_examples import load_example
from tests.workflows_console import review
from tests.workflows_waits import signalled

ORDERS = load_example("orders").orders
REGISTRY = Registry([workflows.chain, workflows.gated, review, ORDERS, signalled])


@dataclass
class Stack:
    url: str
    tokens: dict[str, str]
    settings: Settings

    @property
    def dsn(self) -> str:
        return self.settings.database_url or ""


@pytest.fixture
async def stack(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str,
                tmp_path: Path) -> AsyncIterator[Stack]:
    workflows.LEDGER_DSN = database_url
    tokens = write_tokens(tmp_path / "tokens", {"val": "viewer", "otto": "operator"})
    settings = make_settings(database_url, queue_pair, sqs_endpoint, api_auth="tokens",
                             api_tokens_file=str(tmp_path / "tokens"))
    options = OrchestratorOptions(host="127.0.0.1", port=free_port())
    async with running_orchestrator(settings, REGISTRY, options) as orchestrator, \
            running_worker(settings, REGISTRY):
        yield Stack(orchestrator.url, tokens, settings)


async def test_async_client_starts_waits_lists_and_reports_typed_errors(stack: Stack) -> None:
    async with AsyncClient(stack.url, token=stack.tokens["otto"]) as api:
        run = await api.start("chain", {"n": 1}, workflow_id="c-1")
        assert run.workflow_id == "c-1" and run.status in ("pending", "running")
        done = await api.wait("c-1", timeout=60)
        assert done.status == "completed" and done.terminal and done.finished_at is not None
        again = await api.start("chain", {"n": 9}, workflow_id="c-1")  # idempotent on the id
        assert again.status == "completed"
        page = await api.list(workflow="chain")
        assert [r.workflow_id for r in page.runs] == ["c-1"] and page.next_cursor is None

        with pytest.raises(Conflict, match="finished runs cannot be cancelled"):
            await api.cancel("c-1")
        with pytest.raises(NotFound, match="missing"):
            await api.get("missing")
        with pytest.raises(InvalidRequest, match="unknown workflow 'nope'"):
            await api.start("nope")
        with pytest.raises(InvalidRequest, match="wait"):
            await api._call("GET", "/v1/workflows/c-1", params={"wait": 31})
    async with AsyncClient(stack.url, token=stack.tokens["val"]) as viewer:
        assert (await viewer.get("c-1")).status == "completed"
        with pytest.raises(Forbidden, match="operator"):
            await viewer.start("chain", {"n": 1})
    async with AsyncClient(stack.url, token="pgt_wrong") as stranger:
        with pytest.raises(Unauthenticated, match="not valid"):
            await stranger.get("c-1")
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", token="x") as nowhere:
        with pytest.raises(Unavailable) as caught:
            await nowhere.get("c-1")
        assert caught.value.status == 0
    assert await fetchval(stack.dsn, "SELECT count(*) FROM workflow_runs") == 1


async def test_review_approve_reject_and_wait_timeout(stack: Stack) -> None:
    async with AsyncClient(stack.url, token=stack.tokens["otto"]) as api:
        await api.start("review", {}, workflow_id="rv-1")
        held = await api.wait("rv-1", timeout=60)
        assert held.status == "awaiting_review" and held.settled and not held.terminal
        rejected = await api.reject("rv-1", "draft again")
        assert rejected.action == "reject" and rejected.run.status == "running"
        assert (await api.wait("rv-1", timeout=60)).status == "awaiting_review"
        approved = await api.approve("rv-1")
        assert approved.action == "approve"
        assert (await api.wait("rv-1", timeout=60)).status == "completed"
        with pytest.raises(Conflict, match="retry needs failed"):
            await api.retry("rv-1")
    drafts = await fetch(stack.dsn, "SELECT phase FROM checkpoints WHERE workflow_id = 'rv-1' "
                         "ORDER BY checkpoint_id")
    assert [r["phase"] for r in drafts] == ["draft", "draft", "publish"]

    # The sync client, in a thread (it blocks): a run held at its gate does not settle, so
    # wait gives up with the run as last seen; then it is cancelled.
    def sync_part() -> tuple[str, str]:
        with Client(stack.url, token=stack.tokens["otto"]) as api:
            api.start("gated", {"gate": "g-sync"}, workflow_id="g-1")
            with pytest.raises(WaitTimeout) as caught:
                api.wait("g-1", timeout=1.0)
            cancelled = api.cancel("g-1", "not needed")
            return caught.value.run.status, cancelled.run.status

    last_seen, now = await asyncio.to_thread(sync_part)
    assert last_seen in ("pending", "running") and now == "cancelled"
    await fetch(stack.dsn, "INSERT INTO test_gates (name) VALUES ('g-sync')")


async def test_a_retried_decision_with_its_key_is_not_a_second_decision(stack: Stack) -> None:
    """With a real worker and orchestrator: the run is rejected with a key and comes back to
    review; a retry of that call (same key) answers the first rejection and does NOT reject
    the new review round. The approve with its own key completes the run."""
    async with AsyncClient(stack.url, token=stack.tokens["otto"]) as api:
        await api.start("review", {}, workflow_id="rv-k")
        assert (await api.wait("rv-k", timeout=60)).status == "awaiting_review"
        rejected = await api.reject("rv-k", "draft again", idempotency_key="rv-k/round-1")
        assert rejected.action == "reject" and rejected.run.status == "running"
        assert (await api.wait("rv-k", timeout=60)).status == "awaiting_review"
        retried = await api.reject("rv-k", "draft again", idempotency_key="rv-k/round-1")
        assert retried == rejected
        assert (await api.get("rv-k")).status == "awaiting_review"  # round 2 still open
        approved = await api.approve("rv-k", idempotency_key="rv-k/round-2")
        assert (await api.wait("rv-k", timeout=60)).status == "completed"
        assert await api.approve("rv-k", idempotency_key="rv-k/round-2") == approved
        with pytest.raises(Conflict, match="needs awaiting_review"):
            await api.approve("rv-k", idempotency_key="rv-k/round-3")
        with pytest.raises(InvalidRequest, match="idempotency-key"):
            await api.approve("rv-k", idempotency_key="round 3")
    actions = await fetch(stack.dsn, "SELECT action FROM control_actions WHERE "
                          "workflow_id = 'rv-k' ORDER BY action_id")
    assert [r["action"] for r in actions] == ["reject", "approve"]


async def test_signal_ends_a_wait_once_and_unknown_runs_are_typed(stack: Stack) -> None:
    async with AsyncClient(stack.url, token=stack.tokens["otto"]) as api:
        await api.start("signalled", {"timeout_s": 600}, workflow_id="sg-1")
        async def is_waiting() -> bool:
            return (await api.get("sg-1")).status == "waiting"

        await wait_for(is_waiting, timeout=60, what="the run to wait for its signal")
        waiting = await api.get("sg-1")
        assert waiting.waiting_for == "approval" and waiting.due_at is not None
        sent = await api.signal("sg-1", "approval", {"ok": True}, idempotency_key="k-1")
        assert sent.delivered and not sent.duplicate and sent.name == "approval"
        again = await api.signal("sg-1", "approval", {"ok": False}, idempotency_key="k-1")
        assert again.duplicate and again.signal_id == sent.signal_id  # the first one, once
        done = await api.wait("sg-1", timeout=60)
        assert done.status == "completed"
        with pytest.raises(NotFound):
            await api.signal("no-such-run", "approval", {})
        with pytest.raises(Conflict):
            await api.signal("sg-1", "approval", {})
    async with AsyncClient(stack.url, token=stack.tokens["val"]) as viewer:
        with pytest.raises(Forbidden):
            await viewer.signal("sg-1", "approval", {})
    state = await fetchval(stack.dsn, "SELECT state FROM checkpoints WHERE workflow_id = "
                           "'sg-1' AND phase = 'act' AND kind = 'phase'")
    assert json.loads(state)["signal"] == {"ok": True}


async def run_cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, *args, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 90)
    return process.returncode or 0, out.decode(), err.decode()


async def test_cli_start_through_the_api_and_list(stack: Stack, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(stack.tokens["otto"] + "\n")
    # No database or SQS settings at all: the API is all `start --api` needs.
    api_env = {"PHASEGATE_API_URL": stack.url, "PHASEGATE_API_TOKEN_FILE": str(token_file),
               "PHASEGATE_DATABASE_URL": "", "PHASEGATE_QUEUE_URL": ""}
    code, out, err = await run_cli("-m", "phasegate.cli", "start", "chain", "--input",
                                   '{"n": 2}', "--id", "cli-1", "-o", "json", env=api_env)
    assert code == 0, err
    assert json.loads(out)["workflow_id"] == "cli-1"
    code, out, err = await run_cli("-m", "phasegate.cli", "start", "nope", env=api_env)
    assert code == 2 and "unknown workflow 'nope'" in err
    code, out, err = await run_cli("-m", "phasegate.cli", "start", "chain", "--input", "{x",
                                   env=api_env)
    assert code == 2 and "--input is not valid JSON" in err
    await wait_for(lambda: _status(stack.dsn, "cli-1", "completed"), what="cli-1 completed")

    code, out, err = await run_cli("-m", "phasegate.cli", "list", "-o", "json", env=api_env)
    assert code == 0, err
    assert [r["workflow_id"] for r in json.loads(out)["runs"]] == ["cli-1"]
    db_env = {**settings_env(stack.settings), "PHASEGATE_API_URL": ""}
    code, out, err = await run_cli("-m", "phasegate.cli", "list", "--status", "completed",
                                   env=db_env)
    assert code == 0, err
    assert out.splitlines()[0].split()[:3] == ["ID", "STATUS", "WORKFLOW"]
    assert out.splitlines()[1].split()[:3] == ["cli-1", "completed", "chain"]
    code, out, err = await run_cli("-m", "phasegate.cli", "list", "--status", "bogus",
                                   env=db_env)
    assert code == 2 and "unknown status 'bogus'" in err
    code, out, err = await run_cli("-m", "phasegate.cli", "inspect", "cli-1", "-o", "json",
                                   env=api_env)
    assert code == 0 and json.loads(out)["run"]["status"] == "completed"


async def test_the_client_example_runs_as_documented(stack: Stack) -> None:
    code, out, err = await run_cli(
        str(ROOT / "docs" / "examples" / "client.py"),
        env={"PHASEGATE_API_URL": stack.url, "PHASEGATE_API_TOKEN": stack.tokens["otto"]})
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] in ("started order-o-7: pending", "started order-o-7: running")
    assert lines[1:] == ["order-o-7 is completed", "cannot cancel order-o-7: HTTP 409"]


async def _status(dsn: str, workflow_id: str, status: str) -> bool:
    return await fetchval(dsn, "SELECT status FROM workflow_runs WHERE workflow_id = $1",
                          workflow_id) == status
