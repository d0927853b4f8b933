"""phasegate against a raw floor, side by side in one run.

    python -m bench.transitions            # the full run (~5 min on 2 cores)
    python -m bench.transitions --quick    # smaller workloads, fewer repetitions

For each backend (the in-process ``InMemoryFifoQueue``; moto server over HTTP in its own
process) and each number of message groups (1, 16), floor and phasegate runs alternate, each
on a fresh database, and every figure is the median over the runs, reported as
phasegate / floor. Then round trips are counted through a wire-protocol proxy (a separate pass,
so the proxy's hop is not in the timed runs), and real worker processes are measured for cold
start, idle RSS and failover. Results: ``bench/results/transitions-*.json`` and, with
``--write-docs``, ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import re
import signal
import subprocess
import sys
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
    HISTORY_RUNS,
    MEASURED,
    ROOT,
    VENV_BIN,
    Databases,
    RoundTripProxy,
    ServerMeter,
    commit_figures,
    machine,
    median,
    moto_server,
    rss_mib,
    split_cores,
    with_port,
)
from bench.floor import Floor, SqsFloorQueue, floor_message
from bench.workload import (
    FAILOVER_PHASE_S,
    PAYLOAD,
    noop_workflow,
    seed_runs,
    stopping_worker,
)
from phasegate.envelope import start_message
from phasegate.orchestrator.embedded import free_port, local_aws_env
from phasegate.queue import USER_AGENT, Outgoing, SqsQueue, create_fifo_queue_pair
from phasegate.residency import RegionalStore
from phasegate.settings import Settings
from phasegate.sql import queries
from phasegate.store import Store, create_pool
from phasegate.worker.fake_queue import InMemoryFifoQueue
from phasegate.worker.runtime import Worker

RESULTS = ROOT / "bench" / "results"
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
DOCS = ROOT / "docs" / "benchmarks.md"
CONCURRENCY = 16
# Failover: the worker lease. Visibility 2 s extended every 1 s means a dead worker's message
# is visible again 1-2 s after the kill. The floor has no heartbeat, so its visibility must
# outlast its longest phase.
FAILOVER_VISIBILITY_S = 2
FAILOVER_HEARTBEAT_S = 1.0
FLOOR_FAILOVER_VISIBILITY_S = int(FAILOVER_PHASE_S) + 1


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
    # statement anew (no statement cache, safe behind a pooler); "none" caches them, as the
    # floor's plain asyncpg pool does.
    pooler: str = "transaction"
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
                             pooler="none" if env.pooler == "none" else "transaction")
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


# -- round trips (a separate pass through the counting proxy) -----------------------------------

_WS = re.compile(r"\s+")


def statement_names() -> dict[str, str]:
    """The proxy labels statements by their first SQL characters; map those to query names."""
    return {_WS.sub(" ", sql)[:60]: name for name, sql in queries().items()}


async def count_round_trips(env: Env, workload: Workload) -> dict[str, Any]:
    names = statement_names()
    server = env.databases.server_dsn
    port = int(server.rsplit(":", 1)[1].split("/", 1)[0])
    found: dict[str, Any] = {}
    with RoundTripProxy(upstream_port=port) as proxy:
        for system in ("floor", "phasegate"):
            dsn = await env.databases.fresh()
            env.proxy = proxy
            try:
                proxied = with_port(dsn, proxy.port) + "?sslmode=disable"
                delta = (await SYSTEMS[system](proxied, workload, env))["round_trips"]
            finally:
                env.proxy = None
                await env.databases.drop(dsn)
            by_statement: dict[str, float] = {}
            for label, count in delta.items():
                if label.startswith(("exec:", "prepare:", "describe:", "simple:")) and count:
                    kind, _, text = label.partition(":")
                    name = names.get(text, text[:40])
                    by_statement[f"{kind}:{name}"] = count / workload.transitions
            found[system] = {
                "round_trips_per_transition": delta.get("round_trips", 0) / workload.transitions,
                "by_statement_per_transition": dict(sorted(by_statement.items(),
                                                           key=lambda kv: -kv[1])),
            }
            print(f"  {workload.key:10} {system:9} round trips/transition "
                  f"{found[system]['round_trips_per_transition']:.3f}  "
                  f"{found[system]['by_statement_per_transition']}", flush=True)
    return found


# -- worker processes: cold start, idle RSS, failover -------------------------------------------


def _phasegate_env(dsn: str, endpoint: str, urls: tuple[str, str], **extra: Any) -> dict[str, str]:
    env = {**os.environ, **local_aws_env(), "PYTHONPATH": str(ROOT),
           "PHASEGATE_DATABASE_URL": dsn, "PHASEGATE_QUEUE_URL": urls[0],
           "PHASEGATE_DLQ_URL": urls[1], "PHASEGATE_SQS_ENDPOINT_URL": endpoint,
           "PHASEGATE_AWS_REGION": "us-east-1", "PHASEGATE_WORKFLOW_MODULES": "bench.workload",
           "PHASEGATE_METRICS_HOST": "127.0.0.1", "PHASEGATE_LOG_FORMAT": "json",
           "PHASEGATE_CONCURRENCY": "1"}
    env.update({f"PHASEGATE_{k.upper()}": str(v) for k, v in extra.items()})
    return env


def spawn(system: str, dsn: str, endpoint: str, urls: tuple[str, str], *,
          metrics_port: int = 0, **extra: Any) -> subprocess.Popen[bytes]:
    if system == "phasegate":
        return subprocess.Popen(
            [str(VENV_BIN / "phasegate"), "worker"], cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=_phasegate_env(dsn, endpoint, urls, metrics_port=metrics_port, **extra))
    argv = [sys.executable, "-m", "bench.floor", "--dsn", dsn, "--endpoint", endpoint,
            "--queue-url", urls[0]]
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **local_aws_env(), "PYTHONPATH": str(ROOT)})


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _queue_pair(endpoint: str, prefix: str, visibility_s: int = 30) -> tuple[str, str]:
    manager, client = await _sqs_client(endpoint)
    try:
        return await create_fifo_queue_pair(client, f"{prefix}-{uuid.uuid4().hex[:10]}",
                                            visibility_timeout_s=visibility_s)
    finally:
        await manager.__aexit__(None, None, None)


async def _seed(system: str, dsn: str, endpoint: str, urls: tuple[str, str], workflow: str,
                phases: int) -> str:
    workflow_id = f"w-{uuid.uuid4().hex[:10]}"
    async with SqsQueue(urls[0], endpoint_url=endpoint, region="us-east-1") as queue:
        if system == "floor":
            await queue.send([floor_message(workflow_id, 0, phases)])
            return workflow_id
        pool = await create_pool(dsn, min_size=1, max_size=1)
        try:
            message = start_message(workflow_id, workflow, PAYLOAD)
            await Store(pool).start_run(workflow_id=workflow_id, workflow=workflow,
                                        schema_version=1, input=PAYLOAD, first_phase="p0"
                                        if workflow.startswith("bench-noop") else "slow",
                                        message=message)
        finally:
            await pool.close()
        await queue.send([Outgoing(message.to_json(), message.group_id, message.dedup_id)])
    return workflow_id


async def _poll(dsn: str, sql: str, *args: Any, within_s: float = 60) -> Any:
    connection = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            value = await connection.fetchval(sql, *args)
            if value is not None:
                return value
            await asyncio.sleep(0.01)
    finally:
        await connection.close()
    raise TimeoutError(f"no result after {within_s}s: {sql}")


async def cold_start_and_rss(env: Env, endpoint: str, repeats: int) -> dict[str, Any]:
    """Process start -> first phase committed; then, once the run is done, idle RSS."""
    out: dict[str, list[dict[str, float]]] = {"floor": [], "phasegate": []}
    for round_ in range(repeats):
        for system in (["floor", "phasegate"] if round_ % 2 == 0 else ["phasegate", "floor"]):
            dsn = await env.databases.fresh()
            urls = await _queue_pair(endpoint, "cs")
            await _seed(system, dsn, endpoint, urls, "bench-noop-3", 3)
            first = ("SELECT extract(epoch FROM min(created_at))::float8 FROM checkpoints "
                     f"WHERE {MEASURED}" if system == "phasegate" else
                     "SELECT extract(epoch FROM min(committed_at))::float8 FROM bench_floor "
                     f"WHERE {MEASURED}")
            done = (f"SELECT 1 FROM workflow_runs WHERE status = 'completed' AND {MEASURED}"
                    if system == "phasegate" else
                    f"SELECT 1 FROM bench_floor WHERE seq = 2 AND {MEASURED}")
            started = time.time()
            process = spawn(system, dsn, endpoint, urls, metrics_port=free_port(),
                            **({"wait_time_s": 20} if system == "phasegate" else {}))
            try:
                committed = await _poll(dsn, first)
                await _poll(dsn, done)
                await asyncio.sleep(3.0)  # idle: long-polling an empty queue
                rss = rss_mib(process.pid)
            finally:
                stop(process)
                await env.databases.drop(dsn)
            figures = {"cold_start_s": committed - started, "idle_rss_mib": rss}
            out[system].append(figures)
            print(f"  cold start {system:9} {figures['cold_start_s']:.3f} s   idle RSS "
                  f"{rss:.1f} MiB", flush=True)
    return out


async def failover(env: Env, endpoint: str, repeats: int, seed: int = 7) -> dict[str, Any]:
    """Two worker processes; SIGKILL the one running the phase at a random point of its
    heartbeat cycle; time until the other starts the same phase (both clocks: this host)."""
    rng = random.Random(seed)
    out: dict[str, list[float]] = {"floor": [], "phasegate": []}
    for round_ in range(repeats):
        for system in (["floor", "phasegate"] if round_ % 2 == 0 else ["phasegate", "floor"]):
            dsn = await env.databases.fresh()
            visibility = (FAILOVER_VISIBILITY_S if system == "phasegate"
                          else FLOOR_FAILOVER_VISIBILITY_S)
            urls = await _queue_pair(endpoint, "fo", visibility)
            extra: dict[str, Any] = (
                {"visibility_timeout_s": FAILOVER_VISIBILITY_S, "heartbeat_s":
                 FAILOVER_HEARTBEAT_S, "wait_time_s": 0}
                if system == "phasegate" else
                {"visibility_timeout_s": FLOOR_FAILOVER_VISIBILITY_S, "wait_time_s": 0,
                 "phase_sleep_s": FAILOVER_PHASE_S})
            processes = [spawn(system, dsn, endpoint, urls, metrics_port=free_port(), **extra)
                         for _ in range(2)]
            try:
                await asyncio.sleep(2.0)  # both up and polling
                workflow_id = await _seed(system, dsn, endpoint, urls, "bench-failover", 2)
                pid = await _poll(dsn, "SELECT pid FROM bench_invocations WHERE workflow_id = $1 "
                                  "AND seq = 0 ORDER BY id LIMIT 1", workflow_id)
                await asyncio.sleep(rng.uniform(0.2, 0.2 + FAILOVER_HEARTBEAT_S))
                os.kill(pid, signal.SIGKILL)
                killed = time.time()
                resumed = await _poll(
                    dsn, "SELECT extract(epoch FROM at)::float8 FROM bench_invocations WHERE "
                    "workflow_id = $1 AND seq = 0 AND pid <> $2 ORDER BY id LIMIT 1",
                    workflow_id, pid, within_s=60)
            finally:
                for process in processes:
                    stop(process)
                await env.databases.drop(dsn)
            out[system].append(resumed - killed)
            print(f"  failover {system:9} {resumed - killed:.3f} s", flush=True)
    return out


# -- the report ---------------------------------------------------------------------------------

PER_RUN = ("cpu_per_transition_us", "transitions_per_s", "latency_p50_ms", "latency_p99_ms",
           "sqs_calls_per_transition")
# Postgres' side: exact on the private cluster (the default); on a shared server the WAL
# position also moves with other clients' writes.
SERVER = ("server_cpu_per_transition_us", "wal_bytes_per_transition",
          "server_cpu_ticks_per_transition_us")


def ratio(ours: float, floor: float) -> float:
    return ours / floor if floor else float("nan")


def summarise(env: Env, workloads: list[Workload], round_trips: dict[str, Any],
              processes: dict[str, Any], fail: dict[str, Any]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for workload in workloads:
        row: dict[str, Any] = {"transitions": workload.transitions, "phases": workload.phases,
                               "groups": workload.groups}
        old = env.runs.get(f"{workload.key}/floor16")
        for figure in (*PER_RUN, *SERVER):
            floor = median([r[figure] for r in env.runs[f"{workload.key}/floor"]])
            ours = median([r[figure] for r in env.runs[f"{workload.key}/phasegate"]])
            row[figure] = {"floor": floor, "phasegate": ours, "ratio": ratio(ours, floor)}
            if old:
                row[figure]["floor16"] = median([r[figure] for r in old])
        counted = round_trips.get(workload.key)
        if counted:
            floor = counted["floor"]["round_trips_per_transition"]
            ours = counted["phasegate"]["round_trips_per_transition"]
            row["pg_round_trips_per_transition"] = {
                "floor": floor, "phasegate": ours, "ratio": ratio(ours, floor),
                "phasegate_by_statement": counted["phasegate"]["by_statement_per_transition"],
                "floor_by_statement": counted["floor"]["by_statement_per_transition"]}
        table[workload.key] = row
    single: dict[str, Any] = {}
    for figure in ("cold_start_s", "idle_rss_mib"):
        floor = median([r[figure] for r in processes["floor"]])
        ours = median([r[figure] for r in processes["phasegate"]])
        single[figure] = {"floor": floor, "phasegate": ours, "ratio": ratio(ours, floor)}
    floor, ours = median(fail["floor"]), median(fail["phasegate"])
    single["failover_s"] = {
        "floor": floor, "phasegate": ours, "ratio": ratio(ours, floor),
        "phasegate_max": max(fail["phasegate"]), "floor_max": max(fail["floor"]),
        "settings": {"phasegate": {"visibility_timeout_s": FAILOVER_VISIBILITY_S,
                                   "heartbeat_s": FAILOVER_HEARTBEAT_S},
                     "floor": {"visibility_timeout_s": FLOOR_FAILOVER_VISIBILITY_S,
                               "heartbeat": None},
                     "phase_s": FAILOVER_PHASE_S}}
    return {"per_workload": table, "processes": single}


def workloads_for(quick: bool, backends: list[str],
                  phases: dict[int, int] | None = None) -> list[Workload]:
    # Full sizes give the floor seconds of work per figure in-process (1 group: ~2,000
    # transitions at ~2-3k/s; 16 groups: 6,400 at ~5-8k/s); moto is ~5 ms per call, so less.
    sizes = {("memory", 1): (150, 2000), ("memory", 16): (15, 400),
             ("moto", 1): (30, 100), ("moto", 16): (4, 12)}
    # LocalStack: what one user waits between two phases of one workflow (issue 18); at 16
    # groups, the fleet's figures when every SQS call is a real HTTP request (each costs the
    # client about a millisecond of CPU in botocore, which the in-process FIFO does not). One
    # workflow of 150 phases since the `s25` runs: with 30 (before), five runs in a row of
    # one release read the wait at 0.77-1.34x the floor and client CPU at 0.86-1.44x.
    sizes[("localstack", 1)] = (30, 150)
    sizes[("localstack", 16)] = (10, 40)
    return [Workload(b, g, (phases or {}).get(g) or sizes[(b, g)][0 if quick else 1])
            for b in backends for g in (1, 16) if (b, g) in sizes]


async def bench(*, quick: bool, backends: list[str], repeats: int, process_repeats: int,
                skip_processes: bool = False, server_dsn: str | None = None,
                workloads: list[Workload] | None = None, private_server: bool = False,
                old_floor: bool = False, commit_window_ms: float | None = None,
                localstack_endpoint: str | None = None,
                phases: dict[int, int] | None = None,
                load_window_ms: float | None = None,
                continuation: bool = True, pooler: str = "transaction",
                rehearsal: bool = True,
                history: int = HISTORY_RUNS, cores: str = "shared",
                floor_user_agent: str = "stock") -> dict[str, Any]:
    """Every figure, floor and phasegate alternating; returns the results document."""
    # Dummy credentials for the local SQS server (never AWS): the clients sign requests.
    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    databases = await Databases(server_dsn, private=private_server, history=history).start()
    env = Env(databases, continuation=continuation, pooler=pooler, rehearsal=rehearsal,
              floor_user_agent=floor_user_agent)
    if commit_window_ms is not None:
        env.commit_window_ms = commit_window_ms
    env.localstack_endpoint = localstack_endpoint
    if load_window_ms is not None:
        env.load_window_ms = load_window_ms
    try:
        split = split_cores(databases) if cores == "split" else None
        with moto_server() as endpoint:
            env.moto_endpoint = endpoint
            workloads = workloads or workloads_for(quick, backends, phases)
            for workload in workloads:
                print(f"{workload.key}: {workload.transitions} transitions "
                      f"({workload.groups} x {workload.phases} phases), {repeats} rounds",
                      flush=True)
                await timed_runs(env, workload, repeats, old_floor)
            round_trips = {}
            for workload in workloads:
                if workload.backend == "memory":
                    round_trips[workload.key] = await count_round_trips(env, workload)
            if skip_processes:
                processes = {"floor": [{"cold_start_s": 0.0, "idle_rss_mib": 0.0}],
                             "phasegate": [{"cold_start_s": 0.0, "idle_rss_mib": 0.0}]}
                fail: dict[str, Any] = {"floor": [0.0], "phasegate": [0.0]}
            else:
                processes = await cold_start_and_rss(env, endpoint, process_repeats)
                fail = await failover(env, endpoint, process_repeats)
        summary = summarise(env, workloads, round_trips, processes, fail)
        return {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": quick,
                "private_server": databases.private, "load": os.getloadavg(),
                "repeats": repeats, "process_repeats": process_repeats,
                "concurrency": CONCURRENCY, "commit_window_ms": env.commit_window_ms,
                "load_window_ms": env.load_window_ms,
                "continuation": continuation, "pooler": pooler, "history_runs": history,
                "rehearsal": rehearsal, "cores": split or "shared",
                "floor_user_agent": floor_user_agent,
                "machine": machine(),
                "postgres": await databases.settings(), "summary": summary, "runs": env.runs}
    finally:
        await databases.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="phasegate vs a raw floor, in one run")
    parser.add_argument("--quick", action="store_true", help="small workloads, 2 rounds")
    parser.add_argument("--backends", default="memory,moto")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--process-repeats", type=int, default=None)
    parser.add_argument("--skip-processes", action="store_true")
    parser.add_argument("--label", default="", help="suffix for the results file")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks.md")
    parser.add_argument("--shared-server", action="store_true",
                        help="use $PHASEGATE_BENCH_DATABASE_URL or 127.0.0.1:5432 instead of a "
                        "private cluster (WAL figures then include other clients' writes)")
    parser.add_argument("--old-floor", action="store_true",
                        help="also run the old floor (16 pollers whatever the groups)")
    parser.add_argument("--commit-window-ms", type=float, default=None,
                        help="phasegate's group commit window (default: the setting's "
                        "default; 0 = group commit off)")
    parser.add_argument("--load-window-ms", type=float, default=None,
                        help="phasegate's group load window (default: the setting's default; "
                        "0 = group load off)")
    parser.add_argument("--localstack-endpoint",
                        default=os.environ.get("PHASEGATE_BENCH_LOCALSTACK_URL"),
                        help="a running LocalStack (localstack/run-without-docker.sh) for the "
                        "localstack backend: one 150-phase workflow (the wait per hop) and 16 "
                        "workflows of 40 phases (the fleet's figures over HTTP)")
    parser.add_argument("--phases", default=None, metavar="G:N,...",
                        help="phases per workflow by number of groups, e.g. 1:300,16:60 "
                        "(a loaded machine: same ratios, less time)")
    parser.add_argument("--rehearsal", choices=("on", "off"), default="on",
                        help="before each timed run, one run of the workload's phases on the "
                        "same connections, outside the window (default on; off: the figures "
                        "carry what a connection and a phase name cost once)")
    parser.add_argument("--continuation", choices=("on", "off"), default="on",
                        help="phasegate's local continuation (PHASEGATE_CONTINUATION)")
    parser.add_argument("--pooler", choices=("transaction", "none"), default="transaction",
                        help="phasegate's PHASEGATE_DATABASE_POOLER: transaction (default, no "
                        "statement cache) or none (statements cached, as the floor's are)")
    parser.add_argument("--history", type=int, default=HISTORY_RUNS, metavar="RUNS",
                        help="finished runs every database starts with, analyzed (default "
                        f"{HISTORY_RUNS}; 0: empty, never-analyzed databases, as before "
                        "2026-12-03)")
    parser.add_argument("--cores", choices=("shared", "split"), default="shared",
                        help="shared (default): Postgres and the benchmark on every CPU; split: "
                        "Postgres on a CPU of its own and the benchmark on the others, as a "
                        "deployment runs them on separate machines")
    parser.add_argument("--floor-user-agent", choices=("stock", "fixed"), default="stock",
                        help="the floor's SQS client: stock (default: aioboto3's defaults, "
                        "botocore's User-Agent built per request) or fixed (phasegate's fixed "
                        "User-Agent, phasegate/queue.py)")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    process_repeats = args.process_repeats or (1 if args.quick else 3)
    _quiet_logs()
    result = asyncio.run(bench(quick=args.quick, backends=args.backends.split(","),
                               repeats=repeats, process_repeats=process_repeats,
                               skip_processes=args.skip_processes,
                               private_server=not args.shared_server,
                               old_floor=args.old_floor,
                               commit_window_ms=args.commit_window_ms,
                               localstack_endpoint=args.localstack_endpoint,
                               phases=_phases(args.phases),
                               load_window_ms=args.load_window_ms,
                               continuation=args.continuation == "on",
                               pooler=args.pooler, history=args.history,
                               floor_user_agent=args.floor_user_agent,
                               rehearsal=args.rehearsal == "on", cores=args.cores))
    result["command"] = " ".join(["python -m bench.transitions", *sys.argv[1:]])
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = f"transitions-{time.strftime('%Y%m%dT%H%M%S')}{'-' + args.label if args.label else ''}"
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"results: {path.relative_to(ROOT)}")
    print(render_table(result))
    if args.write_docs:
        from bench.report import write_docs

        write_docs(result, path)


def _phases(text: str | None) -> dict[int, int] | None:
    if not text:
        return None
    pairs = (item.split(":") for item in text.split(","))
    return {int(groups): int(count) for groups, count in pairs}


def _quiet_logs() -> None:
    """The worker logs as in production (JSON, info: one line per phase), into /dev/null."""
    from phasegate.logs import configure_logging

    real = sys.stderr
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    try:
        configure_logging("info", "json")
    finally:
        sys.stderr = real


def render_table(result: dict[str, Any]) -> str:
    lines = ["| workload | figure | floor | phasegate | ratio |", "|---|---|---:|---:|---:|"]
    for key, row in result["summary"]["per_workload"].items():
        for figure in (*PER_RUN, *SERVER, "pg_round_trips_per_transition"):
            if figure in row:
                cell = row[figure]
                lines.append(f"| {key} | {figure} | {cell['floor']:.3g} | "
                             f"{cell['phasegate']:.3g} | {cell['ratio']:.2f} |")
    for figure, cell in result["summary"]["processes"].items():
        lines.append(f"| process | {figure} | {cell['floor']:.3g} | {cell['phasegate']:.3g} | "
                     f"{cell['ratio']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
