"""The raw floor: the least a queue-driven transition can do, written plainly.

``concurrency`` tasks, each with its own asyncpg connection, loop: receive one message -> one
UPSERT commit -> send the next message -> delete the received one. No framework, no checks,
no outbox, no logging. On the in-process backend it uses the same ``InMemoryFifoQueue`` as
phasegate; on moto it calls aioboto3 directly.

Also runnable as a process (``python -m bench.floor ...``) for idle RSS, cold start and
failover, where it plays the part of a ``phasegate worker`` process.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

import asyncpg

from bench.workload import PAYLOAD
from phasegate.queue import Outgoing, Received

UPSERT = """
INSERT INTO bench_floor (workflow_id, seq, state) VALUES ($1, $2, $3::jsonb)
ON CONFLICT (workflow_id, seq) DO UPDATE SET state = excluded.state, committed_at = now()
"""


def floor_message(workflow_id: str, seq: int, phases: int) -> Outgoing:
    body = json.dumps({"workflow_id": workflow_id, "seq": seq, "phases": phases})
    dedup = hashlib.sha256(f"{workflow_id}:{seq}".encode()).hexdigest()
    return Outgoing(body, workflow_id, dedup)


class SqsFloorQueue:
    """Single-message SQS calls on a raw aioboto3 client, counted."""

    def __init__(self, client: Any, queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url
        self.calls = 0

    async def receive(self, max_messages: int, wait_time_s: int,
                      visibility_timeout_s: int) -> list[Received]:
        self.calls += 1
        response = await self.client.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=max_messages,
            WaitTimeSeconds=wait_time_s, VisibilityTimeout=visibility_timeout_s,
            MessageSystemAttributeNames=["MessageGroupId"])  # the worker checks it
        return [Received(m["MessageId"], m["ReceiptHandle"], m["Body"],
                         m.get("Attributes", {}).get("MessageGroupId"), 1)
                for m in response.get("Messages", [])]

    async def send(self, messages: Sequence[Outgoing]) -> None:
        for message in messages:
            self.calls += 1
            await self.client.send_message(
                QueueUrl=self.queue_url, MessageBody=message.body,
                MessageGroupId=message.group_id, MessageDeduplicationId=message.dedup_id)

    async def delete(self, receipt_handles: Sequence[str]) -> None:
        for handle in receipt_handles:
            self.calls += 1
            await self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=handle)


class Floor:
    def __init__(self, *, dsn: str, queue: Any, concurrency: int, wait_time_s: int = 20,
                 visibility_timeout_s: int = 30, expected_runs: int | None = None,
                 phase_sleep_s: float = 0.0, name: str = "floor") -> None:
        self.dsn = dsn
        self.queue = queue
        self.concurrency = concurrency
        self.wait_time_s = wait_time_s
        self.visibility_timeout_s = visibility_timeout_s
        self.expected_runs = expected_runs
        self.phase_sleep_s = phase_sleep_s
        self.name = name
        self.finished = 0
        self.done = asyncio.Event()
        self.first_commit = asyncio.Event()
        self._connections: list[asyncpg.Connection] = []

    async def open(self) -> None:
        """Connect before the timed window, so the server's backends (and their CPU) exist
        from its start to its end, as phasegate's pool does."""
        self._connections = [await asyncpg.connect(self.dsn) for _ in range(self.concurrency)]

    async def rehearse(self, queue: Any, workflow_id: str, phases: int) -> None:
        """One run of ``phases`` through ``queue`` on the open connections, before the timed
        one (bench/transition_runs.py, ``REHEARSAL``); then ready to run again."""
        timed, self.queue = self.queue, queue
        expected, self.expected_runs = self.expected_runs, 1
        try:
            await queue.send([floor_message(workflow_id, 0, phases)])
            await self.run()
        finally:
            self.queue, self.expected_runs, self.finished = timed, expected, 0
            self.done, self.first_commit = asyncio.Event(), asyncio.Event()

    async def close(self) -> None:
        for connection in self._connections:
            await connection.close()
        self._connections = []

    async def run(self) -> None:
        opened_here = not self._connections
        if opened_here:
            await self.open()
        tasks = [asyncio.create_task(self._loop(c)) for c in self._connections]
        try:
            await self.done.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if opened_here:
                await self.close()

    async def _loop(self, connection: asyncpg.Connection) -> None:
        while True:
            for message in await self.queue.receive(1, self.wait_time_s,
                                                    self.visibility_timeout_s):
                await self._transition(connection, message)

    async def _transition(self, connection: asyncpg.Connection, message: Received) -> None:
        body = json.loads(message.body)
        workflow_id, seq, phases = body["workflow_id"], body["seq"], body["phases"]
        if self.phase_sleep_s:
            await connection.execute(
                "INSERT INTO bench_invocations (workflow_id, seq, worker, pid) "
                "VALUES ($1, $2, $3, $4)", workflow_id, seq, self.name, os.getpid())
            await asyncio.sleep(self.phase_sleep_s)
        await connection.execute(UPSERT, workflow_id, seq, json.dumps(PAYLOAD))
        self.first_commit.set()
        if seq + 1 < phases:
            await self.queue.send([floor_message(workflow_id, seq + 1, phases)])
        await self.queue.delete([message.receipt_handle])
        if seq + 1 >= phases:
            self.finished += 1
            if self.expected_runs is not None and self.finished >= self.expected_runs:
                self.done.set()


async def _process(args: argparse.Namespace) -> None:
    import aioboto3
    from botocore.config import Config

    session = aioboto3.Session()
    async with session.client("sqs", endpoint_url=args.endpoint, region_name="us-east-1",
                              config=Config(max_pool_connections=50)) as client:
        floor = Floor(dsn=args.dsn, queue=SqsFloorQueue(client, args.queue_url),
                      concurrency=args.concurrency, wait_time_s=args.wait_time_s,
                      visibility_timeout_s=args.visibility_timeout_s,
                      phase_sleep_s=args.phase_sleep_s, name=f"floor-{os.getpid()}")
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, floor.done.set)
        with suppress(asyncio.CancelledError):
            await floor.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--queue-url", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--wait-time-s", type=int, default=20)
    parser.add_argument("--visibility-timeout-s", type=int, default=30)
    parser.add_argument("--phase-sleep-s", type=float, default=0.0)
    asyncio.run(_process(parser.parse_args()))


if __name__ == "__main__":
    main()
