"""One timed run of each system on a workload, and the rounds that alternate them: the
workload (``Workload``) and what every run shares (``Env``), phasegate's run, the floor's and
the old 16-poller floor's, each rehearsed and timed alike (``_timed``: process CPU and wall
time, the server's CPU and WAL, round trips in the counting pass), and ``timed_runs``, the
rounds ``bench.transitions`` runs them in.
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, AsyncExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aioboto3
import asyncpg
from botocore.config import Config

from bench.common import (
    HISTORY_PREFIX,
    MEASURED,
    Databases,
    RoundTripProxy,
    ServerMeter,
    commit_figures,
)
from bench.floor import Floor, SqsFloorQueue, floor_message
from bench.workload import noop_workflow, seed_runs, stopping_worker
from phasegate.db import Pooler
from phasegate.queue import USER_AGENT, SqsQueue, create_fifo_queue_pair
from phasegate.residency import RegionalStore
from phasegate.settings import Settings
from phasegate.store import create_pool
from phasegate.worker.fake_queue import InMemoryFifoQueue
from phasegate.worker.runtime import Worker

# Before its timed window each system runs one run of the workload's phases on the connections
# it is then timed with, and outside the window: what a server connection does once (asyncpg's
# type introspection of the array parameters, PL/pgSQL compiling the commit functions and
# planning their statements, a statement's first description) and what a process does once
# per phase name (its metric children) is not a transition's cost: without the rehearsal they
# were 13-19 % of phasegate's client and Postgres CPU per transition (bench/benchmarks_notes.md,
# "A rehearsal before each timed run"). One run is enough: rehearsing every group's run did
# not move the figures at 16 groups. The rehearsal's runs are named like the history, so the
# measured figures (``MEASURED``) leave them out.
REHEARSAL = f"{HISTORY_PREFIX}rehearsal-"
# A worker starts outside its timed window, as the floor opens its connections outside its own
# (since the ``s20-*`` runs): what it does once when a pod starts (probes, the store's and the
# queues' checks, its presence row, the watchdog: 6-8 ms of client CPU after the rehearsal's
# worker, 1-3 ms of Postgres CPU) is not a transition's cost. It weighed little in a run of
# thousands of transitions, but ~0.25 ms of client CPU per transition (~6 %) in the
# 30-transition LocalStack run. The clean stop (the drain with the last commit, the presence
# row's goodbye: ~3 ms) stays in.
STARTUP_WITHIN_S = 60.0
CONCURRENCY = 16


@dataclass(frozen=True)
class Workload:
    backend: str  # "memory" | "moto" | "localstack"
    groups: int
    phases: int  # per workflow; transitions = groups * phases

    @property
    def transitions(self) -> int:
        return self.groups * self.phases

    @property
    def key(self) -> str:
        return f"{self.backend}/{self.groups}g"


@dataclass
class Env:
    databases: Databases
    moto_endpoint: str | None = None
    # A LocalStack started by the caller (localstack/run-without-docker.sh): the per-hop wait.
    localstack_endpoint: str | None = None
    proxy: RoundTripProxy | None = None  # set during the round-trip counting pass
    # Group commit window of phasegate's store (PHASEGATE_COMMIT_BATCH_WINDOW_MS; 0 = off).
    commit_window_ms: float = Settings.model_fields["commit_batch_window_ms"].default
    load_window_ms: float = Settings.model_fields["load_batch_window_ms"].default
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    continuation: bool = True  # phasegate's PHASEGATE_CONTINUATION (--continuation)
    # phasegate's PHASEGATE_DATABASE_POOLER (--pooler): "transaction", the default, plans every
    # statement anew (no statement cache, safe behind a pooler); "pgbouncer" names them by
    # their text (once per server connection); "none" caches them, as the floor's plain
    # asyncpg pool does.
    pooler: Pooler = "transaction"
    # ``REHEARSAL`` before each timed run (--rehearsal; off: as results up to ``final4-*``).
    rehearsal: bool = True
    # The floor's SQS client (--floor-user-agent): "stock", aioboto3's defaults, as a plain
    # loop has them; "fixed", phasegate's fixed User-Agent (phasegate/queue.py), so the floor
    # does not pay botocore's per-request User-Agent either.
    floor_user_agent: str = "stock"
    # Wraps the timed run alone (bench/profile.py counts per-transition work with it).
    around: Callable[[], AbstractContextManager[Any]] | None = None

    def endpoint(self, backend: str) -> str:
        found = self.localstack_endpoint if backend == "localstack" else self.moto_endpoint
        if found is None:
            raise RuntimeError(f"no endpoint for the {backend} backend (--localstack-endpoint)")
        return found


# -- queues -------------------------------------------------------------------------------------


async def _sqs_client(endpoint: str, user_agent: str | None = None) -> tuple[Any, Any]:
    session = aioboto3.Session()
    manager = session.client("sqs", endpoint_url=endpoint, region_name="us-east-1",
                             config=Config(max_pool_connections=50, user_agent=user_agent))
    return manager, await manager.__aenter__()


def wait_time_for(backend: str) -> int:
    """Long polls on the fake; short polls on moto, whose long poll keeps the snapshot of
    in-flight groups it took when it started, so a FIFO group freed by a delete stays blocked
    until the poll times out (an emulator artifact: a 1-group run would crawl at 1/poll)."""
    return 0 if backend == "moto" else 20


# -- one phasegate run --------------------------------------------------------------------------


async def run_phasegate(dsn: str, workload: Workload, env: Env) -> dict[str, Any]:
    workflow = noop_workflow(workload.phases)
    pool = await create_pool(dsn, min_size=CONCURRENCY, max_size=CONCURRENCY,
                             pooler=env.pooler)
    # The store a worker runs with (worker/startup.py): one region, its audit line per commit.
    store = RegionalStore(pool, commit_window_s=env.commit_window_ms / 1000,
                          load_window_s=env.load_window_ms / 1000)
    try:
        async with AsyncExitStack() as queues:
            settings = Settings(
                concurrency=CONCURRENCY, wait_time_s=wait_time_for(workload.backend),
                visibility_timeout_s=30, heartbeat_s=10, metrics_port=0,
                metrics_host="127.0.0.1", worker_id="bench", db_pool_max=CONCURRENCY,
                continuation=env.continuation)
            # The rehearsal (``REHEARSAL``): a worker of its own on the same pool, on queues
            # of its own (a long poll it leaves behind takes nothing from the timed run's).
            if env.rehearsal:
                queue, dlq = await _phasegate_queues(workload, env, queues)
                rehearsal = noop_workflow(workload.phases)
                await seed_runs(store, queue, rehearsal, 1, REHEARSAL)
                await stopping_worker(settings, rehearsal, 1, queue=queue, dlq=dlq,
                                      store=store).run()
            queue, dlq = await _phasegate_queues(workload, env, queues)
            await seed_runs(store, queue, workflow, workload.groups, "w")
            worker = stopping_worker(settings, workflow, workload.groups, queue=queue, dlq=dlq,
                                     store=store)
            # Started outside the window (``STARTUP_WITHIN_S``): the window opens once the
            # worker is ready, receiving held until then.
            running = await started(worker)
            calls_before = queue.calls + dlq.calls
            figures = await _timed(lambda: resumed(worker, running), workload, env, dsn)
            figures["sqs_calls"] = queue.calls + dlq.calls - calls_before
        figures.update(await _commits(pool, "SELECT workflow_id, seq, "
                                      "extract(epoch FROM created_at)::float8 FROM checkpoints "
                                      f"WHERE kind = 'phase' AND {MEASURED}", workload))
        done = await pool.fetchval("SELECT count(*) FROM workflow_runs WHERE status = "
                                   f"'completed' AND {MEASURED}")
        if done != workload.groups:
            raise RuntimeError(f"phasegate run finished {done}/{workload.groups} workflows")
        return figures
    finally:
        await pool.close()


async def started(worker: Worker) -> asyncio.Task[None]:
    """``worker`` running and ready, receiving held: what a worker does once when it starts
    (probes, the store's and the queues' checks, its presence row, the watchdog) happens
    here, before the timed window."""
    worker.pause_receiving()
    running = asyncio.create_task(worker.run())
    deadline = time.monotonic() + STARTUP_WITHIN_S
    while not worker.ready:
        if running.done():
            await running  # its error
            raise RuntimeError("the worker stopped before it was ready")
        if time.monotonic() > deadline:
            running.cancel()
            raise RuntimeError(f"the worker was not ready within {STARTUP_WITHIN_S} s")
        await asyncio.sleep(0.001)  # a poll with a deadline, outside any timed window
    return running


async def resumed(worker: Worker, running: asyncio.Task[None]) -> None:
    """The timed part of a run ``started`` began: receiving, every transition, the stop."""
    worker.resume_receiving()
    await running


async def _phasegate_queues(workload: Workload, env: Env,
                            stack: AsyncExitStack) -> tuple[Any, Any]:
    """A fresh queue and dead-letter queue for a worker, closed with ``stack``."""
    if workload.backend == "memory":
        return InMemoryFifoQueue(), InMemoryFifoQueue()
    manager, client = await _sqs_client(env.endpoint(workload.backend))
    stack.push_async_exit(manager)
    urls = await create_fifo_queue_pair(client, f"pg-{uuid.uuid4().hex[:10]}")
    queue = await SqsQueue(urls[0], endpoint_url=env.endpoint(workload.backend),
                           region="us-east-1").open()
    stack.push_async_callback(queue.close)
    return queue, queue.sibling(urls[1])


# -- one floor run ------------------------------------------------------------------------------


async def run_floor(dsn: str, workload: Workload, env: Env, *,
                    pollers: int | None = None) -> dict[str, Any]:
    """The floor with one poller per group (``pollers``: the old floor's 16 for any number of
    groups, whose idle pollers inflated its CPU at one group)."""
    manager = None
    queue: Any
    rehearsal: Any
    if workload.backend == "memory":
        queue, rehearsal = InMemoryFifoQueue(), InMemoryFifoQueue()
    else:
        manager, client = await _sqs_client(
            env.endpoint(workload.backend),
            USER_AGENT if env.floor_user_agent == "fixed" else None)
        urls = await create_fifo_queue_pair(client, f"fl-{uuid.uuid4().hex[:10]}")
        queue = SqsFloorQueue(client, urls[0])
        urls = await create_fifo_queue_pair(client, f"fl-{uuid.uuid4().hex[:10]}")
        rehearsal = SqsFloorQueue(client, urls[0])
    try:
        floor = Floor(dsn=dsn, queue=queue,
                      concurrency=pollers or min(workload.groups, CONCURRENCY),
                      wait_time_s=wait_time_for(workload.backend),
                      expected_runs=workload.groups)
        await floor.open()
        try:
            # ``REHEARSAL``, on a queue of its own, as phasegate's.
            if env.rehearsal:
                await floor.rehearse(rehearsal, f"{REHEARSAL}{uuid.uuid4().hex[:8]}",
                                     workload.phases)
            for index in range(workload.groups):
                await queue.send([floor_message(f"w{index}-{uuid.uuid4().hex[:8]}", 0,
                                                workload.phases)])
            calls_before = queue.calls
            figures = await _timed(floor.run, workload, env, dsn)
            figures["sqs_calls"] = queue.calls - calls_before
        finally:
            await floor.close()
        connection = await asyncpg.connect(dsn)
        try:
            figures.update(await _commits(connection, "SELECT workflow_id, seq, extract(epoch "
                                          "FROM committed_at)::float8 FROM bench_floor "
                                          f"WHERE {MEASURED}", workload))
        finally:
            await connection.close()
        return figures
    finally:
        if manager is not None:
            await manager.__aexit__(None, None, None)


# -- shared measuring ---------------------------------------------------------------------------


async def _timed(run: Callable[[], Awaitable[None]], workload: Workload, env: Env,
                 dsn: str) -> dict[str, Any]:
    """Process CPU and wall time of the run alone (seeding and read-back excluded), the
    server's CPU and WAL over the same window; in the counting pass, its round trips."""
    gc.collect()
    database = urlsplit(dsn).path.lstrip("/")
    async with ServerMeter(env.databases.server_dsn, database) as meter:
        before = await env.proxy.counts() if env.proxy else {}
        cpu, wall = time.process_time(), time.perf_counter()
        with env.around() if env.around else nullcontext():
            await asyncio.wait_for(run(), timeout=900)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        after = await env.proxy.counts() if env.proxy else {}
        server = await meter.read()
    return {"cpu_s": cpu, "wall_s": wall,
            "cpu_per_transition_us": cpu / workload.transitions * 1e6,
            "server_cpu_per_transition_us": server["server_cpu_s"] / workload.transitions * 1e6,
            "server_cpu_ticks_per_transition_us":
                server["server_cpu_ticks_s"] / workload.transitions * 1e6,
            "autovacuum_cpu_per_transition_us":
                server["autovacuum_cpu_s"] / workload.transitions * 1e6,
            "wal_bytes_per_transition": server["wal_bytes"] / workload.transitions,
            "round_trips": {k: after.get(k, 0) - before.get(k, 0) for k in after}}


async def _commits(db: Any, sql: str, workload: Workload) -> dict[str, Any]:
    rows = [tuple(r) for r in await db.fetch(sql)]
    if len(rows) != workload.transitions:
        raise RuntimeError(f"expected {workload.transitions} commits, found {len(rows)}")
    return commit_figures(rows)


async def run_old_floor(dsn: str, workload: Workload, env: Env) -> dict[str, Any]:
    return await run_floor(dsn, workload, env, pollers=CONCURRENCY)


SYSTEMS: dict[str, Callable[[str, Workload, Env], Awaitable[dict[str, Any]]]] = {
    "floor": run_floor, "phasegate": run_phasegate, "floor16": run_old_floor}


async def timed_runs(env: Env, workload: Workload, repeats: int, old_floor: bool = False) -> None:
    """Alternate floor and phasegate (the order flips each round) so load hits both; with
    ``old_floor``, the old 16-poller floor runs beside them in the same rounds."""
    for round_ in range(repeats):
        order = ["floor", "phasegate"] if round_ % 2 == 0 else ["phasegate", "floor"]
        if old_floor and workload.backend == "memory":
            order.insert(1, "floor16")
        for system in order:
            dsn = await env.databases.fresh()
            try:
                figures = await SYSTEMS[system](dsn, workload, env)
            finally:
                await env.databases.drop(dsn)
            figures["sqs_calls_per_transition"] = figures["sqs_calls"] / workload.transitions
            env.runs.setdefault(f"{workload.key}/{system}", []).append(figures)
            print(f"  {workload.key:10} {system:9} round {round_ + 1}: "
                  f"{figures['transitions_per_s']:7.0f}/s  cpu "
                  f"{figures['cpu_per_transition_us']:6.0f} us  p50 "
                  f"{figures['latency_p50_ms']:6.2f} ms  p99 {figures['latency_p99_ms']:6.2f} ms"
                  f"  sqs {figures['sqs_calls_per_transition']:.2f}/t  pg cpu "
                  f"{figures['server_cpu_per_transition_us']:5.0f} us  autovacuum "
                  f"{figures.get('autovacuum_cpu_per_transition_us', 0):4.0f} us  wal "
                  f"{figures['wal_bytes_per_transition']:5.0f} B", flush=True)
