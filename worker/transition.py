"""The phase transition: the one path that carries phasegate's guarantees.

Read top to bottom: parse -> check -> run -> commit -> emit. ``handle`` never sends an ack or
nack itself: it returns a ``Settlement`` and the runtime settles the message in one place.

Delivery is at-least-once; effects are exactly-once per (workflow, seq) because the commit is
conditional on the run still being at the message's seq, and a message whose seq is already
committed only makes sure its successor exists.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import structlog

from phasegate import concurrency, metrics, redact, residency, tracing
from phasegate.backoff import full_jitter
from phasegate.branch_doors import enter as enter_branch_door
from phasegate.branch_doors import halt as halt_branch_at_door
from phasegate.branch_failures import halt as halt_branch
from phasegate.branch_failures import record_failure as record_branch_failure
from phasegate.branch_review import ReviewPlan, apply_discards, commit_review, merge_input
from phasegate.branches import (
    Bounds,
    BranchPosition,
    BranchResult,
    ForkPlan,
    Premature,
    commit_branch,
    commit_fork,
    fork_scope,
    load_branch,
)
from phasegate.context import Context
from phasegate.db_errors import DATABASE_DOWN
from phasegate.door import Door, Halt
from phasegate.door import enter as enter_door
from phasegate.door import settle as settle_door
from phasegate.envelope import (
    MAIN_BRANCH,
    Envelope,
    state_hash,
    successor_message,
)
from phasegate.faults import Faults
from phasegate.queue import Outgoing, Queue, QueueError, Received
from phasegate.race_deadline import expire as expire_race
from phasegate.staleness import Observations
from phasegate.steps import PostgresLedger, Steps, StepScope
from phasegate.storable import UnstorableValue
from phasegate.store import OutboxRow, PhaseCommit, RunPosition, Store
from phasegate.tiers import PhaseOutcome, decide
from phasegate.versions import Corrupt, NeedsRestart, load_verified
from phasegate.waits import Wait
from phasegate.worker.batcher import MicroBatcher
from phasegate.worker.continuation import (
    Chain,
    ContinuationConfig,
    Hop,
    Leases,
    advance,
    can_continue,
)
from phasegate.worker.guards import (
    MAX_TRANSITION_CRASHES,
    Failed,
    attempt,
    phase_timeout,
    storable,
)
from phasegate.worker.parsing import Poison, parse
from phasegate.workflow import Registry, Workflow

log = structlog.get_logger("phasegate.transition")

ERROR_TEXT_LIMIT = 500


class Action(Enum):
    DELETE = "delete"
    RELEASE = "release"


@dataclass(frozen=True)
class Settlement:
    action: Action
    outcome: str
    visibility_s: int = 0


@dataclass
class RunningPhase:
    ctx: Context
    envelope: Envelope
    started: float


@dataclass(frozen=True)
class TransitionConfig:
    worker_id: str
    max_message_bytes: int
    max_attempts: int
    retry_backoff_s: float
    retry_backoff_max_s: float
    stale_after_s: float = 3600.0
    phase_timeout_s: float = 0.0
    # Nested branches: PHASEGATE_BRANCH_MAX_DEPTH / PHASEGATE_BRANCH_MAX_LIVE.
    branch_bounds: Bounds = field(default_factory=Bounds)
    # The random source of the retry delays' jitter (seeded in tests; None: a shared one).
    jitter: random.Random | None = field(default=None, compare=False)


class PhaseTransition:
    def __init__(self, *, store: Store, queue: Queue, dlq: Queue, registry: Registry,
                 config: TransitionConfig, faults: Faults,
                 mark_sent: MicroBatcher[int] | None = None,
                 sender: MicroBatcher[Outgoing] | None = None,
                 continuation: ContinuationConfig | None = None,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self.store = store
        self.queue = queue
        self.dlq = dlq
        self.registry = registry
        self.config = config
        self.faults = faults
        self._mark_sent = mark_sent
        self._sender = sender
        self.running: dict[str, RunningPhase] = {}
        # The per-phase line's logger, built once from the logging configuration in force
        # when the worker is made: structlog's module-level proxy rebuilds its bound logger
        # on every call, half the cost of the line (~35 -> ~18 us, measured in bench/).
        self._phase_log = log.bind()
        # Commits in progress: shielded from shutdown's cancel, awaited before the pool closes.
        self.durable: set[asyncio.Future[Any]] = set()
        # Local continuation (worker/continuation.py): the successor rows leased to this worker.
        self.continuation = continuation or ContinuationConfig()
        self.leases = Leases(store, config.worker_id, self.continuation.lease_s)
        self._stopping = stopping

    async def handle(self, message: Received) -> Settlement:
        self.faults.hit("after_receive")
        try:
            parsed = self.parse(message)
            if isinstance(parsed, Poison):
                return await self.quarantine(message, parsed)
            envelope, workflow = parsed
            with residency.route(self.store, envelope), structlog.contextvars.bound_contextvars(
                    workflow_id=envelope.workflow_id, seq=envelope.seq, branch=envelope.branch,
                    workflow=envelope.workflow), tracing.phase_span(envelope) as span:
                settlement = await self.check_and_run(message, envelope, workflow)
                span.set("phasegate.outcome", settlement.outcome)
                if workflow.concurrency_key is not None \
                        and settlement.outcome in concurrency.FREES_SLOT:
                    await self.emit_admitted(envelope.workflow_id)
                return settlement
        except DATABASE_DOWN as exc:
            metrics.DB_ERRORS.inc()
            log.warning("database_unavailable", error=type(exc).__name__,
                        retry_in_s=self._backoff(1))
            return Settlement(Action.RELEASE, "db_unavailable", self._backoff(1))

    # -- 1. parse -----------------------------------------------------------------------------

    def parse(self, message: Received) -> tuple[Envelope, Workflow] | Poison:
        return parse(message, max_message_bytes=self.config.max_message_bytes,
                     registry=self.registry, store=self.store)

    # -- 2. check -----------------------------------------------------------------------------

    async def check_and_run(self, message: Received, envelope: Envelope,
                            workflow: Workflow) -> Settlement:
        if envelope.kind == "deadline":  # a race's deadline fell due (race_deadline.py)
            ended = await expire_race(self.store, envelope)
            await asyncio.gather(*(self.emit(row) for row in ended.outbox))
            return Settlement(Action.DELETE, ended.label)
        if envelope.kind == "start" and workflow.concurrency_key is not None:
            taken = await concurrency.start(self.store, envelope, workflow)
            if isinstance(taken, concurrency.Refused):  # nothing was written
                return await self.quarantine(message, Poison(
                    "concurrency_key", taken.reason, envelope.workflow_id))
            if workflow.rate is not None:  # a wake-up may have admitted runs queued before it
                await self.emit_admitted(envelope.workflow_id)
            if taken == "queued":  # its admission writes a new start message
                log.info("queued")
                return Settlement(Action.DELETE, "queued")
        elif envelope.kind == "start":
            await self.store.ensure_run(envelope, workflow.schema_version, workflow.first_phase)
        # A branch (phasegate/branches.py) has its own position; main's is the run row.
        position = await (self.store.load_for_phase(envelope.workflow_id, envelope.branch,
                                                    envelope.seq)
                          if envelope.branch == MAIN_BRANCH
                          else load_branch(self.store, envelope.workflow_id, envelope.branch))
        if position is None:
            return await self.quarantine(message, Poison(
                "no_run", "phase message for a run that does not exist", envelope.workflow_id))
        if position.workflow != envelope.workflow:
            return await self.quarantine(message, Poison(
                "workflow_mismatch", f"the run belongs to workflow {position.workflow}",
                envelope.workflow_id))
        if envelope.seq < position.next_seq:
            if not await self.ensure_successor(envelope, position.next_seq):
                # Deleting this message would leave the leased row to the relay alone; held back
                # instead, it returns when the lease may have run out and sends the row itself.
                log.info("duplicate_successor_leased", next_seq=position.next_seq)
                return Settlement(Action.RELEASE, "successor_leased", self._lease_wait_s())
            log.info("duplicate", next_seq=position.next_seq)
            return Settlement(Action.DELETE, "duplicate")
        if envelope.seq > position.next_seq:
            return await self.quarantine(message, Poison(
                "seq_ahead", f"message seq {envelope.seq} is ahead of the run "
                f"({position.next_seq})", envelope.workflow_id))
        if position.status != "running":
            log.info("run_not_running", status=position.status)
            return Settlement(Action.DELETE, "stale")
        phase_name = envelope.phase or position.current_phase or workflow.first_phase
        if phase_name != position.current_phase:
            return await self.quarantine(message, Poison(
                "phase_mismatch", f"message names phase {phase_name} but the run is at "
                f"{position.current_phase}", envelope.workflow_id))
        state = await self.load_state(position, workflow)
        if isinstance(state, Settlement):
            return state
        # Inside the room: a re-run, a review decision, a staleness check (phasegate/door.py).
        enter = enter_branch_door if isinstance(position, BranchPosition) else enter_door
        door = await enter(self.store, workflow, position, envelope.branch,
                           self.config.stale_after_s)
        if isinstance(door, Halt):
            return await self.halt_at_door(envelope, position, door)
        if door.rerun:
            phase_name, state = door.phase or phase_name, door.state
        # A merge phase also receives its branches' final states (ctx.merged).
        merged = await merge_input(self.store, workflow, position, phase_name, envelope.branch)
        if isinstance(merged, Premature):
            log.warning("merge_before_fan_in", phase=phase_name)
            return Settlement(Action.DELETE, "premature")
        if isinstance(merged, Halt):
            return await self.halt_at_door(envelope, position, merged)
        return await self.run(envelope, workflow, phase_name, position, state, door, merged)

    async def load_state(self, position: RunPosition, workflow: Workflow) -> Any:
        """The state committed at the previous door, verified; or a Settlement that halts."""
        seq = position.next_seq
        if seq == position.base_seq:
            return json.loads(position.input_json or "null")
        if position.state_json is None or position.state_hash is None \
                or position.state_version is None:
            return await self.halt(position, "failed", "checkpoint_missing: no phase checkpoint "
                                   f"at seq {seq - 1}")
        # Re-hash (a mismatch fails the run: checkpoint_corrupt), then upcast an older
        # schema version; without an upcaster chain the run needs a restart.
        try:
            return await load_verified(workflow, seq - 1, position.state_json,
                                       position.state_hash, position.state_version)
        except Corrupt as exc:
            return await self.halt(position, "failed", str(exc))
        except NeedsRestart as exc:
            return await self.halt(position, "needs_restart", str(exc))

    async def halt(self, position: RunPosition, status: str, reason: str) -> Settlement:
        if isinstance(position, BranchPosition):
            await halt_branch(self.store, position, status, reason)
        else:
            await self.store.halt_run(position.workflow_id, position.next_seq, status, reason)
        log.warning("run_halted", status=status, reason=reason)
        return Settlement(Action.DELETE, status)

    async def halt_at_door(self, envelope: Envelope, position: RunPosition,
                           halt: Halt) -> Settlement:
        if isinstance(position, BranchPosition):  # the branch stops (branch_doors.py)
            for row in await halt_branch_at_door(self.store, envelope, position, halt):
                await self.emit(row)
        else:
            await settle_door(self.store, position, halt)
        log.warning("run_halted", status=halt.status, reason=halt.reason)
        return Settlement(Action.DELETE, halt.status)

    # -- 3. run -------------------------------------------------------------------------------

    async def run(self, envelope: Envelope, workflow: Workflow, phase_name: str,
                  position: RunPosition, state: Any, door: Door | None = None,
                  merged: list[BranchResult] | None = None) -> Settlement:
        """Run the phase, and while ``can_continue`` allows, the phases after it (local
        continuation: worker/continuation.py); the received message is settled at the end."""
        chain = Chain()
        try:
            while True:
                # A continued hop's own span, parented like a hop through SQS would be (the
                # first hop's is the received message's span, opened in ``handle``).
                with tracing.hop_span(envelope, chain.hops) as span:
                    step = await self.run_hop(envelope, workflow, phase_name, position, state,
                                              chain, door, merged)
                    span.set("phasegate.outcome", step.outcome
                             if isinstance(step, Settlement) else "continued")
                if isinstance(step, Settlement):
                    return await self.end_chain(chain, step)
                self.faults.hit("mid_chain")
                envelope, phase_name, position, state = step
                door, merged = None, None
                structlog.contextvars.bind_contextvars(seq=envelope.seq)
        except asyncio.CancelledError:
            if chain.leased is not None:  # shutdown's cancel: the next worker takes the run now
                self._durable(self.emit(chain.leased))
            raise
        finally:
            self.leases.drop(chain.leased)

    async def end_chain(self, chain: Chain, settlement: Settlement) -> Settlement:
        """After a continued hop, the received message only woke the first one: delete it. A
        leased row left unconsumed (the hop did not commit) goes out now, or for a retry when
        its backoff ends (the lease is set to expire then, and the relay sends it)."""
        if chain.hops == 0:
            return settlement
        row, chain.leased = chain.leased, None
        if row is not None and settlement.action is Action.RELEASE:
            await self.leases.expire_in(row, settlement.visibility_s)
        elif row is not None:
            self.leases.drop(row)
            await self.emit(row)
        return Settlement(Action.DELETE, settlement.outcome)

    def _durable(self, work: Awaitable[Any]) -> asyncio.Future[Any]:
        """Runs to its end even if shutdown cancels the caller; awaited before the pool closes."""
        future = asyncio.ensure_future(work)
        self.durable.add(future)
        future.add_done_callback(self.durable.discard)
        return future

    async def run_hop(self, envelope: Envelope, workflow: Workflow, phase_name: str,
                      position: RunPosition, state: Any, chain: Chain,
                      door: Door | None = None, merged: list[BranchResult] | None = None
                      ) -> Settlement | Hop:
        door = door or Door()
        phase = workflow.get_phase(phase_name)
        assert phase is not None
        ctx = Context(
            workflow_id=envelope.workflow_id, workflow=workflow.name, phase=phase_name,
            seq=envelope.seq, branch=envelope.branch, attempt=position.attempts + 1,
            worker_id=self.config.worker_id, schema_version=workflow.schema_version,
            resumed_progress=(json.loads(position.progress_json)
                              if position.progress_json else None),
            tier_attempt=door.tier_attempt, observed=Observations(workflow, door.resources),
            steps=Steps(PostgresLedger(self.store.pool), StepScope(
                envelope.workflow_id, envelope.branch, envelope.seq, self.config.worker_id),
                self.faults), merged=merged or [], workflow_def=workflow,
            fork_scope=fork_scope(position),
            signal=json.loads(position.signal_json) if position.signal_json else None)
        started = time.monotonic()
        self.running[envelope.dedup_id] = RunningPhase(ctx, envelope, started)
        metrics.PHASES_IN_FLIGHT.inc()
        try:
            result = await attempt(phase, ctx, state, workflow.tiers,
                                   phase_timeout(phase, self.config.phase_timeout_s))
        except asyncio.CancelledError:  # the worker's own (shutdown): handed back, not charged
            self._log_phase(envelope, phase_name, started, "cancelled")
            raise
        finally:
            metrics.PHASES_IN_FLIGHT.dec()
            self.running.pop(envelope.dedup_id, None)
        if isinstance(result, Failed):
            return await self.fail(envelope, phase_name, started, result.exc,
                                   retryable=result.retryable)
        new_state, graded = result
        try:  # the same state would fail on every retry: fail the run now, before the commit
            canonical = storable(new_state, "state")
        except UnstorableValue as exc:
            return await self.fail(envelope, phase_name, started, exc, retryable=False)
        outcome = decide(workflow, phase, envelope.seq, graded, ctx.tier_attempt, door.rerun_of)
        self.faults.hit("mid_phase")
        # The durable part runs to its end even if shutdown cancels this task.
        committing: asyncio.Future[Settlement | Hop] = self._durable(self.commit_and_emit(
            envelope, workflow, phase_name, canonical, position, started, outcome,
            ctx.observed.to_json(), ctx.branching, ctx.wait, chain))
        return await asyncio.shield(committing)

    async def fail(self, envelope: Envelope, phase_name: str, started: float,
                   exc: BaseException, *, retryable: bool) -> Settlement:
        # Type, fingerprint and frames only: a user exception's message may echo state.
        described = redact.describe(exc)
        error = described["error"]
        log.error("phase_error", phase=phase_name, retryable=retryable, **described)
        limit = self.config.max_attempts if retryable else 0
        if envelope.branch == MAIN_BRANCH:
            result = await self.store.record_failure(
                envelope.workflow_id, envelope.seq, error, limit, phase=phase_name,
                worker_id=self.config.worker_id)
        else:  # a failed branch may fan its fork in (phasegate/branch_failures.py)
            failure = await record_branch_failure(self.store, envelope, error, limit,
                                                  worker_id=self.config.worker_id)
            result = None if failure is None else (failure.attempts, failure.status)
            for row in failure.outbox if failure is not None else []:
                await self.emit(row)
        if result is None:
            self._log_phase(envelope, phase_name, started, "superseded")
            return Settlement(Action.DELETE, "superseded")
        attempts, status = result
        if status == "failed":
            self._log_phase(envelope, phase_name, started, "failed", attempts=attempts)
            return Settlement(Action.DELETE, "failed")
        delay = self._backoff(attempts)
        self._log_phase(envelope, phase_name, started, "retry", attempts=attempts,
                        retry_in_s=delay)
        return Settlement(Action.RELEASE, "retry", delay)

    # -- 4. commit, 5. emit ---------------------------------------------------------------------

    async def commit_and_emit(self, envelope: Envelope, workflow: Workflow, phase_name: str,
                              canonical: str, position: RunPosition, started: float,
                              outcome: PhaseOutcome | None = None,
                              resources_json: str | None = None,
                              fork: ForkPlan | ReviewPlan | None = None,
                              wait: Wait | None = None,
                              chain: Chain | None = None) -> Settlement | Hop:
        phase = workflow.get_phase(phase_name)
        assert phase is not None
        # Where the run goes: the next phase, or (below its tier) this phase again / review.
        outcome = outcome or decide(workflow, phase, envelope.seq, None, 1, None)
        next_phase = outcome.next_phase
        successor = (successor_message(envelope, workflow.name, outcome.next_phase)
                     if outcome.next_phase and outcome.sends_successor else None)
        successor = residency.carry(envelope, tracing.propagate(envelope, successor))
        commit = PhaseCommit(
            workflow_id=envelope.workflow_id, branch=envelope.branch, seq=envelope.seq,
            phase=phase_name, schema_version=workflow.schema_version, state_json=canonical,
            state_hash=state_hash(canonical), next_phase=next_phase,
            status=outcome.status, worker_id=self.config.worker_id, successor=successor,
            tier=outcome.tier, tier_label=outcome.tier_label,
            resource_versions_json=resources_json, **outcome.commit_fields(),
            **(wait.commit_fields() if wait and successor else {}))
        commit_started = time.monotonic()
        if isinstance(fork, ReviewPlan) and not fork.retries:  # accept/discard: a plain commit
            await apply_discards(self.store, envelope.workflow_id, fork, envelope.seq)
            fork = None
        if envelope.branch != MAIN_BRANCH or (fork is not None and outcome.action == "advance"):
            return await self.commit_branching(envelope, workflow, commit, position, fork,
                                               started, commit_started)
        body = successor.to_json() if successor is not None else None  # once: commit and send
        chain = chain or Chain()
        leasing = can_continue(self.continuation, chain, workflow=workflow, envelope=envelope,
                               outcome=outcome, forking=fork is not None,
                               waiting=wait is not None, stopping=self._stopping())
        with tracing.commit_span(envelope) as span:
            result = await self.store.commit_phase(
                commit, body, lease=self.leases.lease if leasing else None,
                consumed=chain.leased.outbox_id if chain.leased else None)
            span.set("checkpoint.success", result is not None)
        metrics.COMMIT_DURATION.observe(time.monotonic() - commit_started)
        if result is None:
            # Another delivery of this message committed first; our side effects were
            # deduplicated by their keys. Nothing to emit.
            self._log_phase(envelope, phase_name, started, "superseded")
            return Settlement(Action.DELETE, "superseded")
        _, outbox_id = result
        self.leases.drop(chain.leased)  # consumed by this commit
        chain.leased = None
        self.faults.hit("after_commit")
        if leasing and successor is not None and body is not None and outbox_id is not None:
            row = OutboxRow(outbox_id, successor.dedup_id, successor.group_id, body)
            if not self._stopping():  # else SIGTERM came during the commit: hand off now
                self._log_phase(envelope, phase_name, started, outcome.label, continued=True)
                return advance(chain, self.leases, row, successor, position, commit)
        if successor is not None and body is not None and outbox_id is not None:
            await self.emit(OutboxRow(outbox_id, successor.dedup_id, successor.group_id, body),
                            commit_started)
        self.faults.hit("after_send")
        self._log_phase(envelope, phase_name, started, outcome.label, tier=outcome.tier)
        return Settlement(Action.DELETE, outcome.label)

    async def commit_branching(self, envelope: Envelope, workflow: Workflow,
                               commit: PhaseCommit, position: RunPosition,
                               fork: ForkPlan | ReviewPlan | None, started: float,
                               commit_started: float) -> Settlement:
        """A fork, a review that retries branches, or a phase in a branch
        (phasegate/branches.py and branch_review.py commit; the fan-in is decided inside the
        branch's commit transaction). Then every message it left is sent."""
        with tracing.commit_span(envelope) as span:
            if isinstance(fork, ForkPlan) and commit.outcome is None:  # main, or nested
                done = await commit_fork(self.store, commit, fork, envelope,
                                         self.config.branch_bounds)
            elif isinstance(fork, ReviewPlan):
                done = await commit_review(self.store, commit, fork, envelope)
            else:
                assert isinstance(position, BranchPosition)
                done = await commit_branch(self.store, commit, position, envelope, workflow)
            span.set("checkpoint.success", done.committed)
        metrics.COMMIT_DURATION.observe(time.monotonic() - commit_started)
        if done.refused is not None:  # out of bounds: nothing written, the phase fails
            return await self.fail(envelope, commit.phase, started, done.refused,
                                   retryable=False)
        if done.committed:
            self.faults.hit("after_commit")
            # A fork's start messages go out together (one SendMessageBatch with a sender).
            await asyncio.gather(*(self.emit(row, commit_started) for row in done.outbox))
            self.faults.hit("after_send")
        self._log_phase(envelope, commit.phase, started, done.label, tier=commit.tier)
        return Settlement(Action.DELETE, done.label)

    async def emit(self, row: OutboxRow, committed: float | None = None) -> bool:
        """Send an outbox row and mark it sent. On failure the relay sends it later.

        Concurrent sends share one SendMessageBatch. Marking sent does not hold up the delete
        of the received message: it is posted to a batcher (a row left unmarked is only sent
        again by the relay, and SQS drops it by its deduplication id)."""
        message = Outgoing(row.body, row.group_id, row.dedup_id)
        try:
            with tracing.send_span("queue"):
                if self._sender is not None:
                    await self._sender.submit(message)
                else:
                    await self.queue.send([message])
        except Exception as exc:
            metrics.SQS_ERRORS.labels("send").inc()
            log.warning("emit_failed_relay_will_send", error=type(exc).__name__)
            return False
        if committed is not None:
            metrics.OUTBOX_SEND_LAG.observe(time.monotonic() - committed)
        if self._mark_sent is not None:
            self._mark_sent.post(row.outbox_id)
        else:
            await self.store.mark_sent([row.outbox_id])
        return True

    async def emit_admitted(self, workflow_id: str) -> None:
        """Send the start messages of the runs this run's end admitted (concurrency.py)."""
        rows = await concurrency.admitted_by(self.store, workflow_id)
        await asyncio.gather(*(self.emit(row) for row in rows))

    async def ensure_successor(self, envelope: Envelope, next_seq: int) -> bool:
        """Send the run's next message if its commit left it unsent (a crash between the commit
        and the send). False while a worker holds it leased (local continuation): its chain is
        running, or its worker died and the lease runs out within one visibility timeout."""
        row = await self.store.successor(envelope.workflow_id, envelope.branch, next_seq)
        if row is None or row.sent_at is not None:
            return True
        if row.leased:
            return False
        await self.emit(row)
        return True

    def _lease_wait_s(self) -> int:
        return max(1, math.ceil(self.continuation.lease_s / 2))

    # -- poison -------------------------------------------------------------------------------

    async def quarantine(self, message: Received, poison: Poison) -> Settlement:
        """DLQ + a quarantine row with a reason (no payload data), then delete."""
        body_bytes = len(message.body.encode())
        try:
            with tracing.send_span("dlq"):
                # Never the input or unknown fields: see phasegate/redact.py.
                await self.dlq.send([Outgoing(
                    redact.dlq_body(message.body, poison.code),
                    message.group_id or "quarantine",
                    state_hash(f"quarantine:{message.message_id}"))])
        except QueueError as exc:
            metrics.SQS_ERRORS.labels("dlq_send").inc()
            log.error("quarantine_dlq_send_failed", error=str(exc))
            return Settlement(Action.RELEASE, "quarantine_retry", self._backoff(1))
        await self.store.quarantine(
            message_id=message.message_id, workflow_id=poison.workflow_id, reason=poison.reason,
            body_bytes=body_bytes, worker_id=self.config.worker_id)
        log.warning("quarantined", code=poison.code, reason=poison.reason,
                    message_id=message.message_id, quarantined_workflow_id=poison.workflow_id)
        return Settlement(Action.DELETE, "quarantined")

    async def crashed(self, message: Received, exc: BaseException) -> Settlement:
        """The transition itself raised (a bug, or user code outside a phase: an upcaster):
        counted per message, retried, then quarantined with its run failed (never a loop)."""
        described = redact.describe(exc)
        log.error("transition_crashed", **described)
        parsed = self.parse(message)
        envelope = parsed[0] if isinstance(parsed, tuple) else None
        with residency.route(self.store, envelope) if envelope else nullcontext():
            crashes = await self.store.count_crash(message.message_id, described["error_type"])
            if crashes < MAX_TRANSITION_CRASHES:
                return Settlement(Action.RELEASE, "crashed", self._backoff(crashes))
            why = f"{described['error']} on {crashes} deliveries"
            settlement = await self.quarantine(message, Poison(
                "transition_crashed", why, envelope.workflow_id if envelope else None))
            if envelope is not None and settlement.action is Action.DELETE:  # else: it retries
                await self.store.fail_run(envelope.workflow_id, f"transition_crashed: {why}; "
                                          "the message was quarantined")
        return settlement

    # -- helpers ------------------------------------------------------------------------------

    def _backoff(self, attempts: int) -> int:
        """Whole seconds (a visibility timeout) with full jitter: the n-th retry waits
        random(0, min(max, base * 2**(n-1))), so a fleet that failed together does not retry
        together (phasegate/backoff.py)."""
        delay = full_jitter(attempts - 1, base=self.config.retry_backoff_s,
                            cap=self.config.retry_backoff_max_s, rng=self.config.jitter)
        return max(0, round(delay))

    def _log_phase(self, envelope: Envelope, phase_name: str, started: float, outcome: str,
                   **extra: Any) -> None:
        duration = time.monotonic() - started
        metrics.child(metrics.PHASE_DURATION, envelope.workflow, phase_name,
                      outcome).observe(duration)
        self._phase_log.info("phase", phase=phase_name, outcome=outcome,
                             duration_s=round(duration, 6), **extra)
