"""The queue-depth exporter against a real SQS server and PostgreSQL: what it exports, and
that failed polls are counted, logged and survived."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from phasegate.orchestrator.exporter import QueueDepthExporter
from phasegate.orchestrator.views import Views
from phasegate.queue import SqsQueue
from phasegate.settings import Settings
from phasegate.store import create_pool
from tests.helpers import fetch, make_settings, queue_for, send_raw, wait_for


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.fixture
def settings(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str) -> Settings:
    return make_settings(database_url, queue_pair, sqs_endpoint)


async def test_exports_queue_depth_by_state_and_oldest_unfinished_age(settings: Settings) -> None:
    for group in ("a", "b", "c"):
        await send_raw(settings, {"hello": group}, group=group)
    await fetch(settings.database_url or "", "INSERT INTO workflow_runs (workflow_id, workflow, "
                "schema_version, status, created_at) VALUES ('old', 'chain', 1, 'running', "
                "now() - interval '10 minutes'), ('done', 'chain', 1, 'completed', "
                "now() - interval '1 day')")
    pool = await create_pool(settings.database_url or "", min_size=1, max_size=2)
    try:
        async with queue_for(settings) as queue:
            await queue.receive(1, 0, 30)  # one message in flight
            exporter = QueueDepthExporter(queue=queue, views=Views(pool), interval_s=60)
            await exporter.poll_once()
    finally:
        await pool.close()
    assert sample("phasegate_queue_messages", state="visible") == 2
    assert sample("phasegate_queue_messages", state="inflight") == 1
    assert sample("phasegate_queue_messages", state="delayed") == 0
    assert 600 <= sample("phasegate_oldest_unfinished_run_age_seconds") < 86400
    assert exporter.last_depth is not None and exporter.last_error is None


async def test_exports_dlq_depth_and_runs_by_status(settings: Settings) -> None:
    await send_raw(settings, {"poison": 1}, group="p1", url=settings.dlq_url)
    await send_raw(settings, {"poison": 2}, group="p2", url=settings.dlq_url)
    await fetch(settings.database_url or "", "INSERT INTO workflow_runs (workflow_id, workflow, "
                "schema_version, status) VALUES ('r1', 'chain', 1, 'running'), "
                "('r2', 'chain', 1, 'running'), ('f1', 'chain', 1, 'failed')")
    pool = await create_pool(settings.database_url or "", min_size=1, max_size=2)
    try:
        async with queue_for(settings) as queue:
            exporter = QueueDepthExporter(queue=queue, views=Views(pool), interval_s=60,
                                          dlq=queue.sibling(settings.dlq_url or ""))
            await exporter.poll_once()
            assert exporter.last_error is None
            await fetch(settings.database_url or "",
                        "UPDATE workflow_runs SET status = 'completed' WHERE status = 'failed'")
            await exporter.poll_once()
    finally:
        await pool.close()
    assert sample("phasegate_dlq_messages", state="visible") == 2
    assert sample("phasegate_queue_messages", state="visible") == 0
    assert sample("phasegate_runs", status="running") == 2
    assert sample("phasegate_runs", status="completed") == 1
    assert sample("phasegate_runs", status="failed") == 0, "a status that emptied reads 0"
    assert sample("phasegate_runs", status="cancelled") == 0


async def test_failed_polls_are_counted_logged_and_survived(settings: Settings) -> None:
    pool = await create_pool(settings.database_url or "", min_size=1, max_size=1)
    await pool.close()  # every database call now fails
    missing = SqsQueue((settings.queue_url or "") + "-gone",
                       endpoint_url=settings.sqs_endpoint_url, region="us-east-1")
    before = {s: sample("phasegate_exporter_errors_total", source=s)
              for s in ("queue", "database")}
    async with missing:
        exporter = QueueDepthExporter(queue=missing, views=Views(pool), interval_s=0.01)
        with capture_logs() as logs:
            task = asyncio.create_task(exporter.run())
            await wait_for(lambda: _errors_above(before, 2), what="two failed rounds")
            exporter.stop()
            await asyncio.wait_for(task, 10)
    assert task.exception() is None
    failures = [e for e in logs if e["event"] == "exporter_poll_failed"]
    assert {e["source"] for e in failures} == {"queue", "database"}
    assert exporter.last_error is not None


async def _errors_above(before: dict[str, float], rounds: int) -> bool:
    return all(sample("phasegate_exporter_errors_total", source=s) >= before[s] + rounds
               for s in before)
