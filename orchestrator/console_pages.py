"""What the console's pages show, computed from the control plane's reads (no HTTP here).

Statuses are rendered as they come: a status this code has never heard of gets a neutral
badge and the generic buttons its role allows, so a new run status needs no console change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from phasegate.orchestrator.auth import Caller
from phasegate.orchestrator.control import CANCELLABLE, RULES
from phasegate.orchestrator.gate import required_role
from phasegate.orchestrator.views import Action, Checkpoint, Run
from phasegate.sql import queries

# The most state text one checkpoint shows on the page; the API serves the rest.
STATE_CHARS = 20_000
MAX_TIMELINE = 1000
# Badge colour classes for the statuses known today; any other status gets "other".
BADGES = {"completed": "ok", "running": "busy", "pending": "idle", "failed": "bad",
          "cancelled": "idle", "awaiting_review": "attn", "needs_restart": "attn"}


def badge(status: str) -> str:
    return BADGES.get(status, "other")


def age(since: datetime | None, now: datetime | None = None) -> str:
    """A short human age: 42s, 7m, 3h 5m, 2d 4h."""
    if since is None:
        return "-"
    seconds = max(0, int(((now or datetime.now(UTC)) - since).total_seconds()))
    return duration(seconds)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60}m"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"


def allowed_actions(run: Run, caller: Caller) -> list[str]:
    """The buttons to draw: what the run's status allows AND the caller's role may do."""
    actions = [name for name, rule in RULES.items()
               if run.status in rule.allowed and caller.may(required_role(name))]
    if "cancel" in actions and run.status not in CANCELLABLE:
        actions.remove("cancel")
    return actions


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


@dataclass
class Timeline:
    rows: list[TimelineRow] = field(default_factory=list)
    truncated: bool = False


def _tier(tier: int | None, label: str | None) -> str:
    if tier is None and label is None:
        return "-"
    return f"{tier} {label}" if label else str(tier)


def timeline(run: Run, checkpoints: list[Checkpoint], retries: dict[int, int],
             now: datetime | None = None) -> Timeline:
    """One row per committed phase checkpoint (every branch), in commit order: how long since
    the previous commit on its branch (the run's start for the first), its tier, the retries
    operators asked for at that seq and the emergency flushes inside it; then the phase
    still to run, with the attempts it has used so far."""
    out = Timeline(truncated=len(checkpoints) >= MAX_TIMELINE)
    last: dict[str, datetime] = {}
    flushes: dict[tuple[str, int], int] = {}
    for c in checkpoints:
        if c.kind == "emergency":
            flushes[(c.branch, c.seq)] = flushes.get((c.branch, c.seq), 0) + 1
    for c in checkpoints:
        if c.kind != "phase":
            continue
        since = last.get(c.branch, last.get("main", run.created_at))
        last[c.branch] = c.created_at
        out.rows.append(TimelineRow(
            seq=c.seq, phase=c.phase, branch=c.branch, committed_at=c.created_at,
            duration_s=(c.created_at - since).total_seconds(), tier=_tier(c.tier, c.tier_label),
            retries=retries.get(c.seq, 0) if c.branch == "main" else 0,
            flushes=flushes.get((c.branch, c.seq), 0), worker_id=c.worker_id,
            state=_state_text(c), access=c.access))
    if run.current_phase and run.finished_at is None:
        since = last.get("main", run.created_at)
        out.rows.append(TimelineRow(
            seq=run.seq, phase=run.current_phase, branch="main", committed_at=None,
            duration_s=((now or datetime.now(UTC)) - since).total_seconds(),
            tier=_tier(run.tier, run.tier_label), retries=retries.get(run.seq, 0),
            flushes=flushes.get(("main", run.seq), 0), worker_id=None, current=True,
            note=f"{run.status}; {run.attempts} failed attempt(s) so far"))
    return out


def _state_text(c: Checkpoint) -> str | None:
    if c.access != "read":
        return None
    text = json.dumps(c.state, indent=2, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= STATE_CHARS else text[:STATE_CHARS] + "\n… (cut; the API " \
        "serves the whole state)"


async def retries_by_seq(pool: Any, workflow_id: str) -> dict[int, int]:
    rows = await pool.fetch(queries("console.sql")["attempts_by_seq"], workflow_id)
    return {int(r["seq"]): int(r["retries"]) for r in rows}


def action_log(actions: list[Action]) -> list[dict[str, Any]]:
    return [a.model_dump() for a in actions]
