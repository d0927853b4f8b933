"""Worker presence (migration 0015): how the orchestrator, which cannot see pods, knows which
workers are alive and what their memory watchdog is doing.

Each worker upserts its own row in ``worker_presence`` every ``PHASEGATE_PRESENCE_INTERVAL_S``
and at once when its watchdog changes state (phasegate/worker/presence.py). A row is *live*
while it was seen within two of its own intervals and its worker has not stopped; the
orchestrator deletes rows not seen for ``PHASEGATE_PRESENCE_RETENTION_S``. Each call is one
statement with no session state, so it works behind PgBouncer in transaction mode.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime

import asyncpg
from pydantic import BaseModel

from phasegate.sql import queries

# What a worker's watchdog is doing: ok; pressure (it flushed and runs at reduced
# concurrency until the pressure is over); flushing (an emergency flush in progress); off (no
# watchdog on that host: no cgroup signals, or PHASEGATE_WATCHDOG_ENABLED=false).
WATCHDOG_STATES = ("ok", "pressure", "flushing", "off")
MAX_LIVE = 500


def new_worker_id() -> str:
    """Opaque and random per worker process: no hostname, nothing about a machine or a user."""
    return "w-" + secrets.token_hex(8)


@dataclass(frozen=True)
class PresenceReport:
    """One worker's row. Durations are from the worker's monotonic clock; the database turns
    them into times with its own ``now()``."""

    worker_id: str
    uptime_s: float
    interval_s: float
    in_flight: int
    concurrency: int
    watchdog: str
    flushes: int
    last_flush_ago_s: float | None


class WorkerPresence(BaseModel):
    worker_id: str
    started_at: datetime
    last_seen: datetime
    interval_s: float
    in_flight: int
    concurrency: int
    watchdog: str
    flushes: int
    last_flush_at: datetime | None


async def report(pool: asyncpg.Pool, row: PresenceReport) -> None:
    await pool.execute(queries("presence.sql")["report"], row.worker_id, row.uptime_s,
                       row.interval_s, row.in_flight, row.concurrency, row.watchdog,
                       row.flushes, row.last_flush_ago_s)


async def mark_stopped(pool: asyncpg.Pool, worker_id: str) -> None:
    await pool.execute(queries("presence.sql")["stopped"], worker_id)


async def live_workers(pool: asyncpg.Pool, limit: int = MAX_LIVE) -> list[WorkerPresence]:
    rows = await pool.fetch(queries("presence.sql")["live"], limit)
    return [WorkerPresence(**dict(r)) for r in rows]


async def purge_stale(pool: asyncpg.Pool, older_than_s: float) -> int:
    """Delete rows not seen for ``older_than_s`` seconds; how many went."""
    status = await pool.execute(queries("presence.sql")["purge"], float(older_than_s))
    return int(str(status).rsplit(" ", 1)[-1])
