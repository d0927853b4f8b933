"""The waiting workload under chaos (``--waits N``): every Nth run is ``chaos-wait``, whose
`fetch` defers the next phase by ``WAIT_TIMER_S`` and whose `write` waits for the signal
``go``. The runner sends each run's signal from outside the fleet, as an operator's tool
would (``phasegate.send_signal`` on the database), a random moment after the run's start:
before its wait (kept, then delivered by the waiting commit) or during it (it ends the wait;
the relay sends the woken message). Each signal is sent twice under one idempotency key.

I11 holds when, for every such run, the timer was kept (the phase after it committed no
earlier than its due time), the signal was stored once and consumed once by the seq after the
wait, and the last phase saw its payload (not the timeout's ``None``).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from datetime import timedelta

import asyncpg

from bench.chaos.invariants import DATABASE_ERRORS, Result
from bench.chaos.workload import PHASES, WAIT_SIGNAL, WAIT_TIMER_S, chaos_wait
from phasegate.signals import send_signal

SEND_WITHIN_S = 10.0  # the signal goes out 0-10 s after the run's start
RETRY_S = 0.2  # Postgres restarting: the sender tries again
TIMED = PHASES.index("fetch")  # the phase that defers the next one
WAITING = PHASES.index("write")  # the phase that waits for the signal

RUNS = """
SELECT r.workflow_id, r.status,
       (SELECT created_at FROM checkpoints c WHERE c.workflow_id = r.workflow_id
           AND c.kind = 'phase' AND c.seq = $2) AS timed_at,
       (SELECT created_at FROM checkpoints c WHERE c.workflow_id = r.workflow_id
           AND c.kind = 'phase' AND c.seq = $2 + 1) AS after_timer_at,
       (SELECT state -> 'signal' ->> 'for' FROM checkpoints c
         WHERE c.workflow_id = r.workflow_id AND c.kind = 'phase' AND c.seq = $3) AS seen,
       (SELECT array_agg(s.consumed_seq) FROM signals s WHERE s.workflow_id = r.workflow_id
           AND s.name = $4) AS consumed
  FROM workflow_runs r
 WHERE r.workflow = $1
"""


def payload_of(workflow_id: str) -> dict[str, str]:
    return {"for": workflow_id}


@dataclass
class SignalSender:
    """The signals of the waiting runs, each sent in a task of its own."""

    rng: random.Random
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    answers: dict[str, list[str]] = field(default_factory=dict)

    def schedule(self, pool: asyncpg.Pool, workflow_id: str) -> None:
        task = asyncio.create_task(self._send(pool, workflow_id,
                                              self.rng.uniform(0, SEND_WITHIN_S)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _send(self, pool: asyncpg.Pool, workflow_id: str, after_s: float) -> None:
        await asyncio.sleep(after_s)  # part of the schedule: when the operator sends it
        answers = self.answers.setdefault(workflow_id, [])
        for _ in range(2):  # the second under the same key: a duplicate, stored once
            while True:
                try:
                    result = await send_signal(pool, workflow_id, WAIT_SIGNAL,
                                               payload_of(workflow_id),
                                               idempotency_key=f"chaos-{workflow_id}")
                    break
                except DATABASE_ERRORS:
                    await asyncio.sleep(RETRY_S)
            answers.append("duplicate" if result.duplicate else
                           "delivered" if result.delivered else "kept")

    async def finished(self) -> None:
        await asyncio.gather(*self.tasks)


async def i11_waits_kept(dsn: str, sender: SignalSender) -> Result:
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(RUNS, chaos_wait.name, TIMED, len(PHASES) - 1,
                                      WAIT_SIGNAL)
    finally:
        await connection.close()
    bad = []
    for row in rows:
        wid = row["workflow_id"]
        timed, after = row["timed_at"], row["after_timer_at"]
        if timed is None or after is None or after - timed < timedelta(seconds=WAIT_TIMER_S):
            bad.append(f"{wid}: timer {timed} -> {after}")
        if row["consumed"] != [WAITING + 1]:
            bad.append(f"{wid}: signal rows consumed by {row['consumed']}")
        if row["seen"] != payload_of(wid)["for"]:
            bad.append(f"{wid}: the last phase saw {row['seen']}")
    sent = [a for answers in sender.answers.values() for a in answers]
    kinds = {kind: sent.count(kind) for kind in ("kept", "delivered", "duplicate")}
    ok = bool(rows) and not bad and len(rows) == len(sender.answers)
    return Result("I11 every waiting run kept its timer and got its signal once", ok,
                  f"{len(rows)} waiting runs; signals answered {kinds}"
                  + (f"; {bad[:5]}" if bad else ""))
