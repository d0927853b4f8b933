"""A race's deadline: ``ctx.fork(..., mode="race", deadline_s=N)``.

If no branch has won N seconds after the fork committed, the race ends: every live branch of
the fork is discarded, the fork fails (resolution ``deadline``) and so does its parent -- the
run (``RaceDeadlineExceeded: no branch of the race at main seq 0 won within its deadline of
3 s``), or the parent branch, which is then a failed branch one level up.

- **The time is PostgreSQL's.** The fork statement (``fork_commit``) stores ``deadline_at =
  now() + N`` and writes a ``deadline`` message to the outbox, due at that moment -- the due
  time of timers (migration 0010, phasegate/waits.py). The orchestrator's relay sends it when
  due, so it fires with the worker fleet at zero: the message wakes the fleet like any other.
- **Ending it is one conditional statement under the fork lock** (``race_deadline``): the
  worker that receives the message locks the fork row (``fork_lock``, as a fan-in does), then
  ends the race only if it is still an open race whose deadline has passed and whose parent
  still runs. A winner's final commit takes the same lock first, so the two serialise: a
  race won first makes the message a no-op; a race ended first refuses the winner's commit
  (its branch is no longer running; what it produced is recorded as a ``discarded``
  checkpoint). A message that arrives early, twice, or for a fork that does not exist changes
  nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from phasegate.branch_failures import fail_parent
from phasegate.branches import guard, sql
from phasegate.envelope import MAIN_BRANCH, Envelope
from phasegate.store import OutboxRow

if TYPE_CHECKING:
    from phasegate.store import Store

log = structlog.get_logger("phasegate.branches")


class RaceDeadlineExceeded(Exception):
    """The error a race's deadline records (its name starts the run's or branch's error line,
    so a merge phase one level up sees ``error_type == "RaceDeadlineExceeded"``)."""


@dataclass(frozen=True)
class Expired:
    """What a deadline message did: ``reason`` is None when it changed nothing."""

    reason: str | None = None
    discarded: int = 0
    run_failed: bool = False
    outbox: list[OutboxRow] = field(default_factory=list)  # a fan-in one level up

    @property
    def label(self) -> str:
        if self.reason is None:
            return "deadline_moot"
        return "failed" if self.run_failed else "race_deadline"


async def expire(store: Store, envelope: Envelope) -> Expired:
    """End the race forked at ``envelope.seq`` on chain ``envelope.branch`` if its deadline
    has passed with no winner (above); otherwise change nothing."""
    workflow_id, parent, fork_seq = envelope.workflow_id, envelope.branch, envelope.seq
    await guard(store, workflow_id)
    outbox: list[OutboxRow] = []
    async with store.pool.acquire() as connection, connection.transaction():
        fork = await connection.fetchrow(sql()["fork_lock"], workflow_id, fork_seq, parent)
        if fork is None:
            log.info("race_deadline_moot", fork_seq=fork_seq, parent=parent, why="no_fork")
            return Expired()
        row = await connection.fetchrow(sql()["race_deadline"], workflow_id, parent, fork_seq,
                                        RaceDeadlineExceeded.__name__)
        reason = row["reason"]
        if reason is not None and parent != MAIN_BRANCH:
            outbox = await fail_parent(connection, envelope, parent, reason)
    if reason is None:
        log.info("race_deadline_moot", fork_seq=fork_seq, parent=parent, fork=fork["status"])
        return Expired()
    log.warning("race_deadline", fork_seq=fork_seq, parent=parent,
                discarded=row["discarded"], run_failed=row["run_failed"])
    return Expired(reason, row["discarded"], row["run_failed"], outbox)
