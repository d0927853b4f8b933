"""Shared test helpers: settings, deadline-bounded waits, in-process and subprocess workers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aioboto3
import asyncpg

from phasegate.db import Pooler, connect
from phasegate.orchestrator.relay import Relay
from phasegate.queue import SqsQueue, create_fifo_queue_pair
from phasegate.settings import Settings
from phasegate.store import Store, create_pool
from phasegate.worker.runtime import Worker
from phasegate.workflow import Registry

ROOT = Path(__file__).resolve().parent.parent

# Short leases so redelivery after a crash takes seconds, not the production 30 s.
FAST = {"visibility_timeout_s": 3, "heartbeat_s": 0.5, "wait_time_s": 1,
        "shutdown_grace_s": 5.0, "retry_backoff_s": 0.0, "relay_after_s": 0.5,
        "relay_interval_s": 0.2, "metrics_port": 0, "metrics_host": "127.0.0.1",
        "startup_timeout_s": 20.0,
        # Tests about something else call the API without credentials (loopback only);
        # tests/integration/test_api_auth.py covers tokens.
        "api_auth": "none"}


def write_tokens(path: Path, tokens: dict[str, str]) -> dict[str, str]:
    """A tokens file (PHASEGATE_API_TOKENS_FILE) for {name: "role,role"}; {name: token}."""
    from phasegate.orchestrator.auth import new_token, token_line

    issued = {name: new_token() for name in tokens}
    path.write_text("".join(token_line(name, roles.split(","), issued[name]) + "\n"
                            for name, roles in tokens.items()))
    return issued


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# Database URLs of the tests routed through PgBouncer with statements named by their text
# (tests/conftest.py, route "pgbouncer-named"): their pools and workers use
# PHASEGATE_DATABASE_POOLER=pgbouncer.
NAMED_STATEMENT_URLS: set[str] = set()


def pooler_for(database_url: str) -> Pooler:
    """The pooler mode a test's pools and workers use for ``database_url``."""
    return "pgbouncer" if database_url in NAMED_STATEMENT_URLS else "transaction"


def make_settings(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str,
                  **overrides: Any) -> Settings:
    values: dict[str, Any] = {**FAST, "database_pooler": pooler_for(database_url),
                              "database_url": database_url, "queue_url": queue_pair[0],
                              "dlq_url": queue_pair[1], "sqs_endpoint_url": sqs_endpoint,
                              "aws_region": "us-east-1", **overrides}
    return Settings(**values)


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings as PHASEGATE_* env vars for a subprocess."""
    env = {}
    for name, value in settings.model_dump().items():
        if value is None or name == "worker_id":
            continue
        env[f"PHASEGATE_{name.upper()}"] = str(value)
    return env


async def create_queues(endpoint: str, name: str) -> tuple[str, str]:
    session = aioboto3.Session()
    async with session.client("sqs", endpoint_url=endpoint, region_name="us-east-1") as client:
        return await create_fifo_queue_pair(client, name, visibility_timeout_s=3,
                                            max_receive_count=50)


async def wait_for(predicate: Callable[[], Awaitable[bool]], *, timeout: float = 60,
                   interval: float = 0.05, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if await predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


@asynccontextmanager
async def running_worker(settings: Settings, registry: Registry) -> AsyncIterator[Worker]:
    worker = Worker(settings=settings, registry=registry)
    task = asyncio.create_task(worker.run())
    try:
        await wait_for(lambda: _ready_or_done(worker, task), timeout=30, what="worker ready")
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=60)


async def _ready_or_done(worker: Worker, task: asyncio.Task[None]) -> bool:
    if task.done():
        task.result()
        return True
    return worker.ready


@asynccontextmanager
async def store_for(database_url: str) -> AsyncIterator[Store]:
    pool = await create_pool(database_url, min_size=1, max_size=2,
                             pooler=pooler_for(database_url))
    try:
        yield Store(pool)
    finally:
        await pool.close()


@asynccontextmanager
async def queue_for(settings: Settings, url: str | None = None) -> AsyncIterator[SqsQueue]:
    async with SqsQueue(url or settings.queue_url or "", endpoint_url=settings.sqs_endpoint_url,
                        region="us-east-1") as queue:
        yield queue


async def fetch(database_url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    connection = await connect(database_url)
    try:
        return list(await connection.fetch(sql, *args))
    finally:
        await connection.close()


async def fetchval(database_url: str, sql: str, *args: Any) -> Any:
    connection = await connect(database_url)
    try:
        return await connection.fetchval(sql, *args)
    finally:
        await connection.close()


async def all_done(database_url: str, ids: list[str], status: str = "completed") -> bool:
    count = await fetchval(database_url, "SELECT count(*) FROM workflow_runs "
                           "WHERE workflow_id = ANY($1) AND status = $2", ids, status)
    return bool(count == len(ids))


async def send_raw(settings: Settings, body: str | dict[str, Any], *, group: str = "g",
                   dedup: str | None = None, url: str | None = None) -> None:
    import hashlib

    text = body if isinstance(body, str) else json.dumps(body)
    async with queue_for(settings, url) as queue:
        await queue._client.send_message(
            QueueUrl=queue.queue_url, MessageBody=text, MessageGroupId=group,
            MessageDeduplicationId=dedup or hashlib.sha256(
                f"{text}:{time.time_ns()}".encode()).hexdigest())


def spawn_worker(settings: Settings, *, modules: str = "tests.workflows",
                 extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A real worker OS process (``python -m phasegate.cli worker``)."""
    env = {**os.environ, **settings_env(settings), "PHASEGATE_WORKFLOW_MODULES": modules,
           "PHASEGATE_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT), **(extra_env or {})}
    return subprocess.Popen([sys.executable, "-m", "phasegate.cli", "worker"], env=env,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stop_process(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
    if process.poll() is None:
        process.terminate()
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


@asynccontextmanager
async def running_relay(settings: Settings, interval_s: float = 0.1) -> AsyncIterator[Relay]:
    """The orchestrator's relay (the always-on part that sends due and stranded rows), run
    in this process until the block ends."""
    async with store_for(settings.database_url or "") as store, queue_for(settings) as queue:
        relay = Relay(store=store, queue=queue, after_s=settings.relay_after_s,
                      interval_s=interval_s)
        task = asyncio.create_task(relay.run())
        try:
            yield relay
        finally:
            relay.stop()
            await asyncio.wait_for(task, timeout=30)
