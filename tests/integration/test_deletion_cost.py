"""Checkpoint-aware scale-in through the real ``kubernetes`` client against a local stand-in
of the API server (no kube-apiserver can run here): a worker running a phase raises its pod's
deletion cost, lowers it to 0 when idle again, and a failing API server changes nothing about
the phases."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from phasegate.envelope import start_message
from phasegate.settings import Settings
from phasegate.worker.deletion_cost import ANNOTATION, kubernetes_patcher
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import all_done, fetch, running_worker, send_raw, wait_for
from tests.json_server import JsonServer

POD_PATH = "/api/v1/namespaces/jobs/pods/pg-worker-7d9f-x2"
POD = {"kind": "Pod", "apiVersion": "v1",
       "metadata": {"name": "pg-worker-7d9f-x2", "namespace": "jobs"}}


class PodApi(JsonServer):
    def __init__(self) -> None:
        self.status = 200
        super().__init__(self.respond)

    def respond(self, path: str, headers: Any) -> tuple[int, dict[str, Any]]:
        if self.status != 200:
            return self.status, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                 "code": self.status}
        return (200, POD) if path == POD_PATH else (404, {"kind": "Status", "code": 404})

    def costs(self) -> list[str]:
        return [body["metadata"]["annotations"][ANNOTATION]
                for path, _, body in self.patches if path == POD_PATH]


@pytest.fixture
def api() -> Iterator[PodApi]:
    with PodApi() as server:
        yield server


def worker_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"deletion_cost": True, "deletion_cost_interval_s": 1.0,
                                       "pod_name": "pg-worker-7d9f-x2", "pod_namespace": "jobs"})


async def test_busy_pod_costs_more_and_idle_pod_returns_to_zero(settings, api, monkeypatch):
    monkeypatch.setattr("phasegate.worker.deletion_cost.kubernetes_patcher",
                        lambda: kubernetes_patcher(host=api.url, token="t"))
    workflows.LEDGER_DSN = settings.database_url
    wid, gate = f"dc-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    async with running_worker(worker_settings(settings), Registry([workflows.gated])):
        await wait_for(lambda: _true(api.costs()[:1] == ["0"]), what="idle cost 0")
        await send_raw(settings, start_message(wid, "gated", {"gate": gate}).to_json(),
                       group=wid)
        await wait_for(lambda: _true(any(int(c) > 1 for c in api.costs())), timeout=30,
                       what="a running phase raised the cost")
        await fetch(settings.database_url, "INSERT INTO test_gates VALUES ($1)", gate)
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="run completed")
        await wait_for(lambda: _true(api.costs()[-1] == "0"), timeout=30,
                       what="idle again: cost back to 0")
    _, content_type, _ = api.patches[0]
    assert content_type is not None and "merge-patch+json" in content_type


async def test_a_failing_api_server_never_affects_phases(settings, api, monkeypatch):
    monkeypatch.setattr("phasegate.worker.deletion_cost.kubernetes_patcher",
                        lambda: kubernetes_patcher(host=api.url, token="t"))
    api.status = 403
    workflows.LEDGER_DSN = settings.database_url
    ids = [f"dcf-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    async with running_worker(worker_settings(settings), Registry([workflows.chain])) as worker:
        for wid in ids:
            await send_raw(settings, start_message(wid, "chain", {"n": 1}).to_json(), group=wid)
        await wait_for(lambda: all_done(settings.database_url, ids), what="runs completed")
        assert worker.ready
    assert api.patches, "it kept trying"


async def _true(value: bool) -> bool:
    return value
