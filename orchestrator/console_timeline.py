"""The run page's timeline (docs/how-to/console.md#the-timeline): every committed phase, the
failed attempts before it and the waits between phases, in the order they happened.

Sources: ``checkpoints`` (commits and emergency flushes), ``phase_attempts`` (one row per
failed attempt, written on the failure path only, 0015), the outbox rows of waits (0010: a
successor with a due time; 0015: the signal waited for and when the next phase started),
``signals`` (which signal ended a wait) and ``control_actions`` (operator retries).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncpg

from phasegate.orchestrator.console_pages import duration
from phasegate.orchestrator.views import Checkpoint, Run
from phasegate.sql import queries

# The most state text one checkpoint shows on the page; the API serves the rest.
STATE_CHARS = 20_000
MAX_TIMELINE = 1000


@dataclass(frozen=True)
class Attempt:
    """A failed attempt of a phase. ``outcome``: retry (it ran again after its backoff) or
    failed (it ended its run, or its branch)."""

    branch: str
    seq: int
    phase: str | None
    attempt: int
    outcome: str
    error: str | None
    worker_id: str | None
    failed_at: datetime


@dataclass(frozen=True)
class Wait:
    """The wait before phase ``seq`` of the main chain: from the commit that asked for it
    (``deferred_at``) to the start of that phase (``resumed_at``)."""

    seq: int
    deferred_at: datetime
    due_at: datetime  # when the wait was over: the timer, the signal's arrival, the timeout
    resumed_at: datetime | None  # None: still waiting, or not recorded (before 0015)
    sent_at: datetime | None
    wait_signal: str | None  # the signal it waited for (0015)
    signal_name: str | None  # the signal that ended it, when one did

    @property
    def label(self) -> str:
        name = self.signal_name or self.wait_signal
        return "timer" if name is None else f"signal {name}"

    @property
    def ended_at(self) -> datetime | None:
        """The next phase's start; its message's send time when the start was not recorded
        (the phase cannot have started before it)."""
        return self.resumed_at or self.sent_at


@dataclass
class TimelineRow:
    seq: int
    phase: str
    branch: str
    committed_at: datetime | None
    duration_s: float | None
    tier: str
    retries: int
    flushes: int
    worker_id: str | None
    current: bool = False
    note: str = ""
    state: str | None = None
    access: str | None = None
    kind: str = "phase"  # phase, attempt, wait
    at: datetime | None = None  # an attempt's failure, a wait's end


@dataclass
class Timeline:
    rows: list[TimelineRow] = field(default_factory=list)
    truncated: bool = False


def _tier(tier: int | None, label: str | None) -> str:
    if tier is None and label is None:
        return "-"
    return f"{tier} {label}" if label else str(tier)


def timeline(run: Run, checkpoints: list[Checkpoint], retries: dict[int, int],
             now: datetime | None = None, *, attempts: list[Attempt] | None = None,
             waits: list[Wait] | None = None) -> Timeline:
    """One row per committed phase checkpoint (every branch), per failed attempt and per wait,
    in the order they happened; then the phase still to run. A phase's duration runs from the
    previous commit on its branch (the run's start for the first), or from the end of the wait
    before it, to its commit: waits are their own rows, so the durations add up."""
    now = now or datetime.now(UTC)
    waits_by_seq = {w.seq: w for w in waits or []}
    out = Timeline(truncated=len(checkpoints) >= MAX_TIMELINE)
    last: dict[str, datetime] = {}
    flushes: dict[tuple[str, int], int] = {}
    for c in checkpoints:
        if c.kind == "emergency":
            flushes[(c.branch, c.seq)] = flushes.get((c.branch, c.seq), 0) + 1
    # (moment, rank, row): a wait starts at the very commit that asked for it, so it sorts
    # right after that commit's row.
    events: list[tuple[datetime, int, TimelineRow]] = []
    for c in checkpoints:
        if c.kind != "phase":
            continue
        since = _since(last.get(c.branch, last.get("main", run.created_at)),
                       waits_by_seq.get(c.seq) if c.branch == "main" else None)
        last[c.branch] = c.created_at
        events.append((c.created_at, 0, TimelineRow(
            seq=c.seq, phase=c.phase, branch=c.branch, committed_at=c.created_at,
            duration_s=(c.created_at - since).total_seconds(), tier=_tier(c.tier, c.tier_label),
            retries=retries.get(c.seq, 0) if c.branch == "main" else 0,
            flushes=flushes.get((c.branch, c.seq), 0), worker_id=c.worker_id,
            state=_state_text(c), access=c.access)))
    events.extend((w.deferred_at, 1, wait_row(run, w, now)) for w in waits or [])
    events.extend((a.failed_at, 2, attempt_row(a)) for a in attempts or [])
    events.sort(key=lambda event: (event[0], event[1]))
    out.rows = [row for _, _, row in events]
    if run.current_phase and run.finished_at is None:
        waiting = run.status == "waiting"
        since = _since(last.get("main", run.created_at), waits_by_seq.get(run.seq))
        out.rows.append(TimelineRow(
            seq=run.seq, phase=run.current_phase, branch="main", committed_at=None,
            duration_s=None if waiting else (now - since).total_seconds(),
            tier=_tier(run.tier, run.tier_label), retries=retries.get(run.seq, 0),
            flushes=flushes.get(("main", run.seq), 0), worker_id=None, current=True,
            note=f"{run.status}; {run.attempts} failed attempt(s) so far"))
    return out


def _since(previous: datetime, wait: Wait | None) -> datetime:
    end = wait.ended_at if wait is not None else None
    return max(previous, end) if end is not None else previous


def wait_row(run: Run, wait: Wait, now: datetime) -> TimelineRow:
    ongoing = (wait.resumed_at is None and run.status == "waiting" and run.seq == wait.seq)
    end = None if ongoing else wait.ended_at
    seconds = ((end or now) - wait.deferred_at).total_seconds() if end or ongoing else None
    return TimelineRow(
        seq=wait.seq, phase=wait.label, branch="main", committed_at=None, duration_s=seconds,
        tier="-", retries=0, flushes=0, worker_id=None, current=ongoing, kind="wait", at=end,
        note=_wait_note(wait, ongoing, now))


def _wait_note(wait: Wait, ongoing: bool, now: datetime) -> str:
    signal = wait.wait_signal is not None or wait.signal_name is not None
    if ongoing:
        left = (wait.due_at - now).total_seconds()
        if left > 0:
            return (f"waiting; times out in {duration(left)}" if signal
                    else f"waiting; due in {duration(left)}")
        return f"due {duration(-left)} ago; its phase has not started yet"
    over = max(0.0, (wait.due_at - wait.deferred_at).total_seconds())
    if wait.signal_name is not None:
        text = f"the signal came after {duration(over)}"
    elif signal:
        text = f"timed out after {duration(over)}"
    else:
        text = f"due after {duration(over)}"
    if wait.resumed_at is not None:
        late = max(0.0, (wait.resumed_at - wait.due_at).total_seconds())
        return f"{text}; its phase started {duration(late)} later"
    if wait.sent_at is not None:
        return f"{text}; ends at its message's send (the start was not recorded)"
    return text


def attempt_row(attempt: Attempt) -> TimelineRow:
    then = ("retried after its backoff" if attempt.outcome == "retry"
            else "it failed the run" if attempt.branch == "main" else "it failed the branch")
    return TimelineRow(
        seq=attempt.seq, phase=attempt.phase or "-", branch=attempt.branch, committed_at=None,
        duration_s=None, tier="-", retries=0, flushes=0, worker_id=attempt.worker_id,
        kind="attempt", at=attempt.failed_at,
        note=f"attempt {attempt.attempt} failed: {attempt.error or 'an error'}; {then}")


def _state_text(c: Checkpoint) -> str | None:
    if c.access != "read":
        return None
    text = json.dumps(c.state, indent=2, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= STATE_CHARS else text[:STATE_CHARS] + "\n… (cut; the API " \
        "serves the whole state)"


async def retries_by_seq(pool: asyncpg.Pool, workflow_id: str) -> dict[int, int]:
    rows = await pool.fetch(queries("console.sql")["attempts_by_seq"], workflow_id)
    return {int(r["seq"]): int(r["retries"]) for r in rows}


async def attempts_of(pool: asyncpg.Pool, workflow_id: str,
                      limit: int = MAX_TIMELINE) -> list[Attempt]:
    rows = await pool.fetch(queries("console.sql")["attempts_of_run"], workflow_id, limit)
    return [Attempt(**dict(r)) for r in rows]


async def waits_of(pool: asyncpg.Pool, workflow_id: str,
                   limit: int = MAX_TIMELINE) -> list[Wait]:
    rows = await pool.fetch(queries("console.sql")["waits_of_run"], workflow_id, limit)
    return [Wait(**dict(r)) for r in rows]


def until(moment: datetime | None, now: datetime | None = None) -> str:
    """``in 4m 3s`` or ``12s ago``."""
    if moment is None:
        return "-"
    seconds = (moment - (now or datetime.now(UTC))).total_seconds()
    return f"in {duration(seconds)}" if seconds >= 0 else f"{duration(-seconds)} ago"
