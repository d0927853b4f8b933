"""A small HTTP proxy in front of the SQS server that injects SQS faults during windows.

It speaks just enough HTTP/1.1 for botocore (keep-alive, Content-Length bodies) and forwards
each request to the real server. While a window of a fault kind is open, each request gets
that fault with the window's probability:

- ``throttle``: 400 with ``RequestThrottled`` (what SQS sends; botocore backs off and retries);
- ``server_error``: 500 ``InternalError`` / 503 ``ServiceUnavailable``;
- ``slow``: the response is held back 0.5-3 s;
- ``send_response_dropped``: a send is forwarded and succeeds, then the connection is closed
  without the response (the sender cannot know the message is in the queue);
- ``send_lost``: a send is answered with success but never forwarded - SQS lost the message
  (the design says a lost message must never lose work);
- ``outage``: every call fails with 503 for several seconds, longer than botocore's own
  retries last, so the engine itself sees failed receives, sends, deletes and heartbeats.

Every fault that actually fired is counted in ``fired``. A window that closes before its fault
fired even once (no matching call came, e.g. during another outage or on a loaded machine)
leaves that fault owed: the next matching call gets it, so every scheduled kind really happens.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
import uuid
from collections import Counter
from contextlib import suppress

import aiohttp

SEND_ACTIONS = frozenset({"SendMessage", "SendMessageBatch"})
HOP_BY_HOP = frozenset({"host", "content-length", "connection", "transfer-encoding",
                        "keep-alive", "accept-encoding"})


class SqsFaultProxy:
    def __init__(self, upstream: str, *, seed: int) -> None:
        self.upstream = upstream.rstrip("/")
        self.rng = random.Random(seed)
        self.fired: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()
        # (until monotonic, kind, probability, fired[kind] when the window opened)
        self._windows: list[tuple[float, str, float, int]] = []
        self._owed: Counter[str] = Counter()
        self._server: asyncio.Server | None = None
        self._session: aiohttp.ClientSession | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> int:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=200), timeout=aiohttp.ClientTimeout(total=60),
            auto_decompress=False)
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._conns):
                writer.close()
            with suppress(Exception):
                await self._server.wait_closed()
        if self._session is not None:
            await self._session.close()

    def open_window(self, kind: str, duration_s: float, probability: float) -> None:
        self._windows.append((time.monotonic() + duration_s, kind, probability,
                              self.fired[kind]))

    def _pick(self, action: str) -> str | None:
        now = time.monotonic()
        for until, kind, _, fired_before in self._windows:
            if until <= now and self.fired[kind] == fired_before:
                self._owed[kind] += 1
        self._windows = [w for w in self._windows if w[0] > now]
        for kind in sorted(self._owed):
            if self._owed[kind] > 0 and _applies(kind, action):
                self._owed[kind] -= 1
                return kind
        # Overlapping windows are tried in random order, so one never hides another.
        for _, kind, probability, _ in self.rng.sample(self._windows, len(self._windows)):
            if _applies(kind, action) and self.rng.random() < probability:
                return kind
        return None

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                if not await self._serve(request, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _serve(self, request: tuple[str, str, dict[str, str], bytes],
                     writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must be dropped."""
        method, path, headers, body = request
        action = headers.get("x-amz-target", "").rpartition(".")[2] or "unknown"
        self.requests[action] += 1
        fault = self._pick(action)
        if fault == "throttle":
            self.fired["throttle"] += 1
            await _respond(writer, 400, json.dumps({
                "__type": "com.amazonaws.sqs#RequestThrottled", "message": "Rate exceeded"}),
                {"x-amzn-query-error": "RequestThrottled;Sender"})
            return True
        if fault in ("server_error", "outage"):
            self.fired[fault] += 1
            status = 503 if fault == "outage" else self.rng.choice((500, 503))
            code = "InternalError" if status == 500 else "ServiceUnavailable"
            await _respond(writer, status, json.dumps({
                "__type": f"com.amazonaws.sqs#{code}", "message": "injected"}),
                {"x-amzn-query-error": f"{code};Receiver"})
            return True
        if fault == "send_lost":
            self.fired["send_lost"] += 1
            await _respond(writer, 200, _fake_send_success(action, body))
            return True
        assert self._session is not None
        forward = {k: v for k, v in headers.items() if k not in HOP_BY_HOP}
        try:
            async with self._session.request(method, self.upstream + path, data=body,
                                             headers=forward) as response:
                payload = await response.read()
                status = response.status
                extra = {k: v for k, v in response.headers.items()
                         if k.lower() not in HOP_BY_HOP and k.lower() != "content-type"}
                content_type = response.headers.get("content-type",
                                                    "application/x-amz-json-1.0")
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The server itself dropped the call (moto closes idle keep-alive sockets): a 502,
            # which botocore retries like any gateway error.
            self.requests["upstream_error"] += 1
            await _respond(writer, 502, json.dumps({
                "__type": "com.amazonaws.sqs#InternalError", "message": type(exc).__name__}))
            return True
        if fault == "slow":
            self.fired["slow"] += 1
            await asyncio.sleep(self.rng.uniform(0.5, 3.0))  # the injected fault itself
        if fault == "send_response_dropped":
            if status == 200:
                self.fired["send_response_dropped"] += 1
                return False
            self._owed[fault] += 1  # the send failed upstream: nothing was dropped yet
        await _respond(writer, status, payload, extra, content_type)
        return True


def _applies(kind: str, action: str) -> bool:
    return kind not in ("send_response_dropped", "send_lost") or action in SEND_ACTIONS


def _fake_send_success(action: str, body: bytes) -> str:
    """What SQS answers to a send it accepted (with the body's MD5, which botocore checks)."""
    request = json.loads(body)

    def accepted(message_body: str) -> dict[str, str]:
        return {"MessageId": str(uuid.uuid4()), "SequenceNumber": "1",
                "MD5OfMessageBody": hashlib.md5(message_body.encode()).hexdigest()}

    if action == "SendMessageBatch":
        return json.dumps({"Successful": [{"Id": e["Id"], **accepted(e["MessageBody"])}
                                          for e in request["Entries"]], "Failed": []})
    return json.dumps(accepted(request["MessageBody"]))


async def _read_request(reader: asyncio.StreamReader
                        ) -> tuple[str, str, dict[str, str], bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return method, path, headers, body


async def _respond(writer: asyncio.StreamWriter, status: int, body: str | bytes,
                   headers: dict[str, str] | None = None,
                   content_type: str = "application/x-amz-json-1.0") -> None:
    data = body.encode() if isinstance(body, str) else body
    lines = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}",
             f"Content-Type: {content_type}", f"Content-Length: {len(data)}",
             "Connection: keep-alive"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)
    await writer.drain()
