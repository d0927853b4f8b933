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

from bench.chaos.downstream import Downstream
from bench.chaos.fleet import FAULT_LINE, Fleet
from bench.chaos.invariants import DATABASE_ERRORS, SentPoison
from bench.chaos.pg_proxy import PgCommitCutProxy
from bench.chaos.poison import make_poison
from bench.chaos.schedule import POISON_KINDS, Event
from bench.chaos.sqs_proxy import SqsFaultProxy
from bench.chaos.workload import PHASES, chaos, chaos_wait, is_keyed, is_tree, is_wait, keyed_kind
from phasegate.envelope import dedup_id, phase_message, start_message
from phasegate.orchestrator.embedded import EmbeddedPostgres

if TYPE_CHECKING:
    from bench.chaos.runner import ChaosRun

MAX_MESSAGE_BYTES = 16_384  # the workers' PHASEGATE_MAX_MESSAGE_BYTES in a chaos run
SHUTDOWN_GRACE_S = 5.0  # the workers' PHASEGATE_SHUTDOWN_GRACE_S in a chaos run
SHUTDOWN_MARGIN_S = 10.0  # the chart's default shutdownMarginSeconds
INTERPRETER_START_S = 0.3


@dataclass
class Injector:
    run: ChaosRun
    fleet: Fleet
    pg: EmbeddedPostgres
    pg_proxy: PgCommitCutProxy
    sqs_proxy: SqsFaultProxy
    downstream: Downstream
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
        elif kind == "downstream_lose_next":
            self.downstream.lose_next += 1
        elif kind == "poison":
            await self._send_poison()
        else:
            raise ValueError(f"unknown event {kind}")

    async def restart(self, slot: int) -> None:
        """A rolling restart of one worker (a SIGTERM drain), so its successor is armed with
        the next queued kill point; used after the fault window (``Fleet.end_window``). The
        successor starts at once, beside the draining worker (a Deployment's surge): started
        after the drain, it could find the last runs already held by the others' chains, and
        its point would never fire (I6)."""
        self.run.last_fault = time.monotonic()
        async with self.slot_locks[slot]:
            await self._end_worker("sigterm_worker", slot, self.fleet, surge=True)

    async def _end_worker(self, kind: str, slot: int, fleet: Fleet, *,
                          surge: bool = False) -> None:
        if kind == "sigkill_worker":
            worker = fleet.signal_worker(slot, signal.SIGKILL)
            await asyncio.to_thread(worker.process.wait)
            fleet.retire(worker, worker.process.returncode)
            fleet.start_worker(slot)
            self.run.fired["sigkill_worker"] += 1
            self.run.say(f"SIGKILL worker {slot}.{worker.incarnation}; restarted")
            return
        # No Python code runs in the first moments of a process (the interpreter starts), so
        # nothing can turn a SIGTERM there into a clean stop; from then on it must be one.
        await self._until_age(fleet, slot, INTERPRETER_START_S)
        worker = fleet.signal_worker(slot, signal.SIGTERM)
        if surge:
            fleet.start_worker(slot)
        signalled = time.monotonic()
        try:
            # Kubernetes SIGKILLs at terminationGracePeriodSeconds, which the chart requires to
            # exceed the drain grace plus a margin: a drain that outlives it is a failed drain.
            code = await asyncio.wait_for(asyncio.to_thread(worker.process.wait),
                                          SHUTDOWN_GRACE_S + SHUTDOWN_MARGIN_S)
        except TimeoutError:
            worker.process.kill()
            code = await asyncio.to_thread(worker.process.wait)
            self.run.say(f"SIGTERM worker {slot}.{worker.incarnation}: still draining after "
                         f"{SHUTDOWN_GRACE_S + SHUTDOWN_MARGIN_S:g}s, killed as Kubernetes would")
        self.run.drain_seconds.append(round(time.monotonic() - signalled, 2))
        fleet.retire(worker, code)
        if not surge:
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
    async def _until_age(fleet: Fleet, slot: int, age_s: float) -> None:
        wait = fleet.workers[slot].started_at + age_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)  # part of the fault schedule: when the SIGTERM lands

    async def _send_duplicates(self, count: int) -> None:
        """Same envelope again: with a new dedup id (as if after SQS's 5-minute window), and
        with the original dedup id (inside the window: SQS drops it)."""
        if not self.run.started:
            return
        linear = [w for w in self.run.started if not is_tree(w)]  # five phases each
        picks = self.run.rng.sample(linear, min(count, len(linear)))
        try:
            rows = await self.pool.fetch("SELECT workflow_id, next_seq, status FROM "
                                         "workflow_runs WHERE workflow_id = ANY($1)", picks)
        except DATABASE_ERRORS:
            return
        for row in rows:
            wid, next_seq = row["workflow_id"], row["next_seq"]
            seqs = [s for s in (next_seq - 1, next_seq) if 0 <= s < len(PHASES)]
            name = (keyed_kind(wid).name if is_keyed(wid) else chaos_wait.name if is_wait(wid)
                    else chaos.name)
            for seq in seqs:
                # A keyed run's start again, without its input: the key is the run's own.
                envelope = (start_message(wid, name, None) if seq == 0 else
                            phase_message(wid, name, seq, PHASES[seq]))
                for dedup, label in ((uuid.uuid4().hex, "duplicate_after_window"),
                                     (dedup_id(wid, "main", seq), "duplicate_in_window")):
                    await self.client.send_message(
                        QueueUrl=self.queue_url, MessageBody=envelope.to_json(),
                        MessageGroupId=envelope.group_id, MessageDeduplicationId=dedup)
                    self.run.fired[label] += 1

    async def _send_poison(self) -> None:
        # Poison names the `chaos` workflow: send it into the group of a run of it.
        linear = [w for w in self.run.started
                  if not is_tree(w) and not is_keyed(w) and not is_wait(w)]
        live = self.run.rng.choice(linear) if linear else "none"
        for kind in POISON_KINDS:
            poison = make_poison(kind, live_workflow_id=live, max_message_bytes=MAX_MESSAGE_BYTES)
            response = await self.client.send_message(
                QueueUrl=self.queue_url, MessageBody=poison.body, MessageGroupId=poison.group_id,
                MessageDeduplicationId=uuid.uuid4().hex)
            self.run.poisons.append(SentPoison(kind, response["MessageId"], poison.marker,
                                           poison.live_workflow_id))
            self.run.fired["poison"] += 1
