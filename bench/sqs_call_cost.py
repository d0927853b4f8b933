"""Client CPU of one SQS call through aioboto3, with botocore's default User-Agent and with
phasegate's fixed one (phasegate/queue.py), against a running SQS server.

    python -m bench.sqs_call_cost --endpoint http://127.0.0.1:4599 [--calls 300] [--rounds 3]

botocore builds its default User-Agent twice per request (sanitising each component); a fixed
one is a string. Each round times, per setting: ``SendMessage`` calls, then ``ReceiveMessage``
+ ``DeleteMessage`` of the same messages, one at a time (the floor's calls,
bench/floor.py), in CPU seconds of this process. Settings alternate within a round.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import aioboto3
from botocore.config import Config

from phasegate.queue import client_config, create_fifo_queue_pair

BODY = "x" * 200


def _config(fixed: bool) -> Config:
    config = client_config()
    if fixed:
        return config
    # The same options with botocore's own User-Agent: no override.
    return Config(retries=config.retries, max_pool_connections=config.max_pool_connections,
                  connect_timeout=config.connect_timeout, read_timeout=config.read_timeout)


async def _round(endpoint: str, fixed: bool, calls: int) -> tuple[float, float]:
    session = aioboto3.Session()
    async with session.client("sqs", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="test", aws_secret_access_key="test",
                              config=_config(fixed)) as client:
        queue, _ = await create_fifo_queue_pair(client, f"cost{uuid.uuid4().hex[:10]}")
        await _send(client, queue, 20)  # a warm connection and warm code paths
        await _receive_and_delete(client, queue, 20)
        started = time.process_time()
        await _send(client, queue, calls)
        send = (time.process_time() - started) / calls
        started = time.process_time()
        await _receive_and_delete(client, queue, calls)
        receive_delete = (time.process_time() - started) / calls
        return send, receive_delete


async def _send(client: Any, queue: str, n: int) -> None:
    for i in range(n):
        await client.send_message(QueueUrl=queue, MessageBody=BODY, MessageGroupId=f"g{i}",
                                  MessageDeduplicationId=uuid.uuid4().hex)


async def _receive_and_delete(client: Any, queue: str, n: int) -> None:
    done = 0
    while done < n:
        response = await client.receive_message(
            QueueUrl=queue, MaxNumberOfMessages=1, WaitTimeSeconds=0, VisibilityTimeout=60,
            MessageSystemAttributeNames=["MessageGroupId", "ApproximateReceiveCount"])
        for message in response.get("Messages", []):
            await client.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
            done += 1


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| round | User-Agent | send (µs) | receive + delete (µs) |")
    print("|---|---|---:|---:|")
    for n in range(1, args.rounds + 1):
        for fixed in (False, True) if n % 2 else (True, False):
            send, receive_delete = await _round(args.endpoint, fixed, args.calls)
            print(f"| {n} | {'fixed' if fixed else 'botocore default'} | {send * 1e6:.0f} | "
                  f"{receive_delete * 1e6:.0f} |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
