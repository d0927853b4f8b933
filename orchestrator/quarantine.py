"""The quarantine as the control plane shows it, and the redrive of a quarantined message.

A quarantine row keeps what the worker could say about a poison message without its payload:
the SQS message id, the workflow id when the envelope named one, a reason and the body's size.
That is not enough to rebuild the message itself, and the body is never read back from the DLQ
(it may be the very payload a read policy hides). A redrive therefore rebuilds the *next*
message from the run row -- the committed position is the source of truth -- exactly as a
retry does: a new envelope for the run's current phase, sent through the outbox under a new
epoch. Without a run to resume (a start that never created one, a message with no readable
workflow id) there is nothing to rebuild from; the producer must send it again, and the page
says so.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from phasegate.orchestrator.control import Control, Outcome
from phasegate.orchestrator.views import Conflict, NotFound
from phasegate.sql import queries

MAX_PAGE = 200
NOT_REBUILDABLE = ("the quarantine keeps no message body, and this row names no existing run "
                   "to rebuild the next message from: the producer must send it again")


class Quarantined(BaseModel):
    quarantine_id: int
    message_id: str
    workflow_id: str | None
    reason: str
    body_bytes: int
    worker_id: str | None
    created_at: datetime
    redriven_at: datetime | None
    redriven_by: str | None
    workflow: str | None
    run_status: str | None
    current_phase: str | None
    redrive: str | None = None  # why a redrive is not possible (None: it is)


class QuarantinePage(BaseModel):
    items: list[Quarantined]
    open: int
    total: int
    next_cursor: int | None


class Redriven(BaseModel):
    quarantine_id: int
    action: str
    workflow_id: str
    status: str
    sent: bool | None


def redrive_refusal(item: Quarantined) -> str | None:
    """Why ``item`` cannot be redriven, or None when it can."""
    if item.redriven_at is not None:
        return f"already redriven by {item.redriven_by or 'someone'}"
    if item.workflow_id is None or item.run_status is None:
        return NOT_REBUILDABLE
    if item.run_status not in ("failed", "running") or item.current_phase is None:
        return (f"run {item.workflow_id} is {item.run_status!r}: there is no phase to resend "
                "(a redrive needs a failed or running run)")
    return None


async def list_quarantine(control: Control, *, before: int | None = None,
                          limit: int = 50) -> QuarantinePage:
    limit = max(1, min(limit, MAX_PAGE))
    q = queries("console.sql")
    rows = await control.pool.fetch(q["list_quarantine"], before, limit + 1)
    counts = await control.pool.fetchrow(q["count_quarantine"])
    items = [Quarantined(**dict(r)) for r in rows[:limit]]
    for item in items:
        item.redrive = redrive_refusal(item)
    return QuarantinePage(items=items, open=int(counts["open"]), total=int(counts["total"]),
                          next_cursor=items[-1].quarantine_id if len(rows) > limit else None)


async def redrive(control: Control, quarantine_id: int) -> Redriven:
    """Resend the current phase of the run a quarantined message belonged to (once)."""
    q = queries("console.sql")
    row = await control.pool.fetchrow(q["get_quarantine"], quarantine_id)
    if row is None:
        raise NotFound(f"no quarantined message with id {quarantine_id}")
    item = Quarantined(**dict(row))
    refusal = redrive_refusal(item)
    if refusal is not None:
        raise Conflict(f"cannot redrive quarantined message {quarantine_id}: {refusal}")
    assert item.workflow_id is not None
    # Claim the row first: two operators clicking at once redrive once.
    if await control.pool.fetchval(q["mark_redriven"], quarantine_id, control.actor) is None:
        raise Conflict(f"quarantined message {quarantine_id} was redriven a moment ago")
    try:
        scoped = await control.scoped(item.workflow_id)
        outcome: Outcome = await scoped.redrive(
            item.workflow_id, f"redrive of quarantined message {quarantine_id}")
    except BaseException:
        await control.pool.execute(q["unmark_redriven"], quarantine_id)
        raise
    return Redriven(quarantine_id=quarantine_id, action="redrive",
                    workflow_id=item.workflow_id, status=outcome.run.status, sent=outcome.sent)
