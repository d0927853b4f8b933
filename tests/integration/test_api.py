"""The orchestrator's HTTP API against real PostgreSQL and a real SQS server (moto over HTTP).

The HTTP layer runs in-process through httpx's ASGI transport; everything behind it (asyncpg,
aioboto3, the worker when one runs) is real.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from phasegate import Context, NonRetryableError, Workflow
from phasegate.envelope import dedup_id
from phasegate.orchestrator.api import INCLUDE_RULE, PATTERN_RULES, Services, create_app
from phasegate.orchestrator.auth import TokenFile
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.fleet import FleetView
from phasegate.queue import SqsQueue
from phasegate.settings import Settings
from phasegate.store import create_pool
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import (
    bearer,
    fetch,
    fetchval,
    make_settings,
    queue_for,
    running_worker,
    wait_for,
    write_tokens,
)

# -- a workflow whose middle phase fails until a test opens its gate ---------------------------


def make_switch(version: int) -> Workflow:
    """``prep`` -> ``work`` (fails non-retryably while gate ``open-<id>`` is closed) -> ``end``."""
    switch = Workflow("switch", schema_version=version)

    @switch.phase("prep")
    async def prep(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
        await workflows.record(ctx)
        return {**state, "prepped": True}

    @switch.phase("work")
    async def work(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
        await workflows.record(ctx)
        opened = await fetchval(workflows.ledger_dsn(),
                                "SELECT 1 FROM test_gates WHERE name = $1",
                                f"open-{ctx.workflow_id}")
        if not opened:
            raise NonRetryableError("the gate is closed")
        return {**state, "worked": True}

    @switch.phase("end")
    async def end(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
        await workflows.record(ctx)
        return {**state, "ended": True}

    return switch


SWITCH = make_switch(1)
REGISTRY = Registry([workflows.chain, workflows.gated, SWITCH])


@dataclass
class Api:
    client: httpx.AsyncClient
    settings: Settings
    queue: SqsQueue
    control: Control

    @property
    def dsn(self) -> str:
        return self.settings.database_url or ""


@pytest.fixture
def settings(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str) -> Settings:
    workflows.LEDGER_DSN = database_url
    return make_settings(database_url, queue_pair, sqs_endpoint, max_attempts=2)


@pytest.fixture
async def api(settings: Settings, tmp_path: Path) -> AsyncIterator[Api]:
    # One admin token named "test": the action log's actor.
    tokens = write_tokens(tmp_path / "tokens", {"test": "admin"})
    pool = await create_pool(settings.database_url or "", min_size=1, max_size=4)
    try:
        async with queue_for(settings) as queue:
            control = Control(pool, queue, REGISTRY, actor="test")
            fleet = FleetView(None, reason="not running in a Kubernetes cluster")
            app = create_app(Services(control=control, queue=queue, fleet=fleet,
                                      auth=TokenFile(tmp_path / "tokens")))
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api",
                                         headers=bearer(tokens["test"])) as client:
                yield Api(client, settings, queue, control)
    finally:
        await pool.close()


async def status_of(api: Api, workflow_id: str) -> str:
    return str(await fetchval(api.dsn, "SELECT status FROM workflow_runs WHERE workflow_id = $1",
                              workflow_id))


async def run_is(api: Api, workflow_id: str, status: str) -> bool:
    return await status_of(api, workflow_id) == status


async def open_gate(api: Api, name: str) -> None:
    await fetch(api.dsn, "INSERT INTO test_gates (name) VALUES ($1)", name)


async def fail_switch_run(api: Api, workflow_id: str) -> None:
    """Start a switch run and let a worker take it to `failed` at phase work (seq 1)."""
    response = await api.client.post("/v1/workflows", json={
        "workflow": "switch", "input": {"n": 1}, "id": workflow_id})
    assert response.status_code == 201, response.text
    async with running_worker(api.settings, REGISTRY):
        await wait_for(lambda: run_is(api, workflow_id, "failed"), what="run failed")


# -- start, get, list ---------------------------------------------------------------------------


async def test_start_writes_run_and_outbox_then_sends(api: Api) -> None:
    response = await api.client.post("/v1/workflows", json={"workflow": "chain",
                                                             "input": {"n": 2}, "id": "s-1"})
    assert response.status_code == 201
    body = response.json()
    assert body["workflow_id"] == "s-1" and body["status"] == "pending" and body["seq"] == 0
    assert body["current_phase"] == "fetch"
    outbox = await fetch(api.dsn, "SELECT seq, sent_at FROM outbox WHERE workflow_id = 's-1'")
    assert len(outbox) == 1 and outbox[0]["seq"] == 0 and outbox[0]["sent_at"] is not None
    assert (await api.queue.depth()).visible == 1

    again = await api.client.post("/v1/workflows", json={"workflow": "chain",
                                                         "input": {"n": 99}, "id": "s-1"})
    assert again.status_code == 200 and again.json()["workflow_id"] == "s-1"
    assert await fetchval(api.dsn, "SELECT count(*) FROM outbox") == 1
    assert json.loads(await fetchval(api.dsn, "SELECT input::text FROM workflow_runs")) == {
        "n": 2}

    generated = await api.client.post("/v1/workflows", json={"workflow": "chain"})
    assert generated.status_code == 201 and generated.json()["workflow_id"].startswith("wf_")


async def test_start_rejects_bad_requests(api: Api) -> None:
    unknown = await api.client.post("/v1/workflows", json={"workflow": "nope", "input": 1})
    assert unknown.status_code == 422 and "'nope'" in unknown.json()["detail"]
    bad_json = await api.client.post("/v1/workflows", content=b"{not json",
                                     headers={"content-type": "application/json"})
    assert bad_json.status_code == 422
    missing = await api.client.post("/v1/workflows", json={"input": 1})
    assert missing.status_code == 422
    bad_id = await api.client.post("/v1/workflows", json={"workflow": "chain",
                                                          "id": "has spaces@example.com"})
    assert bad_id.status_code == 422 and "opaque" in bad_id.json()["detail"]
    await api.client.post("/v1/workflows", json={"workflow": "chain", "id": "taken"})
    other = await api.client.post("/v1/workflows", json={"workflow": "switch", "id": "taken"})
    assert other.status_code == 409 and "chain" in other.json()["detail"]
    assert await fetchval(api.dsn, "SELECT count(*) FROM workflow_runs") == 1


async def test_run_completes_and_history_is_served(api: Api) -> None:
    await api.client.post("/v1/workflows", json={"workflow": "chain", "input": {"n": 1},
                                                 "id": "h-1"})
    async with running_worker(api.settings, REGISTRY):
        await wait_for(lambda: run_is(api, "h-1", "completed"), what="run completed")

    run = (await api.client.get("/v1/workflows/h-1")).json()
    assert run["status"] == "completed" and run["seq"] == 3 and run["current_phase"] is None
    assert run["finished_at"] is not None and run["error"] is None

    history = (await api.client.get("/v1/workflows/h-1/checkpoints")).json()
    assert [(c["seq"], c["phase"], c["kind"]) for c in history["checkpoints"]] == [
        (0, "fetch", "phase"), (1, "transform", "phase"), (2, "publish", "phase")]
    assert all(c["state"] is None and len(c["state_hash"]) == 64
               for c in history["checkpoints"])
    with_state = (await api.client.get("/v1/workflows/h-1/checkpoints",
                                       params={"include": "state"})).json()
    assert with_state["checkpoints"][-1]["state"] == {
        "n": 21, "trail": ["fetch", "transform", "publish"]}
    paged = (await api.client.get("/v1/workflows/h-1/checkpoints", params={"limit": 2})).json()
    assert len(paged["checkpoints"]) == 2 and paged["next_cursor"] is not None
    rest = (await api.client.get("/v1/workflows/h-1/checkpoints",
                                 params={"after": paged["next_cursor"]})).json()
    assert [c["seq"] for c in rest["checkpoints"]] == [2] and rest["next_cursor"] is None
    bad = await api.client.get("/v1/workflows/h-1/checkpoints", params={"include": "all"})
    assert bad.status_code == 422


async def test_unknown_ids_are_404(api: Api) -> None:
    for method, path in [("GET", "/v1/workflows/missing"),
                         ("GET", "/v1/workflows/missing/checkpoints"),
                         ("GET", "/v1/workflows/missing/actions"),
                         *[("POST", f"/v1/workflows/missing/{a}")
                           for a in ("cancel", "retry", "restart", "approve", "reject")]]:
        response = await api.client.request(method, path)
        assert response.status_code == 404, (path, response.text)
        assert "missing" in response.json()["detail"]


async def test_a_bad_include_is_422_stating_the_rule(api: Api) -> None:
    response = await api.client.get("/v1/workflows/missing/checkpoints",
                                    params={"include": "all"})
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == [{"loc": ["query", "include"], "msg": INCLUDE_RULE,
                                          "type": "string_pattern_mismatch"}]


def declared_patterns(node: Any) -> set[str]:
    """Every ``pattern`` in an OpenAPI document: parameters' and bodies' fields alike."""
    if isinstance(node, dict):
        own = {node["pattern"]} if isinstance(node.get("pattern"), str) else set()
        return own.union(*(declared_patterns(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(declared_patterns(value) for value in node))
    return set()


async def test_every_pattern_a_route_declares_has_its_rule_in_words(api: Api) -> None:
    """A 422 for a pattern never leaves the caller to read a regular expression: a route
    that declares a new one fails here until PATTERN_RULES words it."""
    spec = (await api.client.get("/openapi.json")).json()
    patterns = declared_patterns(spec["paths"]) | declared_patterns(spec["components"])
    assert patterns and patterns <= PATTERN_RULES.keys(), patterns - PATTERN_RULES.keys()


async def insert_runs(dsn: str, rows: list[tuple[str, str, str, str | None, int]]) -> None:
    """(id, workflow, status, phase, age in minutes of created_at/updated_at)."""
    for wid, workflow, status, phase, minutes in rows:
        await fetch(dsn, "INSERT INTO workflow_runs (workflow_id, workflow, status, "
                    "current_phase, schema_version, created_at, updated_at, finished_at) "
                    "VALUES ($1, $2, $3, $4, 1, now() - make_interval(mins => $5), "
                    "now() - make_interval(mins => $5), CASE WHEN $3 IN ('completed', "
                    "'failed', 'cancelled') THEN now() - make_interval(mins => $5) END)",
                    wid, workflow, status, phase, minutes)


async def test_list_is_keyset_paginated_newest_first_and_filtered(api: Api) -> None:
    await insert_runs(api.dsn, [
        (f"r{i:02d}", "chain" if i % 2 else "gated", "running" if i % 3 else "completed",
         "fetch" if i % 2 else "held", 100 - i) for i in range(10)])
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await api.client.get("/v1/workflows", params=params)).json()
        seen += [r["workflow_id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"r{i:02d}" for i in reversed(range(10))]

    async def ids(**params: Any) -> list[str]:
        response = await api.client.get("/v1/workflows", params=params)
        assert response.status_code == 200, response.text
        return [r["workflow_id"] for r in response.json()["runs"]]

    assert await ids(status="completed") == ["r09", "r06", "r03", "r00"]
    assert await ids(workflow="gated", status="running") == ["r08", "r04", "r02"]
    assert await ids(phase="fetch", limit=2) == ["r09", "r07"]
    assert await ids(workflow="nothing") == []
    for params in ({"status": "bogus"}, {"limit": 0}, {"limit": 501}, {"cursor": "%%%"},
                   {"cursor": "bm90IGEgY3Vyc29y"}):
        response = await api.client.get("/v1/workflows", params=params)
        assert response.status_code == 422, params


# -- cancel -------------------------------------------------------------------------------------


async def test_cancel_pending_and_refuse_finished(api: Api) -> None:
    await api.client.post("/v1/workflows", json={"workflow": "chain", "id": "c-1"})
    response = await api.client.post("/v1/workflows/c-1/cancel", json={"reason": "typo"})
    assert response.status_code == 200, response.text
    assert response.json()["run"]["status"] == "cancelled"
    again = await api.client.post("/v1/workflows/c-1/cancel")
    assert again.status_code == 409
    assert "'cancelled'" in again.json()["detail"]
    actions = (await api.client.get("/v1/workflows/c-1/actions")).json()["actions"]
    assert [(a["action"], a["from_status"], a["reason"], a["actor"]) for a in actions] == [
        ("cancel", "pending", "typo", "test")]
    # The start message is still queued: a worker that receives it changes nothing.
    async with running_worker(api.settings, REGISTRY):
        await wait_for(lambda: _queue_empty(api), what="queue drained")
    assert await status_of(api, "c-1") == "cancelled"
    assert await fetchval(api.dsn, "SELECT count(*) FROM checkpoints") == 0


async def _queue_empty(api: Api) -> bool:
    depth = await api.queue.depth()
    return depth.visible + depth.inflight + depth.delayed == 0


async def test_cancel_while_a_phase_runs_commits_nothing(api: Api) -> None:
    await api.client.post("/v1/workflows", json={"workflow": "gated", "id": "g-1",
                                                 "input": {"gate": "g-1-gate"}})
    async with running_worker(api.settings, REGISTRY):
        await wait_for(lambda: _phase_started(api, "g-1", "held"), what="held phase running")
        response = await api.client.post("/v1/workflows/g-1/cancel")
        assert response.status_code == 200 and response.json()["run"]["status"] == "cancelled"
        await open_gate(api, "g-1-gate")
        await wait_for(lambda: _queue_empty(api), what="held message settled")
    assert await status_of(api, "g-1") == "cancelled"
    rows = await fetch(api.dsn, "SELECT seq FROM checkpoints WHERE workflow_id = 'g-1'")
    assert [r["seq"] for r in rows] == [0]  # `held` (seq 1) never committed
    assert await fetchval(api.dsn, "SELECT next_seq FROM workflow_runs") == 1


async def _phase_started(api: Api, workflow_id: str, phase: str) -> bool:
    return bool(await fetchval(api.dsn, "SELECT count(*) FROM test_invocations WHERE "
                               "workflow_id = $1 AND phase = $2", workflow_id, phase))


# -- retry, restart, approve, reject ---------------------------------------------------------


async def test_retry_resumes_a_failed_run_from_its_last_checkpoint(api: Api) -> None:
    await fail_switch_run(api, "f-1")
    run = (await api.client.get("/v1/workflows/f-1")).json()
    assert run["seq"] == 1 and run["current_phase"] == "work"
    # A user exception's message may echo state: the error keeps its type and a fingerprint.
    assert run["error"].startswith("NonRetryableError (message withheld")
    assert "gate is closed" not in run["error"]
    wrong = await api.client.post("/v1/workflows/f-1/approve")
    assert wrong.status_code == 409 and "'failed'" in wrong.json()["detail"]

    await open_gate(api, "open-f-1")
    response = await api.client.post("/v1/workflows/f-1/retry", json={"reason": "fixed"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["sent"] is True and body["run"]["status"] == "running"
    assert body["run"]["epoch"] == 1 and body["run"]["error"] is None
    # The resuming message escapes SQS's dedup window: its id carries the epoch. (The failed
    # attempt's own message has a row only if it came through SQS; the worker that ran prep
    # may have run work itself, local continuation, which writes none.)
    dedups = {r["dedup_id"] for r in await fetch(api.dsn, "SELECT dedup_id FROM outbox "
                                                 "WHERE workflow_id = 'f-1' AND seq = 1")}
    assert dedup_id("f-1", "main", 1, 1) in dedups
    assert dedups <= {dedup_id("f-1", "main", 1), dedup_id("f-1", "main", 1, 1)}
    async with running_worker(api.settings, REGISTRY):
        await wait_for(lambda: run_is(api, "f-1", "completed"), what="retried run completed")
    phases = [r["phase"] for r in await fetch(
        api.dsn, "SELECT phase FROM test_invocations WHERE workflow_id = 'f-1' ORDER BY id")]
    assert phases == ["prep", "work", "work", "end"]  # prep was not run again
    final = (await api.client.get("/v1/workflows/f-1/checkpoints",
                                  params={"include": "state"})).json()["checkpoints"]
    assert final[-1]["state"] == {"n": 1, "prepped": True, "worked": True, "ended": True}
    again = await api.client.post("/v1/workflows/f-1/retry")
    assert again.status_code == 409 and "'completed'" in again.json()["detail"]


async def test_restart_runs_a_needs_restart_run_again_from_its_input(api: Api) -> None:
    """A deploy changed the schema version mid-run: the worker halts the run with
    needs_restart; restart begins again at the first phase with the run's input."""
    await fail_switch_run(api, "v-1")
    v2 = Registry([make_switch(2)])
    await api.client.post("/v1/workflows/v-1/retry")
    async with running_worker(api.settings, v2):
        await wait_for(lambda: run_is(api, "v-1", "needs_restart"), what="needs_restart")
    retry = await api.client.post("/v1/workflows/v-1/retry")
    assert retry.status_code == 409 and "needs_restart" in retry.json()["detail"]

    v1_control = api.control.registry
    api.control.registry = v2
    try:
        await open_gate(api, "open-v-1")
        response = await api.client.post("/v1/workflows/v-1/restart")
        assert response.status_code == 200, response.text
        run = response.json()["run"]
        assert (run["status"], run["seq"], run["base_seq"], run["current_phase"],
                run["schema_version"]) == ("running", 1, 1, "prep", 2)
        async with running_worker(api.settings, v2):
            await wait_for(lambda: run_is(api, "v-1", "completed"), what="restarted run done")
    finally:
        api.control.registry = v1_control
    rows = await fetch(api.dsn, "SELECT seq, phase, schema_version, state::text FROM "
                       "checkpoints WHERE workflow_id = 'v-1' ORDER BY seq")
    assert [(r["seq"], r["phase"], r["schema_version"]) for r in rows] == [
        (0, "prep", 1), (1, "prep", 2), (2, "work", 2), (3, "end", 2)]
    assert json.loads(rows[1]["state"]) == {"n": 1, "prepped": True}


async def test_restart_needs_the_workflow_loaded(api: Api) -> None:
    await insert_runs(api.dsn, [("n-1", "gone", "needs_restart", "x", 5)])
    response = await api.client.post("/v1/workflows/n-1/restart")
    assert response.status_code == 409 and "not loaded" in response.json()["detail"]
    assert await status_of(api, "n-1") == "needs_restart"


@pytest.mark.parametrize("decision", ["approve", "reject"])
async def test_review_decisions_resume_the_phase(api: Api, decision: str) -> None:
    await fail_switch_run(api, "a-1")
    # The awaiting_review producer is another feature; put the run there directly.
    await fetch(api.dsn, "UPDATE workflow_runs SET status = 'awaiting_review', "
                "finished_at = NULL WHERE workflow_id = 'a-1'")
    stalls = (await api.client.get("/v1/stalls", params={"older_than_s": 0})).json()
    assert [(s["status"], s["phase"], s["runs"]) for s in stalls["stalls"]] == [
        ("awaiting_review", "work", 1)]
    cancel_wrong = await api.client.post("/v1/workflows/a-1/retry")
    assert cancel_wrong.status_code == 409

    await open_gate(api, "open-a-1")
    response = await api.client.post(f"/v1/workflows/a-1/{decision}",
                                     json={"reason": "looked fine" if decision == "approve"
                                           else "try again"})
    assert response.status_code == 200, response.text
    assert response.json()["run"]["status"] == "running"
    twice = await api.client.post(f"/v1/workflows/a-1/{decision}")
    assert twice.status_code == 409 and "awaiting_review" in twice.json()["detail"]
    actions = await fetch(api.dsn, "SELECT action, from_status, seq, epoch FROM "
                          "control_actions WHERE workflow_id = 'a-1'")
    assert [tuple(a) for a in actions] == [(decision, "awaiting_review", 1, 1)]
    async with running_worker(api.settings, REGISTRY):
        await wait_for(lambda: run_is(api, "a-1", "completed"), what="reviewed run completed")
    bad_body = await api.client.post(f"/v1/workflows/a-1/{decision}", content=b"{",
                                     headers={"content-type": "application/json"})
    assert bad_body.status_code == 422


# -- stalls, probes, metrics, OpenAPI -------------------------------------------------------


async def test_stalls_group_old_unfinished_runs(api: Api) -> None:
    await insert_runs(api.dsn, [
        ("st-1", "chain", "running", "fetch", 120), ("st-2", "chain", "running", "fetch", 30),
        ("st-3", "chain", "pending", "fetch", 60), ("st-4", "gated", "running", "held", 90),
        ("st-5", "chain", "completed", None, 500), ("st-6", "chain", "running", "fetch", 1)])
    # Naming status (unchanged) moves the position the report reads, and keeps the run's age
    # (migration 0031: the position trigger fires for status or updated_at).
    await fetch(api.dsn, "UPDATE workflow_runs SET tier = 2, tier_label = 'found', "
                "status = status WHERE workflow_id = 'st-4'")
    report = (await api.client.get("/v1/stalls", params={"older_than_s": 600})).json()
    groups = {(s["workflow"], s["phase"], s["status"], s["tier"]): s for s in report["stalls"]}
    assert set(groups) == {("chain", "fetch", "running", None),
                           ("chain", "fetch", "pending", None), ("gated", "held", "running", 2)}
    assert groups[("chain", "fetch", "running", None)]["runs"] == 2
    assert groups[("chain", "fetch", "running", None)]["oldest_age_s"] >= 120 * 60
    assert groups[("gated", "held", "running", 2)]["tier_label"] == "found"
    assert report["stalls"][0]["workflow"] == "chain"  # oldest first
    assert (await api.client.get("/v1/stalls", params={"older_than_s": -1})).status_code == 422


async def test_probes_metrics_and_openapi(api: Api, settings: Settings) -> None:
    assert (await api.client.get("/healthz")).text == "ok\n"
    ready = await api.client.get("/readyz")
    assert ready.status_code == 200 and ready.text == "ready\n"
    metrics = await api.client.get("/metrics")
    assert metrics.status_code == 200 and "phasegate_queue_messages" in metrics.text
    spec = (await api.client.get("/openapi.json")).json()
    for path in ("/v1/workflows", "/v1/workflows/{workflow_id}",
                 "/v1/workflows/{workflow_id}/checkpoints", "/v1/workflows/{workflow_id}/retry",
                 "/v1/stalls", "/v1/fleet", "/healthz", "/readyz"):
        assert path in spec["paths"], path
    assert (await api.client.get("/docs")).status_code == 200
    fleet = (await api.client.get("/v1/fleet")).json()
    assert fleet["fleet"]["in_cluster"] is False and "not running" in fleet["fleet"]["message"]
    assert fleet["queue"]["visible"] == 0

    broken_queue = SqsQueue(settings.queue_url + "-missing", endpoint_url=settings.sqs_endpoint_url,
                            region="us-east-1")
    async with broken_queue:
        app = create_app(Services(control=api.control, queue=broken_queue,
                                  fleet=FleetView(None, reason="none")))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://api") as client:
            not_ready = await client.get("/readyz")
            assert not_ready.status_code == 503 and "sqs" in not_ready.text
            summary = (await client.get("/v1/summary")).json()
            assert summary["queue"]["error"]


async def test_summary_counts_runs(api: Api) -> None:
    await insert_runs(api.dsn, [
        ("su-1", "chain", "running", "fetch", 3), ("su-2", "chain", "running", "fetch", 2),
        ("su-3", "chain", "completed", None, 9), ("su-4", "gated", "failed", "held", 4)])
    summary = (await api.client.get("/v1/summary")).json()
    rows = {(r["status"], r["workflow"], r["phase"]): r["runs"] for r in summary["runs"]}
    assert rows == {("running", "chain", "fetch"): 2, ("completed", "chain", None): 1,
                    ("failed", "gated", "held"): 1}
    assert summary["queue"] == {"visible": 0, "inflight": 0, "delayed": 0, "error": None}
