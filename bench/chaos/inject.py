"""The injector: fires the schedule's timed events against the running system.

Worker kills and drains, relay kills, Postgres restarts, flaky database windows, SQS fault
windows, duplicates and poison messages. Each fault that happened is counted in the run's
``fired`` (I6); the proxies and the workers' logs count the rest.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import asyncpg

from bench.chaos.fleet import FAULT_LINE, Fleet
from bench.chaos.invariants import SentPoison
from bench.chaos.pg_proxy import PgCommitCutProxy
from bench.chaos.poison import make_poison
from bench.chaos.schedule import POISON_KINDS, Event
from bench.chaos.sqs_proxy import SqsFaultProxy
from bench.chaos.workload import PHASES, chaos
from orchestrator.embedded import EmbeddedPostgres
from worker.envelope import dedup_id, phase_message, start_message

if TYPE_CHECKING:
    from bench.chaos.runner import ChaosRun

MAX_MESSAGE_BYTES = 16_384  # the workers' PHASEGATE_MAX_MESSAGE_BYTES in a chaos run


@dataclass
class Injector:
    run: ChaosRun
    fleet: Fleet
    pg: EmbeddedPostgres
    pg_proxy: PgCommitCutProxy
    sqs_proxy: SqsFaultProxy
    client: Any
    queue_url: str
    pool: asyncpg.Pool
    slot_locks: defaultdict[int, asyncio.Lock] = field(
        default_factory=lambda: defaultdict(asyncio.Lock))

    async def fire(self, event: Event) -> None:
        kind, detail = event.kind, event.detail
        fleet = self.fleet
        self.run.last_fault = time.monotonic()
        if kind in ("sigkill_worker", "sigterm_worker"):
            slot = self.run.rng.randrange(self.run.config.workers)
            async with self.slot_locks[slot]:  # one kill or drain per worker slot at a time
                await self._end_worker(kind, slot, fleet)
        elif kind == "sigkill_relay":
            if fleet.relay is not None:
                fleet.relay.kill()
                await asyncio.to_thread(fleet.relay.wait)
            fleet.start_relay()
            self.run.fired["sigkill_relay"] += 1
            self.run.say("SIGKILL the outbox relay; restarted")
        elif kind == "pg_restart":
            self.run.say("pg_ctl restart -m immediate")
            await asyncio.to_thread(self.pg.restart, "immediate")
            self.run.fired["pg_restart"] += 1
        elif kind == "pg_cut_next_commit":
            self.pg_proxy.force_next()
        elif kind == "pg_flaky":
            self.pg_proxy.open_window(float(str(detail["duration_s"])),
                                      float(str(detail["probability"])))
            self.run.say(f"flaky database path for {detail['duration_s']}s")
        elif kind == "sqs_window":
            fault = str(detail["fault"])
            self.sqs_proxy.open_window(fault, float(str(detail["duration_s"])),
                                  self.run.schedule.sqs_fault_probability[fault])
        elif kind == "duplicates":
            await self._send_duplicates(int(str(detail["count"])))
        elif kind == "poison":
            await self._send_poison()
        else:
            raise ValueError(f"unknown event {kind}")

    async def _end_worker(self, kind: str, slot: int, fleet: Fleet) -> None:
        if kind == "sigkill_worker":
            worker = fleet.signal_worker(slot, signal.SIGKILL)
            await asyncio.to_thread(worker.process.wait)
            fleet.finished.append((worker, worker.process.returncode))
            fleet.requeue_point(worker)
            fleet.start_worker(slot)
            self.run.fired["sigkill_worker"] += 1
            self.run.say(f"SIGKILL worker {slot}.{worker.incarnation}; restarted")
            return
        # Until a worker has its signal handlers (it logs once it does), Python's default
        # SIGTERM action ends it with -15 while it is still importing: it holds nothing, so
        # there is nothing to drain. A drain test needs a started worker.
        await self._until_started(fleet, slot)
        worker = fleet.signal_worker(slot, signal.SIGTERM)
        try:
            code = await asyncio.wait_for(asyncio.to_thread(worker.process.wait), 30)
        except TimeoutError:
            worker.process.kill()
            code = await asyncio.to_thread(worker.process.wait)
        fleet.finished.append((worker, code))
        fleet.requeue_point(worker)
        fleet.start_worker(slot)
        if code == -signal.SIGKILL and FAULT_LINE.search(worker.log.read_text(errors="replace")):
            # Its armed kill point fired while it drained: a kill (counted from its log).
            self.run.say(f"SIGTERM worker {slot}.{worker.incarnation}: its kill point fired "
                     "while draining")
            return
        self.run.sigterm_codes.append(code)
        if code == 0:
            self.run.fired["sigterm_drain"] += 1
        self.run.say(f"SIGTERM worker {slot}.{worker.incarnation}: drained, exit {code}")

    @staticmethod
    async def _until_started(fleet: Fleet, slot: int, within_s: float = 30) -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            worker = fleet.workers[slot]
            if worker.process.poll() is None and b'"event"' in worker.log.read_bytes():
                return
            await asyncio.sleep(0.1)  # polling a log file under a deadline

    async def _send_duplicates(self, count: int) -> None:
        """Same envelope again: with a new dedup id (as if after SQS's 5-minute window), and
        with the original dedup id (inside the window: SQS drops it)."""
        if not self.run.started:
            return
        picks = self.run.rng.sample(self.run.started, min(count, len(self.run.started)))
        try:
            rows = await self.pool.fetch("SELECT workflow_id, next_seq, status FROM "
                                         "workflow_runs WHERE workflow_id = ANY($1)", picks)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return
        for row in rows:
            wid, next_seq = row["workflow_id"], row["next_seq"]
            seqs = [s for s in (next_seq - 1, next_seq) if 0 <= s < len(PHASES)]
            for seq in seqs:
                envelope = (start_message(wid, chaos.name, None) if seq == 0 else
                            phase_message(wid, chaos.name, seq, PHASES[seq]))
                for dedup, label in ((uuid.uuid4().hex, "duplicate_after_window"),
                                     (dedup_id(wid, "main", seq), "duplicate_in_window")):
                    await self.client.send_message(
                        QueueUrl=self.queue_url, MessageBody=envelope.to_json(),
                        MessageGroupId=envelope.group_id, MessageDeduplicationId=dedup)
                    self.run.fired[label] += 1

    async def _send_poison(self) -> None:
        live = self.run.rng.choice(self.run.started) if self.run.started else "none"
        for kind in POISON_KINDS:
            poison = make_poison(kind, live_workflow_id=live, max_message_bytes=MAX_MESSAGE_BYTES)
            response = await self.client.send_message(
                QueueUrl=self.queue_url, MessageBody=poison.body, MessageGroupId=poison.group_id,
                MessageDeduplicationId=uuid.uuid4().hex)
            self.run.poisons.append(SentPoison(kind, response["MessageId"], poison.marker,
                                           poison.live_workflow_id))
            self.run.fired["poison"] += 1
