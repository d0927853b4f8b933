"""A fleet of real worker processes for the hostile suite, and what it must leave behind.

Every test ends with the same checks: each worker is still alive (user code and data never
end one) and stops with exit 0 on SIGTERM; no canary from an input reached a worker's log, the
DLQ, a quarantine reason or a run's error.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from phasegate.settings import Settings
from tests.helpers import ROOT, fetch, fetchval, queue_for, settings_env

MODULES = "tests.hostile.workflows_hostile"
# In every hostile input: it must never come out anywhere phasegate writes.
CANARY = "CANARY-7f3a9c"


class Fleet:
    def __init__(self, settings: Settings, log_dir: Path, workers: int,
                 extra_env: dict[str, str] | None) -> None:
        self.settings = settings
        self.logs = [log_dir / f"worker-{i}.log" for i in range(workers)]
        env = {**os.environ, **settings_env(settings), "PHASEGATE_WORKFLOW_MODULES": MODULES,
               "PHASEGATE_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT), **(extra_env or {})}
        self.processes = []
        for path in self.logs:
            with open(path, "ab") as log:
                self.processes.append(subprocess.Popen(
                    [sys.executable, "-m", "phasegate.cli", "worker"], env=env, cwd=ROOT,
                    stdout=subprocess.DEVNULL, stderr=log))

    def alive(self) -> list[int | None]:
        return [p.poll() for p in self.processes]

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs)

    def stop(self) -> list[int]:
        codes = []
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                codes.append(process.wait(timeout=60))
            except subprocess.TimeoutExpired:
                process.kill()
                codes.append(process.wait())
        return codes


@contextmanager
def fleet(settings: Settings, log_dir: Path, *, workers: int = 1,
          extra_env: dict[str, str] | None = None) -> Iterator[Fleet]:
    """Real worker processes; on a clean exit of the block, prove none died and all stop 0."""
    running = Fleet(settings, log_dir, workers, extra_env)
    try:
        yield running
    except BaseException:
        running.stop()
        raise
    died = running.alive()
    codes = running.stop()
    assert died == [None] * workers, f"a worker exited: {died}\n{running.log_text()[-3000:]}"
    assert codes == [0] * workers, f"exit codes {codes}"
    assert CANARY not in running.log_text()


def dedup(text: str) -> str:
    return hashlib.sha256(f"{text}:{time.time_ns()}".encode()).hexdigest()


async def send(settings: Settings, body: str | dict[str, Any], group: str) -> None:
    text = body if isinstance(body, str) else json.dumps(body)
    async with queue_for(settings) as queue:
        await queue._client.send_message(
            QueueUrl=queue.queue_url, MessageBody=text, MessageGroupId=group,
            MessageDeduplicationId=dedup(text))


async def drain_dlq(settings: Settings) -> list[str]:
    bodies: list[str] = []
    async with queue_for(settings, settings.dlq_url) as dlq:
        # Deleted as read: a FIFO queue holds back a group while one of its messages is out.
        while batch := await dlq.receive(10, 0, 30):
            bodies += [m.body for m in batch]
            await dlq.delete([m.receipt_handle for m in batch])
    return bodies


async def quarantine_codes(settings: Settings) -> dict[str | None, list[str]]:
    """workflow_id (None when unparseable) -> reason codes."""
    codes: dict[str | None, list[str]] = {}
    for row in await fetch(settings.database_url or "",
                           "SELECT workflow_id, reason FROM quarantine ORDER BY quarantine_id"):
        codes.setdefault(row["workflow_id"], []).append(row["reason"].split(":")[0])
    return codes


async def quarantined(settings: Settings, n: int) -> bool:
    return int(await fetchval(settings.database_url or "",
                              "SELECT count(*) FROM quarantine")) >= n


async def runs(settings: Settings) -> dict[str, Any]:
    return {r["workflow_id"]: r for r in await fetch(
        settings.database_url or "",
        "SELECT workflow_id, status, attempts, error, next_seq FROM workflow_runs")}


async def assert_nothing_leaked(settings: Settings) -> list[str]:
    """No canary in the DLQ, the quarantine or any run's error; returns the DLQ bodies."""
    bodies = await drain_dlq(settings)
    assert all(CANARY not in body for body in bodies)
    reasons = await fetch(settings.database_url or "", "SELECT reason FROM quarantine")
    assert all(CANARY not in r["reason"] for r in reasons)
    errors = await fetch(settings.database_url or "",
                         "SELECT error FROM workflow_runs WHERE error IS NOT NULL")
    assert all(CANARY not in r["error"] for r in errors)
    return bodies
