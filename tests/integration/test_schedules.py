"""Schedules against real Postgres and moto: one run per tick across orchestrator replicas,
the catch-up policies, a crash between a tick's claim and its send, a bad setting.

Most tests move a schedule's ``first_seen`` back in time instead of waiting for the clock:
the ticks are then due at once. One test waits for a real minute boundary.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from phasegate.db import create_pool
from phasegate.orchestrator.scheduler import Scheduler
from phasegate.queue import SqsQueue
from phasegate.schedules import CatchUp, Schedule
from phasegate.workflow import Registry
from tests.helpers import fetch, fetchval, queue_for, running_worker, wait_for
from tests.integration.test_cli_errors import phasegate
from tests.workflows_flow import nightly

MINUTELY = Schedule("every-minute", "nightly", "* * * * *", {"report": "minutely"})


@asynccontextmanager
async def scheduler(settings, schedules: list[Schedule], catchup: CatchUp = "latest",
                    catchup_max: int = 10, interval_s: float = 5.0
                    ) -> AsyncIterator[Scheduler]:
    """A scheduler with its own pool and SQS client, as one orchestrator replica has."""
    pool = await create_pool(settings.database_url, min_size=1, max_size=2)
    try:
        async with queue_for(settings) as queue:
            yield Scheduler(pool=pool, queue=queue, schedules=schedules, catchup=catchup,
                            catchup_max=catchup_max, interval_s=interval_s)
    finally:
        await pool.close()


async def seen_minutes_ago(database_url: str, name: str, minutes: float) -> None:
    """As if the schedule had been known (and nothing fired) for that long."""
    from tests.helpers import fetch as run

    await run(database_url, "UPDATE schedules SET first_seen = now() - make_interval("
              "secs => $2) WHERE name = $1 RETURNING name", name, minutes * 60)


async def drain(queue: SqsQueue) -> list[dict[str, object]]:
    """Every message now in the queue (and deleted), as parsed envelopes."""
    bodies: list[dict[str, object]] = []
    while True:
        got = await queue.receive(10, 0, 30)
        if not got:
            return bodies
        bodies += [json.loads(m.body) for m in got]
        await queue.delete([m.receipt_handle for m in got])


async def ticks(database_url: str, name: str) -> list[tuple[str, str | None, bool]]:
    rows = await fetch(database_url, "SELECT action, workflow_id, sent_at IS NOT NULL AS sent "
                       "FROM schedule_ticks WHERE schedule = $1 ORDER BY tick", name)
    return [(r["action"], r["workflow_id"], r["sent"]) for r in rows]


async def test_two_replicas_scanning_at_once_start_one_run_for_a_tick(settings):
    async with scheduler(settings, [MINUTELY]) as one, \
            scheduler(settings, [MINUTELY]) as two, queue_for(settings) as queue:
        await one.register()
        await two.register()
        await seen_minutes_ago(settings.database_url, MINUTELY.name, 3)
        claims = await asyncio.gather(one.scan(), two.scan())
        rows = await ticks(settings.database_url, MINUTELY.name)
        # One tick (two only if the scans straddled a minute boundary): each claimed once.
        assert sum(len(c) for c in claims) == len(rows) in (1, 2)
        assert all(action == "started" and sent for action, _, sent in rows)
        messages = await drain(queue)
        assert sorted((m["kind"], m["workflow_id"], m["workflow"], json.dumps(m["input"]))
                      for m in messages) == sorted(
            ("start", wid, "nightly", '{"report": "minutely"}') for _, wid, _ in rows)
        assert all("nightly" not in str(wid) for _, wid, _ in rows)  # opaque run ids
        # Scanned again at once: the tick is behind the mark, nothing more starts.
        assert await one.scan() == [] and await two.scan() == []


async def test_a_ticks_start_message_runs_the_workflow(settings):
    async with scheduler(settings, [MINUTELY]) as one:
        await one.register()
        await seen_minutes_ago(settings.database_url, MINUTELY.name, 2)
        [claim] = await one.scan()
    async with running_worker(settings, Registry([nightly])):
        await wait_for(lambda: _completed(settings.database_url, claim.workflow_id),
                       timeout=60, what="the scheduled run completed")
    assert await fetchval(settings.database_url, "SELECT input::text FROM workflow_runs "
                          "WHERE workflow_id = $1", claim.workflow_id) == '{"report": "minutely"}'


async def _completed(database_url: str, workflow_id: str | None) -> bool:
    return await fetchval(database_url, "SELECT status FROM workflow_runs WHERE workflow_id = "
                          "$1", workflow_id) == "completed"


@pytest.mark.parametrize(("policy", "expected"), [
    ("latest", ["started"]),
    ("all", ["started", "started"]),
    ("none", ["skipped"]),
])
async def test_catch_up_after_seventy_minutes_of_downtime(settings, policy, expected):
    """An hourly schedule whose last tick was five minutes ago (two ticks missed): late, so
    `none` records it skipped; `latest` starts it; `all` starts both."""
    now = await fetchval(settings.database_url, "SELECT now()")
    cron = f"{(now.minute - 5) % 60} * * * *"
    schedule = Schedule(f"catchup-{policy}", "nightly", cron, None)
    async with scheduler(settings, [schedule], catchup=policy, catchup_max=3) as one, \
            queue_for(settings) as queue:
        await one.register()
        await seen_minutes_ago(settings.database_url, schedule.name, 70)
        await one.scan()
        rows = await ticks(settings.database_url, schedule.name)
        assert [action for action, _, _ in rows] == expected
        assert len(await drain(queue)) == expected.count("started")
        await one.scan()  # the newest claimed or skipped tick is the mark: nothing again
        assert len(await ticks(settings.database_url, schedule.name)) == len(expected)


async def test_a_tick_claimed_by_a_replica_that_died_before_sending_is_sent(settings):
    async with scheduler(settings, [MINUTELY]) as one, queue_for(settings) as queue:
        await one.register()
        # What a replica killed between its claim and its send leaves behind.
        await fetch(settings.database_url,
                    "INSERT INTO schedule_ticks (schedule, tick, action, workflow_id, dedup_id, "
                    "group_id, body, claimed_at) VALUES ($1, date_trunc('minute', now()), "
                    "'started', 'wf_orphan', 'd-orphan', 'wf_orphan', $2, now() - interval "
                    "'1 minute') RETURNING tick", MINUTELY.name,
                    json.dumps({"v": 1, "kind": "start", "workflow_id": "wf_orphan",
                                "workflow": "nightly", "seq": 0}))
        assert await one.send_unsent() == 1
        assert [m["workflow_id"] for m in await drain(queue)] == ["wf_orphan"]
        assert await ticks(settings.database_url, MINUTELY.name) == \
            [("started", "wf_orphan", True)]


def test_the_orchestrator_refuses_a_bad_schedule_setting_with_exit_2():
    done = phasegate("orchestrator", env={
        "PHASEGATE_DATABASE_URL": "postgresql://127.0.0.1:1/x",
        "PHASEGATE_QUEUE_URL": "http://127.0.0.1:1/q",
        "PHASEGATE_SCHEDULES": '[{"workflow": "report", "cron": "0 25 * * *"}]'})
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("phasegate: invalid setting PHASEGATE_SCHEDULES")
    assert "not a valid 5-field cron" in line


@pytest.mark.slow
async def test_every_minute_fires_once_per_minute_with_two_orchestrators(settings):
    """Two scheduler loops on one database, across a real minute boundary (up to ~65 s): the
    missed tick fires at once (catch-up `latest`), the next one when it comes; each starts
    exactly one run."""
    async with scheduler(settings, [MINUTELY], interval_s=0.5) as one, \
            scheduler(settings, [MINUTELY], interval_s=0.5) as two, \
            queue_for(settings) as queue:
        await one.register()
        await seen_minutes_ago(settings.database_url, MINUTELY.name, 1.5)
        loops = [asyncio.ensure_future(s.run()) for s in (one, two)]
        try:
            await wait_for(lambda: _started(settings.database_url, 2), timeout=75,
                           interval=0.5, what="two ticks started")
        finally:
            one.stop()
            two.stop()
            await asyncio.gather(*loops)
        rows = await fetch(settings.database_url, "SELECT tick, workflow_id FROM "
                           "schedule_ticks WHERE schedule = $1 ORDER BY tick", MINUTELY.name)
        assert len(rows) == 2
        assert (rows[1]["tick"] - rows[0]["tick"]).total_seconds() == 60
        assert one.started + two.started == 2
        messages = await drain(queue)
        assert sorted(m["workflow_id"] for m in messages) == \
            sorted(r["workflow_id"] for r in rows)


async def _started(database_url: str, n: int) -> bool:
    count = await fetchval(database_url, "SELECT count(*) FROM schedule_ticks "
                           "WHERE action = 'started' AND sent_at IS NOT NULL")
    return int(count) >= n
