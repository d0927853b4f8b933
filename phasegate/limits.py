"""AWS SQS limits, named where they come from, so values are checked where they enter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# ReceiveMessage MaxNumberOfMessages is 1..10 (SQS API reference, ReceiveMessage).
SQS_MAX_RECEIVE_BATCH = 10
# SendMessageBatch / DeleteMessageBatch / ChangeMessageVisibilityBatch take at most 10 entries.
SQS_MAX_BATCH_ENTRIES = 10
# WaitTimeSeconds for long polling is 0..20 (SQS API reference, ReceiveMessage).
SQS_MAX_LONG_POLL_SECONDS = 20
# VisibilityTimeout is 0..43,200 seconds (12 hours) (SQS developer guide, visibility timeout).
SQS_MAX_VISIBILITY_TIMEOUT_SECONDS = 43_200
# The classic message size limit, 256 KiB. AWS raised the queue maximum to 1 MiB in 2025, but
# moto, LocalStack and older queues still enforce 256 KiB, and every message phasegate writes
# is small (state lives in Postgres), so this is the safe default ceiling.
SQS_MAX_MESSAGE_BYTES = 262_144
# MessageGroupId and MessageDeduplicationId are at most 128 characters (SQS FIFO guide).
SQS_MAX_GROUP_ID_CHARS = 128
# A FIFO queue drops a message whose deduplication id it saw in the last 5 minutes.
SQS_DEDUP_WINDOW_SECONDS = 300

# FIFO throughput quotas (SQS developer guide, "Amazon SQS FIFO queue quotas" and "High
# throughput for FIFO queues"). A FIFO queue in the default mode allows 300 transactions per
# second per API action (Send/Receive/Delete/ChangeVisibility), each carrying up to 10
# messages: 3,000 messages per second with batching.
SQS_FIFO_CALLS_PER_S = 300
SQS_FIFO_MESSAGES_PER_S_BATCHED = SQS_FIFO_CALLS_PER_S * SQS_MAX_BATCH_ENTRIES
# High-throughput mode (DeduplicationScope=messageGroup + FifoThroughputLimit=
# perMessageGroupId): the limit applies per message group (300 calls/s each), and the queue as
# a whole scales with partitions up to a regional ceiling: 70,000 calls/s per action in
# us-east-1, us-west-2 and eu-west-1 (lower elsewhere; the guide lists each region).
SQS_FIFO_HT_CALLS_PER_S_PER_GROUP = 300
SQS_FIFO_HT_CALLS_PER_S_MAX = 70_000


@dataclass(frozen=True)
class FifoQuota:
    """Which FIFO throughput quota a queue's attributes put it under."""

    mode: str  # "high_throughput" or "standard"
    calls_per_s_per_action: int
    messages_per_s_batched: int
    calls_per_s_per_group: int


def fifo_quota(attributes: Mapping[str, str]) -> FifoQuota:
    """The quota for a FIFO queue's ``DeduplicationScope`` / ``FifoThroughputLimit``."""
    high = (attributes.get("DeduplicationScope") == "messageGroup"
            and attributes.get("FifoThroughputLimit") == "perMessageGroupId")
    if high:
        return FifoQuota("high_throughput", SQS_FIFO_HT_CALLS_PER_S_MAX,
                         SQS_FIFO_HT_CALLS_PER_S_MAX * SQS_MAX_BATCH_ENTRIES,
                         SQS_FIFO_HT_CALLS_PER_S_PER_GROUP)
    return FifoQuota("standard", SQS_FIFO_CALLS_PER_S, SQS_FIFO_MESSAGES_PER_S_BATCHED,
                     SQS_FIFO_CALLS_PER_S)
