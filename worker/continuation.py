"""Local continuation: after committing phase N, run phase N+1 in the same worker.

The state is in memory and the run row was just moved by this worker's own commit, so the next
hop needs no load, and no SQS send, receive or delete. What keeps it safe:

- The successor's outbox row is written by the same commit, *leased* to this worker
  (``lease_holder``, ``lease_until`` = database ``now()`` + the lease). The worker's heartbeat
  extends the lease while the chain lives; nobody (relay, ``ensure_successor``) sends a leased
  row before its lease expires, so a worker that dies mid-chain is replaced through SQS within
  about two heartbeats, exactly like a dead worker's received message.
- The hop's own commit deletes that row in the same statement (it was consumed locally,
  never sent).
- Every commit is still conditional on the run being ``running`` at that seq: a cancel, or
  another worker that took over after an expired lease, makes the next commit a no-op and the
  chain stops there.
- A chain is bounded (``continuation_max_hops`` hops, ``continuation_max_s`` seconds), then
  the run goes back through SQS so work spreads across the fleet; SIGTERM ends chains between
  hops; anything the local path does not know how to check (reviews, tiers, staleness, forks,
  branches, merges) is handed off through SQS exactly as without continuation.

The received SQS message stays held (and heartbeated) until the chain ends, so queue-depth
autoscalers (KEDA's in-flight count) keep seeing the work.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from phasegate import metrics
from phasegate.envelope import MAIN_BRANCH, Envelope
from phasegate.store import Lease, OutboxRow, PhaseCommit, RunPosition, Store
from phasegate.tiers import PhaseOutcome
from phasegate.worker.outcomes import Action, Emit, Settlement
from phasegate.workflow import Workflow


@dataclass(frozen=True)
class ContinuationConfig:
    enabled: bool = False
    max_hops: int = 16
    max_s: float = 30.0
    # How long a leased successor lives without a heartbeat (the worker's visibility timeout:
    # a dead chain comes back as fast as a dead worker's message does).
    lease_s: float = 30.0


@dataclass
class Chain:
    """The hops one received message has run. ``leased``: the committed, unsent row of the
    hop now running locally (None on the first hop, and once it is consumed)."""

    started: float = field(default_factory=time.monotonic)
    hops: int = 0
    leased: OutboxRow | None = None


def can_continue(config: ContinuationConfig, chain: Chain, *, workflow: Workflow,
                 envelope: Envelope, outcome: PhaseOutcome, forking: bool,
                 stopping: bool, waiting: bool = False) -> bool:
    """Whether the phase about to commit may be followed locally by the next one.

    Decided before the commit (the successor is written leased or not); the commit's own
    result is checked after it (``Chain`` continues only on success). Each condition is one
    term, so a further one slots in."""
    return (config.enabled
            and not stopping
            # The main chain of a plain run: branches, forks and merges have their own
            # bookkeeping (phasegate/branches.py); tiers, reviews and staleness need the door's
            # queries (workflow.uses_room). All of those keep going through SQS.
            and envelope.branch == MAIN_BRANCH
            and not forking
            # A timer or a signal wait (phasegate/waits.py): the next phase is due later,
            # sent by the relay; nothing to run now.
            and not waiting
            and not workflow.uses_room
            and outcome.action == "advance"
            and outcome.status == "running"
            and outcome.sends_successor
            and outcome.next_phase is not None
            and outcome.next_phase not in workflow.merge_phases
            # Bounded, so one worker does not keep a long run to itself.
            and chain.hops + 1 <= config.max_hops
            and time.monotonic() - chain.started < config.max_s)


class Hop(NamedTuple):
    """The next phase to run locally, from what the worker knows after its own commit."""

    envelope: Envelope
    phase: str
    position: RunPosition
    state: Any


class Leases:
    """The successor rows leased to this worker by its chains; the heartbeat extends them."""

    def __init__(self, store: Store, worker_id: str, lease_s: float) -> None:
        self.store = store
        self.lease = Lease(worker_id, lease_s)
        self.held: dict[int, OutboxRow] = {}

    def hold(self, row: OutboxRow) -> None:
        self.held[row.outbox_id] = row

    def drop(self, row: OutboxRow | None) -> None:
        if row is not None:
            self.held.pop(row.outbox_id, None)

    async def extend(self) -> int:
        """Extend every held lease (database time); returns how many are still held."""
        ids = list(self.held)
        kept = await self.store.extend_leases(ids, self.lease)
        for lost in set(ids) - kept:  # consumed or taken over meanwhile: not ours to extend
            self.held.pop(lost, None)
        return len(kept)

    async def expire_in(self, row: OutboxRow, seconds: float) -> None:
        """Stop extending ``row``'s lease and let it run out in ``seconds``: the relay sends
        the row then (a continued hop's retry keeps its backoff without holding anything)."""
        self.drop(row)
        await self.store.extend_leases([row.outbox_id], Lease(self.lease.holder, seconds))


def advance(chain: Chain, leases: Leases, row: OutboxRow, successor: Envelope,
            position: RunPosition, commit: PhaseCommit) -> Hop:
    """Chain on: ``row`` (the successor, leased by the commit) is the next hop's. The run row
    as this worker's commit left it; the state as the next worker would load it (decoded from
    the canonical JSON that was committed, same schema version: same values, same types)."""
    chain.hops += 1
    chain.leased = row
    leases.hold(row)
    metrics.CONTINUED_HOPS.inc()
    assert commit.next_phase is not None
    next_position = replace(
        position, status="running", next_seq=commit.seq + 1, current_phase=commit.next_phase,
        attempts=0, state_json=commit.state_json, state_hash=commit.state_hash,
        state_version=commit.schema_version, progress_json=None)
    return Hop(successor, commit.next_phase, next_position, json.loads(commit.state_json))


async def end_chain(chain: Chain, settlement: Settlement, leases: Leases,
                    emit: Emit) -> Settlement:
    """After a continued hop, the received message only woke the first one: delete it. A
    leased row left unconsumed (the hop did not commit) goes out now, or for a retry when
    its backoff ends (the lease is set to expire then, and the relay sends it)."""
    if chain.hops == 0:
        return settlement
    row, chain.leased = chain.leased, None
    if row is not None and settlement.action is Action.RELEASE:
        await leases.expire_in(row, settlement.visibility_s)
    elif row is not None:
        leases.drop(row)
        await emit(row)
    return Settlement(Action.DELETE, settlement.outcome)
