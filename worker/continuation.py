"""Local continuation: after committing phase N, run phase N+1 in the same worker.

The state is in memory and the run row was just moved by this worker's own commit, so the next
hop needs no load, and no SQS send, receive or delete. What keeps it safe:

- The commit of N writes no message for N+1: it puts a *chain lease* on the run's position
  (``chain_holder`` = this worker, ``chain_until`` = database ``now()`` + the lease; migration
  0020), in the same statement. The worker's heartbeat extends it while the chain lives.
- A chain that ends in order writes its message then (``end_chain``): on a retry, leased to
  this worker until the backoff ends (the relay sends it then); on a shutdown between hops,
  sent at once.
- A worker that dies mid-chain leaves an expired lease: the relay, or a duplicate of the
  chain's first message, rebuilds the message from the run and sends it (phasegate/chains.py),
  so the run is back through SQS within about two heartbeats, exactly like a dead worker's
  received message.
- Every commit is still conditional on the run being ``running`` at that seq: a cancel, or
  another worker that took over after an expired lease, makes the next commit a no-op and the
  chain stops there.
- A chain is bounded (``continuation_max_hops`` hops, ``continuation_max_s`` seconds), then
  the run goes back through SQS so work spreads across the fleet; SIGTERM ends chains between
  hops; anything the local path does not know how to check (reviews, tiers, staleness, forks,
  branches, merges) is handed off through SQS exactly as without continuation.

The received SQS message stays held (and heartbeated) until the chain ends, so queue-depth
autoscalers (KEDA's in-flight count) keep seeing the work.

A successor that goes through SQS after all (continuation off, a chain at its bound) uses the
same lease, held by no chain (*a leased send*, ``PHASEGATE_LEASED_SEND``): its commit writes the
lease instead of an outbox row, for the holder's id with ``SENT_SUFFIX``, and the worker sends
the message itself. The lease covers only the moment between the commit and the send: it is
never extended, and the successor's own commit replaces it. Should that commit not come before
the lease runs out (a long phase, a queue backlog, a worker that died before its send), the
relay writes the message as an outbox row under the same deduplication id, which SQS drops as
a duplicate if the worker's send went out, and from then on the run is where a plain advance
would have left it (phasegate/chains.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from phasegate import metrics
from phasegate.chains import sent_holder
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
    # A successor sent through SQS is committed as a lease, not an outbox row (the module
    # docstring); with continuation on or off.
    leased_send: bool = False


class Pending(NamedTuple):
    """The message of the hop now running locally: committed as a chain lease, never written
    as an outbox row unless the chain ends before that hop commits (and only then encoded)."""

    successor: Envelope


@dataclass
class Chain:
    """The hops one received message has run. ``pending``: the hop now running locally (None
    on the first hop, and once its commit has consumed the lease)."""

    started: float = field(default_factory=time.monotonic)
    hops: int = 0
    pending: Pending | None = None


def can_continue(config: ContinuationConfig, chain: Chain, *, workflow: Workflow,
                 envelope: Envelope, outcome: PhaseOutcome, forking: bool,
                 stopping: bool, waiting: bool = False) -> bool:
    """Whether the phase about to commit may be followed locally by the next one.

    Decided before the commit (the successor is written leased or not); the commit's own
    result is checked after it (``Chain`` continues only on success). Each condition is one
    term, so a further one slots in."""
    return (config.enabled
            and not stopping
            and plain_successor(workflow=workflow, envelope=envelope, outcome=outcome,
                                forking=forking, waiting=waiting)
            # Bounded, so one worker does not keep a long run to itself.
            and chain.hops + 1 <= config.max_hops
            and time.monotonic() - chain.started < config.max_s)


def can_send_leased(config: ContinuationConfig, *, workflow: Workflow, envelope: Envelope,
                    outcome: PhaseOutcome, forking: bool, waiting: bool = False) -> bool:
    """Whether a successor that goes through SQS may be committed as a lease (the module
    docstring) rather than an outbox row: the message ``phasegate/chains.py`` rebuilds from
    the run, should the lease run out before the successor commits."""
    return config.leased_send and plain_successor(
        workflow=workflow, envelope=envelope, outcome=outcome, forking=forking,
        waiting=waiting)


def plain_successor(*, workflow: Workflow, envelope: Envelope, outcome: PhaseOutcome,
                    forking: bool, waiting: bool) -> bool:
    """The next phase of the main chain of a plain run, due now: all a chain lease knows of
    a message (``chains.successor_of``)."""
    return (
        # The main chain of a plain run: branches, forks and merges have their own
        # bookkeeping (phasegate/branches.py); tiers, reviews and staleness need the door's
        # queries (workflow.uses_room). All of those keep going through SQS.
        envelope.branch == MAIN_BRANCH
        and not forking
        # A timer or a signal wait (phasegate/waits.py): the next phase is due later, sent
        # by the relay; nothing to run now.
        and not waiting
        and not workflow.uses_room
        and outcome.action == "advance"
        and outcome.status == "running"
        and outcome.sends_successor
        and outcome.next_phase is not None
        and outcome.next_phase not in workflow.merge_phases)


class Hop(NamedTuple):
    """The next phase to run locally, from what the worker knows after its own commit."""

    envelope: Envelope
    phase: str
    position: RunPosition
    state: Any


class Leases:
    """The runs this worker's chains hold (their position's chain lease); the heartbeat
    extends them."""

    def __init__(self, store: Store, worker_id: str, lease_s: float) -> None:
        self.store = store
        self.lease = Lease(worker_id, lease_s)
        # A leased send's: never extended, so no run is ever held under it.
        self.sent = Lease(sent_holder(worker_id), lease_s)
        self.held: set[str] = set()

    def hold(self, workflow_id: str) -> None:
        self.held.add(workflow_id)

    def drop(self, pending: Pending | None) -> None:
        if pending is not None:
            self.held.discard(pending.successor.workflow_id)

    async def extend(self) -> int:
        """Extend every held lease (database time); returns how many are still held."""
        ids = list(self.held)
        kept = await self.store.extend_chains(ids, self.lease)
        self.held.difference_update(set(ids) - kept)  # rescued meanwhile: not ours to extend
        return len(kept)

    async def end(self, pending: Pending, delay_s: float | None = None) -> OutboxRow | None:
        """End the chain of ``pending``'s run before that hop committed: its message becomes an
        outbox row, to send now (returned), or after ``delay_s`` (a retry's backoff: the row
        is leased to this worker until then and the relay sends it). None when the chain was
        no longer this worker's (rescued after its lease ran out)."""
        self.drop(pending)
        successor = pending.successor
        body = successor.to_json()
        lease = Lease(self.lease.holder, delay_s) if delay_s is not None else None
        outbox_id = await self.store.end_chain(successor, body, holder=self.lease.holder,
                                               lease=lease)
        if outbox_id is None or lease is not None:
            return None
        return OutboxRow(outbox_id, successor.dedup_id, successor.group_id, body)


def advance(chain: Chain, leases: Leases, successor: Envelope, position: RunPosition,
            commit: PhaseCommit) -> Hop:
    """Chain on: the successor (its lease committed with ``commit``) is the next hop's. The run
    row as this worker's commit left it; the state as the next worker would load it (decoded
    from the canonical JSON that was committed, same schema version: same values, same
    types). What belongs to one seq goes: its saved progress, and the signal delivered to it
    (the next seq has none: a phase that waits for one never continues)."""
    chain.hops += 1
    chain.pending = Pending(successor)
    leases.hold(successor.workflow_id)
    metrics.CONTINUED_HOPS.inc()
    return hop_after(successor, position, commit)


def hop_after(successor: Envelope, position: RunPosition, commit: PhaseCommit) -> Hop:
    """The successor's hop from what this worker knows: ``position`` as read before ``commit``
    (``advance``; worker/own_successors.py)."""
    assert commit.next_phase is not None
    return Hop(successor, commit.next_phase, position.after(commit), json.loads(commit.state_json))


async def end_chain(chain: Chain, settlement: Settlement, leases: Leases,
                    emit: Emit) -> Settlement:
    """After a continued hop, the received message only woke the first one: delete it. A
    hop that did not commit leaves its chain lease: its message goes out now, or for a retry
    when its backoff ends (the relay sends it then)."""
    if chain.hops == 0:
        return settlement
    pending, chain.pending = chain.pending, None
    if pending is not None:
        retry = settlement.visibility_s if settlement.action is Action.RELEASE else None
        row = await leases.end(pending, retry)
        if row is not None:
            await emit(row)
    # A chain handed off through SQS: its last hop's send is still the runtime's to wait for.
    return Settlement(Action.DELETE, settlement.outcome, sending=settlement.sending)
