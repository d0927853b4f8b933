"""Every SQS request phasegate sends carries its own fixed User-Agent (phasegate/queue.py):
built once instead of twice per request, and what CloudTrail shows as the caller. Seen on the
requests as they leave for the real SQS server."""

from __future__ import annotations

from typing import Any

from phasegate.queue import USER_AGENT, Outgoing
from tests.helpers import queue_for


async def test_every_request_carries_phasegates_user_agent(settings) -> None:
    sent: list[tuple[str, str]] = []

    def capture(request: Any, **_: Any) -> None:
        sent.append((_text(request.headers.get("X-Amz-Target", "")),
                     _text(request.headers["User-Agent"])))

    async with queue_for(settings) as queue:
        queue._client.meta.events.register("before-send.sqs", capture)
        await queue.send([Outgoing('{"n": 1}', "g1", "d1")])
        received = await queue.receive(1, 1, 30)
        assert len(received) == 1
        await queue.delete([received[0].receipt_handle])
    assert [target.rsplit(".", 1)[-1] for target, _ in sent] == [
        "SendMessageBatch", "ReceiveMessage", "DeleteMessageBatch"]
    # One string for every request, phasegate's with what the session appends (botocore's).
    assert len({agent for _, agent in sent}) == 1
    assert sent[0][1].startswith(USER_AGENT + " ") and USER_AGENT.startswith("phasegate/")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
