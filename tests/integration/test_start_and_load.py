"""A start message's run is created and loaded in one round trip (migration 0032), counted on
the wire by the benchmarks' round-trip proxy (bench/pgcount.py) between an in-process worker
and a real PostgreSQL, for both ways a run starts: a producer's bare start message (no run
row yet) and the API's start (row and message written together)."""

from __future__ import annotations

import json
from typing import Any

from bench.common import RoundTripProxy
from bench.transitions import statement_names
from phasegate import Context, Workflow
from phasegate.orchestrator.starter import start_workflow
from phasegate.workflow import Registry
from tests.helpers import (
    all_done,
    fetch,
    fetchval,
    queue_for,
    running_worker,
    send_raw,
    store_for,
    wait_for,
)

single = Workflow("start-load", schema_version=1)


@single.phase("only")
async def only(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "done": True}


keyed = Workflow("start-keyed", schema_version=1,
                 concurrency_key=lambda input: str(input["tenant"]), max_concurrency=2)


@keyed.phase("only")
async def keyed_only(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "done": True}


def _executed(counts: dict[str, int]) -> dict[str, int]:
    """Executions by query name (the proxy labels a statement by its first characters)."""
    names = statement_names()
    executed: dict[str, int] = {}
    for label, n in counts.items():
        if label.startswith("exec:"):
            name = names.get(label[5:], "other")
            executed[name] = executed.get(name, 0) + n
    return executed


async def test_a_start_creates_and_loads_its_run_in_one_round_trip(settings) -> None:
    dsn = settings.database_url
    port = int(dsn.rsplit(":", 1)[1].split("/", 1)[0])
    producer_ids = [f"bare-{i}" for i in range(3)]
    for i, workflow_id in enumerate(producer_ids):  # no run row: a producer only enqueued
        await send_raw(settings, {"v": 1, "kind": "start", "workflow_id": workflow_id,
                                  "workflow": "start-load", "input": {"i": i}},
                       group=workflow_id)
    async with store_for(dsn) as store, queue_for(settings) as queue:
        api_ids = [(await start_workflow(store, queue, workflow=single,
                                         input={"api": i})).workflow_id for i in range(3)]
    with RoundTripProxy(upstream_port=port) as proxy:
        proxied = dsn.replace(f":{port}/", f":{proxy.port}/", 1)
        worker_settings = settings.model_copy(update={"database_url": proxied})
        async with running_worker(worker_settings, Registry([single])):
            await wait_for(lambda: all_done(dsn, producer_ids + api_ids), what="runs done")
        executed = _executed(await proxy.counts())
    # Per run: one start_and_load, then the commit. Neither the separate create nor a load.
    assert executed.get("start_and_load") == 6, executed
    assert "ensure_run" not in executed and "load_for_phase" not in executed \
        and "load_for_phases" not in executed, executed
    rows = await fetch(dsn, "SELECT workflow_id, input::text AS input, next_seq "
                            "FROM workflow_runs ORDER BY workflow_id")
    assert {r["workflow_id"]: (json.loads(r["input"]), r["next_seq"]) for r in rows} == {
        **{f"bare-{i}": ({"i": i}, 1) for i in range(3)},
        **{workflow_id: ({"api": i}, 1) for i, workflow_id in enumerate(api_ids)}}


async def test_a_keyed_start_creates_its_run_and_takes_its_slot_in_one_round_trip(
        settings) -> None:
    """A workflow with a concurrency key: the run created and its slot taken by one statement
    (migration 0033), then the load and the commit; the API's start reads the input first
    (the key is computed from it), one more."""
    dsn = settings.database_url
    port = int(dsn.rsplit(":", 1)[1].split("/", 1)[0])
    producer_ids = [f"keyed-{i}" for i in range(2)]
    for i, workflow_id in enumerate(producer_ids):
        await send_raw(settings, {"v": 1, "kind": "start", "workflow_id": workflow_id,
                                  "workflow": "start-keyed", "input": {"tenant": i}},
                       group=workflow_id)
    async with store_for(dsn) as store, queue_for(settings) as queue:
        api_id = (await start_workflow(store, queue, workflow=keyed,
                                       input={"tenant": "t"})).workflow_id
    with RoundTripProxy(upstream_port=port) as proxy:
        proxied = dsn.replace(f":{port}/", f":{proxy.port}/", 1)
        worker_settings = settings.model_copy(update={"database_url": proxied})
        async with running_worker(worker_settings, Registry([keyed])):
            await wait_for(lambda: all_done(dsn, [*producer_ids, api_id]), what="runs done")
        executed = _executed(await proxy.counts())
    assert executed.get("start_keyed") == 3, executed
    assert "ensure_run" not in executed and "start_and_load" not in executed, executed
    assert executed.get("load_for_phase", 0) + executed.get("load_for_phases", 0) >= 1
    rows = await fetch(dsn, "SELECT workflow_id, concurrency_key, status FROM workflow_runs "
                            "ORDER BY workflow_id")
    assert {r["workflow_id"]: (r["concurrency_key"], r["status"]) for r in rows} == {
        "keyed-0": ("0", "completed"), "keyed-1": ("1", "completed"),
        api_id: ("t", "completed")}


async def test_a_second_start_of_a_finished_run_changes_nothing(settings) -> None:
    """A start delivered again after its run ended: the create is a no-op, the load finds the
    run past its start, the message is deleted; one checkpoint, the run still completed."""
    body = {"v": 1, "kind": "start", "workflow_id": "again-1", "workflow": "start-load",
            "input": {"n": 1}}
    async with running_worker(settings, Registry([single])):
        await send_raw(settings, body, group="again-1", dedup="first")
        await wait_for(lambda: all_done(settings.database_url, ["again-1"]), what="run done")
        await send_raw(settings, body, group="again-1", dedup="second")
        async with queue_for(settings) as queue:
            await wait_for(lambda: _queue_empty(queue), what="second start consumed")
    assert await fetchval(settings.database_url, "SELECT count(*) FROM checkpoints "
                          "WHERE workflow_id = 'again-1' AND kind = 'phase'") == 1
    assert await fetchval(settings.database_url, "SELECT status || '/' || next_seq "
                          "FROM workflow_runs WHERE workflow_id = 'again-1'") == "completed/1"


async def _queue_empty(queue: Any) -> bool:
    depth = await queue.depth()
    return bool(depth.visible == 0 and depth.inflight == 0)
