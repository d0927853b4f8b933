"""The control CLI (status, inspect, cancel|retry|restart|approve|reject, purge) against real
PostgreSQL and SQS, both directly and through a running ``phasegate orchestrator``."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from phasegate.cli import main
from phasegate.envelope import canonical_json, state_hash
from phasegate.orchestrator.embedded import free_port
from phasegate.presence import PresenceReport, report
from phasegate.settings import Settings
from tests.helpers import fetch, fetchval, make_settings, queue_for, settings_env, store_for
from tests.integration.test_api_server import spawn_orchestrator


@pytest.fixture
def settings(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str) -> Settings:
    return make_settings(database_url, queue_pair, sqs_endpoint)


@pytest.fixture
def cli(settings: Settings) -> Iterator[Any]:
    env = {**settings_env(settings), "PHASEGATE_WORKFLOW_MODULES": "tests.workflows",
           "PHASEGATE_LOG_FORMAT": "json", "PHASEGATE_API_URL": ""}
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(main, list(args), env=env, catch_exceptions=False)

    yield invoke


def sql(settings: Settings, query: str, *args: Any) -> Any:
    return asyncio.run(fetch(settings.database_url or "", query, *args))


def value(settings: Settings, query: str, *args: Any) -> Any:
    return asyncio.run(fetchval(settings.database_url or "", query, *args))


def add_run(settings: Settings, workflow_id: str, status: str, *, workflow: str = "chain",
            phase: str | None = "transform", next_seq: int = 1, finished_days: float | None = None,
            retention_days: float | None = None) -> None:
    """A run with ``next_seq`` phase checkpoints and an outbox row per checkpoint."""
    sql(settings, "INSERT INTO workflow_runs (workflow_id, workflow, schema_version, status, "
        "next_seq, current_phase, input, finished_at, retention) VALUES ($1, $2, 1, $3, $4, $5, "
        "'{\"n\": 1}', now() - make_interval(secs => $6 * 86400), "
        "make_interval(secs => $7 * 86400))",
        workflow_id, workflow, status, next_seq, phase, finished_days, retention_days)
    for seq in range(next_seq):
        state = {"n": seq + 1, "trail": ["fetch", "transform"][: seq + 1]}
        canonical = canonical_json(state)
        sql(settings, "INSERT INTO checkpoints (workflow_id, seq, phase, kind, schema_version, "
            "state, state_hash, worker_id) VALUES ($1, $2, $3, 'phase', 1, $4::jsonb, $5, 'w1')",
            workflow_id, seq, ["fetch", "transform", "publish"][seq], canonical,
            state_hash(canonical))
        sql(settings, "INSERT INTO outbox (workflow_id, seq, dedup_id, group_id, body, sent_at) "
            "VALUES ($1, $2, $3, $1, '{}', now())", workflow_id, seq + 1,
            f"{workflow_id}-{seq}")


def add_worker(settings: Settings, worker_id: str, *, in_flight: int, watchdog: str) -> None:
    """A worker's presence row, written as a worker writes it (phasegate/presence.py)."""
    async def put() -> None:
        async with store_for(settings.database_url or "") as store:
            await report(store.pool, PresenceReport(worker_id, 30.0, 15.0, in_flight, 4,
                                                    watchdog, 0, None))
    asyncio.run(put())


def test_status_shows_runs_queue_and_fleet(cli: Any, settings: Settings) -> None:
    empty = cli("status")
    assert empty.exit_code == 0, empty.output
    assert "no workflow runs" in empty.stdout
    add_run(settings, "a", "running")
    add_run(settings, "b", "running")
    add_run(settings, "c", "completed", phase=None, next_seq=3, finished_days=0.5)
    sql(settings, "UPDATE workflow_runs SET tier = 1, tier_label = 'draft', status = status "
        "WHERE workflow_id = 'a'")  # status named: the position follows (migration 0031)
    assert "workers: none live (the fleet may be scaled to zero)" in empty.stdout
    add_worker(settings, "w-1", in_flight=2, watchdog="ok")
    add_worker(settings, "w-2", in_flight=1, watchdog="pressure")
    result = cli("status", "--watch", "--interval", "0", "--count", "2")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.count("phasegate status (Ctrl-C to stop)") == 2
    assert "queue: 0 visible, 0 in flight, 0 delayed" in out
    assert "fleet: not running in a Kubernetes cluster" in out
    assert "workers: 2 live, 3 of 8 in flight; watchdog ok x1, pressure x1" in out
    # a and b: a running run's successor, sent, its phase not committed.
    assert re.search(r"^messages: oldest not started - \(0\), oldest uncommitted \d\S* \(2\)$",
                     out, re.MULTILINE)
    document = json.loads(cli("status", "-o", "json").stdout)
    assert [w["worker_id"] for w in document["workers"]] == ["w-1", "w-2"]
    assert (document["ages"]["not_started"], document["ages"]["uncommitted"]) == (0, 2)
    rows = [line.split() for line in out.splitlines()]
    assert ["completed", "chain", "-", "-", "1", "-"] in rows
    assert ["running", "chain", "transform", "-", "1"] in [r[:5] for r in rows]
    assert ["running", "chain", "transform", "1", "draft", "1"] in [r[:6] for r in rows]


def test_inspect_shows_history_and_actions(cli: Any, settings: Settings) -> None:
    add_run(settings, "i-1", "failed", next_seq=2)
    result = cli("inspect", "i-1", "--state")
    assert result.exit_code == 0, result.output
    assert "status:    failed" in result.stdout
    assert "transform  phase" in result.stdout and "fetch      phase" in result.stdout
    assert '{"n": 2, "trail": ["fetch", "transform"]}' in result.stdout
    missing = cli("inspect", "nope")
    assert missing.exit_code == 1 and "no workflow run with id 'nope'" in missing.stderr


def test_actions_directly_against_the_database(cli: Any, settings: Settings) -> None:
    add_run(settings, "f-1", "failed", next_seq=1)
    retried = cli("retry", "f-1", "--reason", "fixed the bug")
    assert retried.exit_code == 0, retried.output
    assert retried.stdout.strip() == "retry: f-1 is now running"
    row = sql(settings, "SELECT status, epoch FROM workflow_runs WHERE workflow_id = 'f-1'")[0]
    assert (row["status"], row["epoch"]) == ("running", 1)

    async def depth() -> int:
        async with queue_for(settings) as queue:
            return (await queue.depth()).visible

    assert asyncio.run(depth()) == 1
    again = cli("retry", "f-1")
    assert again.exit_code == 1 and "its status is 'running'" in again.stderr
    cancelled = cli("cancel", "f-1")
    assert cancelled.exit_code == 0 and "is now cancelled" in cancelled.stdout

    add_run(settings, "r-1", "needs_restart", next_seq=2)
    restarted = cli("restart", "r-1")
    assert restarted.exit_code == 0, restarted.output
    row = sql(settings, "SELECT base_seq, current_phase FROM workflow_runs "
              "WHERE workflow_id = 'r-1'")[0]
    assert (row["base_seq"], row["current_phase"]) == (2, "fetch")
    actions = cli("inspect", "f-1")
    assert "retry   failed" in actions.stdout and "fixed the bug" in actions.stdout
    assert cli("approve", "missing").exit_code == 1

    # A review decision with a key, straight to the database: a retry prints the first answer.
    add_run(settings, "v-1", "awaiting_review", next_seq=1)
    decided = cli("reject", "v-1", "--idempotency-key", "db-v-1", "-o", "json")
    assert decided.exit_code == 0, decided.output
    repeated = cli("reject", "v-1", "--idempotency-key", "db-v-1", "-o", "json")
    assert repeated.exit_code == 0 and json.loads(repeated.stdout) == json.loads(decided.stdout)
    assert value(settings, "SELECT count(*) FROM control_actions "
                 "WHERE workflow_id = 'v-1'") == 1
    bad = cli("reject", "v-1", "--idempotency-key", "é")
    assert bad.exit_code == 2 and "visible ASCII" in bad.stderr


def test_purge_dry_run_then_batches(cli: Any, settings: Settings) -> None:
    for i in range(5):
        add_run(settings, f"old-{i}", "completed", phase=None, next_seq=3, finished_days=10)
    add_run(settings, "old-failed", "failed", next_seq=1, finished_days=8)
    add_run(settings, "kept-long", "completed", phase=None, next_seq=3, finished_days=10,
            retention_days=30)
    add_run(settings, "recent", "completed", phase=None, next_seq=3, finished_days=1)
    add_run(settings, "running", "running", next_seq=2)
    sql(settings, "UPDATE workflow_runs SET created_at = now() - interval '30 days' "
        "WHERE workflow_id = 'running'")

    dry = cli("purge", "--older-than", "7d", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.strip() == ("would delete 6 runs, 16 checkpoints, 16 outbox rows finished "
                                  "more than 7d ago")
    assert value(settings, "SELECT count(*) FROM workflow_runs") == 9

    done = cli("purge", "--older-than", "7d", "--batch-size", "4")
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == ("deleted 6 runs, 16 checkpoints, 16 outbox rows finished "
                                   "more than 7d ago in 2 batches")
    left = {r["workflow_id"] for r in sql(settings, "SELECT workflow_id FROM workflow_runs")}
    assert left == {"kept-long", "recent", "running"}
    orphans = value(settings, "SELECT count(*) FROM checkpoints WHERE workflow_id NOT IN "
                    "(SELECT workflow_id FROM workflow_runs)")
    assert orphans == 0
    bad = cli("purge", "--older-than", "soon")
    assert bad.exit_code == 2 and "not an age" in bad.stderr


def test_commands_through_the_api(cli: Any, settings: Settings) -> None:
    add_run(settings, "a-1", "awaiting_review", next_seq=1, workflow="chain")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = spawn_orchestrator(settings, port, "--no-relay")
    try:
        asyncio.run(_until_ready(url, process))
        status = cli("status", "--api", url)
        assert status.exit_code == 0, status.output
        assert "awaiting_review" in status.stdout and "queue: 0 visible" in status.stdout
        approved = cli("approve", "a-1", "--api", url, "--reason", "ok",
                       "--idempotency-key", "cli-a-1")
        assert approved.exit_code == 0, approved.output
        assert approved.stdout.strip() == "approve: a-1 is now running"
        # A retry of the command with its key (the first answer was lost): the same answer.
        again = cli("approve", "a-1", "--api", url, "--idempotency-key", "cli-a-1", "-o", "json")
        assert again.exit_code == 0, again.output
        assert json.loads(again.stdout)["action"] == "approve"
        refused = cli("reject", "a-1", "--api", url)
        assert refused.exit_code == 1 and "needs awaiting_review" in refused.stderr
        # A 422: one line per refused input, its field path and why; never a raw list.
        bad_key = cli("reject", "a-1", "--api", url, "--idempotency-key", "not ok")
        assert bad_key.exit_code == 2
        assert bad_key.stderr == "phasegate: header.idempotency-key: an idempotency key is " \
            "1-200 visible ASCII characters (no spaces)\n"
        two_bad = cli("signal", "a-1", "bad name", "--api", url, "--idempotency-key", "not ok")
        assert two_bad.exit_code == 2
        assert sorted(two_bad.stderr.splitlines()) == [
            "phasegate: body.idempotency_key: an idempotency key is 1-200 visible ASCII "
            "characters (no spaces)",
            "phasegate: path.name: a signal name is 1-100 characters, each an ASCII letter, "
            "a digit, '_', '.' or '-'"]
        long_name = cli("start", "w" * 201, "--api", url)
        assert long_name.exit_code == 2
        assert long_name.stderr == \
            "phasegate: body.workflow: String should have at most 200 characters\n"
        inspected = cli("inspect", "a-1", "--api", url)
        assert "approve  awaiting_review" in inspected.stdout
        assert cli("cancel", "zzz", "--api", url).exit_code == 1
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    unreachable = cli("status", "--api", url)
    assert unreachable.exit_code == 1 and "cannot reach the API" in unreachable.stderr


async def _until_ready(url: str, process: Any) -> None:
    from tests.helpers import wait_for

    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        async def ready() -> bool:
            assert process.poll() is None, "orchestrator exited"
            try:
                return (await client.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await wait_for(ready, timeout=60, what="orchestrator ready")
