"""A local chain's next message, when the worker that ran the chain died.

A continued hop writes no outbox row (migration 0020): the run's position carries a lease
for the worker that runs the next phase itself (worker/continuation.py). A chain that ends in
order writes its message itself. When its worker dies, the lease runs out and the message
must be rebuilt from the run: the relay does so for every expired chain, and so does a
worker that receives a duplicate of the chain's first message (the dead worker's held message
coming back), whichever comes first; the statement that writes the row clears the lease, so
only one of them does.

The rebuilt message is what the chain would have sent: the next phase of the run at its
next seq, on the main branch, with its region hint and the chain's first trace context, under
the same deduplication id.

A leased send (worker/continuation.py) holds the same lease, under the holder's id with
``SENT_SUFFIX``: its message was sent, or its worker died before the send. When its lease runs
out before the successor commits (a long phase, a backlog), the relay writes the message the
same way; SQS drops it as a duplicate of the worker's send, and the run is left where a plain
advance leaves it: its message an outbox row marked sent, in the stall detector's view. That is
routine, not a rescue, and is counted apart (``phasegate_sent_leases_lapsed_total``).
"""

from __future__ import annotations

import structlog

from phasegate import metrics
from phasegate.envelope import MAIN_BRANCH, Envelope
from phasegate.store import SENT_SUFFIX, ChainLease, Lease, OutboxRow, Store

log = structlog.get_logger("phasegate.chains")


def sent_holder(worker_id: str) -> str:
    """A leased send's lease holder (worker/continuation.py)."""
    return worker_id + SENT_SUFFIX


def successor_of(chain: ChainLease) -> Envelope:
    """The message of the chain's next phase, from the run."""
    return Envelope(v=1, kind="phase", workflow_id=chain.workflow_id, workflow=chain.workflow,
                    seq=chain.next_seq, phase=chain.current_phase, branch=MAIN_BRANCH,
                    traceparent=chain.chain_traceparent, region=chain.region)


async def rescue(store: Store, chain: ChainLease, claim: Lease | None = None
                 ) -> OutboxRow | None:
    """Write an expired chain's message as an outbox row (leased to ``claim`` when given:
    a relay's send) and return it for sending; None when the chain was no longer there to
    rescue (its worker came back, or another rescuer was first). A live lease is ended only
    as its holder: a leased send's, by a duplicate (worker/duplicates.py)."""
    successor = successor_of(chain)
    body = successor.to_json()
    holder = chain.holder if chain.live and chain.sent else None
    outbox_id = await store.end_chain(successor, body, holder=holder, lease=claim)
    if outbox_id is None:
        return None
    if chain.sent:
        metrics.SENT_LEASES_LAPSED.inc()
        log.info("sent_lease_lapsed", workflow_id=chain.workflow_id, next_seq=chain.next_seq)
    else:
        metrics.CHAINS_RESCUED.inc()
        log.warning("chain_rescued", workflow_id=chain.workflow_id, next_seq=chain.next_seq)
    return OutboxRow(outbox_id, successor.dedup_id, successor.group_id, body)
