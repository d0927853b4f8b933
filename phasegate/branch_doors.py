"""The doors of a branch: what the main chain's door (phasegate/door.py) does, inside a branch.

- **Staleness check**: a branch phase entering from a checkpoint older than
  ``PHASEGATE_STALE_AFTER_S`` (database time) fetches the current versions of what the
  branch observed; a change (or an unknown version) stops **the branch**, not the run: it is
  marked ``stale`` with the reason, in a transaction that first locks its fork row (like a
  failure), and counted like a failed branch -- an ``all`` fork fans in with it (the merge
  phase sees ``status="stale"`` and may ``Retry`` it), a race goes on, ``require="all"``
  fails the parent.
- **Below-tier retry**: a checkpoint that ended in ``retry`` makes its phase run again from
  the input of its first attempt, inside the branch's own chain (``ctx.tier_attempt`` counts),
  exactly as on main (``door.rerun``).
- **Escalation**: a branch has no ``awaiting_review`` of its own; a result its policy would
  escalate fails the branch (``BelowTierError``, phasegate/branches.py ``commit_branch``) and
  the merge phase decides. Operator reviews (approve/reject) stay on the main chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from phasegate import staleness
from phasegate.branch_failures import branch_failed
from phasegate.branch_failures import halt as halt_branch
from phasegate.branches import guard
from phasegate.door import Door, Halt, rerun
from phasegate.sql import queries

if TYPE_CHECKING:
    from phasegate.branches import BranchPosition
    from phasegate.envelope import Envelope
    from phasegate.store import OutboxRow, RunPosition, Store
    from phasegate.workflow import Workflow

log = structlog.get_logger("phasegate.branches")

STALE = "stale"


def sql() -> dict[str, str]:
    return queries("branch_doors.sql")


async def enter(store: Store, workflow: Workflow, position: RunPosition, branch: str,
                stale_after_s: float) -> Door | Halt:
    """How the phase at ``position.next_seq`` of ``branch`` runs (only workflows with tiers
    or a version fetcher pay the query). The same signature as ``door.enter``."""
    if not workflow.uses_room or position.next_seq == position.base_seq:
        return Door()
    row = await store.pool.fetchrow(sql()["branch_door"], position.workflow_id, branch,
                                    position.next_seq)
    if row is None:
        return Door()
    if row["door_outcome"] == "retry":
        return await rerun(store.pool, workflow, position, branch, row)
    resources = staleness.parse_envelope(row["resource_versions"])
    if workflow.version_fetchers and resources and row["age_s"] >= stale_after_s:
        stale = await staleness.check(workflow, resources)
        if stale:
            reason, _ = staleness.review_for(stale, position.next_seq, position.current_phase)
            return Halt(STALE, reason)
    return Door(resources=resources)


async def halt(store: Store, envelope: Envelope, position: BranchPosition,
               stopped: Halt) -> list[OutboxRow]:
    """Write a branch's Halt. ``stale``: the branch stops and its fork counts it like a failed
    branch (a merge message it fanned in is returned, to send now). Anything else (a corrupt
    checkpoint, no upcaster): the branch fails and its run stops (branch_failures.halt)."""
    reason = stopped.reason or stopped.status
    if stopped.status != STALE:
        await halt_branch(store, position, stopped.status, reason)
        return []
    await guard(store, position.workflow_id)
    branches_sql = queries("branches.sql")
    async with store.pool.acquire() as connection, connection.transaction():
        fork = await connection.fetchrow(branches_sql["fork_lock"], position.workflow_id,
                                         position.fork_seq, position.parent_branch)
        marked = await connection.fetchval(sql()["branch_stale"], position.workflow_id,
                                           position.branch, position.next_seq, reason)
        if marked is None or fork is None:
            return []
        log.warning("branch_stale", branch=position.branch, reason=reason)
        return await branch_failed(connection, envelope, position.branch,
                                   position.parent_branch, position.fork_seq, fork, reason)
