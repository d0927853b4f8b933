"""A successor this worker sent, received back by this worker: checked from memory.

A leased send (worker/continuation.py) commits phase N and sends N+1 through SQS. When the
same worker receives that message back (one worker; a small fleet, often), it already knows
what the check before a phase would read: its own commit left the run at N+1, running, with
the state it just wrote. So the message is run as a continued hop is, from memory, without
``load_for_phase``'s round trip. What keeps it as safe as the load:

- Only the message this worker sent, byte for byte (the body it encoded), within half the
  lease it committed: its run's position has moved only through commits since, and every
  commit is conditional on the run being ``running`` at that seq. A cancel, or a retry or
  another worker's commit in between, makes this hop's commit a no-op (``superseded``), as
  for a continued hop; the phase ran once more than a load would have let it, as a chain's
  next hop does.
- Only plain successors (``continuation.plain_successor``): no door, no branch, no merge, no
  wait, so the load has nothing else to tell.
- Taken once: a second delivery of the same message goes through the load like any message
  and finds it a duplicate.

Bounded by count and by the bytes kept (the state, the run's input, the body); the oldest
go first.
"""

from __future__ import annotations

import time

from phasegate import metrics
from phasegate.envelope import Envelope
from phasegate.records import record
from phasegate.store import PhaseCommit, RunPosition
from phasegate.worker.continuation import Hop, hop_after

# The successors a worker can have in flight is its concurrency; a few times that covers a
# queue that holds them back a little.
MAX_KEPT = 256
# 8 MiB of states at most (a state may be up to 1 MiB: phasegate/storable.py).
MAX_KEPT_BYTES = 8 * 1024 * 1024


@record
class _Sent:
    body: str
    successor: Envelope
    position: RunPosition
    commit: PhaseCommit
    until: float  # monotonic


class OwnSuccessors:
    def __init__(self, lease_s: float, *, max_kept: int = MAX_KEPT,
                 max_bytes: int = MAX_KEPT_BYTES) -> None:
        # Half the lease: the relay writes the message again only once the lease is out.
        self._keep_s = lease_s / 2
        self._max_kept = max_kept
        self._max_bytes = max_bytes
        self._sent: dict[str, _Sent] = {}  # by deduplication id, oldest first
        self._bodies: dict[str, str] = {}  # each kept body's deduplication id
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._sent)

    def remember(self, successor: Envelope, body: str, position: RunPosition,
                 commit: PhaseCommit) -> None:
        """After a leased send's commit: ``position`` as the check read it before ``commit``,
        ``body`` the successor's JSON as sent."""
        # What the successor's hop replaces is not kept (the previous state may be 1 MiB).
        position = position.without_state()
        size = _size(body, position, commit)
        if size > self._max_bytes:
            return
        self._drop_expired()
        self._forget(successor.dedup_id)
        while self._sent and (len(self._sent) >= self._max_kept
                              or self._bytes + size > self._max_bytes):
            self._forget(next(iter(self._sent)))
        self._sent[successor.dedup_id] = _Sent(body, successor, position, commit,
                                               time.monotonic() + self._keep_s)
        self._bodies[body] = successor.dedup_id
        self._bytes += size

    def envelope_sent(self, body: str) -> Envelope | None:
        """The envelope this worker encoded as ``body``, if it is kept: a received copy of it
        needs no parse (the text is the envelope's own ``to_json``)."""
        dedup_id = self._bodies.get(body)
        return None if dedup_id is None else self._sent[dedup_id].successor

    def take(self, envelope: Envelope, body: str) -> Hop | None:
        """The hop to run for a received message this worker sent (and forget it), or None:
        the message then goes through the check before a phase."""
        sent = self._sent.get(envelope.dedup_id)
        if sent is None:
            return None
        self._forget(envelope.dedup_id)
        if sent.body != body or time.monotonic() > sent.until:
            return None
        metrics.OWN_SUCCESSORS.inc()
        return hop_after(sent.successor, sent.position, sent.commit)

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for dedup_id, sent in list(self._sent.items()):
            if sent.until >= now:
                break  # oldest first: the rest are newer
            self._forget(dedup_id)

    def _forget(self, dedup_id: str) -> None:
        sent = self._sent.pop(dedup_id, None)
        if sent is not None:
            self._bodies.pop(sent.body, None)
            self._bytes -= _size(sent.body, sent.position, sent.commit)


def _size(body: str, position: RunPosition, commit: PhaseCommit) -> int:
    return len(body) + len(position.input_json or "") + len(commit.state_json)
