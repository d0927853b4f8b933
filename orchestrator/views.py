"""What the control plane shows: runs, their checkpoint history, stalls, the status summary.

Everything is read from the tables the worker writes; the control plane keeps no state of its
own. The models double as the API's response schemas (and so as its OpenAPI spec).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection
from datetime import datetime
from typing import Any

import asyncpg
from pydantic import BaseModel

from phasegate import access
from phasegate.access import ReadPolicy
from phasegate.sql import queries

UNFINISHED = ("pending", "running", "awaiting_review")
STATUSES = ("pending", "running", "awaiting_review", "completed", "failed", "cancelled",
            "needs_restart", "queued", "waiting")
MAX_PAGE = 500
MAX_CHECKPOINTS = 5000
# The status table counts completed and cancelled runs of the last day only.
SUMMARY_WINDOW_S = 86400.0


class ControlError(Exception):
    """A request the control plane refuses; ``status_code`` is the HTTP status it maps to."""

    status_code = 400

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotFound(ControlError):
    status_code = 404


class Conflict(ControlError):
    status_code = 409


class Invalid(ControlError):
    status_code = 422


class Run(BaseModel):
    workflow_id: str
    workflow: str
    status: str
    seq: int
    base_seq: int
    epoch: int
    current_phase: str | None
    schema_version: int
    tier: int | None
    tier_label: str | None
    attempts: int
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    classification: str = "internal"
    region: str | None = None
    # A waiting run (phasegate/waits.py): when its next phase becomes deliverable (database
    # time) and, for a signal wait, the signal's name.
    due_at: datetime | None = None
    waiting_for: str | None = None


class RunPage(BaseModel):
    runs: list[Run]
    next_cursor: str | None


class Checkpoint(BaseModel):
    checkpoint_id: int
    branch: str
    seq: int
    phase: str
    kind: str
    schema_version: int
    state_hash: str
    tier: int | None
    tier_label: str | None
    worker_id: str | None
    created_at: datetime
    state: Any = None
    access: str | None = None  # with state asked for: "read", or "denied" (state withheld)


class CheckpointPage(BaseModel):
    workflow_id: str
    checkpoints: list[Checkpoint]
    next_cursor: int | None


class Action(BaseModel):
    action_id: int
    action: str
    from_status: str
    seq: int
    epoch: int
    reason: str | None
    actor: str | None
    created_at: datetime


class Stall(BaseModel):
    workflow: str
    phase: str | None
    tier: int | None
    tier_label: str | None
    status: str
    runs: int
    oldest_age_s: float


class StallReport(BaseModel):
    older_than_s: float
    stalls: list[Stall]


class MessageAges(BaseModel):
    """How long messages have waited, from PostgreSQL (control.sql ``message_ages``)."""

    not_started_s: float | None
    not_started: int
    uncommitted_s: float | None
    uncommitted: int


class LiveWorker(BaseModel):
    """A live worker as the console's fleet page lists it (phasegate/presence.py): its opaque
    id and what it reports about itself, nothing about the pod or host it runs on."""

    worker_id: str
    watchdog: str
    in_flight: int
    concurrency: int
    flushes: int
    last_flush_at: datetime | None
    started_at: datetime
    last_seen: datetime


class SummaryRow(BaseModel):
    status: str
    workflow: str
    phase: str | None
    tier: int | None
    tier_label: str | None
    runs: int
    oldest_age_s: float | None


def run_from_row(row: asyncpg.Record) -> Run:
    values = dict(row)
    values["seq"] = values.pop("next_seq")
    return Run(**values)


def encode_cursor(created_at: datetime, workflow_id: str) -> str:
    raw = json.dumps([created_at.isoformat(), workflow_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, workflow_id = json.loads(raw)
        return datetime.fromisoformat(created), str(workflow_id)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise Invalid("cursor is not one this API returned") from exc


class Views:
    """The read side of the control plane over an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool, *, policy: ReadPolicy | None = None,
                 actor: str | None = None) -> None:
        self.pool = pool
        self.policy = policy
        self.actor = actor
        self._q = queries("control.sql")

    async def get_run(self, workflow_id: str) -> Run:
        row = await self.pool.fetchrow(self._q["get_run"], workflow_id)
        if row is None:
            raise NotFound(f"no workflow run with id {workflow_id!r}")
        return run_from_row(row)

    async def list_runs(self, *, status: str | None = None, workflow: str | None = None,
                        phase: str | None = None, limit: int = 50,
                        cursor: str | None = None) -> RunPage:
        if status is not None and status not in STATUSES:
            raise Invalid(f"unknown status {status!r}; one of {list(STATUSES)}")
        if not 1 <= limit <= MAX_PAGE:
            raise Invalid(f"limit must be between 1 and {MAX_PAGE}")
        args: list[Any] = [limit + 1]
        filters = []
        for column, value in (("status", status), ("workflow", workflow),
                              ("current_phase", phase)):
            if value is not None:
                args.append(value)
                filters.append(f"AND {column} = ${len(args)}")
        if cursor is not None:
            args.extend(decode_cursor(cursor))
            filters.append(f"AND (created_at, workflow_id) < (${len(args) - 1}, ${len(args)})")
        sql = self._q["list_runs"].replace("/*filters*/", " ".join(filters))
        rows = await self.pool.fetch(sql, *args)
        runs = [run_from_row(r) for r in rows[:limit]]
        more = len(rows) > limit
        return RunPage(runs=runs, next_cursor=encode_cursor(runs[-1].created_at,
                                                            runs[-1].workflow_id)
                       if more else None)

    async def checkpoints(self, workflow_id: str, *, include_state: bool = False,
                          after: int = 0, limit: int = 1000,
                          roles: Collection[str] | None = None) -> CheckpointPage:
        """A run's checkpoints; with ``include_state``, each state as the read policy allows
        for ``roles`` -- every read and denial goes to the access log (phasegate/access.py)."""
        if not 1 <= limit <= MAX_CHECKPOINTS:
            raise Invalid(f"limit must be between 1 and {MAX_CHECKPOINTS}")
        run = await self.get_run(workflow_id)
        rows = await self.pool.fetch(self._q["checkpoints"], workflow_id, include_state, after,
                                     limit + 1)
        items = []
        for row in rows[:limit]:
            values = dict(row)
            state = values.pop("state")
            items.append(Checkpoint(**values, state=json.loads(state) if state else None))
        if include_state:
            allowed = await access.enforce(
                self.pool, self.policy, workflow_id=workflow_id, workflow=run.workflow,
                items=items, roles=roles, actor=self.actor)
            for item, ok in zip(items, allowed, strict=True):
                item.access = "read" if ok else "denied"
                if not ok:
                    item.state = None
        return CheckpointPage(
            workflow_id=workflow_id, checkpoints=items,
            next_cursor=items[-1].checkpoint_id if len(rows) > limit else None)

    async def actions(self, workflow_id: str, limit: int = 50) -> list[Action]:
        rows = await self.pool.fetch(self._q["actions"], workflow_id, limit)
        return [Action(**dict(r)) for r in rows]

    async def stalls(self, older_than_s: float, limit: int = 200) -> StallReport:
        if older_than_s < 0:
            raise Invalid("older_than_s must not be negative")
        rows = await self.pool.fetch(self._q["stalls"], float(older_than_s), limit)
        return StallReport(older_than_s=older_than_s, stalls=[Stall(**dict(r)) for r in rows])

    async def summary(self, finished_within_s: float = SUMMARY_WINDOW_S) -> list[SummaryRow]:
        rows = await self.pool.fetch(self._q["summary"], float(finished_within_s))
        return [SummaryRow(**dict(r)) for r in rows]

    async def oldest_unfinished_age_s(self) -> float:
        return float(await self.pool.fetchval(self._q["oldest_unfinished_age"]))

    async def message_ages(self) -> MessageAges:
        row = await self.pool.fetchrow(self._q["message_ages"])
        return MessageAges(**dict(row))

    async def runs_by_status(self) -> dict[str, int]:
        rows = await self.pool.fetch(self._q["runs_by_status"])
        return {r["status"]: int(r["runs"]) for r in rows}

    async def timers_due_soon(self, within_s: float) -> int:
        """Waiting runs whose next phase falls due within ``within_s`` (or is overdue),
        queued runs' wake-ups and open races' deadline messages as soon (signals.sql)."""
        return int(await self.pool.fetchval(queries("signals.sql")["due_soon"], within_s))
