"""The deletion cost itself and the updater's rules: patch only on change, never raise."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from phasegate.worker.deletion_cost import ANNOTATION, MAX_COST, DeletionCostUpdater, deletion_cost


def test_idle_is_lowest_and_long_uncommitted_work_highest():
    assert deletion_cost([]) == 0
    assert deletion_cost([0.2]) == 1, "any running phase costs more than idle"
    assert deletion_cost([30.5, 90.0]) == 121
    assert deletion_cost([1e12]) == MAX_COST, "capped at the annotation's int32 limit"
    assert deletion_cost([3.0]) < deletion_cost([300.0])


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.fail: Exception | None = None

    def __call__(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        if self.fail is not None:
            raise self.fail
        self.calls.append((name, namespace, body))


async def test_patches_only_when_the_cost_changes_and_survives_failures():
    work: list[float] = []
    patcher = Recorder()
    updater = DeletionCostUpdater(pod_name="pg-worker-abc", namespace="jobs", interval_s=10,
                                  uncommitted=lambda: work, patcher=patcher)
    assert await updater.update_once()
    assert patcher.calls == [("pg-worker-abc", "jobs",
                              {"metadata": {"annotations": {ANNOTATION: "0"}}})]
    assert not await updater.update_once(), "unchanged: no patch"
    work.append(42.0)
    patcher.fail = ConnectionError("apiserver unreachable")
    with capture_logs() as logs:
        assert not await updater.update_once()
        assert not await updater.update_once()
    assert [e["event"] for e in logs] == ["deletion_cost_failed"], "said once per failure kind"
    assert updater.last_cost == 0, "a failed patch is retried on the next round"
    patcher.fail = None
    assert await updater.update_once()
    assert patcher.calls[-1][2] == {"metadata": {"annotations": {ANNOTATION: "43"}}}


async def test_a_broken_cost_source_is_reported_not_raised():
    def broken() -> list[float]:
        raise RuntimeError("bug")

    updater = DeletionCostUpdater(pod_name="p", namespace="n", interval_s=10,
                                  uncommitted=broken, patcher=Recorder())
    with capture_logs() as logs:
        assert not await updater.update_once()
    assert logs[0]["stage"] == "cost"


@pytest.mark.parametrize("missing", ["pod_name", "pod_namespace"])
def test_off_without_the_downward_api_names(missing, monkeypatch):
    from phasegate.settings import Settings
    from phasegate.worker.deletion_cost import updater_from_settings

    values = {"deletion_cost": True, "pod_name": "p", "pod_namespace": "n", missing: None}
    settings = Settings(**values)
    with capture_logs() as logs:
        assert updater_from_settings(settings, list, patcher=Recorder()) is None
    assert logs[0]["event"] == "deletion_cost_off"
    assert updater_from_settings(Settings(deletion_cost=False), list) is None
