"""AWS SQS limits, named where they come from, so values are checked where they enter."""

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
