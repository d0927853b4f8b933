"""Schema versions across deploys: upcasters, and the ``phasegate versions`` report.

Every checkpoint records the ``schema_version`` of the code that wrote it. When a worker with
another version resumes a run, the state is brought forward by the workflow's upcasters::

    wf = Workflow("agent", schema_version=3)

    @wf.upcast(from_version=2)
    def rename_target(state: dict) -> dict:      # 2 -> 3 (may be async)
        return {**state, "target": state.pop("goal")}

Upcasters chain (1 -> 2 -> 3); the resumed phase commits its checkpoint under the new
version. Without a complete chain -- or when the checkpoint is NEWER than the code, a
rollback -- the run stops at ``needs_restart`` and says why. ``version_report`` tells, before
a rollout, how many unfinished runs per workflow each outcome applies to.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import asyncpg

from phasegate.envelope import canonical_json, state_hash
from phasegate.sql import queries

if TYPE_CHECKING:
    from phasegate.workflow import Registry, Workflow

Upcaster = Callable[[Any], "Awaitable[Any] | Any"]


class NeedsRestart(Exception):
    """The state cannot be brought to the loaded code's schema version."""


class Corrupt(Exception):
    """The state does not match its recorded hash."""


def chain_gap(workflow: Workflow, from_version: int) -> str | None:
    """Why ``from_version`` cannot be upcast to the workflow's version; None if it can."""
    current = workflow.schema_version
    if from_version > current:
        return "it is newer than the code (a rollback); there are no downcasters"
    missing = [v for v in range(from_version, current) if v not in workflow.upcasters]
    if missing:
        return f"no upcaster from version {missing[0]}"
    return None


async def upcast(workflow: Workflow, state: Any, from_version: int) -> Any:
    """Run the upcasters from ``from_version`` to the workflow's version."""
    gap = chain_gap(workflow, from_version)
    if gap is not None:
        raise NeedsRestart(gap)
    for version in range(from_version, workflow.schema_version):
        try:
            result = workflow.upcasters[version](state)
            if inspect.isawaitable(result):
                result = await result
            state = json.loads(canonical_json(result))
        except Exception as exc:
            raise NeedsRestart(f"the upcaster from version {version} raised "
                               f"{type(exc).__name__}: {str(exc)[:200]}") from exc
    return state


async def load_verified(workflow: Workflow, seq: int, state_json: str, recorded_hash: str,
                        version: int) -> Any:
    """A checkpoint's state, hash-checked, in the loaded code's shape.

    Raises ``Corrupt`` (the run must fail) or ``NeedsRestart`` (it cannot be resumed here)."""
    state = json.loads(state_json)
    if state_hash(canonical_json(state)) != recorded_hash:
        raise Corrupt(f"checkpoint_corrupt: state at seq {seq} does not match its state_hash")
    if version == workflow.schema_version:
        return state
    try:
        return await upcast(workflow, state, version)
    except NeedsRestart as exc:
        raise NeedsRestart(
            f"schema_version: checkpoint at seq {seq} has version {version}, the loaded code "
            f"has {workflow.schema_version} ({exc})") from None


# -- the report ---------------------------------------------------------------------------------


@dataclass
class VersionRow:
    """Unfinished runs of one workflow, by what the loaded code would do with them."""

    workflow: str
    code_version: int | None
    recoverable: int = 0
    upcastable: int = 0
    needs_restart: int = 0
    by_version: dict[str, int] = field(default_factory=dict)
    note: str | None = None

    @property
    def in_flight(self) -> int:
        return self.recoverable + self.upcastable + self.needs_restart

    def as_dict(self) -> dict[str, Any]:
        return {"workflow": self.workflow, "code_version": self.code_version,
                "in_flight": self.in_flight, "recoverable": self.recoverable,
                "upcastable": self.upcastable, "needs_restart": self.needs_restart,
                "by_version": self.by_version, "note": self.note}


def classify(workflow: Workflow | None, at_input: bool, version: int | None) -> str:
    """recoverable | upcastable | needs_restart for one run, as a worker would decide."""
    if workflow is None:
        return "needs_restart"
    if at_input or version == workflow.schema_version:
        # A run that starts from its input has no versioned state to load.
        return "recoverable"
    if version is None:
        return "needs_restart"  # its checkpoint is missing: a worker would fail it
    return "upcastable" if chain_gap(workflow, version) is None else "needs_restart"


def build_report(rows: list[tuple[str, bool, int | None, int]],
                 registry: Registry) -> list[VersionRow]:
    report: dict[str, VersionRow] = {}
    for name, at_input, version, runs in rows:
        workflow = registry.get(name)
        row = report.setdefault(name, VersionRow(
            name, workflow.schema_version if workflow else None,
            note=None if workflow else "not in the loaded workflow modules"))
        outcome = classify(workflow, at_input, version)
        setattr(row, outcome, getattr(row, outcome) + runs)
        label = "input" if at_input or version is None else f"v{version}"
        row.by_version[label] = row.by_version.get(label, 0) + runs
    return [report[name] for name in sorted(report)]


async def version_report(pool: asyncpg.Pool, registry: Registry) -> list[VersionRow]:
    """What the code in ``registry`` would do with every unfinished run (one query)."""
    rows = await pool.fetch(queries()["versions_in_flight"])
    return build_report([(r["workflow"], r["at_input"], r["version"], r["runs"])
                         for r in rows], registry)


def format_report(report: list[VersionRow]) -> str:
    header = ("workflow", "code", "in-flight", "recoverable", "upcastable", "needs_restart",
              "by state version")
    lines = [header]
    for row in report:
        versions = ", ".join(f"{k}: {v}" for k, v in sorted(row.by_version.items()))
        lines.append((row.workflow, str(row.code_version or "-"), str(row.in_flight),
                      str(row.recoverable), str(row.upcastable), str(row.needs_restart),
                      versions + (f"  ({row.note})" if row.note else "")))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) + "  "
           + line[-1] for line in lines]
    if not report:
        out.append("(no unfinished runs)")
    return "\n".join(out)


def restart_gate(report: list[VersionRow], max_share: float) -> str | None:
    """Why a rollout must stop, or None: the share of unfinished runs that would stop at
    ``needs_restart`` exceeds ``max_share`` (0..1). The message names each workflow."""
    total = sum(row.in_flight for row in report)
    restart = sum(row.needs_restart for row in report)
    if total == 0 or restart / total <= max_share:
        return None
    names = ", ".join(f"{row.workflow} ({row.needs_restart} of {row.in_flight})"
                      for row in report if row.needs_restart)
    return (f"{restart} of {total} unfinished runs ({restart / total:.1%}) would need a "
            f"restart, more than the allowed {max_share:.1%}: {names}")
