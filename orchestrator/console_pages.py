"""What the console's pages show, computed from the control plane's reads (no HTTP here); the
run page's timeline is console_timeline.py.

Statuses are rendered as they come: a status this code has never heard of gets a neutral
badge and the generic buttons its role allows, so a new run status needs no console change.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from phasegate.orchestrator.auth import Caller
from phasegate.orchestrator.control import CANCELLABLE, RULES
from phasegate.orchestrator.gate import required_role
from phasegate.orchestrator.views import Action, Run

# Badge colour classes for the statuses known today; any other status gets "other".
BADGES = {"completed": "ok", "running": "busy", "pending": "idle", "failed": "bad",
          "cancelled": "idle", "awaiting_review": "attn", "needs_restart": "attn"}


# The fleet page's watchdog states (phasegate/presence.py); any other state gets "other".
WATCHDOG_BADGES = {"ok": "ok", "pressure": "attn", "flushing": "bad", "off": "idle"}


def badge(status: str) -> str:
    return BADGES.get(status, "other")


def watchdog_badge(state: str) -> str:
    return WATCHDOG_BADGES.get(state, "other")


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


def action_log(actions: list[Action]) -> list[dict[str, Any]]:
    return [a.model_dump() for a in actions]
