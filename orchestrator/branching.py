"""The control plane's side of branches: the branch DAG of a run, and the supervisor merge.

A supervisor merge promotes one branch's latest committed state to the main chain at the
merge seq, instead of running the merge phase: a main checkpoint recording its
``source_branch``, the fork resolved as ``supervisor`` with that branch as ``winner``, its
siblings discarded, a ``merge`` row in the action log, and the run moved on to the phase
after the merge phase (completed when there is none). It runs in a transaction that first
locks the fork row, exactly like a branch's final commit, so it and a fan-in never both
resolve one fork: whichever locks the row second finds it resolved.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import structlog

from phasegate.branches import sql
from phasegate.envelope import MAIN_BRANCH, dedup_id, phase_message
from phasegate.orchestrator.views import Conflict, NotFound
from phasegate.queue import Outgoing, Queue
from phasegate.sql import queries
from phasegate.store import Store

log = structlog.get_logger("phasegate.branching")

MERGEABLE = ("running", "failed")


async def branch_tree(pool: asyncpg.Pool, workflow_id: str) -> list[dict[str, Any]]:
    """Every fork of a run with its branches and their checkpoints (the API's JSON)."""
    return tree_rows_to_json(await pool.fetch(sql()["branch_tree"], workflow_id))


async def supervisor_merge(pool: asyncpg.Pool, queue: Queue | None, workflow_id: str,
                           branch: str, reason: str | None, actor: str | None) -> bool | None:
    """Promote ``branch``'s state; returns whether the next message reached SQS (None: the
    run completed, there is none)."""
    async with pool.acquire() as connection, connection.transaction():
        fork = await connection.fetchrow(sql()["open_fork_lock"], workflow_id)
        if fork is None:
            if not await connection.fetchval(queries("control.sql")["run_exists"], workflow_id):
                raise NotFound(f"no workflow run with id {workflow_id!r}")
            raise Conflict(f"cannot merge run {workflow_id}: it has no open fork (its branches "
                           "were merged already, or it never forked)")
        if fork["run_status"] not in MERGEABLE or fork["next_seq"] != fork["merge_seq"]:
            raise Conflict(f"cannot merge run {workflow_id}: its status is "
                           f"{fork['run_status']!r}, merge needs {' or '.join(MERGEABLE)}")
        after, seq = fork["after_merge"], fork["merge_seq"] + 1
        message = (phase_message(workflow_id, fork["workflow"], seq, after)
                   if after is not None else None)
        dedup = dedup_id(workflow_id, MAIN_BRANCH, seq, fork["epoch"])
        note = f"merge branch {branch}" + (f": {reason}" if reason else "")
        row = await connection.fetchrow(
            sql()["supervisor_merge"], workflow_id, branch, fork["fork_seq"],
            fork["merge_phase"], after, fork["run_status"], note[:1000], actor,
            dedup if message else None, message.group_id if message else None,
            message.to_json() if message else None, fork["merge_seq"])
        if row is None or row["committed_at"] is None:
            raise Conflict(f"cannot merge branch {branch!r} of run {workflow_id}: it is not a "
                           f"branch of the open fork at seq {fork['fork_seq']}, or it has no "
                           "committed state yet")
    log.info("supervisor_merge", workflow_id=workflow_id, branch=branch,
             fork_seq=fork["fork_seq"])
    if message is None:
        return None
    if queue is None or row["outbox_id"] is None:
        return False
    try:
        await queue.send([Outgoing(message.to_json(), message.group_id, dedup)])
    except Exception as exc:
        log.warning("merge_send_failed_relay_will_send", error=type(exc).__name__)
        return False
    await Store(pool).mark_sent([row["outbox_id"]])
    return True


def tree_rows_to_json(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """``branch_tree`` rows as forks, each with its branches (the API's JSON shape). A nested
    fork names its ``parent_branch``; forks come parents first."""
    forks: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        fork = forks.setdefault((row["parent_branch"], row["fork_seq"]), {
            "parent_branch": row["parent_branch"], "fork_seq": row["fork_seq"],
            "mode": row["mode"], "merge_phase": row["merge_phase"],
            "merge_seq": row["merge_seq"], "status": row["fork_status"],
            "resolution": row["resolution"], "winner": row["winner"],
            "branch_count": row["branch_count"], "pending": row["pending"],
            "require_all": row["require_all"], "retries": row["fork_retries"],
            "max_retries": row["max_retries"],
            "deadline_at": (row["deadline_at"].isoformat()
                            if row["deadline_at"] is not None else None),
            "branches": []})
        steps = []
        for step in row["steps"]:
            seq, phase, kind = step.split(":", 2)
            steps.append({"seq": int(seq), "phase": phase, "kind": kind})
        fork["branches"].append({
            "branch": row["branch"], "status": row["status"], "next_seq": row["next_seq"],
            "final_seq": row["final_seq"], "current_phase": row["current_phase"],
            "tier": row["tier"], "tier_label": row["tier_label"], "error": row["error"],
            "depth": row["depth"], "retries": row["retries"], "steps": steps})
    return list(forks.values())

