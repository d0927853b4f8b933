"""The SDK users write workflows with: ``Workflow`` and its ``@phase`` decorator.

    storm = Workflow("storm-intel", schema_version=2)

    @storm.phase("ingest")
    async def ingest(ctx: Context, state: dict) -> dict: ...

Phases run in declaration order. The first phase receives the start input as its state; the
value a phase returns is the state committed at its door and handed to the next phase.
"""

from __future__ import annotations

import importlib
import re
import types
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from phasegate.tiers import Grader, Tier, TierDefinitionError, TierPolicy, build_policy, build_tiers

if TYPE_CHECKING:
    from phasegate.context import Context
    from phasegate.staleness import VersionFetcher
    from phasegate.versions import Upcaster

PhaseFn = Callable[["Context", Any], Awaitable[Any]]

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


class WorkflowDefinitionError(ValueError):
    """A workflow was declared wrongly (bad name, duplicate phase, not a coroutine)."""


class NonRetryableError(Exception):
    """Raise from a phase to fail the run at once, without the retry budget."""


@dataclass(frozen=True)
class Phase:
    name: str
    fn: PhaseFn
    index: int
    policy: TierPolicy | None = None  # what happens when the phase ends below a tier
    timeout_s: float | None = None  # None: the worker's PHASEGATE_PHASE_TIMEOUT_S


class Workflow:
    """A named, versioned sequence of phases."""

    def __init__(self, name: str, *, schema_version: int = 1,
                 tiers: Sequence[tuple[str, Grader]] = (),
                 concurrency_key: Callable[[Any], str] | None = None,
                 max_concurrency: int | None = None,
                 rate: tuple[int, float] | None = None,
                 schedule: str | None = None, schedule_input: Any = None) -> None:
        """``concurrency_key(input) -> str`` with ``max_concurrency=N``: at most N runs per key
        are past their start at once, the rest wait ``queued`` (docs/how-to/concurrency.md);
        with ``rate=(N, seconds)``: at most N runs per key are admitted in any such window.
        ``schedule``: a cron expression (UTC); the orchestrator starts one run per tick with
        ``schedule_input`` (docs/how-to/schedules.md)."""
        if not _NAME.fullmatch(name):
            raise WorkflowDefinitionError(
                f"workflow name {name!r} must be 1-100 chars of [A-Za-z0-9_.-]")
        if schema_version < 1:
            raise WorkflowDefinitionError("schema_version must be >= 1")
        self.name = name
        self.schema_version = schema_version
        self.concurrency_key, self.max_concurrency, self.rate = _concurrency(
            name, concurrency_key, max_concurrency, rate)
        self.schedule, self.schedule_input = _schedule(name, schedule, schedule_input)
        self._phases: dict[str, Phase] = {}
        self._order: tuple[str, ...] = ()  # the phase names in order (next_phase)
        try:
            self.tiers: list[Tier] = build_tiers(tiers)
        except TierDefinitionError as exc:
            raise WorkflowDefinitionError(f"workflow {name!r}: {exc}") from None
        self.upcasters: dict[int, Upcaster] = {}
        self.version_fetchers: dict[str, VersionFetcher] = {}
        # Phases declared with ``merge()``: where ``ctx.fork`` may merge (phasegate/branches.py).
        self.merge_phases: set[str] = set()

    def phase(self, name: str, *, expect_tier: str | int | None = None,
              below_tier: str = "advance",
              max_tier_retries: int = 2,
              timeout_s: float | None = None) -> Callable[[PhaseFn], PhaseFn]:
        """Register ``async def fn(ctx, state) -> state`` as the next phase.

        ``expect_tier`` (a tier label or number) with ``below_tier`` = ``"retry"`` (up to
        ``max_tier_retries`` more attempts, then escalate), ``"escalate"`` (awaiting_review) or
        ``"advance"`` says what happens when the phase ends below that tier. ``timeout_s``
        bounds one attempt (0: no limit; default: ``PHASEGATE_PHASE_TIMEOUT_S``)."""
        if not _NAME.fullmatch(name):
            raise WorkflowDefinitionError(
                f"phase name {name!r} must be 1-100 chars of [A-Za-z0-9_.-]")
        if name in self._phases:
            raise WorkflowDefinitionError(f"phase {name!r} declared twice in {self.name!r}")
        if timeout_s is not None and not timeout_s >= 0:
            raise WorkflowDefinitionError(f"phase {name!r}: timeout_s must be >= 0")

        try:
            policy = build_policy(self.tiers, name, expect_tier, below_tier, max_tier_retries)
        except TierDefinitionError as exc:
            raise WorkflowDefinitionError(str(exc)) from None

        def register(fn: PhaseFn) -> PhaseFn:
            if not callable(fn) or not _is_coroutine_function(fn):
                raise WorkflowDefinitionError(f"phase {name!r} must be an async function")
            self._phases[name] = Phase(name=name, fn=fn, index=len(self._phases),
                                       policy=policy, timeout_s=timeout_s)
            return fn

        return register

    def merge(self, name: str, **kwargs: Any) -> Callable[[PhaseFn], PhaseFn]:
        """Register the next phase as a merge phase: the one a ``ctx.fork(...,
        merge=name)`` fans in to. It runs once on the main chain after the fork is resolved,
        with the forking phase's state and the branches' final states in ``ctx.merged``
        (see phasegate/branches.py). Takes the same options as ``phase()``."""
        register = self.phase(name, **kwargs)
        self.merge_phases.add(name)
        return register

    def upcast(self, *, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Register ``fn(state) -> state`` turning version ``from_version`` state into
        ``from_version + 1`` (sync or async); upcasters chain up to ``schema_version``."""
        if not 1 <= from_version < self.schema_version:
            raise WorkflowDefinitionError(
                f"upcast(from_version={from_version}) in {self.name!r}: from_version must be "
                f"1..{self.schema_version - 1} (schema_version is {self.schema_version})")
        if from_version in self.upcasters:
            raise WorkflowDefinitionError(
                f"two upcasters from version {from_version} in {self.name!r}")

        def register(fn: Upcaster) -> Upcaster:
            if not callable(fn):
                raise WorkflowDefinitionError("an upcaster must be callable")
            self.upcasters[from_version] = fn
            return fn

        return register

    def version_fetcher(self, resource_type: str = "*"
                        ) -> Callable[[VersionFetcher], VersionFetcher]:
        """Register ``fn(resource_id) -> version token`` (sync or async) for the resources
        phases ``observe`` of ``resource_type`` (``"*"``: every type without its own)."""
        if resource_type in self.version_fetchers:
            raise WorkflowDefinitionError(
                f"two version fetchers for {resource_type!r} in {self.name!r}")

        def register(fn: VersionFetcher) -> VersionFetcher:
            if not callable(fn):
                raise WorkflowDefinitionError("a version fetcher must be callable")
            self.version_fetchers[resource_type] = fn
            return fn

        return register

    @property
    def uses_room(self) -> bool:
        """Tiers or staleness: its phases need the door's details (one more query)."""
        return bool(self.tiers or self.version_fetchers)

    @property
    def phases(self) -> list[Phase]:
        return list(self._phases.values())

    @property
    def first_phase(self) -> str:
        if not self._phases:
            raise WorkflowDefinitionError(f"workflow {self.name!r} has no phases")
        return next(iter(self._phases))

    def get_phase(self, name: str) -> Phase | None:
        return self._phases.get(name)

    def next_phase(self, name: str) -> str | None:
        # Asked once per transition: the names in order, not a list of every phase each time.
        index = self._phases[name].index + 1
        names = self._names
        return names[index] if index < len(names) else None

    @property
    def _names(self) -> tuple[str, ...]:
        if len(self._order) != len(self._phases):  # a phase was registered since
            self._order = tuple(self._phases)
        return self._order

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, schema_version={self.schema_version}, " \
               f"phases={list(self._phases)})"


def _concurrency(name: str, key: Callable[[Any], str] | None, limit: int | None,
                 rate: Any) -> tuple[Callable[[Any], str] | None, int | None,
                                    tuple[int, float] | None]:
    if key is None:
        if limit is not None or rate is not None:
            raise WorkflowDefinitionError(
                f"workflow {name!r}: {'max_concurrency' if limit is not None else 'rate'} "
                "needs a concurrency_key function")
        return None, None, None
    if not callable(key):
        raise WorkflowDefinitionError(f"workflow {name!r}: concurrency_key must be callable")
    if (limit is not None or rate is None) and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise WorkflowDefinitionError(
            f"workflow {name!r}: concurrency_key needs max_concurrency, an int >= 1, "
            "or rate=(N, seconds)")
    from phasegate.concurrency import check_rate

    try:
        return key, limit, check_rate(rate)
    except ValueError as exc:
        raise WorkflowDefinitionError(f"workflow {name!r}: {exc}") from None


def _schedule(name: str, cron: str | None, input: Any) -> tuple[str | None, Any]:
    if cron is None:
        if input is not None:
            raise WorkflowDefinitionError(f"workflow {name!r}: schedule_input needs a schedule")
        return None, None
    from phasegate.schedules import ScheduleError, check_cron, check_input

    try:
        return check_cron(cron), check_input(input)
    except ScheduleError as exc:
        raise WorkflowDefinitionError(f"workflow {name!r}: {exc}") from None


def _is_coroutine_function(fn: object) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


class Registry:
    """The workflows a process knows, by name."""

    def __init__(self, workflows: Iterable[Workflow] = ()) -> None:
        self._by_name: dict[str, Workflow] = {}
        for workflow in workflows:
            self.add(workflow)

    def add(self, workflow: Workflow) -> None:
        existing = self._by_name.get(workflow.name)
        if existing is not None and existing is not workflow:
            raise WorkflowDefinitionError(f"two workflows are named {workflow.name!r}")
        if not workflow.phases:
            raise WorkflowDefinitionError(f"workflow {workflow.name!r} has no phases")
        self._by_name[workflow.name] = workflow

    def get(self, name: str) -> Workflow | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    @classmethod
    def from_modules(cls, module_paths: Iterable[str]) -> Registry:
        """Import each module and collect every ``Workflow`` among its globals."""
        registry = cls()
        for path in module_paths:
            try:
                module = importlib.import_module(path)
            except ImportError as exc:
                raise ImportError(f"cannot import {path!r}: {exc}") from exc
            registry.add_module(module)
        return registry

    def add_module(self, module: types.ModuleType) -> None:
        for value in vars(module).values():
            if isinstance(value, Workflow):
                self.add(value)
