"""Review decisions with an ``Idempotency-Key`` header (``POST .../approve|reject``) against real
PostgreSQL and a real SQS server (moto over HTTP): a retry of the key gets the first answer,
a decision is made once however many requests carry its key, and a bad key is refused
before anything is written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from phasegate.orchestrator.api import Services, create_app
from phasegate.orchestrator.auth import TokenFile
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.fleet import FleetView
from phasegate.queue import SqsQueue
from phasegate.settings import Settings
from phasegate.store import create_pool
from phasegate.workflow import Registry
from tests.helpers import bearer, fetch, fetchval, make_settings, queue_for, write_tokens


@dataclass
class Api:
    client: httpx.AsyncClient
    queue: SqsQueue
    dsn: str


@pytest.fixture
def settings(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str) -> Settings:
    return make_settings(database_url, queue_pair, sqs_endpoint)


@pytest.fixture
async def api(settings: Settings, tmp_path: Path) -> AsyncIterator[Api]:
    tokens = write_tokens(tmp_path / "tokens", {"otto": "operator"})
    pool = await create_pool(settings.database_url or "", min_size=1, max_size=4)
    try:
        async with queue_for(settings) as queue:
            app = create_app(Services(
                control=Control(pool, queue, Registry()), queue=queue,
                fleet=FleetView(None, reason="not running in a Kubernetes cluster"),
                auth=TokenFile(tmp_path / "tokens")))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://api",
                                         headers=bearer(tokens["otto"])) as client:
                yield Api(client, queue, settings.database_url or "")
    finally:
        await pool.close()


async def under_review(dsn: str, workflow_id: str) -> None:
    """A run held for review at phase `work` (seq 1); no worker needed to decide it."""
    await fetch(dsn, "INSERT INTO workflow_runs (workflow_id, workflow, schema_version, status, "
                "next_seq, current_phase) VALUES ($1, 'switch', 1, 'awaiting_review', 1, 'work')",
                workflow_id)


async def decide(api: Api, workflow_id: str, action: str, key: str | bytes | None,
                 reason: str | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return await api.client.post(f"/v1/workflows/{workflow_id}/{action}",
                                 json={"reason": reason}, headers=headers)


async def written(api: Api, workflow_id: str) -> dict[str, Any]:
    """What deciding writes: the action log, the decision signal, the resuming message."""
    counts: dict[str, Any] = {}
    for table in ("control_actions", "signals", "outbox"):
        counts[table] = await fetchval(api.dsn, f"SELECT count(*) FROM {table} "
                                       "WHERE workflow_id = $1", workflow_id)
    counts["status"] = await fetchval(api.dsn, "SELECT status FROM workflow_runs "
                                      "WHERE workflow_id = $1", workflow_id)
    return counts


@pytest.mark.parametrize("action", ["approve", "reject"])
async def test_a_retry_with_the_same_key_gets_the_first_answer(api: Api, action: str) -> None:
    await under_review(api.dsn, "k-1")
    first = await decide(api, "k-1", action, "order-7f3a:review-1", "looked fine")
    assert first.status_code == 200, first.text
    assert first.json()["action"] == action and first.json()["sent"] is True
    assert first.json()["run"]["status"] == "running"
    assert "idempotent-replayed" not in first.headers
    # The run moves on (a worker ran the phase); the retry's answer is still the first one.
    await fetch(api.dsn, "UPDATE workflow_runs SET status = 'completed', next_seq = 2, "
                "finished_at = now(), updated_at = now() + interval '1 second' "
                "WHERE workflow_id = 'k-1'")
    again = await decide(api, "k-1", action, "order-7f3a:review-1", "looked fine")
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    # The key names the decision, not the path: the other action with it gets the same answer.
    other_path = await decide(api, "k-1", "reject" if action == "approve" else "approve",
                              "order-7f3a:review-1")
    assert other_path.status_code == 200 and other_path.json() == first.json()
    # A new key, or none, on a decided run: 409 as before.
    for key in ("order-7f3a:review-2", None):
        refused = await decide(api, "k-1", action, key)
        assert refused.status_code == 409, refused.text
        assert "awaiting_review" in refused.json()["detail"]
    # Decided once: one action, one signal, one resuming message sent.
    assert await written(api, "k-1") == {"control_actions": 1, "signals": 1, "outbox": 1,
                                         "status": "completed"}
    assert (await api.queue.depth()).visible == 1


async def test_concurrent_requests_with_one_key_decide_once(api: Api) -> None:
    await under_review(api.dsn, "k-2")
    answers = await asyncio.gather(*(decide(api, "k-2", "approve", "double-click")
                                     for _ in range(4)))
    assert [a.status_code for a in answers] == [200] * 4
    assert all(a.json() == answers[0].json() for a in answers)
    assert sorted(a.headers.get("idempotent-replayed", "") for a in answers) == [
        "", "true", "true", "true"]
    assert await written(api, "k-2") == {"control_actions": 1, "signals": 1, "outbox": 1,
                                         "status": "running"}
    assert (await api.queue.depth()).visible == 1


@pytest.mark.parametrize("key", [
    "",                     # empty
    "k" * 201,              # too long
    "two words",            # a space
    "tab\there",            # a control character
    b"caf\xc3\xa9",         # not ASCII
])
async def test_a_bad_key_is_422_and_changes_nothing(api: Api, key: str | bytes) -> None:
    await under_review(api.dsn, "k-3")
    response = await decide(api, "k-3", "approve", key)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["header", "idempotency-key"]
    assert await written(api, "k-3") == {"control_actions": 0, "signals": 0, "outbox": 0,
                                         "status": "awaiting_review"}
    # The longest key allowed, of every visible ASCII character class, is taken.
    longest = ("Az09-_.:/+=~!" * 16)[:200]
    assert (await decide(api, "k-3", "approve", longest)).status_code == 200


async def test_a_key_a_signal_used_is_not_a_decision(api: Api) -> None:
    """A run's signals and decisions share one key space (the signals table); a decision
    retried under a user signal's key would answer with something it never did: 409."""
    await under_review(api.dsn, "k-4")
    sent = await api.client.post("/v1/workflows/k-4/signals/note",
                                 json={"payload": 1, "idempotency_key": "shared"})
    assert sent.status_code == 200, sent.text
    refused = await decide(api, "k-4", "approve", "shared")
    assert refused.status_code == 409
    assert "used for a signal" in refused.json()["detail"]
    assert (await written(api, "k-4"))["status"] == "awaiting_review"
    assert (await decide(api, "k-4", "approve", "own-key")).status_code == 200
