"""Step 2's duplicate: a message whose seq its run has already committed.

Its work is done; what may be missing is the successor message (a crash between the commit
and the send). The duplicate makes sure it exists, then is deleted -- unless a worker runs the
run's next phase itself (a local chain, worker/continuation.py) or holds its row leased: then
the duplicate is held back instead of deleted, so that a dead worker's chain does not depend
on the relay alone. When it comes back and the chain's lease has run out, it rebuilds the
chain's message and sends it (phasegate/chains.py).

A leased send's lease is not a chain: no worker runs the phase, its message went out (or its
worker died before the send) and waits in the queue behind this duplicate, whose group it
holds up. Held back, the duplicate would hold the successor up until the lease runs out; it
ends the lease instead, writing the message as an outbox row and sending it (SQS drops it if the
first send went out), and is deleted.
"""

from __future__ import annotations

import math

import structlog

from phasegate import chains
from phasegate.envelope import MAIN_BRANCH, Envelope
from phasegate.store import Store
from phasegate.worker.outcomes import Action, Emit, Settlement

log = structlog.get_logger("phasegate.transition")


class Duplicates:
    def __init__(self, *, store: Store, emit: Emit, lease_s: float) -> None:
        self.store = store
        self._emit = emit
        self.lease_s = lease_s

    async def settle(self, envelope: Envelope, next_seq: int) -> Settlement:
        if not await self.ensure_successor(envelope, next_seq):
            # Deleting this message would leave the leased row to the relay alone; held back
            # instead, it returns when the lease may have run out and sends the row itself.
            log.info("duplicate_successor_leased", next_seq=next_seq)
            return Settlement(Action.RELEASE, "successor_leased", self.lease_wait_s())
        log.info("duplicate", next_seq=next_seq)
        return Settlement(Action.DELETE, "duplicate")

    async def ensure_successor(self, envelope: Envelope, next_seq: int) -> bool:
        """Send the run's next message if its commit left it unsent (a crash between the commit
        and the send), or its chain left it unwritten (local continuation: the chain's worker
        died). False while a chain or a lease holds it: its worker is running it, or died and
        the lease runs out within one visibility timeout."""
        row = await self.store.successor(envelope.workflow_id, envelope.branch, next_seq)
        if row is None and envelope.branch == MAIN_BRANCH:
            chain = await self.store.chain_of(envelope.workflow_id, next_seq)
            if chain is not None and chain.live and not chain.sent:
                return False
            if chain is not None:  # its worker died mid-chain, or it was a leased send
                row = await chains.rescue(self.store, chain)
        if row is None or row.sent_at is not None:
            return True
        if row.leased:
            return False
        await self._emit(row)
        return True

    def lease_wait_s(self) -> int:
        return max(1, math.ceil(self.lease_s / 2))
