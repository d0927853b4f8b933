"""The figures of real worker processes, phasegate's (``phasegate worker``) and the floor's
(``python -m bench.floor``) against a local SQS server, alternating: cold start (process start
to its first phase committed), idle RSS, and failover (how long a phase waits for the second
of two workers after the one running it is killed).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import asyncpg

from bench.common import MEASURED, ROOT, VENV_BIN, rss_mib
from bench.floor import floor_message
from bench.transition_runs import Env, _sqs_client
from bench.workload import FAILOVER_PHASE_S, PAYLOAD
from phasegate.envelope import start_message
from phasegate.orchestrator.embedded import free_port, local_aws_env
from phasegate.queue import Outgoing, SqsQueue, create_fifo_queue_pair
from phasegate.store import Store, create_pool

# Failover: the worker lease. Visibility 2 s extended every 1 s means a dead worker's message
# is visible again 1-2 s after the kill. The floor has no heartbeat, so its visibility must
# outlast its longest phase.
FAILOVER_VISIBILITY_S = 2
FAILOVER_HEARTBEAT_S = 1.0
FLOOR_FAILOVER_VISIBILITY_S = int(FAILOVER_PHASE_S) + 1


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
