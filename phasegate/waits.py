"""Durable waits between two phases: timers (``ctx.defer_next``) and signals
(``ctx.wait_for_signal``).

A phase asks for a wait; the wait is committed with the phase, in the same statement: the
successor's outbox row carries a due time computed from PostgreSQL's ``now()`` (never this
process's clock), the run becomes ``waiting``. No worker holds the run meanwhile: the
orchestrator's relay sends the row when it is due, and a signal makes it due at once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

# How far ahead a wait may reach. Longer waits are better modelled as a schedule; the bound
# also keeps a typo (seconds for milliseconds) from parking a run for decades.
MAX_WAIT_S = 365 * 86400.0
# Signal names travel in URL paths and CLI arguments: the same alphabet as phase names. The
# API's 422 for a path's name and WaitError state the same rule in words.
MAX_SIGNAL_NAME_CHARS = 100
SIGNAL_NAME = re.compile(rf"^[A-Za-z0-9_.-]{{1,{MAX_SIGNAL_NAME_CHARS}}}$")
SIGNAL_NAME_RULE = (f"a signal name is 1-{MAX_SIGNAL_NAME_CHARS} characters, each an ASCII "
                    "letter, a digit, '_', '.' or '-'")
# Names the control plane sends for review decisions (phasegate.approve, phasegate.reject:
# phasegate/signals.py send_decision). User code can neither wait for nor send them.
RESERVED_PREFIX = "phasegate."


class WaitError(ValueError):
    """A wait was asked for wrongly (naive datetime, out of range, twice in one phase)."""


@dataclass(frozen=True)
class Wait:
    """What a phase asked for: a delay (``seconds``) or a moment (``until``), and for a signal
    wait the signal's name (``seconds`` is then its timeout)."""

    seconds: float | None = None
    until: datetime | None = None
    signal: str | None = None

    def commit_fields(self) -> dict[str, Any]:
        """The commit statement's wait parameters (phasegate/store.py ``PhaseCommit``)."""
        return {"wait_s": self.seconds, "wait_until": self.until, "wait_signal": self.signal}


def timer(seconds: float | None = None, *, until: datetime | None = None) -> Wait:
    """A timer wait, checked: exactly one of ``seconds`` (0..MAX_WAIT_S) or an aware ``until``."""
    if (seconds is None) == (until is None):
        raise WaitError("defer_next takes either seconds or until=datetime, exactly one")
    if until is not None:
        if not isinstance(until, datetime):
            raise WaitError(f"until must be a datetime, not {type(until).__name__}")
        if until.tzinfo is None or until.tzinfo.utcoffset(until) is None:
            raise WaitError("until must be timezone-aware (e.g. datetime.now(timezone.utc) + "
                            "timedelta(hours=1)); a naive datetime has no defined moment")
        # A coarse range check only: the due time itself is this exact moment, stored as is.
        # Minutes of clock skew cannot matter against a bound of a year.
        now = datetime.now(until.tzinfo)
        if until - now > timedelta(seconds=MAX_WAIT_S):
            raise WaitError(f"until is more than {MAX_WAIT_S / 86400:.0f} days ahead")
        return Wait(until=until)
    return Wait(seconds=_seconds(seconds, "defer_next seconds"))


def signal_wait(name: str, timeout_s: float) -> Wait:
    """A signal wait: the next phase runs when signal ``name`` arrives or after ``timeout_s``."""
    check_signal_name(name)
    return Wait(seconds=_seconds(timeout_s, "wait_for_signal timeout_s"), signal=name)


def check_signal_name(name: object) -> str:
    # fullmatch: match's "$" also matches before a final newline, which the API refuses.
    if not isinstance(name, str) or not SIGNAL_NAME.fullmatch(name):
        raise WaitError(SIGNAL_NAME_RULE)
    if name.startswith(RESERVED_PREFIX):
        raise WaitError(f"signal names starting with {RESERVED_PREFIX!r} are reserved (review "
                        "decisions: phasegate approve|reject, POST .../approve|reject)")
    return name


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WaitError(f"{what} must be a number, not {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_WAIT_S:
        raise WaitError(f"{what} must be between 0 and {MAX_WAIT_S:.0f} "
                        f"({MAX_WAIT_S / 86400:.0f} days), not {value!r}")
    return seconds
