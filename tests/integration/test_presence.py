"""Worker presence (phasegate/presence.py, worker/presence.py) against real PostgreSQL: a
worker's own row, what "live" means, the purge of stale rows, the same through PgBouncer in
transaction mode, and a database that is down or hangs, which the reporter survives."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest
from structlog.testing import capture_logs

from bench.pgbouncer import PgBouncer
from phasegate.db import create_pool
from phasegate.orchestrator.presence_purge import PresencePurger
from phasegate.presence import (
    PresenceReport,
    live_workers,
    mark_stopped,
    purge_stale,
    report,
)
from phasegate.settings import Settings
from phasegate.worker.presence import PresenceReporter, WorkerState
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import fetch, fetchval, make_settings, running_worker, wait_for

REGISTRY = Registry([workflows.chain])
IDLE = WorkerState(in_flight=0, concurrency=4, watchdog="ok", flushes=0, last_flush_ago_s=None)


def row(worker_id: str, **changes: object) -> PresenceReport:
    values: dict[str, object] = dict(worker_id=worker_id, uptime_s=60.0, interval_s=15.0,
                                     in_flight=1, concurrency=4, watchdog="ok", flushes=0,
                                     last_flush_ago_s=None)
    return PresenceReport(**{**values, **changes})  # type: ignore[arg-type]


@asynccontextmanager
async def pool_for(dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(dsn, min_size=0, max_size=2, connect_timeout_s=2.0)
    try:
        yield pool
    finally:
        await pool.close()


async def test_a_worker_reports_itself_opaquely_and_leaves_when_it_stops(
        database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str) -> None:
    workflows.LEDGER_DSN = database_url
    settings: Settings = make_settings(database_url, queue_pair, sqs_endpoint,
                                       presence_interval_s=0.2)
    async with pool_for(database_url) as pool:
        async with running_worker(settings, REGISTRY):
            async def listed() -> bool:
                return len(await live_workers(pool)) == 1

            await wait_for(listed, what="the worker's presence row")
            (me,) = await live_workers(pool)
            assert re.fullmatch(r"w-[0-9a-f]{16}", me.worker_id)
            assert socket.gethostname() not in me.worker_id  # opaque: no hostname
            # "off" where this host gives the watchdog nothing to watch.
            assert me.watchdog in ("ok", "off") and me.concurrency == settings.concurrency
            assert me.interval_s == pytest.approx(0.2) and me.started_at <= me.last_seen
        # A clean stop marks the row at once; it is kept until the retention purges it.
        assert await live_workers(pool) == []
        assert await fetchval(database_url, "SELECT stopped_at IS NOT NULL FROM "
                              "worker_presence") is True


async def test_live_means_seen_within_two_intervals_and_stale_rows_are_purged(
        database_url: str) -> None:
    async with pool_for(database_url) as pool:
        await report(pool, row("w-fresh", last_flush_ago_s=30.0, flushes=2,
                               watchdog="pressure"))
        await report(pool, row("w-late"))
        await report(pool, row("w-gone"))
        await report(pool, row("w-stopped"))
        await mark_stopped(pool, "w-stopped")
        await fetch(database_url, "UPDATE worker_presence SET last_seen = now() - "
                    "interval '31 seconds' WHERE worker_id = 'w-late'")
        await fetch(database_url, "UPDATE worker_presence SET last_seen = now() - "
                    "interval '2 hours' WHERE worker_id = 'w-gone'")
        live = {w.worker_id: w for w in await live_workers(pool)}
        assert set(live) == {"w-fresh"}  # w-late missed two 15 s intervals
        fresh = live["w-fresh"]
        assert fresh.watchdog == "pressure" and fresh.flushes == 2
        assert fresh.last_flush_at is not None and fresh.last_flush_at < fresh.last_seen
        # The same count again keeps the flush time; a new flush moves it.
        flushed_at = fresh.last_flush_at
        await report(pool, row("w-fresh", last_flush_ago_s=5.0, flushes=2))
        assert (await live_workers(pool))[0].last_flush_at == flushed_at
        await report(pool, row("w-fresh", last_flush_ago_s=0.0, flushes=3))
        assert (await live_workers(pool))[0].last_flush_at > flushed_at

        assert await purge_stale(pool, 3600) == 1
        left = {r["worker_id"] for r in await fetch(database_url,
                                                    "SELECT worker_id FROM worker_presence")}
        assert left == {"w-fresh", "w-late", "w-stopped"}
        purger = PresencePurger(pool, retention_s=10)
        assert await purger.purge_once() == 1 and purger.purged == 1  # w-late, 31 s old


async def test_presence_through_pgbouncer_in_transaction_mode(
        pgbouncer: PgBouncer, database_url: str) -> None:
    async with pool_for(pgbouncer.route(database_url)) as pool:
        reporters = [PresenceReporter(pool, lambda: IDLE, interval_s=5.0) for _ in range(6)]
        for _ in range(3):
            assert all(await asyncio.gather(*(r.report_once() for r in reporters)))
        assert len(await live_workers(pool)) == 6
        assert await purge_stale(pool, 3600) == 0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def failures_logged(logs: list[dict[str, object]], at_least: int) -> bool:
    return sum(e["event"] == "presence_report_failed" for e in logs) >= at_least


async def test_a_database_that_is_down_or_hangs_never_stops_the_reporter() -> None:
    # Nothing listens: every connect is refused.
    refused = f"postgresql://postgres@127.0.0.1:{closed_port()}/none"
    # Accepts and never answers: only the reporter's own bound ends each try.
    held: list[asyncio.StreamWriter] = []
    silent = await asyncio.start_server(lambda r, w: held.append(w), "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    hanging = f"postgresql://postgres@127.0.0.1:{port}/none"
    try:
        for dsn, error in ((refused, "ConnectionRefusedError"), (hanging, "TimeoutError")):
            async with pool_for(dsn) as pool:
                reporter = PresenceReporter(pool, lambda: IDLE, interval_s=0.1)
                with capture_logs() as logs:
                    task = asyncio.create_task(reporter.run())
                    await wait_for(lambda: failures_logged(logs, 3), timeout=30,
                                   what=f"three failed reports against {error}")
                    assert not task.done(), "the reporter must outlive the database"
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                failed = [e for e in logs if e["event"] == "presence_report_failed"]
                assert {e["error"] for e in failed} == {error}
                assert reporter.reports == 0 and reporter.failures >= 3
    finally:
        for writer in held:
            writer.close()
        silent.close()
