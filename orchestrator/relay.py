"""The outbox relay: sends successor messages a crashed worker committed but never sent, and
the messages of waits (timers, signal timeouts; phasegate/waits.py) when they fall due.

A worker sends its successor right after the commit; the relay only picks up rows still
unsent ``relay_after_s`` seconds after their commit (database time), and rows with a
``due_at`` as soon as it has passed. A run that has not moved for ``relay_stall_after_s``
although its message was sent gets that message again under a new deduplication id (the
message was lost); so does a running branch of a run. Rows are claimed with one short
statement that leases them to this relay for ``claim_ttl_s`` (``FOR UPDATE SKIP
LOCKED`` inside it, so several relays split the rows) and commits before the SQS send: no
transaction or row lock is held across the call, nothing depends on session state (PgBouncer
in transaction mode), and a relay that dies between claim and send leaves rows that another
relay takes once the claim expires. Rows under a live lease (a worker's retry backoff,
worker/continuation.py) are never sent; when such a lease expires the row is due at once. A
local chain whose worker died has no row at all: once its lease on the run's position runs
out, the relay rebuilds its message from the run and sends it (phasegate/chains.py). A row
the worker sends while the relay also does is harmless: the deduplication id is the same, and
a worker treats an already-committed seq as a duplicate.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import socket
from contextlib import suppress

import structlog

from phasegate import chains, metrics
from phasegate.backoff import Backoff
from phasegate.faults import Faults
from phasegate.queue import Outgoing, Queue, QueueError
from phasegate.sql import queries
from phasegate.store import Lease, OutboxRow, Store

log = structlog.get_logger("phasegate.relay")

# A failing round (Postgres or SQS down) retries with full jitter (phasegate/backoff.py) from
# interval_s up to this, so every orchestrator replica does not hit a recovering database in
# the same second; the first good round returns to interval_s.
RELAY_RETRY_CAP_S = 30.0


class Relay:
    def __init__(self, *, store: Store, queue: Queue, after_s: float = 5.0,
                 interval_s: float = 1.0, batch: int = 100,
                 stall_after_s: float = 300.0, claim_ttl_s: float = 30.0,
                 jitter: random.Random | None = None, relay_id: str | None = None,
                 faults: Faults | None = None) -> None:
        self.store = store
        self.faults = faults or Faults()
        self.claim_ttl_s = claim_ttl_s
        self.relay_id = relay_id or new_relay_id()
        self.queue = queue
        self.after_s = after_s
        self.stall_after_s = stall_after_s
        self.requeued = 0
        self.interval_s = interval_s
        self.batch = batch
        self.relayed = 0
        self._stop = asyncio.Event()
        self._failures = Backoff(base=interval_s, cap=max(interval_s, RELAY_RETRY_CAP_S),
                                 rng=jitter)

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Relay until stopped. Failures are logged and retried next round, never fatal."""
        log.info("relay_started", after_s=self.after_s, interval_s=self.interval_s)
        while not self._stop.is_set():
            try:
                await self.requeue_stalled()
                await self.wake_kept_signals()
                sent = await self.rescue_chains()
                sent += await self.relay_once()
                metrics.OUTBOX_LAG.set(await self.store.outbox_lag_s())
            except Exception as exc:
                wait = self._failures.next()
                log.warning("relay_round_failed", error=f"{type(exc).__name__}: {exc}"[:300],
                            retry_in_s=round(wait, 3))
            else:
                self._failures.reset()
                wait = 0.0 if sent >= self.batch else self.interval_s
            if wait > 0:
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), wait)
        log.info("relay_stopped", relayed=self.relayed)

    async def requeue_stalled(self) -> int:
        """Mark the sent-but-never-processed message of stalled runs and branch chains unsent
        again, under a new deduplication id, for this round to send (found by bench/chaos: a
        message lost after it was sent left its run stuck forever, the outbox row being marked
        sent; a lost branch message too)."""
        rows = await self.store.pool.fetch(self.store._q["requeue_stalled"],
                                           self.stall_after_s, self.batch)
        if rows:
            self.requeued += len(rows)
            log.warning("requeued_stalled_runs", runs=len(rows),
                        stalled_for_s=self.stall_after_s)
        return len(rows)

    async def wake_kept_signals(self) -> int:
        """Make due the waits a kept signal already satisfies (a signal that arrived while
        the waiting phase's commit ran, phasegate/sql/signals.sql ``wake_kept``); this
        round's claim then sends them."""
        rows = await self.store.pool.fetch(queries("signals.sql")["wake_kept"], self.batch)
        if rows:
            log.info("woke_signalled_runs", runs=len(rows))
        return len(rows)

    async def rescue_chains(self) -> int:
        """Send the next message of local chains whose worker died mid-chain (their lease on
        the run's position ran out: phasegate/chains.py). Each row is written claimed by this
        relay, so a relay that dies before the send leaves it to the next claim."""
        claim = Lease(self.relay_id, self.claim_ttl_s)
        rows = [row for chain in await self.store.expired_chains(self.batch)
                if (row := await chains.rescue(self.store, chain, claim)) is not None]
        return await self.send_claimed(rows) if rows else 0

    async def relay_once(self) -> int:
        """Send one batch of due rows; returns how many were sent."""
        rows = await self.claim()
        if not rows:
            return 0
        self.faults.hit("relay_claimed")
        return await self.send_claimed(rows)

    async def claim(self) -> list[OutboxRow]:
        """Lease due rows to this relay in one committed statement (nothing held after)."""
        return await self.store.claim_unsent(self.after_s, self.batch,
                                             Lease(self.relay_id, self.claim_ttl_s))

    async def send_claimed(self, rows: list[OutboxRow]) -> int:
        """Send claimed rows, mark the sent ones sent and give the others back at once."""
        failed: set[str] = set()
        try:
            await self.queue.send([Outgoing(r.body, r.group_id, r.dedup_id) for r in rows])
        except QueueError as exc:
            failed = set(exc.failed)
        except Exception:
            # SQS unreachable: the claim expires on its own, but give the rows back now so the
            # next round (whoever runs it) does not wait claim_ttl_s for them.
            with suppress(Exception):
                await self.store.release_leases([r.outbox_id for r in rows], self.relay_id)
            raise
        sent = [r.outbox_id for r in rows if r.dedup_id not in failed]
        await self.store.mark_sent(sent)
        await self.store.release_leases(
            [r.outbox_id for r in rows if r.dedup_id in failed], self.relay_id)
        self.relayed += len(sent)
        metrics.OUTBOX_RELAYED.inc(len(sent))
        if sent:
            log.info("relayed", messages=len(sent), failed=len(failed))
        return len(sent)


def new_relay_id() -> str:
    """Unique per relay: host, process and a random part (a restarted pod gets a new one)."""
    return f"relay:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
