"""The phase transition: the one path that carries phasegate's guarantees.

Read top to bottom: parse -> check -> run -> commit -> emit. ``handle`` never sends an ack or
nack itself: it returns a ``Settlement`` (worker/outcomes.py) and the runtime settles the
message in one place.

The side parts the path hands work to live next to it, one job each: the quarantine and the
transition's own crashes (worker/poison.py), duplicates (worker/duplicates.py), failed attempts
and halts (worker/failures.py), the fork/review/branch commits (worker/branch_commits.py), the
end of a local chain (worker/continuation.py) and the settings (worker/transition_config.py).

Delivery is at-least-once; effects are exactly-once per (workflow, seq) because the commit is
conditional on the run still being at the message's seq, and a message whose seq is already
committed only makes sure its successor exists.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from phasegate import concurrency, logs, metrics, residency, tracing
from phasegate.batcher import MicroBatcher
from phasegate.branch_doors import enter as enter_branch_door
from phasegate.branch_review import ReviewPlan, apply_discards, merge_input
from phasegate.branches import (
    BranchPosition,
    BranchResult,
    ForkPlan,
    Premature,
    fork_scope,
    load_branch,
)
from phasegate.context import Context
from phasegate.db_errors import DATABASE_DOWN
from phasegate.door import Door, Halt
from phasegate.door import enter as enter_door
from phasegate.envelope import (
    MAIN_BRANCH,
    Envelope,
    state_hash,
    successor_message,
)
from phasegate.faults import Faults
from phasegate.queue import Outgoing, Queue, Received
from phasegate.race_deadline import expire as expire_race
from phasegate.staleness import Observations
from phasegate.steps import PostgresLedger, Steps, StepScope
from phasegate.storable import UnstorableValue
from phasegate.store import OutboxRow, PhaseCommit, RunPosition, Store
from phasegate.tiers import PhaseOutcome, decide
from phasegate.versions import Corrupt, NeedsRestart, load_verified
from phasegate.waits import Wait
from phasegate.worker.branch_commits import BranchCommits
from phasegate.worker.continuation import (
    Chain,
    ContinuationConfig,
    Hop,
    Leases,
    Pending,
    advance,
    can_continue,
    can_send_leased,
    end_chain,
)
from phasegate.worker.deadlines import PhaseDeadlines
from phasegate.worker.duplicates import Duplicates
from phasegate.worker.emitter import Emitter
from phasegate.worker.failures import Failures
from phasegate.worker.guards import Failed, attempt, phase_timeout, storable
from phasegate.worker.outcomes import Action, PhaseLog, Settlement
from phasegate.worker.own_successors import OwnSuccessors
from phasegate.worker.parsing import Poison, parse
from phasegate.worker.poison import Quarantine
from phasegate.worker.transition_config import TransitionConfig, retry_delay_s
from phasegate.workflow import Registry, Workflow

log = structlog.get_logger("phasegate.transition")

# Re-exported: the runtime, tests and tools import these from here.
__all__ = ["DATABASE_DOWN", "Action", "PhaseTransition", "RunningPhase", "Settlement",
           "TransitionConfig"]


@dataclass
class RunningPhase:
    ctx: Context
    envelope: Envelope
    started: float


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
        self.running: dict[str, RunningPhase] = {}
        self.deadlines = PhaseDeadlines()  # the phases' time limits, one timer for all
        metrics.count_running(self)
        self._log_phase = PhaseLog(log)
        # Sends and hand-offs in progress: shielded from shutdown's cancel, awaited before the
        # pool closes.
        self.durable: set[asyncio.Future[Any]] = set()
        # The transitions whose commit is in flight: a drain past its grace does not cancel
        # them but gives them the durable share of the stop (worker/runtime.py), so a commit
        # needs no task of its own (one per hop was 5 % of a continued hop's client CPU).
        self.committing: set[asyncio.Task[Any]] = set()
        # Local continuation (worker/continuation.py): the successor rows leased to this worker.
        self.continuation = continuation or ContinuationConfig()
        self.leases = Leases(store, config.worker_id, self.continuation.lease_s)
        self.emitter = Emitter(store=store, queue=queue, faults=faults,
                               sent_lease=self.leases.sent, mark_sent=mark_sent, sender=sender)
        self.emit = self.emitter.emit
        self.own_successors = OwnSuccessors(self.continuation.lease_s)
        self._stopping = stopping
        # The side parts of the path, each in its own module.
        self.poison = Quarantine(store=store, dlq=dlq, worker_id=config.worker_id,
                                 parse=self.parse, backoff=self._backoff)
        self.duplicates = Duplicates(store=store, emit=self.emit,
                                     lease_s=self.continuation.lease_s)
        self.failures = Failures(store=store, config=config, emit=self.emit,
                                 phase_log=self._log_phase, backoff=self._backoff)
        self.branch_commits = BranchCommits(store=store, config=config, faults=faults,
                                            emit=self.emit, phase_log=self._log_phase,
                                            failures=self.failures)

    async def handle(self, message: Received) -> Settlement:
        self.faults.hit("after_receive")
        try:
            parsed = self.parse(message)
            if isinstance(parsed, Poison):
                return await self.poison.quarantine(message, parsed)
            envelope, workflow = parsed
            with residency.route(self.store, envelope), logs.bound_contextvars(
                    workflow_id=envelope.workflow_id, seq=envelope.seq, branch=envelope.branch,
                    workflow=envelope.workflow), tracing.phase_span(envelope) as span:
                settlement = await self.check_and_run(message, envelope, workflow)
                span.set("phasegate.outcome", settlement.outcome)
                if workflow.concurrency_key is not None \
                        and settlement.outcome in concurrency.FREES_SLOT:
                    await self.emitter.admitted(envelope.workflow_id)
                return settlement
        except DATABASE_DOWN as exc:
            metrics.DB_ERRORS.inc()
            log.warning("database_unavailable", error=type(exc).__name__,
                        retry_in_s=self._backoff(1))
            return Settlement(Action.RELEASE, "db_unavailable", self._backoff(1))

    # -- 1. parse -----------------------------------------------------------------------------

    def parse(self, message: Received) -> tuple[Envelope, Workflow] | Poison:
        return parse(message, max_message_bytes=self.config.max_message_bytes,
                     registry=self.registry, store=self.store,
                     sent=self.own_successors.envelope_sent)

    # -- 2. check -----------------------------------------------------------------------------

    async def check_and_run(self, message: Received, envelope: Envelope,
                            workflow: Workflow) -> Settlement:
        quarantine = self.poison.quarantine
        # A message this worker sent after its own commit: checked from memory.
        hop = self.own_successors.take(envelope, message.body)
        if hop is not None:
            return await self.run(hop.envelope, workflow, hop.phase, hop.position, hop.state)
        if envelope.kind == "deadline":  # a race's deadline fell due (race_deadline.py)
            ended = await expire_race(self.store, envelope)
            await asyncio.gather(*(self.emit(row) for row in ended.outbox))
            return Settlement(Action.DELETE, ended.label)
        position: RunPosition | None
        if envelope.kind == "start" and workflow.concurrency_key is not None:
            taken = await concurrency.start(self.store, envelope, workflow)
            if isinstance(taken, concurrency.Refused):  # nothing was written
                return await quarantine(message, Poison(
                    "concurrency_key", taken.reason, envelope.workflow_id))
            if workflow.rate is not None:  # a wake-up may have admitted runs queued before it
                await self.emitter.admitted(envelope.workflow_id)
            status, position = taken
            if status == "queued":  # its admission writes a new start message
                log.info("queued")
                return Settlement(Action.DELETE, "queued")
        # A start creates its run if a producer only enqueued it, in the load's round trip
        # (a keyed start's above, with its slot). A branch (phasegate/branches.py) has its
        # own position; main's is the run row.
        elif envelope.kind == "start":
            position = await self.store.start_and_load(envelope, workflow.schema_version,
                                                       workflow.first_phase)
        elif envelope.branch == MAIN_BRANCH:
            position = await self.store.load_for_phase(envelope.workflow_id, envelope.branch,
                                                       envelope.seq)
        else:
            position = await load_branch(self.store, envelope.workflow_id, envelope.branch)
        if position is None:
            return await quarantine(message, Poison(
                "no_run", "phase message for a run that does not exist", envelope.workflow_id))
        if position.workflow != envelope.workflow:
            return await quarantine(message, Poison(
                "workflow_mismatch", f"the run belongs to workflow {position.workflow}",
                envelope.workflow_id))
        if envelope.seq < position.next_seq:  # a duplicate (worker/duplicates.py)
            return await self.duplicates.settle(envelope, position.next_seq)
        if envelope.seq > position.next_seq:
            return await quarantine(message, Poison(
                "seq_ahead", f"message seq {envelope.seq} is ahead of the run "
                f"({position.next_seq})", envelope.workflow_id))
        if position.status != "running":
            log.info("run_not_running", status=position.status)
            return Settlement(Action.DELETE, "stale")
        phase_name = envelope.phase or position.current_phase or workflow.first_phase
        if phase_name != position.current_phase:
            return await quarantine(message, Poison(
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
            return await self.failures.halt_at_door(envelope, position, door)
        if door.rerun:
            phase_name, state = door.phase or phase_name, door.state
        # A merge phase also receives its branches' final states (ctx.merged).
        merged = await merge_input(self.store, workflow, position, phase_name, envelope.branch)
        if isinstance(merged, Premature):
            log.warning("merge_before_fan_in", phase=phase_name)
            return Settlement(Action.DELETE, "premature")
        if isinstance(merged, Halt):
            return await self.failures.halt_at_door(envelope, position, merged)
        return await self.run(envelope, workflow, phase_name, position, state, door, merged)

    async def load_state(self, position: RunPosition, workflow: Workflow) -> Any:
        """The state committed at the previous door, verified; or a Settlement that halts."""
        seq = position.next_seq
        if seq == position.base_seq:
            return json.loads(position.input_json or "null")
        halt = self.failures.halt
        if position.state_json is None or position.state_hash is None \
                or position.state_version is None:
            return await halt(position, "failed", "checkpoint_missing: no phase checkpoint "
                              f"at seq {seq - 1}")
        # Re-hash (a mismatch fails the run: checkpoint_corrupt), then upcast an older
        # schema version; without an upcaster chain the run needs a restart.
        try:
            return await load_verified(workflow, seq - 1, position.state_json,
                                       position.state_hash, position.state_version)
        except Corrupt as exc:
            return await halt(position, "failed", str(exc))
        except NeedsRestart as exc:
            return await halt(position, "needs_restart", str(exc))

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
                    return await end_chain(chain, step, self.leases, self.emit)
                self.faults.hit("mid_chain")
                envelope, phase_name, position, state = step
                door, merged = None, None
                structlog.contextvars.bind_contextvars(seq=envelope.seq)
        except asyncio.CancelledError:
            if chain.pending is not None:  # shutdown's cancel: the next worker takes the run now
                self._durable(self._hand_off(chain.pending))
            raise
        finally:
            self.leases.drop(chain.pending)

    async def _hand_off(self, pending: Pending) -> None:
        """End a chain between hops and send its next message at once."""
        row = await self.leases.end(pending)
        if row is not None:
            await self.emit(row)

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
        running_key = envelope.dedup_id
        self.running[running_key] = RunningPhase(ctx, envelope, started)
        try:
            result = await attempt(phase, ctx, state, workflow.tiers,
                                   phase_timeout(phase, self.config.phase_timeout_s),
                                   self.deadlines)
        except asyncio.CancelledError:  # the worker's own (shutdown): handed back, not charged
            self._log_phase(envelope, phase_name, started, "cancelled")
            raise
        finally:
            self.running.pop(running_key, None)
        if isinstance(result, Failed):
            return await self.failures.fail(envelope, phase_name, started, result.exc,
                                            retryable=result.retryable)
        new_state, graded = result
        try:  # the same state would fail on every retry: fail the run now, before the commit
            canonical = storable(new_state, "state")
        except UnstorableValue as exc:
            return await self.failures.fail(envelope, phase_name, started, exc, retryable=False)
        outcome = decide(workflow, phase, envelope.seq, graded, ctx.tier_attempt, door.rerun_of)
        self.faults.hit("mid_phase")
        # The durable part: a stopping worker lets it run to its end (``committing``).
        task = asyncio.current_task(self.deadlines.event_loop())
        assert task is not None
        self.committing.add(task)
        try:
            return await self.commit_and_emit(
                envelope, workflow, phase_name, canonical, position, started, outcome,
                ctx.observed.to_json(), ctx.branching, ctx.wait, chain)
        finally:
            self.committing.discard(task)

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
            return await self.branch_commits.commit(envelope, workflow, commit, position, fork,
                                                    started, commit_started)
        chain = chain or Chain()
        leasing = can_continue(self.continuation, chain, workflow=workflow, envelope=envelope,
                               outcome=outcome, forking=fork is not None,
                               waiting=wait is not None, stopping=self._stopping())
        # A successor for SQS: committed as a lease rather than an outbox row when it may be
        # (worker/continuation.py, leased send).
        sent_leased = (not leasing and successor is not None and can_send_leased(
            self.continuation, workflow=workflow, envelope=envelope, outcome=outcome,
            forking=fork is not None, waiting=wait is not None))
        # Encoded once, for the commit and the send; a continued hop's successor is encoded
        # only if its chain ends before it commits (continuation.Leases.end).
        body = successor.to_json() if successor is not None and not leasing else None
        lease = self.leases.lease if leasing else self.leases.sent if sent_leased else None
        with tracing.commit_span(envelope) as span:
            result = await self.store.commit_phase(commit, body, lease=lease)
            span.set("checkpoint.success", result is not None)
        metrics.COMMIT_DURATION.observe(time.monotonic() - commit_started)
        if result is None:
            # Another delivery of this message committed first; our side effects were
            # deduplicated by their keys. Nothing to emit.
            self._log_phase(envelope, phase_name, started, "superseded")
            return Settlement(Action.DELETE, "superseded")
        _, outbox_id = result
        self.leases.drop(chain.pending)  # this commit consumed (or ended) its chain lease
        chain.pending = None
        self.faults.hit("after_commit")
        if leasing and successor is not None:
            # The commit wrote a chain lease for the successor, not an outbox row.
            if not self._stopping():
                self._log_phase(envelope, phase_name, started, outcome.label, continued=True)
                return advance(chain, self.leases, successor, position, commit)
            # SIGTERM came during the commit: hand off now.
            await self._hand_off(Pending(successor))
        elif successor is not None and body is not None and (sent_leased or outbox_id is not None):
            # Sent while the runtime deletes the received message: the hop waits for the
            # longer of the two SQS calls, not their sum. The delete starts once the send's
            # request is under way, so building the delete's request does not hold the send's
            # up (the wait between two phases on LocalStack: 1.22x the floor with both started
            # together, 1.12x before, when the send had a head start by accident).
            if sent_leased:
                self.own_successors.remember(successor, body, position, commit)
            issued: asyncio.Future[None] = self.deadlines.event_loop().create_future()
            sending = self._durable(
                self.emitter.leased(successor, body, commit_started, issued) if outbox_id is None
                else self.emitter.successor(
                    OutboxRow(outbox_id, successor.dedup_id, successor.group_id, body),
                    commit_started, issued))
            self._log_phase(envelope, phase_name, started, outcome.label, tier=outcome.tier)
            await issued
            return Settlement(Action.DELETE, outcome.label, sending=sending)
        self.faults.hit("after_send")
        self._log_phase(envelope, phase_name, started, outcome.label, tier=outcome.tier)
        return Settlement(Action.DELETE, outcome.label)

    # -- the side parts' entry points the runtime calls -----------------------------------------

    async def crashed(self, message: Received, exc: BaseException) -> Settlement:
        """The transition itself raised: counted, retried, then quarantined (worker/poison.py)."""
        return await self.poison.crashed(message, exc)

    # -- helpers ------------------------------------------------------------------------------

    def _backoff(self, attempts: int) -> int:
        """A retry's visibility timeout: whole seconds with full jitter (transition_config.py)."""
        return retry_delay_s(self.config, attempts)

