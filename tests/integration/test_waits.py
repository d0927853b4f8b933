"""Timers (``ctx.defer_next``): the wait lives in PostgreSQL, the relay sends the successor
when it is due, and neither a worker nor the orchestrator has to survive the wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest
from prometheus_client import REGISTRY as REGISTRY_METRICS

from phasegate.envelope import phase_message
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.embedded import free_port
from phasegate.orchestrator.exporter import QueueDepthExporter
from phasegate.orchestrator.relay import Relay
from phasegate.orchestrator.starter import start_workflow
from phasegate.orchestrator.views import Views
from phasegate.queue import Outgoing
from phasegate.settings import Settings
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import (
    ROOT,
    all_done,
    fetch,
    fetchval,
    queue_for,
    running_relay,
    running_worker,
    settings_env,
    spawn_worker,
    stop_process,
    store_for,
    wait_for,
)
from tests.workflows_waits import timed

MODULES = "tests.workflows_waits"
REGISTRY = Registry([timed])


@pytest.fixture
def settings(settings: Settings) -> Settings:
    workflows.LEDGER_DSN = settings.database_url
    return settings


def spawn_orchestrator(settings: Settings) -> subprocess.Popen[bytes]:
    env = {**os.environ, **settings_env(settings), "PHASEGATE_WORKFLOW_MODULES": MODULES,
           "PHASEGATE_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "phasegate.cli", "orchestrator", "--port", str(free_port()),
         "--exporter-interval", "0.5"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def start(settings: Settings, input: dict[str, object]) -> str:
    async with store_for(settings.database_url or "") as store, queue_for(settings) as queue:
        return (await start_workflow(store, queue, workflow=timed, input=input)).workflow_id


async def waiting(dsn: str, workflow_id: str, seq: int) -> bool:
    rows = await fetch(dsn, "SELECT status, next_seq FROM workflow_runs WHERE workflow_id = $1",
                       workflow_id)
    return bool(rows) and (rows[0]["status"], rows[0]["next_seq"]) == ("waiting", seq)


async def invocations(dsn: str) -> dict[str, int]:
    rows = await fetch(dsn, "SELECT phase, count(*) AS n FROM test_invocations GROUP BY phase")
    return {r["phase"]: r["n"] for r in rows}


@pytest.mark.slow
async def test_three_phase_run_waits_5s_with_every_worker_and_the_orchestrator_killed(
        settings: Settings) -> None:
    """The wait is committed: SIGKILL the only worker and the orchestrator during it; a fresh
    pair finishes the run, and phase b never runs before its due time (database time)."""
    dsn = settings.database_url or ""
    wid = await start(settings, {"wait_s": 5, "second_wait_s": 1})
    worker, orchestrator = spawn_worker(settings, modules=MODULES), spawn_orchestrator(settings)
    try:
        await wait_for(lambda: waiting(dsn, wid, 1), what="run waiting before phase b")
        for process in (worker, orchestrator):
            process.send_signal(signal.SIGKILL)
            assert process.wait(timeout=30) == -9
    finally:
        stop_process(worker)
        stop_process(orchestrator)
    row = (await fetch(dsn, "SELECT o.due_at, o.sent_at, r.due_at AS run_due, "
                       "o.due_at > now() AS ahead FROM outbox o JOIN workflow_runs r USING "
                       "(workflow_id) WHERE o.seq = 1"))[0]
    assert row["sent_at"] is None and row["due_at"] == row["run_due"]
    due = row["due_at"]
    worker, orchestrator = spawn_worker(settings, modules=MODULES), spawn_orchestrator(settings)
    try:
        await wait_for(lambda: all_done(dsn, [wid]), timeout=90, what="run completed")
    finally:
        stop_process(worker)
        stop_process(orchestrator)
    assert await invocations(dsn) == {"a": 1, "b": 1, "c": 1}
    b_ran = await fetchval(dsn, "SELECT min(at) FROM test_invocations WHERE phase = 'b'")
    assert b_ran >= due  # never before the due time (both are PostgreSQL's now())
    state = await fetchval(dsn, "SELECT state->'trail' FROM checkpoints WHERE seq = 2")
    assert state == '["a", "b", "c"]'
    assert await fetchval(dsn, "SELECT due_at FROM workflow_runs") is None


@pytest.mark.slow
async def test_crash_between_commit_and_timer_send_still_delivers_when_due(
        settings: Settings) -> None:
    """A kill point right after the commit of a phase that deferred its successor: the row
    is committed unsent with its due time; the relay sends it when due, once."""
    dsn = settings.database_url or ""
    wid = await start(settings, {"wait_s": 1})
    crashing = spawn_worker(settings, modules=MODULES,
                            extra_env={"PHASEGATE_FAULTS": "after_commit"})
    try:
        assert crashing.wait(timeout=60) == -9
    finally:
        stop_process(crashing)
    unsent = await fetch(dsn, "SELECT seq, due_at IS NOT NULL AS timed FROM outbox "
                         "WHERE sent_at IS NULL")
    assert [(r["seq"], r["timed"]) for r in unsent] == [(1, True)]
    async with running_relay(settings), running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(dsn, [wid]), what="run completed")
    assert await invocations(dsn) == {"a": 1, "b": 1, "c": 1}


async def test_waiting_run_shows_due_at_and_a_cancel_means_its_next_phase_never_runs(
        settings: Settings) -> None:
    """Cancel deletes the waiting run's timer row in its own transaction: nothing reaches SQS
    at the due time (the relay finds nothing to claim), and the next phase never runs."""
    dsn = settings.database_url or ""
    wid = await start(settings, {"wait_s": 1})
    async with store_for(dsn) as store, queue_for(settings) as queue:
        control = Control(store.pool, queue, REGISTRY, actor="test")
        async with running_worker(settings, REGISTRY) as worker:
            await wait_for(lambda: waiting(dsn, wid, 1), what="run waiting")
            run = await control.views.get_run(wid)
            assert run.status == "waiting" and run.due_at is not None
            assert run.waiting_for is None
            due = await fetchval(dsn, "SELECT due_at FROM outbox WHERE seq = 1")
            assert (await control.cancel(wid, "no longer needed")).run.status == "cancelled"
            assert await fetchval(dsn, "SELECT count(*) FROM outbox WHERE workflow_id = $1 "
                                  "AND sent_at IS NULL", wid) == 0
            await wait_for(lambda: _database_time_after(dsn, due), what="the due time passed")
            relay = Relay(store=store, queue=queue, after_s=settings.relay_after_s)
            assert await relay.relay_once() == 0  # nothing to send, now or later
            await wait_for(lambda: _drained(worker), what="queue empty")
    assert await invocations(dsn) == {"a": 1}
    assert await fetchval(dsn, "SELECT status FROM workflow_runs") == "cancelled"
    assert await fetchval(dsn, "SELECT count(*) FROM outbox WHERE seq = 1") == 0


async def test_retry_of_a_run_that_failed_while_waiting_drops_its_timer_row(
        settings: Settings) -> None:
    """A waiting run can end failed (``fail_run``: a message of it was quarantined after
    repeated crashes; set directly here). Its retry's resuming message replaces the old timer
    row, which is never sent."""
    dsn = settings.database_url or ""
    wid = await start(settings, {"wait_s": 3600})
    async with store_for(dsn) as store, queue_for(settings) as queue:
        async with running_worker(settings, REGISTRY):
            await wait_for(lambda: waiting(dsn, wid, 1), what="run waiting")
        await fetchval(dsn, "UPDATE workflow_runs SET status = 'failed', finished_at = now() "
                       "WHERE workflow_id = $1 RETURNING 1", wid)
        control = Control(store.pool, queue, REGISTRY, actor="test")
        assert (await control.retry(wid)).run.status == "running"
    rows = await fetch(dsn, "SELECT due_at IS NULL AS plain FROM outbox WHERE seq = 1")
    assert [r["plain"] for r in rows] == [True]  # only the resuming message is left


async def _database_time_after(dsn: str, moment: object) -> bool:
    return bool(await fetchval(dsn, "SELECT now() > $1::timestamptz", moment))


async def test_a_late_duplicate_of_the_waiting_phase_does_not_send_its_successor_early(
        settings: Settings) -> None:
    """A redelivered message of the phase that deferred (seq 0) is a duplicate: the worker
    makes sure its successor exists, but a successor not due yet is left to the relay, and
    the run stays waiting."""
    dsn = settings.database_url or ""
    wid = await start(settings, {"wait_s": 3600})
    async with running_worker(settings, REGISTRY) as worker:
        await wait_for(lambda: waiting(dsn, wid, 1), what="run waiting")
        async with store_for(dsn) as store:
            run = await store.load_for_phase(wid, "main", 0)
            assert run is not None and run.status == "waiting"
            assert await store.successor(wid, "main", 1) is None
        await wait_for(lambda: _drained(worker), what="queue drained")
    assert await fetchval(dsn, "SELECT sent_at FROM outbox WHERE seq = 1") is None
    assert await fetchval(dsn, "SELECT status FROM workflow_runs") == "waiting"
    assert await _due_soon(dsn) == 0


async def test_exporter_counts_waits_due_within_the_minute(settings: Settings) -> None:
    dsn = settings.database_url or ""
    soon, later = await start(settings, {"wait_s": 30}), await start(settings, {"wait_s": 600})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: waiting(dsn, soon, 1), what="first run waiting")
        await wait_for(lambda: waiting(dsn, later, 1), what="second run waiting")
    async with store_for(dsn) as store:
        exporter = QueueDepthExporter(queue=None, views=Views(store.pool))
        await exporter.poll_once()
    assert exporter.last_error is None
    assert REGISTRY_METRICS.get_sample_value("phasegate_timers_due_soon") == 1.0
    assert REGISTRY_METRICS.get_sample_value("phasegate_runs", {"status": "waiting"}) == 2.0


async def _due_soon(dsn: str) -> int:
    async with store_for(dsn) as store:
        return await Views(store.pool).timers_due_soon(60)


async def _relayed(relay: Relay) -> bool:
    return relay.relayed >= 1


async def _drained(worker: object) -> bool:
    depth = await worker.queue.depth()  # type: ignore[attr-defined]
    return depth.visible == 0 and depth.inflight == 0 and worker.held == 0  # type: ignore[attr-defined]



async def test_a_message_for_the_next_phase_before_its_due_time_does_not_end_the_wait(
        settings: Settings) -> None:
    """Only the wait's own row, sent by the relay when due (or a signal that ends the wait),
    wakes a waiting run. A message for the seq the run waits on that comes early (written by
    hand, by a stranger with send rights on the queue, by a tool replaying messages) is
    dropped as stale: the next phase does not run, the run stays waiting, its row unsent."""
    dsn = settings.database_url or ""
    wid = await start(settings, {"wait_s": 3600})
    async with running_worker(settings, REGISTRY) as worker:
        await wait_for(lambda: waiting(dsn, wid, 1), what="run waiting")
        # Neither the group load's statement (phasegate/group_commit.py) nor the single one
        # claims it (either would have: the run would read `running`).
        batch = await fetch(dsn, "SELECT status FROM phasegate_load_for_phases($1, $2, $3)",
                            [wid], ["main"], [1])
        assert [r["status"] for r in batch] == ["waiting"]
        async with store_for(dsn) as store:
            early = await store.load_for_phase(wid, "main", 1)
            assert early is not None and early.status == "waiting"
        async with queue_for(settings) as queue:
            forged = phase_message(wid, "timed", 1, "b")
            await queue.send([Outgoing(forged.to_json(), forged.group_id, uuid.uuid4().hex)])
        await wait_for(lambda: _drained(worker), what="the early message handled")
    assert await invocations(dsn) == {"a": 1}
    assert await fetchval(dsn, "SELECT status FROM workflow_runs") == "waiting"
    assert await fetchval(dsn, "SELECT sent_at FROM outbox WHERE seq = 1") is None
