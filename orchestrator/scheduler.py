"""The scheduler: starts one run per cron tick, exactly once across orchestrator replicas.

Every ``schedule_interval_s`` each replica reads Postgres ``now()`` and, per schedule, the
point after which ticks are due (its last claimed tick, or when it was first seen), asks
``phasegate.schedules.due`` which ticks the catch-up policy fires, and claims each with an
INSERT into ``schedule_ticks`` whose primary key is (schedule, tick): one replica wins, the
others insert nothing. The winner sends the tick's start message (it carries the input, so
the orchestrator needs no workflow code: the worker creates the run, as for any producer's
start). A replica that dies between the claim and the send leaves the row unsent; any
replica sends it on a later scan. The run id is random (``new_workflow_id``), fixed in the
tick row, so a second send is a duplicate start of the same run, which changes nothing.
"""

from __future__ import annotations

import asyncio
import random
import time
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime

import asyncpg
import structlog

from phasegate.backoff import Backoff
from phasegate.envelope import start_message
from phasegate.orchestrator.starter import new_workflow_id
from phasegate.queue import Outgoing, Queue, QueueError
from phasegate.schedules import CatchUp, Schedule, due, from_workflows, parse_schedules, unique
from phasegate.sql import queries
from phasegate.workflow import Registry

log = structlog.get_logger("phasegate.scheduler")

RETRY_CAP_S = 30.0
# Claimed ticks still unsent this long after the claim are sent by any replica (the claimer
# sends at once; this covers one that died in between).
UNSENT_AFTER_S = 10.0
UNSENT_BATCH = 100
# Tick rows are kept a week (the newest of each schedule always), pruned hourly.
KEEP_TICKS_S = 7 * 86400.0
PRUNE_EVERY_S = 3600.0


def schedules_for(registry: Registry, configured: str | None) -> list[Schedule]:
    """The workflows' own schedules (those this orchestrator loads) and PHASEGATE_SCHEDULES.
    A ScheduleError names a clash (two different schedules under one name)."""
    own = from_workflows(w for w in (registry.get(n) for n in registry.names()) if w)
    return unique([*own, *parse_schedules(configured)])


@dataclass(frozen=True)
class Claimed:
    schedule: str
    tick: datetime
    action: str
    workflow_id: str | None


class Scheduler:
    def __init__(self, *, pool: asyncpg.Pool, queue: Queue, schedules: list[Schedule],
                 catchup: CatchUp = "latest", catchup_max: int = 10,
                 interval_s: float = 5.0, jitter: random.Random | None = None) -> None:
        self.pool = pool
        self.queue = queue
        self.schedules = {s.name: s for s in schedules}
        self.catchup: CatchUp = catchup
        self.catchup_max = catchup_max
        self.interval_s = interval_s
        self.started = 0
        self._q = queries("flow.sql")
        self._stop = asyncio.Event()
        self._failures = Backoff(base=interval_s, cap=max(interval_s, RETRY_CAP_S), rng=jitter)
        self._registered = False
        self._pruned = float("-inf")

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Scan until stopped. A failed scan is logged and retried with backoff, never fatal."""
        log.info("scheduler_started", schedules=sorted(self.schedules), catchup=self.catchup)
        while not self._stop.is_set():
            try:
                await self.scan()
            except Exception as exc:
                wait = self._failures.next()
                log.warning("scheduler_scan_failed",
                            error=f"{type(exc).__name__}: {exc}"[:300], retry_in_s=round(wait, 3))
            else:
                self._failures.reset()
                wait = self.interval_s
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), wait)
        log.info("scheduler_stopped", started=self.started)

    async def register(self) -> None:
        """Make each schedule known to the database (its first_seen starts catch-up)."""
        for schedule in self.schedules.values():
            await self.pool.execute(self._q["schedule_register"], schedule.name,
                                    schedule.workflow, schedule.cron)
        self._registered = True

    async def scan(self) -> list[Claimed]:
        """One round: claim and send every due tick; send ticks others left unsent."""
        if not self.schedules:
            return []
        if not self._registered:
            await self.register()
        claimed: list[Claimed] = []
        marks = await self.pool.fetch(self._q["schedule_marks"], list(self.schedules))
        for mark in marks:
            schedule = self.schedules[mark["name"]]
            plan = due(schedule.cron, mark["after"], mark["now"], self.catchup,
                       self.catchup_max)
            for tick in plan.fire:
                claim = await self.claim(schedule, tick)
                if claim is not None:
                    claimed.append(claim)
            if plan.skip is not None:
                await self.pool.fetchrow(self._q["schedule_claim"], schedule.name, plan.skip,
                                         "skipped", None, None, None, None)
                log.info("schedule_tick_skipped", schedule=schedule.name,
                         tick=plan.skip.isoformat(), catchup=self.catchup)
        await self.send_unsent()
        if time.monotonic() - self._pruned > PRUNE_EVERY_S:
            for name in self.schedules:
                await self.pool.execute(self._q["schedule_prune"], name, KEEP_TICKS_S)
            self._pruned = time.monotonic()
        return claimed

    async def claim(self, schedule: Schedule, tick: datetime) -> Claimed | None:
        """Claim one tick; if this replica won it, send its start message now."""
        workflow_id = new_workflow_id()
        message = start_message(workflow_id, schedule.workflow, schedule.input)
        body = message.to_json()
        row = await self.pool.fetchrow(self._q["schedule_claim"], schedule.name, tick,
                                       "started", workflow_id, message.dedup_id,
                                       message.group_id, body)
        if row is None:
            return None  # another replica claimed it
        self.started += 1
        log.info("schedule_tick_claimed", schedule=schedule.name, tick=tick.isoformat(),
                 workflow_id=workflow_id)
        try:
            await self.queue.send([Outgoing(body, message.group_id, message.dedup_id)])
        except Exception as exc:  # SQS down or throttling: a later scan sends the row
            log.warning("schedule_send_failed_will_retry", schedule=schedule.name,
                        error=type(exc).__name__)
        else:
            await self.pool.execute(self._q["schedule_sent"], schedule.name, tick)
        return Claimed(schedule.name, tick, "started", workflow_id)

    async def send_unsent(self) -> int:
        async with self.pool.acquire() as connection, connection.transaction():
            rows = await connection.fetch(self._q["schedule_unsent"], UNSENT_AFTER_S,
                                          UNSENT_BATCH)
            if not rows:
                return 0
            failed: set[str] = set()
            try:
                await self.queue.send([Outgoing(r["body"], r["group_id"], r["dedup_id"])
                                       for r in rows])
            except QueueError as exc:
                failed = set(exc.failed)
            sent = [r for r in rows if r["dedup_id"] not in failed]
            for r in sent:
                await connection.execute(self._q["schedule_sent"], r["schedule"], r["tick"])
        log.info("schedule_ticks_resent", messages=len(sent), failed=len(failed))
        return len(sent)
