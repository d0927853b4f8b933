"""``phasegate demo``: the whole system on this machine, with nothing configured.

A throwaway PostgreSQL (or $PHASEGATE_DATABASE_URL), moto's SQS server over HTTP, a FIFO queue
and DLQ, worker processes and the control process (orchestrator, or the relay), a few hundred
sample runs, one worker SIGKILLed mid-run and replaced, a live progress view, and a summary
that proves from the database that every run completed exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import aioboto3
import asyncpg
from rich.console import Console
from rich.live import Live
from rich.text import Text

from phasegate.db import connect, create_pool
from phasegate.envelope import canonical_json, state_hash
from phasegate.migrate import migrate
from phasegate.orchestrator import render
from phasegate.orchestrator.embedded import EmbeddedPostgres, EmbeddedSqs, free_port, local_aws_env
from phasegate.orchestrator.starter import start_workflow
from phasegate.queue import SqsQueue, create_fifo_queue_pair
from phasegate.samples import pipeline
from phasegate.sql import queries
from phasegate.store import Store

RUN_DEADLINE_S = 600
VISIBILITY_S = 10
HEARTBEAT_S = 3
# Short polls against moto (quickstart.md says the same): see the workers' environment below.
WAIT_TIME_S = 1


class Display:
    """A live progress view: rich's Live region on a terminal (redrawn in place, messages
    printed above it, the rest of the screen left alone), a plain line every few seconds
    otherwise (CI logs)."""

    def __init__(self, out: Console | None = None) -> None:
        self.tty = sys.stdout.isatty() if out is None else out.is_terminal
        self.console = out or render.console(color=self.tty)
        self._live: Live | None = None
        self._last_plain = 0.0

    def show(self, lines: list[str]) -> None:
        if self.tty:
            if self._live is None:
                self._live = Live(console=self.console, auto_refresh=False,
                                  redirect_stdout=False, redirect_stderr=False)
                self._live.start()
            self._live.update(Text("\n".join(lines)), refresh=True)
        elif time.monotonic() - self._last_plain > 3:
            self.console.print(Text(" | ".join(line.strip() for line in lines if line.strip())))
            self.console.file.flush()
            self._last_plain = time.monotonic()

    def say(self, text: str) -> None:
        # With a live view on screen, rich prints above it and redraws it below.
        self.console.print(Text(text))
        self.console.file.flush()

    def close(self) -> None:
        """Leave the last progress frame on screen and stop redrawing it."""
        if self._live is not None:
            self._live.stop()
            self._live = None


def bar(done: int, total: int, width: int = 40) -> str:
    filled = int(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


class Fleet:
    """The OS processes of the demo: workers and the control process."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.workers: list[subprocess.Popen[bytes]] = []
        self.control: subprocess.Popen[bytes] | None = None
        self.control_url: str | None = None
        self.control_token: str | None = None

    def _spawn(self, args: list[str], name: str, extra: dict[str, str] | None = None
               ) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        return subprocess.Popen([sys.executable, "-m", "phasegate.cli", *args],
                                env={**self.env, **(extra or {})}, stdout=log, stderr=log)

    def start_worker(self) -> subprocess.Popen[bytes]:
        index = len(self.workers)
        process = self._spawn(["worker"], f"worker-{index}",
                              {"PHASEGATE_WORKER_ID": f"demo-worker-{index}"})
        self.workers.append(process)
        return process

    def start_control(self) -> None:
        from phasegate.cli import main

        if "orchestrator" in main.commands:
            from phasegate.orchestrator.auth import new_token, token_line

            # The demo's API is protected like any other: one admin token, printed with the URL.
            port = free_port()
            self.control_token = new_token()
            tokens = self.log_dir / "api-tokens"
            tokens.write_text(token_line("demo", ["admin"], self.control_token) + "\n")
            tokens.chmod(0o600)
            self.control = self._spawn(["orchestrator"], "orchestrator",
                                       {"PHASEGATE_API_PORT": str(port),
                                        "PHASEGATE_API_AUTH": "tokens",
                                        "PHASEGATE_API_TOKENS_FILE": str(tokens)})
            self.control_url = f"http://127.0.0.1:{port}"
        else:
            self.control = self._spawn(["relay"], "relay")

    def stop_all(self, timeout: float = 30) -> list[int]:
        processes = [*self.workers, *([self.control] if self.control else [])]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = []
        deadline = time.monotonic() + timeout
        for process in processes:
            try:
                codes.append(process.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                process.kill()
                codes.append(process.wait())
        return codes


async def progress_lines(connection: asyncpg.Connection, total: int, fleet: Fleet,
                         started: float) -> tuple[list[str], int]:
    rows = await connection.fetch(queries("demo.sql")["runs_by_status_and_phase"])
    by_status: Counter[str] = Counter()
    by_phase: Counter[str] = Counter()
    for row in rows:
        by_status[row["status"]] += row["n"]
        if row["status"] in ("pending", "running"):
            by_phase[row["current_phase"]] += row["n"]
    done = by_status["completed"]
    alive = sum(1 for w in fleet.workers if w.poll() is None)
    phases = "  ".join(f"{p.name}:{by_phase.get(p.name, 0)}" for p in pipeline.phases)
    others = ", ".join(f"{k}={v}" for k, v in sorted(by_status.items()) if k != "completed")
    return [f"  completed {bar(done, total)}  {time.monotonic() - started:5.1f}s",
            f"  in flight by phase  {phases}",
            f"  workers alive {alive}   {others or 'nothing else pending'}"], done


def phase_outcomes(log_dir: Path) -> Counter[str]:
    """The canonical per-phase log lines the workers wrote, counted by outcome. Each line is
    read as JSON: the workers' encoder writes it compact (``"event":"phase"``), and a line
    that is not JSON (a traceback, a partial last line) is skipped."""
    outcomes = Counter[str]()
    for path in log_dir.glob("worker-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if '"phase"' not in line:
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("event") == "phase":
                outcomes[str(entry.get("outcome", "?"))] += 1
    return outcomes


async def summarize(dsn: str, total: int, log_dir: Path) -> tuple[list[str], bool]:
    connection = await connect(dsn)
    try:
        q = queries("demo.sql")
        runs = await connection.fetch(q["runs"])
        checkpoints = await connection.fetch(q["phase_checkpoints"])
        unsent = await connection.fetchval(q["unsent_outbox"])
        quarantined = await connection.fetchval(q["quarantined"])
    finally:
        await connection.close()
    phases = len(pipeline.phases)
    chains: dict[str, list[int]] = {}
    bad_hashes = 0
    for row in checkpoints:
        chains.setdefault(row["workflow_id"], []).append(row["seq"])
        if state_hash(canonical_json(json.loads(row["state"]))) != row["state_hash"]:
            bad_hashes += 1
    completed = sum(1 for r in runs if r["status"] == "completed")
    exact = sum(1 for r in runs if chains.get(r["workflow_id"]) == list(range(phases)))
    executions = phase_outcomes(log_dir)
    committed = executions["advanced"] + executions["completed"]
    superseded = executions["superseded"]
    ok = (completed == total == len(runs) == exact and bad_hashes == 0 and unsent == 0
          and len(checkpoints) == total * phases)
    lines = [
        "Summary (read back from PostgreSQL)",
        f"  runs started                {total}",
        f"  runs completed              {completed}",
        f"  phase checkpoints           {len(checkpoints)} (expected {total} x {phases} = "
        f"{total * phases})",
        f"  runs with exactly one checkpoint per seq 0..{phases - 1}, no gaps: {exact}",
        f"  checkpoint hashes verified  {len(checkpoints) - bad_hashes} ok, {bad_hashes} bad",
        f"  outbox rows unsent          {unsent}",
        f"  quarantined messages        {quarantined}",
        f"  phase commits logged        {committed} (late duplicates rolled back: "
        f"{superseded})",
        "  RESULT: " + ("every run completed exactly once" if ok else "MISMATCH - see above"),
    ]
    return lines, ok


async def start_runs(dsn: str, queue_url: str, endpoint: str, total: int) -> None:
    pool = await create_pool(dsn, max_size=8)
    try:
        async with SqsQueue(queue_url, endpoint_url=endpoint, region="us-east-1") as queue:
            store = Store(pool)
            semaphore = asyncio.Semaphore(16)

            async def one(i: int) -> None:
                async with semaphore:
                    await start_workflow(store, queue, workflow=pipeline,
                                         input={"source": "demo", "pages": 2 + i % 5})

            await asyncio.gather(*(one(i) for i in range(total)))
    finally:
        await pool.close()


async def demo_main(*, runs: int, workers: int, kill: bool, display: Display,
                    dsn: str, endpoint: str, fleet_dir: Path) -> bool:
    session = aioboto3.Session()
    async with session.client("sqs", endpoint_url=endpoint, region_name="us-east-1") as client:
        queue_url, dlq_url = await create_fifo_queue_pair(
            client, f"phasegate-demo-{uuid.uuid4().hex[:8]}", visibility_timeout_s=VISIBILITY_S)
    report = await migrate(dsn)
    display.say(f"schema at version {report.current_version}; queue {queue_url}")
    env = {**os.environ, **local_aws_env(), "PHASEGATE_DATABASE_URL": dsn,
           "PHASEGATE_QUEUE_URL": queue_url, "PHASEGATE_DLQ_URL": dlq_url,
           "PHASEGATE_SQS_ENDPOINT_URL": endpoint, "PHASEGATE_AWS_REGION": "us-east-1",
           "PHASEGATE_WORKFLOW_MODULES": "phasegate.samples", "PHASEGATE_CONCURRENCY": "8",
           "PHASEGATE_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S),
           "PHASEGATE_HEARTBEAT_S": str(HEARTBEAT_S), "PHASEGATE_SHUTDOWN_GRACE_S": "5",
           "PHASEGATE_METRICS_PORT": "0", "PHASEGATE_LOG_FORMAT": "json",
           "PHASEGATE_RELAY_AFTER_S": "3",
           # moto's long poll keeps the FIFO groups it saw in flight when it began: a group
           # freed meanwhile (a killed worker's run, once rescued) waits out the whole poll.
           "PHASEGATE_WAIT_TIME_S": str(WAIT_TIME_S)}
    fleet = Fleet(env, fleet_dir)
    try:
        fleet.start_control()
        for _ in range(workers):
            fleet.start_worker()
        if fleet.control_url:
            display.say(f"orchestrator API: {fleet.control_url}  (OpenAPI: "
                        f"{fleet.control_url}/docs)\n  token (admin): {fleet.control_token}\n"
                        f"  try: PHASEGATE_API_TOKEN={fleet.control_token} phasegate status "
                        f"--api {fleet.control_url}")
        display.say(f"{workers} workers, starting {runs} runs of '{pipeline.name}' "
                    f"({' -> '.join(p.name for p in pipeline.phases)})")
        await start_runs(dsn, queue_url, endpoint, runs)
        started = time.monotonic()
        killed = not kill
        connection = await connect(dsn)
        try:
            while True:
                lines, done = await progress_lines(connection, runs, fleet, started)
                display.show(lines)
                if done >= runs:
                    break
                if not killed and done >= runs * 0.3:
                    victim = fleet.workers[0]
                    victim.send_signal(signal.SIGKILL)
                    killed = True
                    display.say(f"SIGKILL worker pid {victim.pid} mid-run; its messages come "
                                f"back after the {VISIBILITY_S}s visibility timeout; "
                                "starting a replacement")
                    fleet.start_worker()
                if time.monotonic() - started > RUN_DEADLINE_S:
                    display.say("deadline passed before every run completed")
                    break
                await asyncio.sleep(0.25)  # the refresh period of the progress view
        finally:
            display.close()
            await connection.close()
    finally:
        codes = fleet.stop_all()
    clean = sum(1 for code in codes if code == 0)
    sigkilled = sum(1 for code in codes if code == -signal.SIGKILL)
    display.say(f"stopped {len(codes)} processes: {clean} exited 0 on SIGTERM, "
                f"{sigkilled} SIGKILLed by the demo, {len(codes) - clean - sigkilled} other")
    lines, ok = await summarize(dsn, runs, fleet_dir)
    for line in lines:
        display.say(line)
    display.say(f"logs: {fleet_dir}")
    return ok


def run_demo(*, runs: int = 200, workers: int = 3, kill: bool = True) -> int:
    display = Display()
    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    with ExitStack() as stack:
        dsn = os.environ.get("PHASEGATE_DATABASE_URL")
        if not dsn:
            display.say("starting a throwaway PostgreSQL ...")
            dsn = stack.enter_context(EmbeddedPostgres()).dsn
        sqs = stack.enter_context(EmbeddedSqs())
        display.say(f"PostgreSQL {dsn}\nSQS server (moto) {sqs.endpoint_url}")
        log_dir = Path(tempfile.mkdtemp(prefix="phasegate-demo-logs-"))
        try:
            ok = asyncio.run(demo_main(runs=runs, workers=workers, kill=kill, display=display,
                                       dsn=dsn, endpoint=sqs.endpoint_url, fleet_dir=log_dir))
        except KeyboardInterrupt:
            display.say("interrupted; stopping everything")
            return 130
    return 0 if ok else 1
