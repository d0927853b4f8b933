"""Schedules: which cron ticks are due, and the schedules an orchestrator fires.

A schedule is a workflow name, a cron expression (UTC) and the start input. It comes from a
workflow's own ``Workflow(..., schedule=...)`` (when the orchestrator loads that workflow's
module) or from ``PHASEGATE_SCHEDULES`` (for workflows it does not load). Ticks are computed
from Postgres ``now()``, never a host clock; exactly-once per tick is the ``schedule_ticks``
primary key (orchestrator/scheduler.py claims it).

Catch-up after downtime (``PHASEGATE_SCHEDULE_CATCHUP``): of the ticks due since a schedule's
last claimed tick,

- ``latest`` (default): start a run for the latest one only;
- ``all``: start one per tick, the newest ``PHASEGATE_SCHEDULE_CATCHUP_MAX`` of them;
- ``none``: start the latest one only if it is less than ``ON_TIME_S`` late, else record it
  as skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from croniter import croniter

from phasegate.envelope import canonical_json

if TYPE_CHECKING:
    from phasegate.workflow import Workflow

CatchUp = Literal["none", "latest", "all"]

# `none`: how late a tick may be and still count as on time. Cron's resolution is a minute,
# and an orchestrator scans every few seconds, so a minute separates "a scan came a little
# late" from "the orchestrator was down".
ON_TIME_S = 60.0
# A start message carries the schedule's input; SQS's 256 KiB message limit leaves room for
# the envelope around this.
MAX_INPUT_BYTES = 64 * 1024
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


class ScheduleError(ValueError):
    """A schedule is malformed (bad cron expression, unknown field, input not JSON)."""


@dataclass(frozen=True)
class Schedule:
    name: str
    workflow: str
    cron: str
    input: Any = None


@dataclass(frozen=True)
class Due:
    """What one scan does for one schedule: start these ticks (oldest first), and record
    ``skip`` (a missed tick not started) as the new high-water mark."""

    fire: list[datetime]
    skip: datetime | None = None


def check_cron(expression: str) -> str:
    if not isinstance(expression, str) or not expression.strip():
        raise ScheduleError("schedule must be a cron expression such as '*/5 * * * *'")
    expression = " ".join(expression.split())
    if len(expression.split()) != 5 or not croniter.is_valid(expression):
        raise ScheduleError(f"schedule {expression!r} is not a valid 5-field cron expression "
                            "(minute hour day-of-month month day-of-week)")
    return expression


def check_input(value: Any) -> Any:
    try:
        encoded = canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"schedule input is not JSON: {type(exc).__name__}") from None
    if len(encoded.encode()) > MAX_INPUT_BYTES:
        raise ScheduleError(f"schedule input is {len(encoded.encode())} bytes as JSON "
                            f"(at most {MAX_INPUT_BYTES})")
    return value


def parse_schedules(text: str | None) -> list[Schedule]:
    """``PHASEGATE_SCHEDULES``: a JSON list of ``{"workflow", "cron", "input"?, "name"?}``
    (``name`` defaults to the workflow's; two schedules of one workflow need names)."""
    if text is None or not text.strip():
        return []
    try:
        raw = json.loads(text)
    except ValueError:
        raise ScheduleError("not valid JSON (expected a list of "
                            '{"workflow": ..., "cron": ..., "input": ...})') from None
    if not isinstance(raw, list):
        raise ScheduleError("expected a JSON list of schedules")
    schedules: list[Schedule] = []
    for number, item in enumerate(raw, start=1):
        if not isinstance(item, dict):
            raise ScheduleError(f"schedule {number} is not an object")
        unknown = sorted(set(item) - {"workflow", "cron", "input", "name"})
        if unknown:
            raise ScheduleError(f"schedule {number} has unknown fields {unknown}")
        workflow = item.get("workflow")
        if not isinstance(workflow, str) or not _NAME.fullmatch(workflow):
            raise ScheduleError(f"schedule {number} needs a workflow name "
                                "(1-100 chars of [A-Za-z0-9_.-])")
        name = item.get("name", workflow)
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ScheduleError(f"schedule {number}: name must be 1-100 chars of "
                                "[A-Za-z0-9_.-]")
        try:
            cron = check_cron(item.get("cron"))  # type: ignore[arg-type]
            schedules.append(Schedule(name, workflow, cron, check_input(item.get("input"))))
        except ScheduleError as exc:
            raise ScheduleError(f"schedule {number}: {exc}") from None
    return unique(schedules)


def unique(schedules: Iterable[Schedule]) -> list[Schedule]:
    by_name: dict[str, Schedule] = {}
    for schedule in schedules:
        if schedule.name in by_name and by_name[schedule.name] != schedule:
            raise ScheduleError(f"two different schedules are named {schedule.name!r} "
                                "(give one a \"name\")")
        by_name[schedule.name] = schedule
    return sorted(by_name.values(), key=lambda s: s.name)


def from_workflows(workflows: Iterable[Workflow]) -> list[Schedule]:
    return [Schedule(w.name, w.name, w.schedule, w.schedule_input)
            for w in workflows if w.schedule is not None]


def due(cron: str, after: datetime, now: datetime, policy: CatchUp = "latest",
        max_catchup: int = 10) -> Due:
    """The ticks of ``cron`` in (after, now], decided by the catch-up policy. Times are UTC."""
    after, now = after.astimezone(UTC), now.astimezone(UTC)
    wanted = max_catchup if policy == "all" else 1
    ticks: list[datetime] = []
    # Walk back from now: the newest ticks are the ones any policy may fire, and the walk
    # stops after `wanted`, however long the downtime was.
    walk = croniter(cron, now + timedelta(microseconds=1))
    while len(ticks) < wanted:
        tick: datetime = walk.get_prev(datetime)
        if tick <= after:
            break
        ticks.append(tick)
    ticks.reverse()
    if policy == "none" and ticks and (now - ticks[-1]).total_seconds() >= ON_TIME_S:
        return Due(fire=[], skip=ticks[-1])
    return Due(fire=ticks)
