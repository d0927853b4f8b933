"""The worked example of docs/concepts/inside-a-phase.md (worker/examples/agent.py) runs as
documented against the fake external API, real PostgreSQL and a real SQS server."""

from __future__ import annotations

from phasegate.steps import delivery_key, idempotency_key
from phasegate.worker.examples import agent
from phasegate.workflow import Registry
from tests.helpers import all_done, fetch, running_worker, wait_for
from tests.room_helpers import api_fixture, checkpoints, settings_fixture, start  # noqa: F401


async def test_the_support_agent_example(settings, api, monkeypatch):
    monkeypatch.setenv("AGENT_API_URL", api.url)
    wid = await start(settings, agent.agent, {"ticket_id": "T-1", "batch": "daily-1",
                                              "skim": True})
    async with running_worker(settings, Registry([agent.agent])):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="completed")
    rows = await checkpoints(settings, wid)
    assert [(r["phase"], r["tier"], r["tier_label"], r["outcome"]) for r in rows] == [
        ("triage", 0, None, "retry"),            # skimmed: not understood, so tried again
        ("triage", 1, "understood", None),
        ("reply", 2, "replied", None),
        ("report", 3, "reported", None)]
    assert rows[3]["resources"] == [{"type": "ticket", "id": "T-1", "version": "v1"}]
    stats = api.stats()
    reply_key, report_key = idempotency_key(wid, "main", 2, 1), delivery_key(wid, "daily-1",
                                                                            "T-1")
    assert stats["calls_by_key"] == {reply_key: 1, report_key: 1}
    assert [e["kind"] for e in stats["effects"]] == ["reply", "report"]
    ledger = await fetch(settings.database_url, "SELECT batch_id, artifact_id FROM deliveries "
                         "WHERE workflow_id = $1 ORDER BY artifact_id", wid)
    assert [(r["batch_id"], r["artifact_id"]) for r in ledger] == [("daily-1", ""),
                                                                    ("daily-1", "T-1")]
