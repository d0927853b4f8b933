"""The queue contract the worker speaks, and its SQS implementation over aioboto3.

``SqsQueue`` talks to a real SQS-compatible server (AWS, moto server, LocalStack) over HTTP.
``phasegate.worker.fake_queue.InMemoryFifoQueue`` implements the same protocol for unit tests.
"""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Protocol, TypeVar

import aioboto3
from botocore.config import Config

from phasegate.limits import (
    SQS_MAX_BATCH_ENTRIES,
    SQS_MAX_LONG_POLL_SECONDS,
    SQS_MAX_RECEIVE_BATCH,
    SQS_MAX_VISIBILITY_TIMEOUT_SECONDS,
)
from phasegate.records import record


@record
class Received:
    message_id: str
    receipt_handle: str
    body: str
    group_id: str | None
    receive_count: int


@record
class Outgoing:
    body: str
    group_id: str
    dedup_id: str


@dataclass(frozen=True)
class QueueDepth:
    visible: int
    inflight: int
    delayed: int


class QueueError(Exception):
    """Some entries of a batch call failed; ``failed`` holds their ids."""

    def __init__(self, action: str, failed: dict[str, str]) -> None:
        super().__init__(f"{action} failed for {len(failed)} entries: "
                         f"{sorted(set(failed.values()))}")
        self.failed = failed


# FIFO high-throughput mode: deduplication and the throughput quota per message group (one
# group per run), so the queue scales with partitions instead of stopping at 300 calls/s per
# action. Ordering and deduplication within a run are unchanged: both are per group.
HIGH_THROUGHPUT_FIFO = {"DeduplicationScope": "messageGroup",
                        "FifoThroughputLimit": "perMessageGroupId"}
FIFO_ATTRIBUTES = ("FifoQueue", "DeduplicationScope", "FifoThroughputLimit")


class Queue(Protocol):
    async def receive(self, max_messages: int, wait_time_s: int,
                      visibility_timeout_s: int) -> list[Received]: ...

    async def send(self, messages: Sequence[Outgoing]) -> None: ...

    async def delete(self, receipt_handles: Sequence[str]) -> None: ...

    async def change_visibility(self, entries: Sequence[tuple[str, int]]) -> None: ...

    async def depth(self) -> QueueDepth: ...

    async def is_fifo(self) -> bool: ...

    async def encryption(self) -> str | None: ...

    async def fifo_attributes(self) -> dict[str, str]: ...


T = TypeVar("T")


def chunks(items: Sequence[T], size: int = SQS_MAX_BATCH_ENTRIES) -> list[Sequence[T]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _user_agent() -> str:
    try:
        version = metadata.version("phasegate")
    except metadata.PackageNotFoundError:  # a checkout run without being installed
        version = "dev"
    # The session appends botocore's own name and version.
    return f"phasegate/{version} Python/{platform.python_version()}"


# Fixed once. botocore otherwise builds its User-Agent twice per request, sanitising a dozen
# components each time: about 11 % of an SQS call's client CPU (python -m bench.sqs_call_cost). It
# also names phasegate in CloudTrail's userAgent.
USER_AGENT = _user_agent()


def client_config(max_connections: int = 20) -> Config:
    # "standard" retry mode backs off on throttling and 5xx, which SQS returns under load.
    return Config(retries={"mode": "standard", "max_attempts": 5},
                  max_pool_connections=max_connections, connect_timeout=5, read_timeout=30,
                  user_agent=USER_AGENT)


class SqsQueue:
    """One queue URL on one aioboto3 client. Open with ``async with`` or ``open()``."""

    def __init__(self, queue_url: str, *, endpoint_url: str | None = None,
                 region: str | None = None, client: Any = None) -> None:
        self.queue_url = queue_url
        self._endpoint_url = endpoint_url
        self._region = region
        self._client = client
        self._stack: AsyncExitStack | None = None
        self.calls = 0
        # Calls per action (receive, send, delete, change_visibility, depth): what the
        # benchmarks and tests count (SQS bills and throttles per call and per action).
        self.counts: Counter[str] = Counter()

    async def open(self) -> SqsQueue:
        if self._client is None:
            self._stack = AsyncExitStack()
            session = aioboto3.Session()
            self._client = await self._stack.enter_async_context(session.client(
                "sqs", endpoint_url=self._endpoint_url, region_name=self._region,
                config=client_config()))
        return self

    def sibling(self, queue_url: str) -> SqsQueue:
        """Another queue on the same client (the DLQ)."""
        return SqsQueue(queue_url, client=self._client)

    async def close(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None
            self._client = None

    async def __aenter__(self) -> SqsQueue:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def receive(self, max_messages: int, wait_time_s: int,
                      visibility_timeout_s: int) -> list[Received]:
        assert 1 <= max_messages <= SQS_MAX_RECEIVE_BATCH
        assert 0 <= wait_time_s <= SQS_MAX_LONG_POLL_SECONDS
        self.calls += 1
        self.counts["receive"] += 1
        response = await self._client.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=max_messages,
            WaitTimeSeconds=wait_time_s, VisibilityTimeout=visibility_timeout_s,
            MessageSystemAttributeNames=["MessageGroupId", "ApproximateReceiveCount"])
        return [
            Received(message_id=m["MessageId"], receipt_handle=m["ReceiptHandle"],
                     body=m.get("Body", ""),
                     group_id=m.get("Attributes", {}).get("MessageGroupId"),
                     receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)))
            for m in response.get("Messages", [])
        ]

    async def send(self, messages: Sequence[Outgoing]) -> None:
        failed: dict[str, str] = {}
        for batch in chunks(messages):
            self.calls += 1
            self.counts["send"] += 1
            response = await self._client.send_message_batch(QueueUrl=self.queue_url, Entries=[
                {"Id": str(i), "MessageBody": m.body, "MessageGroupId": m.group_id,
                 "MessageDeduplicationId": m.dedup_id} for i, m in enumerate(batch)])
            for entry in response.get("Failed", []):
                failed[batch[int(entry["Id"])].dedup_id] = entry.get("Code", "error")
        if failed:
            raise QueueError("SendMessageBatch", failed)

    async def delete(self, receipt_handles: Sequence[str]) -> None:
        failed: dict[str, str] = {}
        for batch in chunks(receipt_handles):
            self.calls += 1
            self.counts["delete"] += 1
            response = await self._client.delete_message_batch(QueueUrl=self.queue_url, Entries=[
                {"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(batch)])
            for entry in response.get("Failed", []):
                failed[batch[int(entry["Id"])]] = entry.get("Code", "error")
        if failed:
            raise QueueError("DeleteMessageBatch", failed)

    async def change_visibility(self, entries: Sequence[tuple[str, int]]) -> None:
        failed: dict[str, str] = {}
        for batch in chunks(entries):
            self.calls += 1
            self.counts["change_visibility"] += 1
            response = await self._client.change_message_visibility_batch(
                QueueUrl=self.queue_url, Entries=[
                    {"Id": str(i), "ReceiptHandle": h,
                     "VisibilityTimeout": max(0, min(v, SQS_MAX_VISIBILITY_TIMEOUT_SECONDS))}
                    for i, (h, v) in enumerate(batch)])
            for entry in response.get("Failed", []):
                failed[batch[int(entry["Id"])][0]] = entry.get("Code", "error")
        if failed:
            raise QueueError("ChangeMessageVisibilityBatch", failed)

    async def depth(self) -> QueueDepth:
        self.calls += 1
        self.counts["depth"] += 1
        response = await self._client.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=[
                "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed"])
        attrs = response.get("Attributes", {})
        return QueueDepth(visible=int(attrs.get("ApproximateNumberOfMessages", 0)),
                          inflight=int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0)),
                          delayed=int(attrs.get("ApproximateNumberOfMessagesDelayed", 0)))

    async def is_fifo(self) -> bool:
        """The queue's FifoQueue attribute: a standard queue would lose per-run ordering."""
        return (await self.fifo_attributes()).get("FifoQueue") == "true"

    async def fifo_attributes(self) -> dict[str, str]:
        """FifoQueue, DeduplicationScope and FifoThroughputLimit: which quota applies."""
        self.calls += 1
        response = await self._client.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=list(FIFO_ATTRIBUTES))
        attributes: dict[str, str] = response.get("Attributes", {})
        return {k: v for k, v in attributes.items() if k in FIFO_ATTRIBUTES}

    async def encryption(self) -> str | None:
        """How the queue is encrypted at rest: "SSE-KMS", "SSE-SQS", or None (it is not)."""
        self.calls += 1
        response = await self._client.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["SqsManagedSseEnabled", "KmsMasterKeyId"])
        attrs = response.get("Attributes", {})
        if attrs.get("KmsMasterKeyId"):
            return "SSE-KMS"
        if attrs.get("SqsManagedSseEnabled") == "true":
            return "SSE-SQS"
        return None


async def create_fifo_queue_pair(client: Any, name: str, *, visibility_timeout_s: int = 30,
                                 max_receive_count: int = 50) -> tuple[str, str]:
    """Create ``name.fifo`` and its DLQ ``name-dlq.fifo`` with a redrive policy.

    Used by the demo and the tests; production queues are created by the CLI snippet in
    docs/how-to/deploy-eks.md or CloudFormation (with KMS encryption, which local servers ignore).
    """
    import json

    dlq = await client.create_queue(QueueName=f"{name}-dlq.fifo", Attributes={
        "FifoQueue": "true", **HIGH_THROUGHPUT_FIFO, "MessageRetentionPeriod": "1209600"})
    dlq_url = dlq["QueueUrl"]
    dlq_arn = (await client.get_queue_attributes(
        QueueUrl=dlq_url, AttributeNames=["QueueArn"]))["Attributes"]["QueueArn"]
    queue = await client.create_queue(QueueName=f"{name}.fifo", Attributes={
        "FifoQueue": "true", **HIGH_THROUGHPUT_FIFO,
        "VisibilityTimeout": str(visibility_timeout_s),
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn,
                                     "maxReceiveCount": str(max_receive_count)})})
    return queue["QueueUrl"], dlq_url
