"""A branch that fails: recorded under its fork's lock, and what that means for the fork.

A branch phase that exhausts its retries (or raises a ``NonRetryableError``) marks its branch
``failed`` in a transaction that first locks the branch's fork row, like a final commit, so
it is counted exactly once against the fork's ``pending`` and never races a fan-in:

- ``require="all"``: the fork fails at once and so does its parent -- the run (main chain),
  or the parent branch, which is then a failed branch of the fork one level up (the same
  rules apply there, inside the same transaction);
- ``race``: the race goes on; when the last branch still running fails with no winner, the
  fork fails and so does its parent;
- ``all`` (default): the failure is counted like a finished branch; the last one fans in and
  the merge phase receives the failed branches in ``ctx.merged`` (``status="failed"``).

Locks are taken child fork first, then up: a fork row, then rows of its branches, then the
fork row one level up. Nothing takes a fork lock below one it holds (a discarded branch's
descendants find out lazily, phasegate/branches.py ``load_branch``), so this order cannot
deadlock with a fan-in or a race at another level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from phasegate.branches import guard, settle, sql
from phasegate.envelope import MAIN_BRANCH, Envelope
from phasegate.store import OutboxRow

if TYPE_CHECKING:
    from phasegate.branches import BranchPosition
    from phasegate.store import Store

log = structlog.get_logger("phasegate.branches")


@dataclass(frozen=True)
class Failure:
    """``Store.record_failure``'s answer for a branch, plus a merge message the failure
    fanned in (to send now; the relay sends it otherwise)."""

    attempts: int
    status: str
    outbox: list[OutboxRow] = field(default_factory=list)


async def record_failure(store: Store, envelope: Envelope, error: str,
                         max_attempts: int, *, worker_id: str | None = None) -> Failure | None:
    """Count a failed attempt of a branch phase; at the limit the branch fails (above)."""
    workflow_id, branch = envelope.workflow_id, envelope.branch
    await guard(store, workflow_id)
    at = await store.pool.fetchrow(sql()["branch_fork"], workflow_id, branch)
    if at is None:
        return None
    outbox: list[OutboxRow] = []
    async with store.pool.acquire() as connection, connection.transaction():
        fork = await connection.fetchrow(sql()["fork_lock"], workflow_id, at["fork_seq"],
                                         at["parent_branch"])
        row = await connection.fetchrow(sql()["branch_failure"], workflow_id, branch, error,
                                        envelope.seq, max_attempts, envelope.phase, worker_id)
        if row is None:
            return None
        if row["status"] == "failed" and fork is not None:
            outbox = await branch_failed(connection, envelope, branch, at["parent_branch"],
                                         at["fork_seq"], fork, error)
    return Failure(row["attempts"], row["status"], outbox)


async def branch_failed(connection: Any, envelope: Envelope, branch: str, parent: str,
                        fork_seq: int, fork: Any, error: str) -> list[OutboxRow]:
    """Under the lock of ``branch``'s fork, after the branch was marked failed."""
    if fork["status"] != "open":  # a race already won, a review closed it: recorded only
        return []
    last = fork["pending"] - 1 == 0
    if fork["require_all"]:
        return await fail_fork(connection, envelope, parent, fork_seq,
                               f"branch {branch} failed (the fork requires all): {error}")
    if fork["mode"] == "race":
        if last:
            return await fail_fork(connection, envelope, parent, fork_seq,
                                   f"every branch of the race at {parent} seq {fork_seq} "
                                   f"failed; the last, {branch}: {error}")
        await settle(connection, envelope, parent, fork_seq, fork, None, None)
        log.info("race_branch_failed", branch=branch, pending=fork["pending"] - 1)
        return []
    outbox = await settle(connection, envelope, parent, fork_seq, fork,
                          "fan_in" if last else None, None)
    log.info("branch_failed_counted", branch=branch, fanned_in=bool(outbox))
    return outbox


async def fail_fork(connection: Any, envelope: Envelope, parent: str, fork_seq: int,
                    reason: str) -> list[OutboxRow]:
    """The fork cannot succeed: close it, and fail its parent (one level up, recursively;
    a tolerant fork up there may fan in: its merge message is returned)."""
    await connection.execute(sql()["fork_failed"], envelope.workflow_id, fork_seq, parent)
    log.warning("fork_failed", parent=parent, fork_seq=fork_seq)
    return await fail_parent(connection, envelope, parent, reason)


async def fail_parent(connection: Any, envelope: Envelope, parent: str,
                      reason: str) -> list[OutboxRow]:
    """A fork of ``parent`` failed (its lock held): fail the run, or the parent branch as a
    failed branch of its own fork one level up (whose lock this takes next)."""
    if parent == MAIN_BRANCH:
        await connection.fetchval(sql()["run_fail"], envelope.workflow_id, reason[:1000])
        return []
    up = await connection.fetchrow(sql()["branch_fork"], envelope.workflow_id, parent)
    grand = await connection.fetchrow(sql()["fork_lock"], envelope.workflow_id,
                                      up["fork_seq"], up["parent_branch"])
    failed = await connection.fetchval(sql()["branch_fail"], envelope.workflow_id, parent,
                                       reason[:1000])
    if failed is None or grand is None:
        return []
    return await branch_failed(connection, envelope, parent, up["parent_branch"],
                               up["fork_seq"], grand, reason)


async def halt(store: Store, position: BranchPosition, status: str, reason: str) -> bool:
    """Stop a branch that cannot go on (a corrupt checkpoint, no upcaster) and its run, with
    the reason: not a failure of the branch's work, so no fork tolerates it."""
    await guard(store, position.workflow_id)
    return await store.pool.fetchval(
        sql()["branch_halt"], position.workflow_id, position.branch, position.next_seq, reason,
        status) is not None
