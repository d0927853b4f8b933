"""Per-transition work that does not depend on the machine's load: counted, not timed.

While the worker runs, ``WorkCounts`` counts what the event loop and the libraries are asked to
do -- asyncio tasks created, callbacks scheduled (``call_soon``), timers (``call_later``),
futures, JSON encodings and decodings, sha256 digests, connection-pool acquires, log lines --
by wrapping the loop's methods and the modules' functions for the duration of a ``with``
block. Divided by the transitions run, these are the "per transition" figures of
docs/benchmarks-rounds.md ("Python per hop"): unlike CPU time they stay the same on a
loaded machine.

Benchmark code only: the wrappers cost time themselves, so a counted run is never a timed or
profiled one (``python -m bench.profile --count`` does a separate run for it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

import asyncpg.pool
import structlog

FIGURES = ("tasks", "call_soon", "call_later", "futures", "json_encodings", "json_decodings",
           "sha256", "pool_acquires", "log_lines", "records", "frozen_dataclasses")


class WorkCounts:
    """``with WorkCounts(loop) as counts: ...``; then ``counts.per(transitions)``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.counts: Counter[str] = Counter()
        self._undo: list[Callable[[], None]] = []

    def per(self, transitions: int) -> dict[str, float]:
        return {name: self.counts[name] / transitions for name in FIGURES}

    def tasks_by_coroutine(self, transitions: int) -> dict[str, float]:
        """Tasks per transition by the coroutine each one runs, most first."""
        return {name.removeprefix("task:"): count / transitions
                for name, count in self.counts.most_common() if name.startswith("task:")}

    def __enter__(self) -> WorkCounts:
        loop: Any = self.loop
        for method, name in (("call_soon", "call_soon"), ("call_later", "call_later"),
                             ("create_future", "futures")):
            self._wrap_instance(loop, method, name)
        self._count_tasks()
        self._wrap_attribute(json, "dumps", "json_encodings")
        self._wrap_attribute(json, "loads", "json_decodings")
        self._wrap_attribute(hashlib, "sha256", "sha256")
        self._count_pool_acquires()
        self._count_log_lines()
        self._count_dataclasses()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    # -- the wrappers

    def _wrap_instance(self, target: Any, method: str, name: str) -> None:
        """An instance attribute shadows the class's method; deleting it restores the method
        (the C futures and tasks look ``call_soon`` up on the loop instance, so they see it)."""
        original = getattr(target, method)
        counts = self.counts

        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return original(*args, **kwargs)

        setattr(target, method, counted)
        self._undo.append(lambda: delattr(target, method))

    def _wrap_attribute(self, module: Any, attribute: str, name: str) -> None:
        """Callers that look the function up at call time (``json.dumps(...)``) are counted;
        a reference taken earlier (structlog's renderer keeps its own ``json.dumps``) is
        not: log lines are counted on their own."""
        original = getattr(module, attribute)
        counts = self.counts

        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return original(*args, **kwargs)

        setattr(module, attribute, counted)
        self._undo.append(lambda: setattr(module, attribute, original))

    def _count_dataclasses(self) -> None:
        """Values of phasegate's dataclasses built, as ``@record``s (phasegate/records.py) and
        as frozen dataclasses (each field set through ``object.__setattr__``)."""
        for module in [m for n, m in sys.modules.items() if n.startswith("phasegate")]:
            for cls in list(vars(module).values()):
                params = getattr(cls, "__dataclass_params__", None)
                if (not isinstance(cls, type) or params is None
                        or cls.__module__ != module.__name__ or "__init__" not in vars(cls)):
                    continue
                record = not params.frozen and params.unsafe_hash
                if not (record or params.frozen):
                    continue
                self._count_init(cls, "records" if record else "frozen_dataclasses")

    def _count_init(self, cls: type, name: str) -> None:
        original = vars(cls)["__init__"]
        counts = self.counts

        def counted(*args: Any, **kwargs: Any) -> None:
            counts[name] += 1
            original(*args, **kwargs)

        setattr(cls, "__init__", counted)  # noqa: B010 - the class's own attribute, undone below
        self._undo.append(lambda: setattr(cls, "__init__", original))

    def _count_tasks(self) -> None:
        loop = self.loop
        previous = loop.get_task_factory()
        counts = self.counts

        def factory(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                    **kwargs: Any) -> asyncio.Future[Any]:
            counts["tasks"] += 1
            counts["task:" + getattr(coro, "__qualname__", type(coro).__name__)] += 1
            if previous is not None:
                return previous(loop, coro, **kwargs)
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)  # type: ignore[arg-type]
        self._undo.append(lambda: loop.set_task_factory(previous))

    def _count_pool_acquires(self) -> None:
        pool_class: Any = asyncpg.pool.Pool
        original = pool_class._acquire
        counts = self.counts

        async def acquire(pool: Any, *args: Any) -> Any:  # (pool, timeout): asyncpg's own
            counts["pool_acquires"] += 1
            return await original(pool, *args)

        pool_class._acquire = acquire
        self._undo.append(lambda: setattr(pool_class, "_acquire", original))

    def _count_log_lines(self) -> None:
        """A first processor in structlog's list: bound loggers share that list object, so
        loggers bound before the run see it too. Lines the level filters out never reach it."""
        processors: list[Any] = structlog.get_config()["processors"]
        counts = self.counts

        def counted(logger: Any, method: str, event: Any) -> Any:
            counts["log_lines"] += 1
            return event

        processors.insert(0, counted)
        self._undo.append(lambda: processors.remove(counted))
