"""Per-key concurrency end to end: a real worker process, real Postgres, moto over HTTP.

Twenty runs of one tenant with ``max_concurrency=2`` on a worker that could run six at once
never overlap more than two, measured from the times the runs recorded themselves (first
phase's start, last phase's end). Half are started through the API path (the run row first,
a start message without input), half by a producer's raw start message (input in the
message): the key is computed from the input either way.
"""

from __future__ import annotations

import json

import pytest

from phasegate.envelope import start_message
from phasegate.orchestrator.starter import StartError, start_workflow
from tests.helpers import (
    all_done,
    fetch,
    fetchval,
    queue_for,
    send_raw,
    spawn_worker,
    stop_process,
    store_for,
    wait_for,
)
from tests.workflows_flow import limited

pytestmark = pytest.mark.slow

RUNS = 20


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(t0, 1) for t0, _ in intervals] + [(t1, -1) for _, t1 in intervals],
                    key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def test_max_overlap_counts_what_it_should():
    assert max_overlap([(0, 2), (1, 3), (2.5, 4)]) == 2
    assert max_overlap([(0, 5), (1, 3), (2, 4)]) == 3
    assert max_overlap([(0, 1), (1, 2)]) == 1


async def test_twenty_runs_of_one_key_never_overlap_more_than_two(settings):
    settings = settings.model_copy(update={"concurrency": 6})
    ids: list[str] = []
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        for i in range(RUNS // 2):
            started = await start_workflow(store, queue, workflow=limited,
                                           input={"tenant": "acme", "i": i})
            ids.append(started.workflow_id)
    for i in range(RUNS // 2):
        wid = f"wf_raw_{i}"
        message = start_message(wid, "limited", {"tenant": "acme", "i": 100 + i})
        await send_raw(settings, message.to_json(), group=wid)
        ids.append(wid)
    worker = spawn_worker(settings, modules="tests.workflows_flow",
                          extra_env={"PHASEGATE_CONCURRENCY": "6"})
    try:
        await wait_for(lambda: all_done(settings.database_url, ids), timeout=150,
                       what=f"{RUNS} limited runs completed")
    finally:
        assert stop_process(worker) == 0
    rows = await fetch(settings.database_url,
                       "SELECT state::text AS state FROM checkpoints WHERE phase = 'finish' "
                       "AND workflow_id = ANY($1)", ids)
    intervals = [(s["t0"], s["t1"]) for s in (json.loads(r["state"]) for r in rows)]
    assert len(intervals) == RUNS
    assert max_overlap(intervals) <= 2
    # The limit was what held them back: most runs waited in the queue until another run's
    # end admitted them (with six phases at once possible, at least twelve had to wait).
    waited = await fetchval(settings.database_url, "SELECT count(*) FROM run_admissions "
                            "WHERE admitted_by <> workflow_id AND workflow_id = ANY($1)", ids)
    assert waited >= RUNS - 2 - 6


async def test_a_start_whose_key_cannot_be_computed_is_refused(settings):
    # The API refuses it before writing anything.
    async with store_for(settings.database_url) as store, queue_for(settings) as queue:
        with pytest.raises(StartError, match="concurrency_key of limited raised KeyError"):
            await start_workflow(store, queue, workflow=limited, input={"no": "tenant"},
                                 workflow_id="wf_api_bad")
    # A producer's start message: quarantined with the reason, no run row, worker unharmed.
    bad = start_message("wf_raw_bad", "limited", {"tenant_missing": "secret-value"})
    await send_raw(settings, bad.to_json(), group="wf_raw_bad")
    # No input and no run: the start without a key writes nothing ('unkeyed'), the input
    # read finds none, and the key cannot be computed from nothing.
    bare = start_message("wf_raw_none", "limited", None)
    await send_raw(settings, bare.to_json(), group="wf_raw_none")
    good = start_message("wf_raw_good", "limited", {"tenant": "acme", "work_s": 0})
    await send_raw(settings, good.to_json(), group="wf_raw_good")
    worker = spawn_worker(settings, modules="tests.workflows_flow")
    try:
        await wait_for(lambda: all_done(settings.database_url, ["wf_raw_good"]),
                       timeout=60, what="the good run completed")
        await wait_for(lambda: _quarantined(settings.database_url), timeout=30,
                       what="the bad start quarantined")
    finally:
        assert stop_process(worker) == 0
    reasons = dict((r["workflow_id"], r["reason"]) for r in await fetch(
        settings.database_url, "SELECT workflow_id, reason FROM quarantine "
        "WHERE workflow_id IN ('wf_raw_bad', 'wf_raw_none')"))
    assert reasons == {
        "wf_raw_bad": "concurrency_key: concurrency_key of limited raised KeyError",
        "wf_raw_none": "concurrency_key: concurrency_key of limited raised TypeError"}
    assert "secret-value" not in reasons["wf_raw_bad"]
    assert await fetchval(settings.database_url, "SELECT count(*) FROM workflow_runs WHERE "
                          "workflow_id IN ('wf_raw_bad', 'wf_api_bad', 'wf_raw_none')") == 0


async def _quarantined(database_url: str) -> bool:
    return await fetchval(database_url, "SELECT count(*) FROM quarantine "
                          "WHERE workflow_id IN ('wf_raw_bad', 'wf_raw_none')") == 2
