"""Per-transition cost of the worker's cross-cutting hooks, each timed alone in a loop.

    python -m bench.hops [--n 20000]

Times, in µs per transition, what the worker does around every phase besides the queries:
the three span hooks plus trace propagation with no OpenTelemetry SDK configured, the
per-phase log line (production JSON pipeline, run ids bound as context variables, output to
/dev/null), building the successor envelope (validated, or copied from the received one) and
one JSON encoding of it, and a phase's returned state checked and encoded for its commit
(a 1 KB and a 118 KB state), and a no-op phase under its time limit (``asyncio.timeout`` per
attempt, the worker's shared deadlines, no limit). Run it in two checkouts to compare
them; the machine's load shows as noise, so run each a few times, alternating.

The two log lines of a transition (the phase line and the checkpoint's audit line) are timed
through structlog's processor chain and as the worker writes them (``lean_logger``), and also
rendered by structlog's stock pipeline (``TimeStamper(fmt="iso", utc=True)``,
``JSONRenderer()``, ``PrintLoggerFactory``), as phasegate configured it before its own
timestamp, renderer and writer (phasegate/logs.py): the same lines, the same process.

The values built on every phase (a run's position, a commit) are timed as ``@record``s
(phasegate/records.py) and as frozen dataclasses of the same fields, and the keys bound per
message as the worker binds them (``logs.bound_contextvars``) and by structlog's
``bound_contextvars``, with as many other context variables as a worker holds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import dataclasses
import os
import sys
import time
import timeit
from typing import Any

import structlog

from bench.workload import PAYLOAD
from phasegate import tracing
from phasegate.envelope import canonical_json, phase_message, successor_message
from phasegate.logs import bound_contextvars, configure_logging, lean_logger
from phasegate.storable import check_storable
from phasegate.store import PhaseCommit, RunPosition
from phasegate.worker.guards import call_phase, storable

# An agent run's state: 250 messages of 400 characters (118 KB of JSON).
BIG_STATE = {"messages": [{"role": "user" if i % 2 else "assistant", "content": "x" * 400,
                           "meta": {"tokens": i, "ok": True}} for i in range(250)], "step": 3}


def per_call_us(fn: Any, n: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    n = parser.parse_args().n
    real = sys.stderr
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    try:
        configure_logging("info", "json")
    finally:
        sys.stderr = real
    envelope = phase_message("w-0123456789", "bench-noop-400", 7, "p7")
    successor = phase_message("w-0123456789", "bench-noop-400", 8, "p8")

    def spans() -> None:
        with tracing.phase_span(envelope), tracing.commit_span(envelope):
            tracing.propagate(envelope, successor)
        with tracing.send_span("queue"):
            pass

    module_log = structlog.get_logger("phasegate.transition")
    bound = module_log.bind()
    figures = {"spans + propagation, no SDK": per_call_us(spans, n)}
    with structlog.contextvars.bound_contextvars(workflow_id="w-0123456789", seq=7,
                                                 branch="main", workflow="bench-noop-400"):
        for name, logger in (("phase log line, module proxy", module_log),
                             ("phase log line, pre-bound logger", bound)):
            figures[name] = per_call_us(lambda lg=logger: lg.info(
                "phase", phase="p7", outcome="advanced", duration_s=0.000123), n)
        audit = structlog.get_logger("phasegate.audit").bind()
        figures["audit line, pre-bound logger"] = per_call_us(lambda: audit.info(
            "checkpoint_audit", workflow_id="w-0123456789", seq=7, branch="main",
            region="default", classification="internal", kind="phase"), n)
        # What the worker writes them with (phasegate/logs.py: lean_logger).
        lean = lean_logger(module_log)
        figures["phase log line, lean (the worker's)"] = per_call_us(lambda: lean.info(
            "phase", phase="p7", outcome="advanced", duration_s=0.000123), n)
        lean_audit = lean_logger(structlog.get_logger("phasegate.audit"))
        figures["audit line, lean (the worker's)"] = per_call_us(lambda: lean_audit.info(
            "checkpoint_audit", workflow_id="w-0123456789", seq=7, branch="main",
            region="default", classification="internal", kind="phase"), n)
        configured = structlog.get_config()
        with open(os.devnull, "w") as devnull:
            structlog.configure(
                processors=[*configured["processors"][:-3],
                            structlog.processors.TimeStamper(fmt="iso", utc=True),
                            structlog.processors.dict_tracebacks,
                            structlog.processors.JSONRenderer()],
                logger_factory=structlog.PrintLoggerFactory(file=devnull))
            stock = structlog.get_logger("phasegate.transition").bind()
            stock_audit = structlog.get_logger("phasegate.audit").bind()
            figures["phase log line, structlog's stock renderer"] = per_call_us(
                lambda: stock.info("phase", phase="p7", outcome="advanced",
                                   duration_s=0.000123), n)
            figures["audit line, structlog's stock renderer"] = per_call_us(
                lambda: stock_audit.info(
                    "checkpoint_audit", workflow_id="w-0123456789", seq=7, branch="main",
                    region="default", classification="internal", kind="phase"), n)
            structlog.configure(**configured)
    figures["successor built, validated (phase_message)"] = per_call_us(
        lambda: phase_message(envelope.workflow_id, envelope.workflow, envelope.seq + 1, "p8",
                              envelope.branch, envelope.traceparent), n)
    figures["successor built, copied (successor_message)"] = per_call_us(
        lambda: successor_message(envelope, envelope.workflow, "p8"), n)
    figures["successor to_json, once"] = per_call_us(successor.to_json, n)
    # A phase's returned state, checked and encoded for its commit (worker/guards.storable),
    # against the full walk then the encoding, which it did until it encoded first.
    for name, state, calls in (("1 KB state", PAYLOAD, n), ("118 KB state", BIG_STATE, n // 100)):
        figures[f"{name}: storable"] = per_call_us(lambda v=state: storable(v, "state"), calls)

        def walk_then_encode(v: dict[str, Any] = state) -> str:
            check_storable(v, where="state")
            return canonical_json(v)

        figures[f"{name}: full walk, then encoded"] = per_call_us(walk_then_encode, calls)
    figures.update(asyncio.run(_phase_limits(n)))
    figures.update(_records_and_scope(n))
    for name, value in figures.items():
        print(f"{name}: {value:.2f} us")


POSITION = {"workflow_id": "w-0123456789", "workflow": "bench-noop-400", "status": "running",
            "next_seq": 8, "base_seq": 0, "current_phase": "p8", "schema_version": 1,
            "input_json": "{}", "attempts": 0, "epoch": 0, "state_json": '{"a":1}',
            "state_hash": "0" * 64, "state_version": 1, "progress_json": None,
            "classification": "internal", "region": None, "signal_json": None}
COMMIT = {"workflow_id": "w-0123456789", "branch": "main", "seq": 7, "phase": "p7",
          "schema_version": 1, "state_json": '{"a":1}', "state_hash": "0" * 64,
          "next_phase": "p8", "status": "running", "worker_id": "worker-1", "successor": None}


def _frozen_twin(cls: type) -> Any:
    """A frozen dataclass with ``cls``'s fields and defaults: what a record was before."""
    return dataclasses.make_dataclass(f"Frozen{cls.__name__}", [
        (f.name, f.type, dataclasses.field(default=f.default))
        if f.default is not dataclasses.MISSING else (f.name, f.type)
        for f in dataclasses.fields(cls)], frozen=True)


def _records_and_scope(n: int) -> dict[str, float]:
    figures = {}
    for cls, values in ((RunPosition, POSITION), (PhaseCommit, COMMIT)):
        twin = _frozen_twin(cls)
        figures[f"{cls.__name__} built, @record"] = per_call_us(lambda c=cls, v=values: c(**v), n)
        figures[f"{cls.__name__} built, frozen dataclass"] = per_call_us(
            lambda c=twin, v=values: c(**v), n)
    # A worker's context holds asyncio's, OpenTelemetry's and structlog's variables, which
    # structlog's bound_contextvars reads one by one on entry.
    others: list[contextvars.ContextVar[int]] = [
        contextvars.ContextVar(f"bench_other_{i}") for i in range(8)]
    for var in others:
        var.set(1)
    keys = {"workflow_id": "w-0123456789", "seq": 7, "branch": "main",
            "workflow": "bench-noop-400"}

    def ours() -> None:
        with bound_contextvars(**keys):
            pass

    def structlogs() -> None:
        with structlog.contextvars.bound_contextvars(**keys):
            pass

    figures["message keys bound, the worker's"] = per_call_us(ours, n)
    figures["message keys bound, structlog's bound_contextvars"] = per_call_us(structlogs, n)
    return figures


async def _phase_limits(n: int) -> dict[str, float]:
    """A no-op phase under its time limit: ``asyncio.timeout`` per attempt (as the worker did
    before worker/deadlines.py), the worker's shared deadlines, and no limit at all."""
    from phasegate.worker.deadlines import PhaseDeadlines
    from phasegate.workflow import Workflow

    workflow = Workflow("bench-limits")

    @workflow.phase("noop")
    async def noop(ctx: Any, state: Any) -> Any:
        return state

    phase = workflow.phases[0]
    deadlines = PhaseDeadlines()

    async def timeout_scope() -> Any:
        async with asyncio.timeout(3600):
            return await phase.fn(None, None)  # type: ignore[arg-type]

    async def shared() -> Any:
        return await call_phase(phase, None, None, 3600, deadlines)  # type: ignore[arg-type]

    async def unlimited() -> Any:
        return await phase.fn(None, None)  # type: ignore[arg-type]

    figures = {}
    for name, call in (("phase limit: asyncio.timeout per attempt", timeout_scope),
                       ("phase limit: the worker's shared deadlines", shared),
                       ("phase limit: none", unlimited)):
        best = float("inf")
        for _ in range(5):
            began = time.perf_counter()
            for _ in range(n):
                await call()
            best = min(best, time.perf_counter() - began)
        figures[name] = best / n * 1e6
    return figures


if __name__ == "__main__":
    main()
