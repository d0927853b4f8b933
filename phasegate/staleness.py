"""The staleness envelope: the external resources a run relied on, and whether they moved.

``ctx.observe(resource_id, resource_type, version_token)`` records a resource a phase read.
The checkpoint keeps the envelope (``resource_versions``): everything observed so far in the
run, the newest token per resource. A workflow registers a version fetcher::

    @wf.version_fetcher("ticket")          # or version_fetcher() for every type
    async def ticket_version(resource_id: str) -> str: ...

When a run resumes from a checkpoint older than ``PHASEGATE_STALE_AFTER_S`` (database time),
or right after an operator decided a review of it, the worker fetches the current versions.
Any change, and any fetcher failure ("unknown"), stops the run at ``awaiting_review`` with
the list of stale resources; it never continues silently. ``approve`` continues with the
recorded state (the envelope then takes the current versions), ``reject`` runs the phase that
made the checkpoint again.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from phasegate.workflow import Workflow

log = structlog.get_logger("phasegate.staleness")

VersionFetcher = Callable[[str], "Awaitable[str | int] | str | int"]
ANY_TYPE = "*"
# A fetcher that hangs must not hold a phase forever; past this its answer is "unknown".
FETCH_TIMEOUT_S = 30.0
REASON_LIMIT = 500


class StalenessError(ValueError):
    """``observe`` was called wrongly (no fetcher for the type, bad arguments)."""


@dataclass(frozen=True)
class Stale:
    resource_type: str
    resource_id: str
    recorded: str
    current: str | None  # None: the fetcher failed, the version is unknown
    error: str | None = None

    def describe(self) -> str:
        now = f"now {self.current}" if self.current is not None else f"unknown: {self.error}"
        return f"{self.resource_type}:{self.resource_id} (recorded {self.recorded}, {now})"

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.resource_type, "id": self.resource_id, "recorded": self.recorded,
                "current": self.current, "error": self.error}


def _key(resource_type: str, resource_id: str) -> str:
    return f"{resource_type}:{resource_id}"


class Observations:
    """The envelope a phase carries: the one it entered with plus what it observes."""

    def __init__(self, workflow: Workflow | None = None,
                 prior: list[dict[str, str]] | None = None) -> None:
        self.workflow = workflow
        self._resources: dict[str, dict[str, str]] = {
            _key(r["type"], r["id"]): dict(r) for r in prior or []}
        self.observed_now: set[str] = set()

    def observe(self, resource_id: str, resource_type: str, version_token: str | int) -> None:
        if not isinstance(resource_id, str) or not resource_id:
            raise StalenessError("observe: resource_id must be a non-empty string")
        if not isinstance(resource_type, str) or not resource_type:
            raise StalenessError("observe: resource_type must be a non-empty string")
        if isinstance(version_token, bool) or not isinstance(version_token, str | int):
            raise StalenessError("observe: version_token must be a str or an int")
        if self.workflow is not None and fetcher_for(self.workflow, resource_type) is None:
            raise StalenessError(
                f"observe({resource_id!r}, {resource_type!r}): workflow "
                f"{self.workflow.name!r} registers no version fetcher for {resource_type!r} "
                f"(@{self.workflow.name}.version_fetcher({resource_type!r}) or "
                "version_fetcher() for every type); without one staleness cannot be checked")
        key = _key(resource_type, resource_id)
        if key in self.observed_now:
            return  # the phase relied on the first version it saw
        self.observed_now.add(key)
        self._resources[key] = {"type": resource_type, "id": resource_id,
                                "version": str(version_token)}

    @property
    def resources(self) -> list[dict[str, str]]:
        return [self._resources[k] for k in sorted(self._resources)]

    def to_json(self) -> str | None:
        return json.dumps(self.resources, separators=(",", ":")) if self._resources else None


def parse_envelope(text: str | None) -> list[dict[str, str]]:
    if not text:
        return []
    value = json.loads(text)
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def fetcher_for(workflow: Workflow, resource_type: str) -> VersionFetcher | None:
    fetchers = workflow.version_fetchers
    return fetchers.get(resource_type) or fetchers.get(ANY_TYPE)


async def _current(workflow: Workflow, resource: dict[str, str]) -> Stale | None:
    recorded = resource["version"]
    fetcher = fetcher_for(workflow, resource["type"])
    try:
        if fetcher is None:
            raise LookupError(f"no version fetcher for type {resource['type']!r}")
        result = fetcher(resource["id"])
        if inspect.isawaitable(result):
            result = await asyncio.wait_for(result, FETCH_TIMEOUT_S)
        current = str(result)
    except Exception as exc:  # any failure means "unknown", which goes to review
        return Stale(resource["type"], resource["id"], recorded, None,
                     f"{type(exc).__name__}: {exc}"[:200])
    if current != recorded:
        return Stale(resource["type"], resource["id"], recorded, current)
    return None


async def check(workflow: Workflow, resources: list[dict[str, str]]) -> list[Stale]:
    """Fetch every resource's current version; the changed and the unknown ones."""
    found = await asyncio.gather(*(_current(workflow, r) for r in resources))
    stale = [s for s in found if s is not None]
    log.info("staleness_checked", resources=len(resources), stale=len(stale))
    return stale


def review_for(stale: list[Stale], seq: int, phase: str | None) -> tuple[str, dict[str, Any]]:
    """The run's error line and review record for a staleness stop."""
    reason = "stale_resources: " + "; ".join(s.describe() for s in stale)
    if len(reason) > REASON_LIMIT:
        reason = reason[:REASON_LIMIT - 3] + "..."
    return reason, {"kind": "stale", "seq": seq, "phase": phase,
                    "stale": [s.as_dict() for s in stale]}


def approved(resources: list[dict[str, str]], review: dict[str, Any]) -> list[dict[str, str]]:
    """An approved staleness review: the envelope takes the versions the review saw, so the
    same change does not stop the run again. Unknown versions keep their recorded token."""
    current = {_key(s["type"], s["id"]): s["current"] for s in review.get("stale", [])
               if isinstance(s, dict) and s.get("current") is not None}
    return [{**r, "version": str(current.get(_key(r["type"], r["id"]), r["version"]))}
            for r in resources]
