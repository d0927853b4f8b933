"""Where the worker's CPU goes per transition: one in-process phasegate run under py-spy.

    python -m bench.profile [--groups 16] [--phases 200] [--continuation on|off]
                            [--commit-window-ms MS] [--count] [--time-log-lines | --time-hop]
                            [--out bench/results/profile-X.txt]

Runs the phasegate side of ``bench/transitions.py`` (in-process FIFO, a fresh database on a
private cluster holding a history as the benchmark's do, the worker's own store, production
JSON logging to /dev/null) while py-spy
samples it (on-CPU samples only: time spent waiting for Postgres is not counted), after a
warm-up run so imports and first-use caches stay out of the figures. Prints the share of
samples spent under each lever the transition's cost is split into, and the hottest functions
by own and by total samples: the before/after figures of docs/benchmarks-rounds.md. A machine loaded
by other work makes absolute times meaningless; the shares and the counts hold.

``--count``: one more run, not sampled, that counts per-transition work which does not depend
on load (asyncio tasks, ``call_soon`` callbacks, JSON encodings, pool acquires, log lines:
``bench/per_transition.py``).

``--time-log-lines``: one more run, not sampled, that times the two log lines of every
transition inside the worker (the phase line and the checkpoint's audit line, wall time in the
two calls, µs per transition). Inside the worker a line costs two to three times what it costs
in a loop (``python -m bench.hops``): its caches are cold between a phase and its commit.

``--time-hop``: the same run timing, besides the two lines, the hop's other named steps as the
transition calls them (``advance``, ``storable``, ``successor_message``, ``PhaseCommit``,
``attempt`` with the no-op phase inside it, ``decide``, ``state_hash``): what is left of the
client CPU per transition is the event loop, asyncpg and group commit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.common import HISTORY_RUNS, VENV_BIN, Databases
from phasegate.orchestrator.embedded import local_aws_env

# Inclusive share of samples with a frame from these files on the stack.
LEVERS = {
    "tracing (phasegate/tracing.py, opentelemetry)": ("phasegate/tracing.py", "opentelemetry/"),
    "logging (structlog, phasegate/logs.py)": ("structlog/", "phasegate/logs.py"),
    "envelope (phasegate/envelope.py, pydantic)": ("phasegate/envelope.py", "pydantic"),
    "metrics (prometheus_client)": ("prometheus_client/",),
    "json (encode, decode)": ("json/",),
    "queries through asyncpg (pool, connection, protocol)": ("asyncpg/",),
}
# The pool's own work (acquire, release, the release shield's task) is asyncpg/pool.py frames
# with no query below them: the lever above counts the queries too.
POOL = "asyncpg/pool.py"
QUERY = ("asyncpg/connection.py", "asyncpg/protocol", "asyncpg/prepared_stmt.py")


# The hop's named steps, as ``worker/transition.py`` looks them up when it calls them (names
# imported into that module): wrapping them there reaches a worker made before.
HOP_STEPS = ("advance", "storable", "successor_message", "PhaseCommit", "decide", "state_hash")


class LogLineTimes:
    """``with LogLineTimes() as times: ...``: wall time inside the worker's two log lines per
    transition (``PhaseLog.__call__``, ``audit.checkpoint_written``: both looked up when
    called, so wrapping them here reaches a worker made before); with ``hop``, inside the
    hop's other named steps too (``HOP_STEPS`` and ``attempt``)."""

    def __init__(self, hop: bool = False) -> None:
        self.ns: Counter[str] = Counter()
        self.figures: list[str] = []
        self._hop = hop
        self._undo: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> LogLineTimes:
        from phasegate import audit
        from phasegate.worker import outcomes, transition

        self._wrap(outcomes.PhaseLog, "__call__", "the phase line")
        self._wrap(audit, "checkpoint_written", "the audit line")
        if self._hop:
            for name in HOP_STEPS:
                self._wrap(transition, name, f"`{name}`")
            self._wrap(transition, "attempt", "`attempt` (the no-op phase inside)",
                       awaited=True)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def _wrap(self, owner: Any, name: str, figure: str, awaited: bool = False) -> None:
        original = getattr(owner, name)
        spent = self.ns
        self.figures.append(figure)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                spent[figure] += time.perf_counter_ns() - started

        async def timed_awaited(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter_ns()
            try:
                return await original(*args, **kwargs)
            finally:
                spent[figure] += time.perf_counter_ns() - started

        setattr(owner, name, timed_awaited if awaited else timed)
        self._undo.append((owner, name, original))

    def table(self, transitions: int) -> str:
        lines = ["| per transition (timed run) | µs |", "|---|---:|"]
        lines += [f"| {figure} | {self.ns[figure] / transitions / 1000:.1f} |"
                  for figure in self.figures]
        return "\n".join(lines)


async def _run(groups: int, phases: int, raw: Path, options: dict[str, Any],
               count: bool, time_log_lines: bool = False, time_hop: bool = False) -> str:
    """A warm-up run (imports, connections, first-use caches), then the measured run with
    py-spy attached to this process for exactly its duration; with ``count``, a counted run;
    with ``time_log_lines``, a run timing the log lines (with ``time_hop``, and the hop's
    other named steps)."""
    from bench.per_transition import WorkCounts
    from bench.transition_runs import Env, Workload, run_phasegate
    from bench.transitions import _quiet_logs

    _quiet_logs()
    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    databases = await Databases(private=True, history=HISTORY_RUNS).start()
    counted = ""
    try:
        # No rehearsal (bench/transition_runs.py): the warm-up run below stands for it, outside
        # py-spy's window; inside run_phasegate it would be sampled with the measured run.
        env = Env(databases, rehearsal=False, **options)
        # The warm-up runs the measured workload: its phases' metric children (one per phase
        # name and outcome, made on first use and kept, as a worker keeps them for its
        # workflows' phases) are made there, not in the measured run.
        workload = Workload("memory", groups, phases)
        await run_phasegate(await databases.fresh(), workload, env)
        dsn = await databases.fresh()
        spy = await asyncio.create_subprocess_exec(
            str(VENV_BIN / "py-spy"), "record", "--format", "raw", "--rate", "500",
            "--output", str(raw), "--pid", str(os.getpid()),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(1.0)  # py-spy attaches (it has no readiness signal)
        try:
            figures = await run_phasegate(dsn, workload, env)
        finally:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            await asyncio.wait_for(spy.wait(), timeout=60)
        if count:
            counts = WorkCounts(asyncio.get_running_loop())
            env.around = lambda: counts
            await run_phasegate(await databases.fresh(), workload, env)
            env.around = None
            counted = "\n\n" + count_table(counts.per(workload.transitions))
            counted += "\n\n" + count_table(counts.tasks_by_coroutine(workload.transitions),
                                             "tasks by coroutine")
        if time_log_lines or time_hop:
            times = LogLineTimes(hop=time_hop)
            env.around = lambda: times
            await run_phasegate(await databases.fresh(), workload, env)
            env.around = None
            counted += "\n\n" + times.table(workload.transitions)
    finally:
        await databases.stop()
    setting = ", ".join(f"{k}={v}" for k, v in options.items())
    return (f"{groups * phases} transitions ({setting}), {figures['transitions_per_s']:.0f}/s, "
            f"client CPU {figures['cpu_per_transition_us']:.0f} us/transition (load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs){counted}")


def count_table(per: dict[str, float], what: str = "counted run") -> str:
    lines = [f"| per transition ({what}) | count |", "|---|---:|"]
    lines += [f"| {name} | {value:.2f} |" for name, value in per.items()]
    return "\n".join(lines)


HARNESS = tuple(f"(bench/{name}.py:" for name in (
    "transitions", "transition_runs", "transition_round_trips", "transition_processes",
    "transition_summary", "workload", "common", "profile"))
SOCKET = ("_SelectorSocketTransport.write", "_SelectorSocketTransport._read_ready")
IDLE = ("EpollSelector.select", "_timed ")


_LINE = re.compile(r":\d+\)$")


def function(frame: str) -> str:
    """``fn (file.py:123)`` -> ``fn (file.py)``: samples of one function at any line."""
    return _LINE.sub(")", frame)


def analyse(raw: str, top: int = 15) -> str:
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in raw.splitlines():
        folded, _, samples = line.rpartition(" ")
        if folded and samples.isdigit():
            stacks[tuple(folded.split(";"))] += int(samples)
    # The event loop's work (the measured run; py-spy is attached only for it), without the
    # samples caught in epoll (waiting for sockets) or in the benchmark's own wait for the run.
    # The harness's own work (seeding, reading the commits back) is left out too: a stack
    # with a frame of bench/ is not the worker's.
    stacks = Counter({s: n for s, n in stacks.items() if any("run_forever" in f for f in s)
                      and not s[-1].startswith(IDLE)
                      and not _harness(s)})
    total = sum(stacks.values()) or 1
    # The socket calls' share swells with the machine's load (a loaded kernel), which shrinks
    # every other share: the second column leaves them out of the denominator.
    python = sum(n for s, n in stacks.items() if not s[-1].startswith(SOCKET)) or 1
    lines = [f"{total} on-CPU samples of the worker's event loop (epoll waits and the "
             f"harness excluded), {python} outside the socket calls", "",
             "| lever | share of samples | share without the socket calls |", "|---|---:|---:|"]
    for name, paths in LEVERS.items():
        hit = sum(n for s, n in stacks.items() if any(p in f for f in s for p in paths))
        outside = sum(n for s, n in stacks.items() if any(p in f for f in s for p in paths)
                      and not s[-1].startswith(SOCKET))
        lines.append(f"| {name} | {hit / total * 100:.1f} % | {outside / python * 100:.1f} % |")
    pool = sum(n for s, n in stacks.items() if _pool_only(s))
    lines.append(f"| pool acquire/release, no query below ({POOL}) | {pool / total * 100:.1f} % "
                 f"| {pool / python * 100:.1f} % |")
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for stack, count in stacks.items():
        own[function(stack[-1])] += count
        for name in {function(frame) for frame in stack}:
            inclusive[name] += count
    lines += ["", "| hottest functions (own samples) | share |", "|---|---:|"]
    lines += [f"| `{name}` | {count / total * 100:.1f} % |"
              for name, count in own.most_common(top)]
    # Total: the function or anything it called; the loop's own frames are left out (every
    # sample is under them).
    lines += ["", "| functions by total samples (itself and callees) | share |", "|---|---:|"]
    lines += [f"| `{name}` | {count / total * 100:.1f} % |"
              for name, count in inclusive.most_common(top + 12)
              if not name.startswith(LOOP_FRAMES)][:top]
    return "\n".join(lines)


LOOP_FRAMES = ("<module>", "run (", "_run_code", "_run_module_as_main", "main (bench",
               "BaseEventLoop.run_forever", "BaseEventLoop.run_until_complete",
               "BaseEventLoop._run_once", "Runner.run", "Handle._run")


def _harness(stack: tuple[str, ...]) -> bool:
    """A step of one of the harness's own tasks: below the loop's ``Handle._run`` (the task
    being stepped), a frame of bench/. (The process's main frames are bench's too.)"""
    step = next((i for i, f in enumerate(stack) if f.startswith("Handle._run ")), len(stack))
    return any(h in f for f in stack[step + 1:] for h in HARNESS)


def _pool_only(stack: tuple[str, ...]) -> bool:
    first = next((i for i, f in enumerate(stack) if POOL in f), None)
    return first is not None and not any(q in f for f in stack[first:] for q in QUERY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--phases", type=int, default=200)
    parser.add_argument("--continuation", choices=("on", "off"), default="on",
                        help="phasegate's local continuation (PHASEGATE_CONTINUATION)")
    parser.add_argument("--commit-window-ms", type=float, default=None,
                        help="group commit window (default: the setting's; 0 = off)")
    parser.add_argument("--load-window-ms", type=float, default=None,
                        help="group load window (default: the setting's; 0 = off)")
    parser.add_argument("--count", action="store_true",
                        help="also count per-transition work in a separate, unsampled run")
    parser.add_argument("--time-log-lines", action="store_true",
                        help="also time the two log lines per transition in a separate run")
    parser.add_argument("--time-hop", action="store_true",
                        help="as --time-log-lines, and the hop's other named steps")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    options: dict[str, Any] = {"continuation": args.continuation == "on"}
    if args.commit_window_ms is not None:
        options["commit_window_ms"] = args.commit_window_ms
    if args.load_window_ms is not None:
        options["load_window_ms"] = args.load_window_ms
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "profile.txt"
        header = asyncio.run(_run(args.groups, args.phases, raw, options, args.count,
                                  args.time_log_lines, args.time_hop))
        report = header + "\n\n" + analyse(raw.read_text())
        if args.out:  # the raw stacks beside the report, for a flame graph or a re-analysis
            args.out.with_suffix(".raw.txt").write_text(raw.read_text())
    if args.out:
        args.out.write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
