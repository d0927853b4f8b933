"""The watchdog under real memory pressure: a worker process in a memory-limited cgroup.

Runs as root (CI here does); skips only where cgroups cannot be created, saying why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phasegate.orchestrator.starter import start_workflow
from tests import workflows_pressure
from tests.cgroup_sandbox import (
    CgroupSandbox,
    SandboxUnavailable,
    log_events,
    spawn_logged_worker,
)
from tests.helpers import all_done, fetch, queue_for, store_for, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

MODULES = "tests.workflows_pressure"
MiB = 1 << 20
FILE_MB = 256


@pytest.fixture(scope="module")
def big_file() -> Iterator[str]:
    """On a real disk (not tmpfs): page cache that reclaim has to evict and re-read."""
    path = Path("/var/tmp") / f"phasegate-pressure-{os.getpid()}.bin"
    block = os.urandom(MiB)
    with open(path, "wb") as f:
        for _ in range(FILE_MB):
            f.write(block)
    try:
        yield str(path)
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture
def sandbox() -> Iterator[CgroupSandbox]:
    try:
        box = CgroupSandbox.create()
    except SandboxUnavailable as exc:
        print(f"skipping: {exc}")
        pytest.skip(f"cannot create cgroups here: {exc}")
    try:
        yield box
    finally:
        box.close()


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:]


def open_gate(gate: str) -> None:
    Path(gate).touch()


async def wait_log(path: Path, event: str, process: subprocess.Popen[bytes],
                   timeout: float = 60) -> dict[str, Any]:
    async def seen() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"worker exited ({process.returncode}) before {event}:\n"
                                 + tail(path))
        return bool(log_events(path, event))

    await wait_for(seen, timeout=timeout, interval=0.1, what=f"log event {event}")
    return log_events(path, event)[0]


def kill(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    return process.wait(timeout=30)


async def test_psi_trigger_flushes_progress_and_a_killed_phase_resumes_elsewhere(
        settings, sandbox, big_file, tmp_path):
    gate = str(tmp_path / "gate")
    log_a = tmp_path / "worker-a.log"
    worker_a = sandbox.spawn_worker(settings, modules=MODULES, log_path=log_a, extra_env={
        # Isolate the PSI path: no headroom or memory.events flushes in this test.
        "PHASEGATE_WATCHDOG_HEADROOM_RATIO": "1.0",
        "PHASEGATE_WATCHDOG_RELEASE_HEADROOM_RATIO": "1.0",
        "PHASEGATE_WATCHDOG_MEMORY_EVENTS": "",
        "PHASEGATE_WATCHDOG_RELEASE_AFTER_S": "600"})
    started = await wait_log(log_a, "watchdog_started", worker_a)
    assert started["v2_dir"] == str(sandbox.v2_dir), "the worker found its own cgroup"
    assert started["psi_trigger"] is True, "PSI trigger registration (2 s window) works here"
    await wait_log(log_a, "worker_ready", worker_a)
    # Leave little room above what the idle worker uses: the file's page cache must be
    # reclaimed over and over, which PSI counts as memory stall.
    sandbox.set_limit(sandbox.usage() + 32 * MiB)

    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        run = await start_workflow(store, queue, workflow=workflows_pressure.pressure,
                                   input={"file": big_file, "gate": gate})
    wid = run.workflow_id

    async def emergency_saved() -> bool:
        if worker_a.poll() is not None:
            raise AssertionError("worker A died before its flush:\n" + tail(log_a))
        rows = await fetch(settings.database_url, "SELECT 1 FROM checkpoints WHERE "
                           "workflow_id = $1 AND kind = 'emergency'", wid)
        return bool(rows)

    await wait_for(emergency_saved, timeout=90, interval=0.1, what="emergency checkpoint")
    flush = (await wait_log(log_a, "emergency_flush", worker_a))
    assert flush["reason"] == "psi_trigger"
    assert flush["checkpoints"] == 1

    # The run did not move: the emergency checkpoint sits at the running phase's seq.
    runs = await fetch(settings.database_url,
                       "SELECT next_seq, status FROM workflow_runs WHERE workflow_id = $1", wid)
    assert (runs[0]["next_seq"], runs[0]["status"]) == (0, "running")

    assert kill(worker_a) == -signal.SIGKILL
    saved = await fetch(settings.database_url,
                        "SELECT seq, phase, state::text FROM checkpoints WHERE workflow_id = $1 "
                        "AND kind = 'emergency' ORDER BY checkpoint_id DESC LIMIT 1", wid)
    assert (saved[0]["seq"], saved[0]["phase"]) == (0, "scan")
    saved_chunks = json.loads(saved[0]["state"])["chunks"]
    assert saved_chunks > 0

    # Another worker (no cgroup, no pressure) picks the phase up from the saved progress.
    open_gate(gate)
    log_b = tmp_path / "worker-b.log"
    worker_b = spawn_logged_worker(settings, modules=MODULES, log_path=log_b)
    try:
        await wait_for(lambda: all_done(settings.database_url, [wid]), timeout=90,
                       what="run completed on worker B")
    finally:
        kill(worker_b)

    notes = [r["note"] for r in await fetch(
        settings.database_url, "SELECT note FROM test_invocations WHERE workflow_id = $1 "
        "AND phase = 'scan' ORDER BY id", wid)]
    assert notes == ["start:0", f"start:{saved_chunks}"], "resumed, not from scratch"
    final = await fetch(settings.database_url,
                        "SELECT state::text FROM checkpoints WHERE workflow_id = $1 "
                        "AND kind = 'phase' AND seq = 0", wid)
    state = json.loads(final[0]["state"])
    assert state["resumed_from"] == saved_chunks and state["chunks"] >= saved_chunks


async def test_heap_spike_is_oom_killed_without_warning_and_the_run_loses_nothing(
        settings, sandbox, tmp_path):
    log_a = tmp_path / "worker-a.log"
    worker_a = sandbox.spawn_worker(settings, modules=MODULES, log_path=log_a)
    await wait_log(log_a, "worker_ready", worker_a)
    limit = sandbox.usage() + 64 * MiB
    sandbox.set_limit(limit)
    kills_before = sandbox.oom_kills()

    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        run = await start_workflow(store, queue, workflow=workflows_pressure.spike,
                                   input={"spike_mb": 512, "items": 50})
    wid = run.workflow_id

    async def killed() -> bool:
        return worker_a.poll() is not None

    await wait_for(killed, timeout=90, what="worker A OOM-killed by the kernel")
    assert worker_a.returncode == -signal.SIGKILL
    assert sandbox.oom_kills() > kills_before, "the kernel's OOM killer, not something else"
    # Whatever the watchdog managed (usually nothing: a spike gives no PSI warning), the run
    # is still exactly at its last phase checkpoint.
    runs = await fetch(settings.database_url,
                       "SELECT next_seq, current_phase FROM workflow_runs WHERE workflow_id = $1",
                       wid)
    assert (runs[0]["next_seq"], runs[0]["current_phase"]) == (1, "grow")
    flushes = log_events(log_a, "emergency_flush")
    print(f"flushes before the OOM kill: {[f['reason'] for f in flushes]}")

    log_b = tmp_path / "worker-b.log"
    worker_b = spawn_logged_worker(settings, modules=MODULES, log_path=log_b)
    try:
        await wait_for(lambda: all_done(settings.database_url, [wid]), timeout=90,
                       what="run completed on worker B")
    finally:
        kill(worker_b)

    calls = [(r["phase"], r["seq"]) for r in await fetch(
        settings.database_url, "SELECT phase, seq FROM test_invocations WHERE workflow_id = $1 "
        "ORDER BY id", wid)]
    assert calls == [("prepare", 0), ("grow", 1), ("grow", 1), ("finish", 2)], \
        "prepare ran once: the killed phase restarted from the last checkpoint"
    rows = await fetch(settings.database_url, "SELECT seq, kind, state::text FROM checkpoints "
                       "WHERE workflow_id = $1 AND kind = 'phase' ORDER BY seq", wid)
    assert [r["seq"] for r in rows] == [0, 1, 2]
    final = json.loads(rows[-1]["state"])
    assert final["prepared"] == [f"item-{i}" for i in range(50)]
    assert final["spiked_bytes"] == 512 * MiB and final["finished"] is True
