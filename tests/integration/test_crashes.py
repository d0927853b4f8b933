"""Worker processes killed and stopped mid-phase: nothing lost, nothing committed twice."""

from __future__ import annotations

import signal

import pytest

from phasegate.orchestrator.starter import start_workflow
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import (
    all_done,
    fetch,
    fetchval,
    queue_for,
    running_worker,
    spawn_worker,
    stop_process,
    store_for,
    wait_for,
)

pytestmark = pytest.mark.slow


async def _start_gated(settings, gate: str) -> str:
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        return (await start_workflow(store, queue, workflow=workflows.gated,
                                     input={"gate": gate})).workflow_id


async def _invocations(settings, phase: str) -> int:
    return int(await fetchval(settings.database_url,
                              "SELECT count(*) FROM test_invocations WHERE phase = $1", phase))


async def test_sigkilled_worker_mid_phase_is_resumed_by_another(settings):
    wid = await _start_gated(settings, "kill-gate")
    victim = spawn_worker(settings)
    try:
        await wait_for(lambda: _has(settings, "held", 1), what="phase `held` running")
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(timeout=30) == -9
    finally:
        stop_process(victim)
    await _open_gate(settings, "kill-gate")
    # The lease of the killed worker expires (visibility timeout 3 s); another worker resumes.
    async with running_worker(settings, Registry([workflows.gated])):
        await wait_for(lambda: all_done(settings.database_url, [wid]), timeout=60,
                       what="run completed after the kill")
    assert await _invocations(settings, "held") == 2  # the killed attempt + the resumed one
    assert await _invocations(settings, "before") == 1  # committed work is never redone
    rows = await fetch(settings.database_url, "SELECT seq, phase FROM checkpoints "
                       "WHERE kind = 'phase' ORDER BY seq")
    assert [(r["seq"], r["phase"]) for r in rows] == [(0, "before"), (1, "held"), (2, "after")]


async def _has(settings, phase: str, n: int) -> bool:
    return await _invocations(settings, phase) >= n


async def _open_gate(settings, name: str) -> None:
    await fetch(settings.database_url, "INSERT INTO test_gates VALUES ($1)", name)


async def test_sigterm_mid_phase_hands_back_and_another_worker_finishes(settings):
    """Grace shorter than the phase: SIGTERM stops receiving, waits the grace, hands the
    message back with visibility 0 and exits 0; another worker runs it at once."""
    wid = await _start_gated(settings, "term-gate")
    first = spawn_worker(settings, extra_env={"PHASEGATE_SHUTDOWN_GRACE_S": "0.5",
                                              "PHASEGATE_VISIBILITY_TIMEOUT_S": "60",
                                              "PHASEGATE_HEARTBEAT_S": "5"})
    try:
        await wait_for(lambda: _has(settings, "held", 1), what="phase `held` running")
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
        stderr = first.stderr.read().decode() if first.stderr else ""
        assert "handed_back" in stderr
    finally:
        stop_process(first)
    await _open_gate(settings, "term-gate")
    # Visibility 60 s would strand the message for a minute; handed back, it runs now.
    async with running_worker(settings, Registry([workflows.gated])):
        await wait_for(lambda: all_done(settings.database_url, [wid]), timeout=20,
                       what="run completed on the second worker well before 60 s")
    assert await fetchval(settings.database_url,
                          "SELECT count(*) FROM checkpoints WHERE kind = 'phase'") == 3


async def test_sigterm_lets_a_running_phase_finish_within_the_grace(settings):
    wid = await _start_gated(settings, "drain-gate")
    worker = spawn_worker(settings, extra_env={"PHASEGATE_SHUTDOWN_GRACE_S": "60"})
    try:
        await wait_for(lambda: _has(settings, "held", 1), what="phase `held` running")
        worker.send_signal(signal.SIGTERM)
        await _open_gate(settings, "drain-gate")
        assert worker.wait(timeout=60) == 0
    finally:
        stop_process(worker)
    # The drained phase committed; it was not handed back and not run twice.
    assert await fetchval(settings.database_url, "SELECT next_seq FROM workflow_runs "
                          "WHERE workflow_id = $1", wid) == 2
    assert await _invocations(settings, "held") == 1


async def test_phase_longer_than_visibility_timeout_is_not_redelivered(settings):
    """A 3 s lease and an 8 s phase: the heartbeat keeps the message invisible, so a second
    worker polling the same queue never receives it."""
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        wid = (await start_workflow(store, queue, workflow=workflows.slow,
                                    input={"seconds": 8})).workflow_id
    registry = Registry([workflows.slow])
    async with running_worker(settings, registry), running_worker(settings, registry) as w2:
        await wait_for(lambda: all_done(settings.database_url, [wid]), timeout=60,
                       what="slow run completed")
        assert w2.receive_calls > 1
    assert await _invocations(settings, "long") == 1
