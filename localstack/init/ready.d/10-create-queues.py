"""LocalStack ready hook: create phasegate's FIFO queue and its FIFO dead-letter queue.

LocalStack runs `.py` hooks inside its own process (boto3 is importable there), both in the
Docker image (/etc/localstack/init/ready.d) and without Docker (run-without-docker.sh links
this directory under FILESYSTEM_ROOT). Idempotent: CreateQueue with the same attributes
returns the existing queue.

Environment: PHASEGATE_QUEUE_NAME, PHASEGATE_DLQ_NAME, PHASEGATE_VISIBILITY_TIMEOUT_S
(match the worker's setting), PHASEGATE_MAX_RECEIVE_COUNT.
"""

import json
import os

import boto3


def gateway_endpoint() -> str:
    listen = os.environ.get("GATEWAY_LISTEN", "0.0.0.0:4566").split(",")[0].strip()
    host, _, port = listen.rpartition(":")
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{port or '4566'}"


region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
sqs = boto3.client(
    "sqs",
    endpoint_url=gateway_endpoint(),
    region_name=region,
    aws_access_key_id="test",  # LocalStack accepts any credentials
    aws_secret_access_key="test",
)
queue_name = os.environ.get("PHASEGATE_QUEUE_NAME", "phasegate.fifo")
dlq_name = os.environ.get("PHASEGATE_DLQ_NAME", "phasegate-dlq.fifo")
visibility = os.environ.get("PHASEGATE_VISIBILITY_TIMEOUT_S", "30")
max_receive = os.environ.get("PHASEGATE_MAX_RECEIVE_COUNT", "50")

# High-throughput FIFO: deduplication and the 300 calls/s quota apply per message group (one
# group per run) instead of per queue; ordering within a run is unchanged.
fifo = {
    "FifoQueue": "true",
    "ContentBasedDeduplication": "false",
    "DeduplicationScope": "messageGroup",
    "FifoThroughputLimit": "perMessageGroupId",
}
dlq_url = sqs.create_queue(
    QueueName=dlq_name,
    # Keep dead letters for the SQS maximum (14 days) so they can be inspected and redriven.
    Attributes={**fifo, "MessageRetentionPeriod": "1209600"},
)["QueueUrl"]
dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
    "Attributes"
]["QueueArn"]
queue_url = sqs.create_queue(
    QueueName=queue_name,
    Attributes={
        **fifo,
        "VisibilityTimeout": visibility,
        "ReceiveMessageWaitTimeSeconds": "20",
        "RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": int(max_receive)}
        ),
    },
)["QueueUrl"]
print(f"phasegate queues ready: {queue_url} (dead letters: {dlq_url})")
