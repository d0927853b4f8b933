"""``phasegate orchestrator`` as a real process: API, relay and exporter in one, a clean exit
0 on SIGTERM, and exit 2 naming the variable on a bad setting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from phasegate.envelope import phase_message
from phasegate.orchestrator.embedded import free_port
from phasegate.orchestrator.server import OrchestratorOptions, running_orchestrator
from phasegate.settings import Settings
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import (
    ROOT,
    bearer,
    fetch,
    fetchval,
    make_settings,
    queue_for,
    settings_env,
    wait_for,
    write_tokens,
)


@pytest.fixture
def settings(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str) -> Settings:
    return make_settings(database_url, queue_pair, sqs_endpoint)


def spawn_orchestrator(settings: Settings, port: int | None, *args: str,
                       extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, **settings_env(settings), "PHASEGATE_WORKFLOW_MODULES": "tests.workflows",
           "PHASEGATE_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT), **(extra_env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "phasegate.cli", "orchestrator",
         *(["--port", str(port)] if port is not None else []), "--exporter-interval", "0.2",
         *args],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def insert_stranded_successor(dsn: str) -> None:
    """A committed successor the worker never sent (it crashed between commit and send)."""
    message = phase_message("stranded", "chain", 1, "transform")
    await fetch(dsn, "INSERT INTO workflow_runs (workflow_id, workflow, schema_version, status, "
                "next_seq, current_phase) VALUES ('stranded', 'chain', 1, 'running', 1, "
                "'transform')")
    await fetch(dsn, "INSERT INTO outbox (workflow_id, seq, dedup_id, group_id, body, "
                "created_at) VALUES ('stranded', 1, $1, $2, $3, now() - interval '1 minute')",
                message.dedup_id, message.group_id, message.to_json())


async def test_orchestrator_process_serves_relays_exports_and_stops_cleanly(
        settings: Settings, tmp_path: Path) -> None:
    dsn = settings.database_url or ""
    await insert_stranded_successor(dsn)
    port = free_port()
    tokens = write_tokens(tmp_path / "tokens", {"ci": "operator"})
    process = spawn_orchestrator(settings, port, extra_env={
        "PHASEGATE_API_AUTH": "tokens", "PHASEGATE_API_TOKENS_FILE": str(tmp_path / "tokens")})
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5,
                                     headers=bearer(tokens["ci"])) as client:

            async def ready() -> bool:
                if process.poll() is not None:
                    raise AssertionError(process.stderr.read().decode()[-2000:]
                                         if process.stderr else "exited")
                try:
                    return (await client.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(ready, timeout=60, what="orchestrator ready")
            await wait_for(lambda: _sent(dsn, "stranded"), what="relay sent the successor")

            started = await client.post("/v1/workflows", json={"workflow": "chain",
                                                               "input": {"n": 1}})
            assert started.status_code == 201

            async def exported_two_visible() -> bool:
                text = (await client.get("/metrics")).text
                return 'phasegate_queue_messages{state="visible"} 2.0' in text

            await wait_for(exported_two_visible, what="exporter sees both messages")
            metrics = (await client.get("/metrics")).text
            assert "phasegate_oldest_unfinished_run_age_seconds" in metrics
            assert "phasegate_outbox_relayed_total 1.0" in metrics
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    assert code == 0, process.stderr.read().decode()[-2000:] if process.stderr else ""


async def _sent(dsn: str, workflow_id: str) -> bool:
    return bool(await fetchval(dsn, "SELECT sent_at IS NOT NULL FROM outbox WHERE "
                               "workflow_id = $1", workflow_id))


def test_bad_setting_exits_2_naming_the_variable(settings: Settings) -> None:
    process = spawn_orchestrator(settings, None, extra_env={"PHASEGATE_API_PORT": "not-a-port"})
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 2
    assert "PHASEGATE_API_PORT" in stderr.decode()


async def test_in_process_orchestrator_without_relay(settings: Settings) -> None:
    dsn = settings.database_url or ""
    options = OrchestratorOptions(host="127.0.0.1", port=0, relay=False,
                                  exporter_interval_s=0.1)
    async with running_orchestrator(settings, Registry([workflows.chain]), options) as orch:
        assert orch.port and orch.url == f"http://127.0.0.1:{orch.port}"
        async with httpx.AsyncClient(base_url=orch.url) as client:
            response = await client.post("/v1/workflows", json={"workflow": "chain"})
            assert response.status_code == 201
        assert orch._relay is None
    assert await fetchval(dsn, "SELECT count(*) FROM workflow_runs") == 1


async def test_a_start_answers_before_its_outbox_row_is_marked(settings: Settings) -> None:
    """The API's start: the run and its message written, the message sent, and the answer is
    the run as created (no read after the write). Marking the outbox row sent is left to the
    orchestrator's batch of marks: every row is marked, in the running orchestrator and by
    its stop for the starts just before it, and none is sent twice (no relay runs here)."""
    dsn = settings.database_url or ""
    options = OrchestratorOptions(host="127.0.0.1", port=0, relay=False,
                                  exporter_interval_s=0.1)
    async with running_orchestrator(settings, Registry([workflows.chain]),
                                    options) as orch, \
            httpx.AsyncClient(base_url=orch.url) as client:
        started = [(await client.post("/v1/workflows", json={
            "workflow": "chain", "input": {"n": i}, "id": f"marked-{i}"})) for i in range(4)]
        assert [r.status_code for r in started] == [201] * 4
        created = started[0].json()
        read = (await client.get("/v1/workflows/marked-0")).json()
        # The answer carries what a read of the run gives (before any worker took it).
        assert created == read, (created, read)
        assert created["status"] == "pending" and created["seq"] == 0

        async def marked() -> bool:
            return await fetchval(dsn, "SELECT count(*) FROM outbox "
                                       "WHERE sent_at IS NOT NULL") == 4
        await wait_for(marked, what="the batch marked the outbox rows")
        # Started just before the stop: marked by the stop's flush.
        late = [(await client.post("/v1/workflows", json={
            "workflow": "chain", "id": f"late-{i}"})).status_code for i in range(3)]
        assert late == [201] * 3
    rows = await fetch(dsn, "SELECT workflow_id, sent_at FROM outbox ORDER BY workflow_id")
    assert [(r["workflow_id"], r["sent_at"] is not None) for r in rows] == [
        *((f"late-{i}", True) for i in range(3)), *((f"marked-{i}", True) for i in range(4))]
    async with queue_for(settings) as queue:
        assert (await queue.depth()).visible == 7  # each start's message, once
