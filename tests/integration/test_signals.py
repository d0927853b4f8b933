"""Signals (``ctx.wait_for_signal``, ``POST /v1/workflows/{id}/signals/{name}``,
``phasegate.send_signal``) against real PostgreSQL, SQS and an in-process worker and relay."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY as METRICS

import phasegate
from phasegate.orchestrator.api import Services, create_app
from phasegate.orchestrator.auth import TokenFile
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.fleet import FleetView
from phasegate.settings import Settings
from phasegate.signals import IDEMPOTENCY_KEY_RULE, SignalError, send_decision
from phasegate.store import create_pool
from phasegate.waits import SIGNAL_NAME_RULE
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import (
    all_done,
    bearer,
    fetch,
    fetchval,
    queue_for,
    running_relay,
    running_worker,
    wait_for,
    write_tokens,
)
from tests.workflows_waits import signalled, signalled_then_after

REGISTRY = Registry([signalled, signalled_then_after])


@pytest.fixture
async def client(settings: Settings, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    workflows.LEDGER_DSN = settings.database_url
    tokens = write_tokens(tmp_path / "tokens", {"op": "operator", "look": "viewer"})
    pool = await create_pool(settings.database_url or "", min_size=1, max_size=4)
    try:
        async with queue_for(settings) as queue:
            control = Control(pool, queue, REGISTRY, actor="op")
            app = create_app(Services(control=control, queue=queue, fleet=FleetView(
                None, reason="no cluster"), auth=TokenFile(tmp_path / "tokens")))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://api",
                                         headers=bearer(tokens["op"])) as client:
                client.headers["X-Viewer"] = tokens["look"]  # for the role test below
                yield client
    finally:
        await pool.close()


async def start(client: httpx.AsyncClient, run_id: str, timeout_s: float) -> None:
    response = await client.post("/v1/workflows", json={
        "workflow": "signalled", "input": {"timeout_s": timeout_s}, "id": run_id})
    assert response.status_code == 201, response.text


async def final_state(dsn: str, run_id: str) -> Any:
    text = await fetchval(dsn, "SELECT state::text FROM checkpoints WHERE workflow_id = $1 "
                          "AND seq = 1 AND kind = 'phase'", run_id)
    return json.loads(text)


async def is_waiting(client: httpx.AsyncClient, run_id: str) -> bool:
    return (await client.get(f"/v1/workflows/{run_id}")).json()["status"] == "waiting"


async def test_a_waiting_run_completes_with_the_signal_payload(
        client: httpx.AsyncClient, settings: Settings) -> None:
    dsn = settings.database_url or ""
    await start(client, "sig-1", timeout_s=3600)
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: is_waiting(client, "sig-1"), what="run waiting for the signal")
        run = (await client.get("/v1/workflows/sig-1")).json()
        assert run["waiting_for"] == "approval" and run["due_at"] is not None
        # Another name is kept, and does not wake the run.
        other = await client.post("/v1/workflows/sig-1/signals/other", json={"payload": 1})
        assert other.status_code == 200 and other.json()["delivered"] is False
        assert await is_waiting(client, "sig-1")
        response = await client.post("/v1/workflows/sig-1/signals/approval",
                                     json={"payload": {"by": "ops", "ok": True}})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["delivered"] is True and body["duplicate"] is False and body["sent"] is True
        await wait_for(lambda: all_done(dsn, ["sig-1"]), what="run completed")
    state = await final_state(dsn, "sig-1")
    assert state["signal"] == {"by": "ops", "ok": True} and state["timed_out"] is False
    # After the end: 409, and the kept signal goes with the run when it is purged.
    late = await client.post("/v1/workflows/sig-1/signals/approval", json={"payload": 2})
    assert late.status_code == 409 and "completed" in late.json()["detail"]
    assert await fetchval(dsn, "SELECT count(*) FROM signals WHERE consumed_seq IS NULL") == 1
    await fetch(dsn, "DELETE FROM workflow_runs WHERE workflow_id = 'sig-1'")
    assert await fetchval(dsn, "SELECT count(*) FROM signals") == 0


async def test_a_phase_continued_after_the_signalled_one_sees_no_signal(
        client: httpx.AsyncClient, settings: Settings) -> None:
    """The signal is delivered to one seq: the phase after it, run in the same worker's chain
    (local continuation, on by default), gets ``ctx.signal`` None, as it would from SQS."""
    dsn = settings.database_url or ""
    response = await client.post("/v1/workflows", json={
        "workflow": "signalled_then_after", "input": {}, "id": "sig-chain"})
    assert response.status_code == 201, response.text
    continued = METRICS.get_sample_value("phasegate_continued_hops_total") or 0.0
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: is_waiting(client, "sig-chain"), what="run waiting")
        response = await client.post("/v1/workflows/sig-chain/signals/approval",
                                     json={"payload": {"go": 1}})
        assert response.status_code == 200 and response.json()["delivered"] is True
        await wait_for(lambda: all_done(dsn, ["sig-chain"]), what="run completed")
    assert (METRICS.get_sample_value("phasegate_continued_hops_total") or 0.0) > continued
    text = await fetchval(dsn, "SELECT state::text FROM checkpoints WHERE workflow_id = $1 "
                          "AND seq = 2 AND kind = 'phase'", "sig-chain")
    assert json.loads(text) == {"act_signal": {"go": 1}, "after_signal": None}


async def test_a_wait_that_times_out_runs_the_next_phase_with_no_signal(
        client: httpx.AsyncClient, settings: Settings) -> None:
    dsn = settings.database_url or ""
    await start(client, "sig-2", timeout_s=1)
    async with running_worker(settings, REGISTRY), running_relay(settings):
        await wait_for(lambda: all_done(dsn, ["sig-2"]), what="run completed after the timeout")
    state = await final_state(dsn, "sig-2")
    assert state["signal"] is None and state["timed_out"] is True
    assert await fetchval(dsn, "SELECT count(*) FROM signals") == 0


async def test_a_signal_sent_before_the_wait_is_kept_and_a_duplicate_counts_once(
        client: httpx.AsyncClient, settings: Settings) -> None:
    """Sent while the run has not reached its wait (no worker yet), twice with one key
    (header, then body field): one signal. The wait finds it at its commit; no relay runs, so
    the worker itself sent the successor, due at once."""
    dsn = settings.database_url or ""
    await start(client, "sig-3", timeout_s=3600)
    first = await client.post("/v1/workflows/sig-3/signals/approval",
                              json={"payload": "early"}, headers={"Idempotency-Key": "k1"})
    again = await client.post("/v1/workflows/sig-3/signals/approval",
                              json={"payload": "again", "idempotency_key": "k1"})
    assert first.status_code == again.status_code == 200
    assert first.json()["delivered"] is False and first.json()["duplicate"] is False
    assert again.json()["duplicate"] is True
    assert again.json()["signal_id"] == first.json()["signal_id"]
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(dsn, ["sig-3"]), what="run completed")
    assert (await final_state(dsn, "sig-3"))["signal"] == "early"
    assert await fetchval(dsn, "SELECT count(*) FROM signals") == 1
    assert await fetchval(dsn, "SELECT consumed_seq FROM signals") == 1


async def test_send_signal_python_call(client: httpx.AsyncClient, settings: Settings) -> None:
    dsn = settings.database_url or ""
    await start(client, "sig-4", timeout_s=3600)
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        async with running_worker(settings, REGISTRY), running_relay(settings):
            await wait_for(lambda: is_waiting(client, "sig-4"), what="run waiting")
            result = await phasegate.send_signal(pool, "sig-4", "approval", [1, 2],
                                                 idempotency_key="once")
            assert result.delivered and not result.sent  # no queue given: the relay sends
            repeat = await phasegate.send_signal(pool, "sig-4", "approval", [3],
                                                 idempotency_key="once")
            assert repeat.duplicate and repeat.signal_id == result.signal_id
            await wait_for(lambda: all_done(dsn, ["sig-4"]), what="run completed")
        with pytest.raises(phasegate.SignalError) as refused:
            await phasegate.send_signal(pool, "no-such-run", "approval")
        assert refused.value.status_code == 404
    finally:
        await pool.close()
    assert (await final_state(dsn, "sig-4"))["signal"] == [1, 2]


@pytest.mark.parametrize(("path", "body", "status"), [
    ("/v1/workflows/missing/signals/approval", {"payload": 1}, 404),
    ("/v1/workflows/sig-5/signals/bad%20name", {"payload": 1}, 422),
    ("/v1/workflows/sig-5/signals/approval", {"payload": "nul \u0000"}, 422),
    ("/v1/workflows/sig-5/signals/approval", {"payload": 1, "idempotency_key": ""}, 422),
    ("/v1/workflows/sig-5/signals/approval", {"payload": 1, "extra": True}, 200),
    # Review decisions are reserved: approve/reject send them (test_tiers.py).
    ("/v1/workflows/sig-5/signals/phasegate.approve", {"payload": {"reason": "x"}}, 422),
    ("/v1/workflows/sig-5/signals/phasegate.reject", {}, 422),
])
async def test_signal_refusals(client: httpx.AsyncClient, settings: Settings, path: str,
                               body: dict[str, Any], status: int) -> None:
    await start(client, "sig-5", timeout_s=3600)
    response = await client.post(path, json=body)
    assert response.status_code == status, response.text
    if "phasegate." in path:
        assert "reserved" in response.json()["detail"]
    kept = await fetchval(settings.database_url or "", "SELECT count(*) FROM signals")
    assert kept == (1 if status == 200 else 0)  # nothing stored for a refusal


@pytest.mark.parametrize("where", ["header", "body"])
@pytest.mark.parametrize(("key", "rule"), [
    ("", False),                # empty
    ("k" * 201, False),         # too long
    ("two words", True),        # a space
    ("tab\there", True),        # a control character
    ("line\nbreak", True),      # a newline
    ("caf\u00e9", True),        # not ASCII
])
async def test_a_bad_idempotency_key_is_422_naming_the_field_and_stores_nothing(
        client: httpx.AsyncClient, settings: Settings, where: str, key: str,
        rule: bool) -> None:
    """The decision routes' rule (1-200 visible ASCII characters), in the header or the body."""
    await start(client, "sig-8", timeout_s=3600)
    if where == "header":
        # httpx refuses a newline in a header it sends; raw bytes reach the server as sent.
        response = await client.post("/v1/workflows/sig-8/signals/approval", json={},
                                     headers={"Idempotency-Key": key.encode()})
    else:
        response = await client.post("/v1/workflows/sig-8/signals/approval",
                                     json={"idempotency_key": key})
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == (["header", "idempotency-key"] if where == "header"
                              else ["body", "idempotency_key"])
    if rule:
        assert problem["msg"] == IDEMPOTENCY_KEY_RULE
    assert await fetchval(settings.database_url or "", "SELECT count(*) FROM signals") == 0
    # The longest key allowed, of every visible ASCII character class, is taken.
    longest = ("Az09-_.:/+=~!" * 16)[:200]
    taken = await client.post("/v1/workflows/sig-8/signals/approval",
                              json={"idempotency_key": longest} if where == "body" else {},
                              headers={"Idempotency-Key": longest} if where == "header" else {})
    assert taken.status_code == 200, taken.text


@pytest.mark.parametrize("name", ["bad name", "n" * 101, "caf\u00e9"])
async def test_a_bad_signal_name_is_422_stating_the_rule(client: httpx.AsyncClient,
                                                        name: str) -> None:
    """The path's name is refused with the rule in words, not the pattern that encodes it."""
    response = await client.post(f"/v1/workflows/missing/signals/{name}", json={})
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == [{"loc": ["path", "name"], "msg": SIGNAL_NAME_RULE,
                                          "type": "string_pattern_mismatch"}]


@pytest.mark.parametrize("name", ["bad name", "n" * 101, "trailing\n"])
async def test_send_signal_refuses_a_name_the_api_refuses(settings: Settings,
                                                           name: str) -> None:
    pool = await create_pool(settings.database_url or "", min_size=1, max_size=1)
    try:
        with pytest.raises(SignalError) as refused:
            await phasegate.send_signal(pool, "missing", name)
    finally:
        await pool.close()
    assert refused.value.status_code == 422 and str(refused.value) == SIGNAL_NAME_RULE


BAD_KEYS = ["", "k" * 201, "two words", "tab\there", "line\nbreak", "trailing\n", "caf\u00e9"]


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_send_signal_and_send_decision_refuse_a_key_the_api_refuses(
        client: httpx.AsyncClient, settings: Settings, key: str) -> None:
    """Python callers with a database connection are held to the API's rule: a SignalError
    (422) stating it, and nothing written, where a key of the right length used to be kept."""
    dsn = settings.database_url or ""
    await start(client, "sig-9", timeout_s=3600)
    await fetch(dsn, "INSERT INTO workflow_runs (workflow_id, workflow, schema_version, status, "
                "next_seq, current_phase) VALUES ('sig-10', 'signalled', 1, 'awaiting_review', "
                "1, 'act')")
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        with pytest.raises(SignalError) as signal_refused:
            await phasegate.send_signal(pool, "sig-9", "approval", 1, idempotency_key=key)
        with pytest.raises(SignalError) as decision_refused:
            await send_decision(pool, "sig-10", "approve", "ok", idempotency_key=key)
        for refused in (signal_refused.value, decision_refused.value):
            assert type(refused) is SignalError and refused.status_code == 422
            assert str(refused) == IDEMPOTENCY_KEY_RULE
        assert await fetchval(dsn, "SELECT count(*) FROM signals") == 0
        assert await fetchval(dsn, "SELECT count(*) FROM control_actions") == 0
        assert await fetchval(dsn, "SELECT status FROM workflow_runs "
                              "WHERE workflow_id = 'sig-10'") == "awaiting_review"
        # The longest key allowed, of every visible ASCII character class, is taken by both.
        longest = ("Az09-_.:/+=~!" * 16)[:200]
        kept = await phasegate.send_signal(pool, "sig-9", "approval", 1, idempotency_key=longest)
        decided = await send_decision(pool, "sig-10", "approve", "ok", idempotency_key=longest)
        assert not kept.duplicate and decided.delivered
    finally:
        await pool.close()


async def test_a_viewer_may_not_signal(client: httpx.AsyncClient) -> None:
    await start(client, "sig-6", timeout_s=3600)
    response = await client.post("/v1/workflows/sig-6/signals/approval", json={},
                                 headers=bearer(client.headers["X-Viewer"]))
    assert response.status_code == 403


async def test_the_relay_wakes_a_wait_that_a_kept_signal_already_satisfies(
        client: httpx.AsyncClient, settings: Settings) -> None:
    """The race the signal's transaction cannot see (it committed while the waiting phase's
    commit ran on an older snapshot) leaves a kept signal next to a wait for its name: the
    relay hands it over, once."""
    dsn = settings.database_url or ""
    await start(client, "sig-7", timeout_s=3600)
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: is_waiting(client, "sig-7"), what="run waiting")
        await fetch(dsn, "INSERT INTO signals (workflow_id, name, payload) "
                    "VALUES ('sig-7', 'approval', '\"raced\"'), ('sig-7', 'approval', '2')")
        async with running_relay(settings):
            await wait_for(lambda: all_done(dsn, ["sig-7"]), what="run completed")
    assert (await final_state(dsn, "sig-7"))["signal"] == "raced"
    rows = await fetch(dsn, "SELECT consumed_seq FROM signals ORDER BY signal_id")
    assert [r["consumed_seq"] for r in rows] == [1, None]  # the second is kept
