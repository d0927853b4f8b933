"""TEST-ONLY fault injection: kill this process with SIGKILL at a named point.

Off unless ``PHASEGATE_FAULTS`` is set. Never set it in production. The value is a
comma-separated list of ``point`` (kill the first time), ``point@N`` (the N-th time) or
``point%P`` (with probability P each time, seeded by ``PHASEGATE_FAULT_SEED``).

Points: ``after_receive``, ``mid_phase`` (inside a write step / before the phase returns),
``after_commit`` (between commit and send), ``after_send`` (the successor sent; the received
message's delete, which runs meanwhile, may or may not be done),
``step_claimed`` (a write step's pre_execution record is committed, its function not yet
called), ``step_effect`` (the write step's effect happened, its completed record not yet
written), ``mid_chain`` (a continued phase's successor is committed leased to this worker,
the next phase not yet started: worker/continuation.py), ``relay_claimed`` (a relay leased rows
to itself, not yet sent). The chaos suite (bench/chaos) arms one point per worker process.
"""

from __future__ import annotations

import os
import random
import signal
import sys

POINTS = frozenset({"after_receive", "mid_phase", "after_commit", "after_send",
                    "step_claimed", "step_effect", "mid_chain", "relay_claimed"})


class Faults:
    def __init__(self, spec: str = "", seed: int = 0) -> None:
        self._nth: dict[str, int] = {}
        self._prob: dict[str, float] = {}
        self._seen: dict[str, int] = {}
        self._random = random.Random(seed)
        for item in filter(None, (part.strip() for part in spec.split(","))):
            if "%" in item:
                point, _, value = item.partition("%")
                self._prob[self._check(point)] = float(value)
            else:
                point, _, value = item.partition("@")
                self._nth[self._check(point)] = int(value or 1)

    @staticmethod
    def _check(point: str) -> str:
        if point not in POINTS:
            raise ValueError(f"unknown fault point {point!r}; known: {sorted(POINTS)}")
        return point

    @property
    def active(self) -> bool:
        return bool(self._nth or self._prob)

    def hit(self, point: str) -> None:
        if not self.active:
            return
        count = self._seen[point] = self._seen.get(point, 0) + 1
        fire = self._nth.get(point) == count or (
            point in self._prob and self._random.random() < self._prob[point])
        if fire:
            print(f"phasegate: fault injection: SIGKILL at {point}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
