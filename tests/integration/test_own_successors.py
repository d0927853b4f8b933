"""A successor a worker sent, received back by the same worker, runs from what its commit left,
without the check's read (worker/own_successors.py): against real PostgreSQL, a real SQS
server and a real worker. What the user sees: the same runs, each phase once, one load per run
instead of one per phase; a run cancelled between the commit and the receive stays cancelled
(the next phase runs once more, as a chain's next hop would, and its commit is refused)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY as METRICS

from bench.common import RoundTripProxy
from bench.transition_round_trips import statement_names
from phasegate import Context, Workflow
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.starter import start_workflow
from phasegate.settings import Settings
from phasegate.workflow import Registry
from tests.helpers import (
    all_done,
    create_queues,
    fetch,
    fetchval,
    queue_for,
    running_worker,
    store_for,
    wait_for,
)
from tests.workflows import record

paused = Workflow("own-successor-paused", schema_version=1)
# Called by phase "first" while it runs: the test's hook (pauses the worker's receiving).
ON_FIRST: list[Callable[[], None]] = []


@paused.phase("first")
async def first(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    for hook in ON_FIRST:
        hook()
    return {**state, "first": True}


@paused.phase("second")
async def second(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return {**state, "second": True}


four = Workflow("own-successor-four", schema_version=1)
FOUR = ("a", "b", "c", "d")


async def _step(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return {**state, "n": state.get("n", 0) + 1}


for _name in FOUR:
    four.phase(_name)(_step)

REGISTRY = Registry([four, paused])


def _sent_only(settings: Settings, **update: Any) -> Settings:
    """Every successor through SQS (continuation off), leased; a lease long enough that a
    slow machine never sees one run out."""
    return settings.model_copy(update={"continuation": False, "leased_send": True,
                                       "visibility_timeout_s": 30, **update})


def _own() -> float:
    return METRICS.get_sample_value("phasegate_own_successors_total") or 0.0


async def _invocations(settings: Settings, wid: str) -> dict[str, int]:
    rows = await fetch(settings.database_url, "SELECT phase, count(*) AS n FROM "
                       "test_invocations WHERE workflow_id = $1 GROUP BY phase", wid)
    return {r["phase"]: r["n"] for r in rows}


async def test_a_run_through_one_worker_loads_once(settings):
    """Four phases through SQS and one worker: the start message is checked against the
    run (one load: the start's, start_and_load), the three successors come back to the
    worker that sent them and run from memory. With leased sends off, every message is
    loaded."""
    dsn = settings.database_url
    port = int(dsn.rsplit(":", 1)[1].split("/", 1)[0])
    loads = {}
    for leased in (True, False):
        # A queue of its own each time: the stopped worker's last long poll may still take
        # a message sent after it stopped, and hold it for the visibility timeout.
        queue_url, dlq_url = await create_queues(settings.sqs_endpoint_url or "",
                                                 f"own{uuid.uuid4().hex[:12]}")
        settings = settings.model_copy(update={"queue_url": queue_url, "dlq_url": dlq_url})
        async with store_for(dsn) as store, queue_for(settings) as queue:
            wid = (await start_workflow(store, queue, workflow=four,
                                        input={})).workflow_id
        before = _own()
        with RoundTripProxy(upstream_port=port) as proxy:
            proxied = dsn.replace(f":{port}/", f":{proxy.port}/", 1)
            mode = _sent_only(settings, leased_send=leased, database_url=proxied)
            async with running_worker(mode, REGISTRY):
                await wait_for(lambda wid=wid: all_done(dsn, [wid]), what="done")
            counts = await proxy.counts()
        names = statement_names()
        loads[leased] = sum(n for label, n in counts.items()
                            if label.startswith("exec:") and names.get(label[5:])
                            in ("load_for_phase", "load_for_phases", "start_and_load"))
        assert await _invocations(settings, wid) == dict.fromkeys(FOUR, 1)
        assert _own() - before == (len(FOUR) - 1 if leased else 0)
        rows = await fetch(dsn, "SELECT seq FROM checkpoints WHERE workflow_id = $1 "
                           "AND kind = 'phase' ORDER BY seq", wid)
        assert [r["seq"] for r in rows] == list(range(len(FOUR)))
    assert loads == {True: 1, False: len(FOUR)}


async def test_a_run_cancelled_before_its_successor_comes_back_stays_cancelled(settings):
    """Phase "first" commits and its successor is sent; the worker does not receive it until
    the run is cancelled. "second" then runs from memory (once: the check's read would have
    stopped it), its commit is refused, the message is deleted, and the run stays cancelled
    at seq 1 with no checkpoint of "second"."""
    settings = _sent_only(settings, concurrency=1)
    dsn = settings.database_url
    before = _own()
    async with running_worker(settings, REGISTRY) as worker:
        assert worker.transition is not None
        # The only message held is "first"'s: no poll is in flight while it runs.
        ON_FIRST.append(worker.pause_receiving)
        try:
            async with store_for(dsn) as store, queue_for(settings) as queue:
                wid = (await start_workflow(store, queue, workflow=paused,
                                            input={})).workflow_id
            kept = worker.transition.own_successors

            async def first_sent() -> bool:
                return len(kept) == 1 and not worker.transition.running  # type: ignore[union-attr]

            await wait_for(first_sent, what="first committed, its successor sent")
        finally:
            ON_FIRST.clear()
        async with store_for(dsn) as store:
            await Control(store.pool, None, REGISTRY, actor="test").cancel(wid, "test")
        worker.resume_receiving()

        async def settled() -> bool:
            return (await _invocations(settings, wid)).get("second") == 1 and len(kept) == 0 \
                and not worker.transition.running  # type: ignore[union-attr]

        await wait_for(settled, what="second run from memory")
        async with queue_for(settings) as queue:
            await wait_for(lambda: _queue_empty(queue), what="second's message deleted")
    assert _own() - before == 1
    assert await fetchval(dsn, "SELECT status FROM workflow_runs WHERE workflow_id = $1",
                          wid) == "cancelled"
    assert await fetchval(dsn, "SELECT next_seq FROM workflow_runs WHERE workflow_id = $1",
                          wid) == 1
    rows = await fetch(dsn, "SELECT phase FROM checkpoints WHERE workflow_id = $1 "
                       "AND kind = 'phase'", wid)
    assert [r["phase"] for r in rows] == ["first"]


async def _queue_empty(queue: Any) -> bool:
    depth = await queue.depth()
    return bool(depth.visible == 0 and depth.inflight == 0)
