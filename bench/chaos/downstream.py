"""The downstream test service: an HTTP API on 127.0.0.1 that applies effects by idempotency key.

``POST /effect`` with ``{"key", "workflow_id", "branch", "seq", "step_seq", "worker_id"}``
records the attempt (every one, with its arrival time) and applies the effect only for a key
it has not seen: a duplicate gets the original effect id back. This is what a well-behaved
external API does with idempotency keys; the ledger lets the checker count effects per key
and attempts per (workflow, seq).

Fault: ``response_lost_probability`` applies the effect and then answers 503, so the phase
fails after the effect happened and its retry must call again WITH THE SAME KEY.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Attempt:
    key: str
    workflow_id: str
    branch: str
    seq: int
    step_seq: int
    worker_id: str
    at: float  # wall clock (same host as the database), for ordering against commits


@dataclass
class Ledger:
    attempts: list[Attempt] = field(default_factory=list)
    effects: dict[str, int] = field(default_factory=dict)  # key -> effect id
    applied: Counter[str] = field(default_factory=Counter)  # key -> times applied (must be 1)


class Downstream:
    def __init__(self, *, seed: int, response_lost_probability: float = 0.0) -> None:
        self.ledger = Ledger()
        self.rng = random.Random(seed)
        self.response_lost_probability = response_lost_probability
        self.responses_lost = 0
        self.lose_next = 0  # armed by the schedule: the next calls' answers are lost
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> int:
        app = web.Application()
        app.router.add_post("/effect", self._effect)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _effect(self, request: web.Request) -> web.Response:
        body = await request.json()
        key = str(body["key"])
        self.ledger.attempts.append(Attempt(
            key=key, workflow_id=str(body["workflow_id"]), branch=str(body["branch"]),
            seq=int(body["seq"]), step_seq=int(body["step_seq"]),
            worker_id=str(body.get("worker_id", "")), at=time.time()))
        duplicate = key in self.ledger.effects
        if not duplicate:
            # The effect itself: applied once per key, numbered in order of application.
            self.ledger.effects[key] = len(self.ledger.effects) + 1
            self.ledger.applied[key] += 1
        lose = self.lose_next > 0 or (self.response_lost_probability
                                      and self.rng.random() < self.response_lost_probability)
        if lose:
            self.lose_next = max(0, self.lose_next - 1)
            self.responses_lost += 1
            return web.json_response({"error": "injected: response lost"}, status=503)
        return web.json_response({"effect_id": self.ledger.effects[key], "duplicate": duplicate})
