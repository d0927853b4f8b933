"""The watchdog thread on a cgroup tree the test writes: events reach the loop only through
call_soon_threadsafe, pressure and release follow the hysteresis, the settings validate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from phasegate.worker import cgroups, watchdog
from phasegate.worker.cgroups import CgroupPaths
from phasegate.worker.watchdog import PressureEvent, Watchdog, WatchdogSettings
from tests.helpers import wait_for

SETTINGS = WatchdogSettings(psi_trigger=False, sample_interval_s=0.01, psi_window_us=500_000,
                            psi_stall_us=50_000, release_after_s=0.1, reflush_interval_s=60)


def tree(tmp_path: Path) -> CgroupPaths:
    (tmp_path / "cgroup.procs").write_text("1\n")
    (tmp_path / "memory.max").write_text("1000\n")
    (tmp_path / "memory.current").write_text("100\n")
    (tmp_path / "memory.events").write_text("high 0\nmax 0\n")
    write_psi(tmp_path, 0)
    return CgroupPaths("unified", tmp_path, None, None, tmp_path / "memory.pressure", None)


def write_psi(directory: Path, total: int, avg10: float = 0.0) -> None:
    (directory / "memory.pressure").write_text(
        f"some avg10={avg10:.2f} avg60=0.00 avg300=0.00 total={total}\n")


async def next_event(events: asyncio.Queue[PressureEvent]) -> PressureEvent:
    return await asyncio.wait_for(events.get(), timeout=10)


async def run_watchdog(settings: WatchdogSettings, paths: CgroupPaths,
                       ) -> tuple[Watchdog, asyncio.Queue[PressureEvent]]:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[PressureEvent] = asyncio.Queue()
    owner = threading_ident()

    def on_loop(event: PressureEvent) -> None:
        assert threading_ident() == owner, "delivered on the loop thread"
        events.put_nowait(event)

    thread = Watchdog(settings, paths, loop, on_loop)
    thread.start()
    # The first sample is the baseline stall deltas are measured against.
    async def sampled() -> bool:
        return thread.samples > 0 or not thread.is_alive()

    await wait_for(sampled, timeout=10, interval=0.005, what="first sample")
    return thread, events


def threading_ident() -> int:
    import threading

    return threading.get_ident()


async def test_polled_stall_budget_fires_once_then_releases(tmp_path):
    paths = tree(tmp_path)
    thread, events = await run_watchdog(SETTINGS, paths)
    try:
        assert thread.daemon and thread.is_alive()
        write_psi(tmp_path, 120_000)
        event = await next_event(events)
        assert (event.kind, event.reason) == ("pressure", "psi_poll")
        assert event.detail["stall_us"] == 120_000
        # No new stall: after the window and release_after_s, one release and nothing else.
        event = await next_event(events)
        assert event.kind == "release"
        assert events.empty()
    finally:
        thread.stop()
    assert not thread.is_alive()


async def test_avg10_alone_fires_the_polling_fallback(tmp_path):
    paths = tree(tmp_path)
    thread, events = await run_watchdog(SETTINGS, paths)
    try:
        write_psi(tmp_path, 0, avg10=25.0)
        event = await next_event(events)
        assert (event.reason, event.detail["avg10"]) == ("psi_poll", 25.0)
    finally:
        thread.stop()


async def test_headroom_and_memory_events(tmp_path):
    paths = tree(tmp_path)
    settings = SETTINGS.model_copy(update={"memory_events": "high,max"})
    thread, events = await run_watchdog(settings, paths)
    try:
        (tmp_path / "memory.events").write_text("high 3\nmax 0\n")
        event = await next_event(events)
        assert (event.reason, event.detail["increment"]) == ("memory_high", 3)
        # Still under pressure: further signals do not re-send within reflush_interval_s.
        (tmp_path / "memory.current").write_text("950\n")
        (tmp_path / "memory.current").write_text("100\n")
        event = await next_event(events)
        assert event.kind == "release"
        (tmp_path / "memory.current").write_text("950\n")
        event = await next_event(events)
        assert (event.reason, event.detail["ratio"]) == ("headroom", 0.95)
    finally:
        thread.stop()


async def test_a_bug_in_the_thread_is_reported_to_the_loop(tmp_path, monkeypatch):
    def broken(paths: CgroupPaths) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(cgroups, "read_cpu", broken)
    thread, events = await run_watchdog(SETTINGS, tree(tmp_path))
    event = await next_event(events)
    assert (event.kind, event.reason) == ("crashed", "ValueError: boom")
    thread.stop()


async def test_psi_trigger_registration_refused_falls_back_to_polling(tmp_path):
    """On the real memory.pressure: a 1 s window is refused without CAP_SYS_RESOURCE."""
    paths = cgroups.discover()
    if paths.memory_pressure is None:
        pytest.skip(f"no PSI on this host ({paths.layout})")
    loop = asyncio.get_running_loop()
    bad = WatchdogSettings(psi_window_us=1_000_000, psi_stall_us=100_000)
    refused = Watchdog(bad, paths, loop, lambda e: None)
    try:
        registered = refused.register_trigger()
    finally:
        refused.stop()
    good = Watchdog(WatchdogSettings(), paths, loop, lambda e: None)
    try:
        assert good.register_trigger(), "a 2 s window is accepted"
    finally:
        good.stop()
    if registered:
        pytest.skip("this process has CAP_SYS_RESOURCE: any window is accepted")


async def test_standing_down_without_psi(tmp_path):
    none = CgroupPaths("legacy", None, None, None, None, None)
    assert watchdog.start_watchdog(SETTINGS, asyncio.get_running_loop(), lambda e: None,
                                   paths=none) is None
    disabled = SETTINGS.model_copy(update={"enabled": False})
    assert watchdog.start_watchdog(disabled, asyncio.get_running_loop(), lambda e: None,
                                   paths=tree(tmp_path)) is None
    assert watchdog.AVAILABLE._value.get() == 0


def v1_tree(directory: Path, usage: int, limit: int = 1000) -> CgroupPaths:
    """A container's view on a cgroup v1 host: the v1 memory controller, no cgroup2, no PSI."""
    (directory / "cgroup.procs").write_text("1\n")
    (directory / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (directory / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (directory / "memory.stat").write_text("total_inactive_file 50\n")
    (directory / "memory.failcnt").write_text("0\n")
    return CgroupPaths("legacy", None, directory, None, None, None)


async def test_cgroup_v1_without_psi_runs_on_headroom_alone(tmp_path):
    paths = v1_tree(tmp_path, usage=300)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[PressureEvent] = asyncio.Queue()
    with capture_logs() as logs:
        thread = watchdog.start_watchdog(SETTINGS, loop, events.put_nowait, paths=paths)
    assert thread is not None, "a v1 memory limit is enough to watch headroom"
    try:
        assert [e["event"] for e in logs] == ["watchdog_headroom_only"]
        assert watchdog.AVAILABLE._value.get() == 1
        # usage 1000 - inactive file 50 = 950 of a 1000-byte limit: over the 0.90 line.
        (tmp_path / "memory.usage_in_bytes").write_text("1000\n")
        event = await next_event(events)
        assert (event.kind, event.reason, event.detail["ratio"]) == ("pressure", "headroom",
                                                                     0.95)
        assert watchdog.WORKING_SET._value.get() == 950
        assert watchdog.MEMORY_LIMIT._value.get() == 1000
    finally:
        thread.stop()


async def test_cgroup_v1_without_a_limit_still_stands_down(tmp_path):
    paths = v1_tree(tmp_path, usage=300, limit=cgroups.V1_UNLIMITED)
    with capture_logs() as logs:
        started = watchdog.start_watchdog(SETTINGS, asyncio.get_running_loop(),
                                          lambda e: None, paths=paths)
    assert started is None
    assert [e["event"] for e in logs] == ["watchdog_standing_down"]
    assert watchdog.AVAILABLE._value.get() == 0


def test_settings_from_env_and_validation(monkeypatch):
    monkeypatch.setenv("PHASEGATE_WATCHDOG_PSI_STALL_US", "100000")
    monkeypatch.setenv("PHASEGATE_WATCHDOG_ENABLED", "false")
    loaded = WatchdogSettings()
    assert (loaded.psi_stall_us, loaded.enabled) == (100_000, False)
    with pytest.raises(ValueError, match="psi_stall_us"):
        WatchdogSettings(psi_stall_us=3_000_000, psi_window_us=2_000_000)
    with pytest.raises(ValueError, match="memory_events"):
        WatchdogSettings(memory_events="high,oom")
    with pytest.raises(ValueError, match="release_headroom_ratio"):
        WatchdogSettings(headroom_ratio=0.7, release_headroom_ratio=0.8)
    assert WatchdogSettings(memory_events="").memory_event_triggers == frozenset()
    assert WatchdogSettings().psi_window_us % watchdog.PSI_UNPRIVILEGED_WINDOW_STEP_US == 0
