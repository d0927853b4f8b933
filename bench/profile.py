"""Where the worker's CPU goes per transition: one in-process phasegate run under py-spy.

    python -m bench.profile [--groups 16] [--phases 200] [--out bench/results/profile-X.txt]

Runs the phasegate side of ``bench/transitions.py`` (in-process FIFO, a fresh database on a
private cluster, production JSON logging to /dev/null) while py-spy samples it (on-CPU
samples only: time spent waiting for Postgres is not counted), after a warm-up run so
imports and first-use caches stay out of the figures. Prints the share of samples spent
under each lever the transition's cost is split into, and the hottest functions by own
samples: the before/after figures of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from bench.common import VENV_BIN, Databases, local_aws_env

# Inclusive share of samples with a frame from these files on the stack.
LEVERS = {
    "tracing (phasegate/tracing.py, opentelemetry)": ("phasegate/tracing.py", "opentelemetry/"),
    "logging (structlog)": ("structlog/",),
    "pool acquire/release (asyncpg/pool.py)": ("asyncpg/pool.py",),
    "envelope (phasegate/envelope.py, pydantic)": ("phasegate/envelope.py", "pydantic"),
    "metrics (prometheus_client)": ("prometheus_client/",),
}


async def _run(groups: int, phases: int, raw: Path) -> str:
    """A warm-up run (imports, connections, first-use caches), then the measured run with
    py-spy attached to this process for exactly its duration."""
    from bench.transitions import Env, Workload, _quiet_logs, run_phasegate

    _quiet_logs()
    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    databases = await Databases(private=True).start()
    try:
        env = Env(databases)
        await run_phasegate(await databases.fresh(), Workload("memory", groups, 10), env)
        dsn = await databases.fresh()
        spy = await asyncio.create_subprocess_exec(
            str(VENV_BIN / "py-spy"), "record", "--format", "raw", "--rate", "500",
            "--output", str(raw), "--pid", str(os.getpid()),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(1.0)  # py-spy attaches (it has no readiness signal)
        try:
            figures = await run_phasegate(dsn, Workload("memory", groups, phases), env)
        finally:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            await asyncio.wait_for(spy.wait(), timeout=60)
    finally:
        await databases.stop()
    return (f"{groups * phases} transitions, {figures['transitions_per_s']:.0f}/s, client CPU "
            f"{figures['cpu_per_transition_us']:.0f} us/transition (load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


IDLE = ("EpollSelector.select", "_timed ")


def analyse(raw: str) -> str:
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(stack.split(";"))] += int(count)
    # The event loop's work (the measured run; py-spy is attached only for it), without the
    # samples caught in epoll (waiting for sockets) or in the benchmark's own wait for the run.
    stacks = Counter({s: n for s, n in stacks.items() if any("run_forever" in f for f in s)
                      and not s[-1].startswith(IDLE)})
    total = sum(stacks.values()) or 1
    lines = [f"{total} on-CPU samples of the event loop (epoll waits excluded)", "",
             "| lever | share of samples |", "|---|---:|"]
    for name, paths in LEVERS.items():
        hit = sum(n for s, n in stacks.items() if any(p in f for f in s for p in paths))
        lines.append(f"| {name} | {hit / total * 100:.1f} % |")
    own: Counter[str] = Counter()
    for stack, count in stacks.items():
        own[stack[-1]] += count
    lines += ["", "| hottest functions (own samples) | share |", "|---|---:|"]
    lines += [f"| `{frame}` | {count / total * 100:.1f} % |"
              for frame, count in own.most_common(15)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--phases", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "profile.txt"
        header = asyncio.run(_run(args.groups, args.phases, raw))
        report = header + "\n\n" + analyse(raw.read_text())
        if args.out:  # the raw stacks beside the report, for a flame graph or a re-analysis
            args.out.with_suffix(".raw.txt").write_text(raw.read_text())
    if args.out:
        args.out.write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
