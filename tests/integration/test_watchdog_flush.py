"""The emergency flush end to end in-process, against real PostgreSQL and SQS, with the
watchdog reading a cgroup tree the test writes (so pressure comes and goes on cue).

Real kernel pressure is in test_watchdog_pressure.py; this file pins the loop side: what
gets committed, what gets handed back, concurrency and its hysteresis, standing down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from phasegate.orchestrator.starter import start_workflow
from phasegate.worker import cgroups
from phasegate.worker.cgroups import CgroupPaths
from phasegate.worker.runtime import Worker
from phasegate.worker.watchdog import WatchdogSettings
from phasegate.workflow import Registry
from tests import workflows, workflows_pressure
from tests.helpers import (
    all_done,
    fetch,
    fetchval,
    make_settings,
    queue_for,
    running_worker,
    send_raw,
    store_for,
    wait_for,
)

pytestmark = pytest.mark.asyncio

REGISTRY_ = Registry([workflows_pressure.progressive])
FAST_WATCHDOG = WatchdogSettings(psi_trigger=False, sample_interval_s=0.02,
                                 psi_window_us=500_000, psi_stall_us=50_000,
                                 release_after_s=0.2, reflush_interval_s=60,
                                 reduced_concurrency=1)


class FakeCgroup:
    """A cgroup v2 directory the test writes; the watchdog polls it like the real one."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "cg"
        self.dir.mkdir()
        (self.dir / "cgroup.procs").write_text("1\n")
        (self.dir / "memory.max").write_text(f"{100 << 20}\n")
        (self.dir / "memory.stat").write_text("inactive_file 0\n")
        (self.dir / "memory.events").write_text("high 0\nmax 0\noom_kill 0\n")
        self.total_us = 0
        self.set_pressure(0)
        self.set_usage(10 << 20)
        self.paths = CgroupPaths("unified", self.dir, None, None, self.dir / "memory.pressure",
                                 None)

    def set_pressure(self, add_stall_us: int) -> None:
        self.total_us += add_stall_us
        (self.dir / "memory.pressure").write_text(
            f"some avg10=0.00 avg60=0.00 avg300=0.00 total={self.total_us}\n"
            f"full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")

    def set_usage(self, usage: int) -> None:
        (self.dir / "memory.current").write_text(f"{usage}\n")


@pytest.fixture
def fake_cgroup(tmp_path, monkeypatch):
    fake = FakeCgroup(tmp_path)
    monkeypatch.setattr(cgroups, "discover", lambda *a, **k: fake.paths)
    return fake


@pytest.fixture
def settings(database_url, queue_pair, sqs_endpoint):
    workflows.LEDGER_DSN = database_url
    return make_settings(database_url, queue_pair, sqs_endpoint, concurrency=4)


def flushes(reason: str) -> float:
    return REGISTRY.get_sample_value("phasegate_emergency_flush_total", {"reason": reason}) or 0


async def progress_published(worker: Worker) -> bool:
    """The phase is running and has published its three progress steps."""
    phases = list(worker.transition.running.values()) if worker.transition else []
    return bool(phases) and phases[0].ctx.latest_progress[0] == 3


async def test_flush_saves_progress_sheds_prefetched_and_restores_after_release(
        settings, fake_cgroup):
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        run = await start_workflow(store, queue, workflow=workflows_pressure.progressive,
                                   input={"gate": "g1"})
    wid = run.workflow_id
    # A second message of the same group, behind the running one: received in the same
    # batch, held by the worker but not started (it will turn out to be a duplicate).
    await send_raw(settings, {"v": 1, "kind": "start", "workflow_id": wid,
                              "workflow": "progressive", "input": {"gate": "g1"}}, group=wid)
    before = flushes("psi_poll")
    worker = Worker(settings=settings, registry=REGISTRY_, watchdog_settings=FAST_WATCHDOG)
    async with running_worker_of(worker):
        await wait_for(lambda: progress_published(worker), what="phase progress")
        # Counted from the running phases when scraped (metrics.count_running).
        assert REGISTRY.get_sample_value("phasegate_phases_in_flight") == 1
        await wait_for(lambda: _true(worker.held == 2), timeout=10,
                       what="both messages of the group held in one batch")
        fake_cgroup.set_pressure(200_000)
        await wait_for(lambda: _true(flushes("psi_poll") > before), what="flush", timeout=10)

        rows = await fetch(settings.database_url, "SELECT seq, phase, state::text FROM "
                           "checkpoints WHERE workflow_id = $1 AND kind = 'emergency'", wid)
        assert [(r["seq"], r["phase"], r["state"]) for r in rows] == [(0, "work",
                                                                        '{"step": 3}')]
        assert await fetchval(settings.database_url, "SELECT next_seq FROM workflow_runs "
                              "WHERE workflow_id = $1", wid) == 0
        assert worker.held == 1, "the unstarted message was handed back"
        assert worker.concurrency_limit == 1
        async with queue_for(settings) as queue:
            async def one_back_one_held() -> bool:
                depth = await queue.depth()
                return (depth.visible, depth.inflight) == (1, 1)

            # SQS's counts are approximate and trail the change-visibility call.
            await wait_for(one_back_one_held, timeout=15,
                           what="one message handed back, the running one in flight")

        # Pressure stays away for release_after_s: concurrency comes back.
        await wait_for(lambda: _true(worker.concurrency_limit == settings.concurrency),
                       what="release")
        async with store_for(settings.database_url) as store:
            await store.pool.execute("INSERT INTO test_gates VALUES ('g1')")
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="run completed")
        assert REGISTRY.get_sample_value("phasegate_phases_in_flight") == 0
    final = await fetch(settings.database_url, "SELECT state::text FROM checkpoints "
                        "WHERE workflow_id = $1 AND kind = 'phase' AND seq = 0", wid)
    assert '"resumed": null' in final[0]["state"], "the phase itself never restarted"


async def test_headroom_flush_lowers_concurrency_until_usage_falls(settings, fake_cgroup):
    before = flushes("headroom")
    worker = Worker(settings=settings, registry=REGISTRY_, watchdog_settings=FAST_WATCHDOG)
    async with running_worker_of(worker):
        fake_cgroup.set_usage(95 << 20)  # 95 % of memory.max
        await wait_for(lambda: _true(flushes("headroom") > before), what="headroom flush")
        assert worker.concurrency_limit == 1
        assert REGISTRY.get_sample_value("phasegate_memory_pressure_active") == 1
        fake_cgroup.set_usage(85 << 20)  # below 90 % but above the 80 % release line
        fake_cgroup.set_usage(50 << 20)
        await wait_for(lambda: _true(worker.concurrency_limit == settings.concurrency),
                       what="release below 80 %")
        assert REGISTRY.get_sample_value("phasegate_memory_pressure_active") == 0


async def test_watchdog_state_changes_reach_the_fleet_page_at_once(settings, fake_cgroup):
    """The presence row follows the watchdog without waiting for its interval (an hour here,
    so only the state changes can have written it): pressure, then ok after the release."""
    hourly = settings.model_copy(update={"presence_interval_s": 3600.0,
                                         "presence_retention_s": 7200.0})
    worker = Worker(settings=hourly, registry=REGISTRY_, watchdog_settings=FAST_WATCHDOG)

    async def presence_is(state: str, flushes: int) -> bool:
        rows = await fetch(settings.database_url, "SELECT watchdog, flushes, last_flush_at, "
                           "concurrency FROM worker_presence")
        return bool(rows) and (rows[0]["watchdog"], rows[0]["flushes"]) == (state, flushes)

    async with running_worker_of(worker):
        await wait_for(lambda: presence_is("ok", 0), what="the first report, at start")
        fake_cgroup.set_usage(95 << 20)
        await wait_for(lambda: presence_is("pressure", 1), what="pressure reported at once")
        row = (await fetch(settings.database_url, "SELECT last_flush_at, concurrency "
                           "FROM worker_presence"))[0]
        assert row["last_flush_at"] is not None and row["concurrency"] == 1
        fake_cgroup.set_usage(50 << 20)
        await wait_for(lambda: presence_is("ok", 1), what="the release reported at once")


async def test_without_cgroup_v2_the_watchdog_says_so_once_and_stands_down(
        settings, monkeypatch):
    legacy = CgroupPaths("legacy", None, None, None, None, None)
    monkeypatch.setattr(cgroups, "discover", lambda *a, **k: legacy)
    with capture_logs() as logs:
        async with running_worker(settings, REGISTRY_) as worker:
            assert worker.ready
    standing_down = [e for e in logs if e["event"] == "watchdog_standing_down"]
    assert len(standing_down) == 1 and standing_down[0]["layout"] == "legacy"
    assert REGISTRY.get_sample_value("phasegate_watchdog_available") == 0


async def test_a_crashed_watchdog_thread_stops_the_worker_loudly(settings, fake_cgroup,
                                                                 monkeypatch):
    def broken(paths: CgroupPaths) -> None:
        raise ValueError("unexpected cpu.stat")

    monkeypatch.setattr(cgroups, "read_cpu", broken)
    worker = Worker(settings=settings, registry=REGISTRY_, watchdog_settings=FAST_WATCHDOG)
    with pytest.raises(RuntimeError, match="emergency"):
        await worker.run()


async def _true(value: bool) -> bool:
    return value


@asynccontextmanager
async def running_worker_of(worker: Worker) -> AsyncIterator[Worker]:
    """Like helpers.running_worker, for a Worker built here (custom watchdog settings)."""
    task = asyncio.create_task(worker.run())

    async def ready() -> bool:
        if task.done():
            task.result()
        return worker.ready

    try:
        await wait_for(ready, timeout=30, what="worker ready")
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=60)
