"""What a worker reports of its watchdog (worker/emergency.py ``state``): each change is told
to the presence reporter as it happens, including the flush in progress."""

from __future__ import annotations

import pytest

from phasegate.settings import Settings, SettingsError, load_settings
from phasegate.worker.emergency import EmergencyController
from phasegate.worker.runtime import Worker
from phasegate.worker.watchdog import PressureEvent, WatchdogSettings
from phasegate.workflow import Registry


async def test_the_controller_reports_flushing_pressure_and_ok_as_they_happen() -> None:
    worker = Worker(settings=Settings(), registry=Registry([]))
    controller = EmergencyController(worker, WatchdogSettings(reduced_concurrency=1))
    seen: list[str] = []
    controller.on_change = lambda: seen.append(controller.state)
    assert controller.state == "ok" and controller.last_flush_ago_s() is None
    await controller.flush(PressureEvent("pressure", "headroom"))
    assert seen == ["flushing", "pressure"] and controller.flushes == 1
    ago = controller.last_flush_ago_s()
    assert ago is not None and ago >= 0
    controller.release(PressureEvent("release", "calm"))
    assert seen == ["flushing", "pressure", "ok"] and controller.state == "ok"


def test_presence_settings_are_checked_together(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(presence_interval_s=0).presence_interval_s == 0  # off
    monkeypatch.setenv("PHASEGATE_PRESENCE_INTERVAL_S", "60")
    monkeypatch.setenv("PHASEGATE_PRESENCE_RETENTION_S", "100")
    with pytest.raises(SettingsError, match="at least twice"):
        load_settings()
    monkeypatch.setenv("PHASEGATE_PRESENCE_INTERVAL_S", "-1")
    with pytest.raises(SettingsError, match="PHASEGATE_PRESENCE_INTERVAL_S"):
        load_settings()
