"""A start message's run is created and loaded in one round trip (migration 0032), counted on
the wire by the benchmarks' round-trip proxy (bench/pgcount.py) between an in-process worker
and a real PostgreSQL, for both ways a run starts: a producer's bare start message (no run
row yet) and the API's start (row and message written together)."""

from __future__ import annotations

import json
import re
from typing import Any

from bench.common import RoundTripProxy
from bench.transition_round_trips import statement_names
from phasegate import Context, Workflow
from phasegate.envelope import start_message
from phasegate.orchestrator.starter import start_workflow
from phasegate.queue import Outgoing
from phasegate.sql import queries
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

_WS = re.compile(r"\s+")
single = Workflow("start-load", schema_version=1)


@single.phase("only")
async def only(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "done": True}


keyed = Workflow("start-keyed", schema_version=1,
                 concurrency_key=lambda input: str(input["tenant"]), max_concurrency=2)


@keyed.phase("only")
async def keyed_only(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "done": True}


limited = Workflow("start-limited", schema_version=1,
                   concurrency_key=lambda input: "one", max_concurrency=1)


@limited.phase("only")
async def limited_only(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "done": True}


def _executed(counts: dict[str, int]) -> dict[str, int]:
    """Executions by query name (the proxy labels a statement by its first characters):
    queries.sql's and flow.sql's."""
    names = {**statement_names(), **{_WS.sub(" ", sql)[:60]: name
                                     for name, sql in queries("flow.sql").items()}}
    executed: dict[str, int] = {}
    for label, n in counts.items():
        if label.startswith("exec:"):
            name = names.get(label[5:], "other")
            executed[name] = executed.get(name, 0) + n
    return executed


async def _bare_starts(settings: Any, workflow: str, inputs: dict[str, Any]) -> None:
    """A producer's start message per run id of ``inputs``, with that run's input."""
    for workflow_id, input in inputs.items():
        await send_raw(settings, {"v": 1, "kind": "start", "workflow_id": workflow_id,
                                  "workflow": workflow, "input": input}, group=workflow_id)


async def _run_counted(settings: Any, workflow: Workflow, ids: list[str]) -> dict[str, int]:
    """A worker for ``workflow`` through the round-trip proxy until the runs ``ids`` are
    done; the statements it executed, by query name."""
    dsn = settings.database_url
    port = int(dsn.rsplit(":", 1)[1].split("/", 1)[0])
    with RoundTripProxy(upstream_port=port) as proxy:
        proxied = dsn.replace(f":{port}/", f":{proxy.port}/", 1)
        worker_settings = settings.model_copy(update={"database_url": proxied})
        async with running_worker(worker_settings, Registry([workflow])):
            await wait_for(lambda: all_done(dsn, ids), what="runs done")
        return _executed(await proxy.counts())


async def test_a_start_creates_and_loads_its_run_in_one_round_trip(settings) -> None:
    dsn = settings.database_url
    producer_ids = [f"bare-{i}" for i in range(3)]
    # No run row: a producer only enqueued.
    await _bare_starts(settings, "start-load", {w: {"i": i} for i, w in enumerate(producer_ids)})
    async with store_for(dsn) as store, queue_for(settings) as queue:
        api_ids = [(await start_workflow(store, queue, workflow=single,
                                         input={"api": i})).workflow_id for i in range(3)]
    executed = await _run_counted(settings, single, producer_ids + api_ids)
    # Per run: one start_and_load, then the commit. Neither the separate create nor a load.
    assert executed.get("start_and_load") == 6, executed
    assert "ensure_run" not in executed and "load_for_phase" not in executed \
        and "load_for_phases" not in executed, executed
    rows = await fetch(dsn, "SELECT workflow_id, input::text AS input, next_seq "
                            "FROM workflow_runs ORDER BY workflow_id")
    assert {r["workflow_id"]: (json.loads(r["input"]), r["next_seq"]) for r in rows} == {
        **{f"bare-{i}": ({"i": i}, 1) for i in range(3)},
        **{workflow_id: ({"api": i}, 1) for i, workflow_id in enumerate(api_ids)}}


async def test_a_keyed_start_creates_takes_its_slot_and_loads_in_one_round_trip(
        settings) -> None:
    """A workflow with a concurrency key: the run created, its slot taken and the admitted run
    loaded by one statement (migration 0034), then the commit. The API's start took the slot
    when it created the run, so its message (no input) is started with the run's own key:
    no read of the input."""
    dsn = settings.database_url
    producer_ids = [f"keyed-{i}" for i in range(2)]
    await _bare_starts(settings, "start-keyed",
                       {w: {"tenant": i} for i, w in enumerate(producer_ids)})
    async with store_for(dsn) as store, queue_for(settings) as queue:
        api_id = (await start_workflow(store, queue, workflow=keyed,
                                       input={"tenant": "t"})).workflow_id
    executed = await _run_counted(settings, keyed, [*producer_ids, api_id])
    assert executed.get("start_keyed_and_load") == 3, executed
    # No separate create, slot, input read or load for any of the three starts.
    assert not {"ensure_run", "start_and_load", "start_keyed", "load_for_phase",
                "load_for_phases", "run_input"} & set(executed), executed
    rows = await fetch(dsn, "SELECT workflow_id, concurrency_key, status FROM workflow_runs "
                            "ORDER BY workflow_id")
    assert {r["workflow_id"]: (r["concurrency_key"], r["status"]) for r in rows} == {
        "keyed-0": ("0", "completed"), "keyed-1": ("1", "completed"),
        api_id: ("t", "completed")}


async def test_a_keyed_start_over_its_limit_is_queued_then_runs(settings) -> None:
    """Three starts of one key with a limit of one: the statement admits and loads one and
    queues what arrives while it holds the slot, loading nothing for them; each queued run is
    admitted when a slot frees, and its admission message (no input: the run row holds it)
    goes the same way, with the run's key. Every run completes, with its one checkpoint."""
    dsn = settings.database_url
    ids = [f"limited-{i}" for i in range(3)]
    await _bare_starts(settings, "start-limited", {w: {"n": i} for i, w in enumerate(ids)})
    executed = await _run_counted(settings, limited, ids)
    # Three starts; each run that was queued (admitted by another's end, not by its own
    # start) has its admission message (no input) started with the run's key.
    admitted = await fetch(dsn, "SELECT workflow_id, admitted_by FROM run_admissions "
                                "WHERE workflow_id LIKE 'limited-%'")
    queued = sum(r["admitted_by"] != r["workflow_id"] for r in admitted)
    assert len(admitted) == 3, admitted
    assert executed.get("start_keyed_and_load") == 3 + queued, (executed, admitted)
    assert not {"load_for_phase", "load_for_phases", "run_input"} & set(executed), executed
    rows = await fetch(dsn, "SELECT r.workflow_id, r.status, count(c.seq) AS checkpoints "
                            "FROM workflow_runs r LEFT JOIN checkpoints c USING (workflow_id) "
                            "WHERE r.workflow_id LIKE 'limited-%' GROUP BY 1, 2 ORDER BY 1")
    assert [(r["workflow_id"], r["status"], r["checkpoints"]) for r in rows] == [
        (workflow_id, "completed", 1) for workflow_id in ids]


async def test_a_keyed_run_created_without_its_key_has_its_input_read(settings) -> None:
    """A run an API of the previous release created (the row without its key, the message
    without the input): the statement without a key writes nothing and answers 'unkeyed';
    the worker reads the input, computes the key and starts it with it."""
    dsn = settings.database_url
    message = start_message("keyless-1", "start-keyed", None)
    async with store_for(dsn) as store, queue_for(settings) as queue:
        created = await store.start_run(workflow_id="keyless-1", workflow="start-keyed",
                                        schema_version=1, input={"tenant": "old"},
                                        first_phase="only", message=message)
        assert created is not None and created.run["status"] == "pending"
        await queue.send([Outgoing(message.to_json(), message.group_id, message.dedup_id)])
    executed = await _run_counted(settings, keyed, ["keyless-1"])
    assert executed.get("start_keyed_and_load") == 2, executed  # 'unkeyed', then keyed
    assert executed.get("run_input") == 1, executed
    assert await fetchval(dsn, "SELECT concurrency_key || '/' || status FROM workflow_runs "
                               "WHERE workflow_id = 'keyless-1'") == "old/completed"


async def test_the_api_start_queues_a_run_over_its_key_limit(settings) -> None:
    """The API's start takes the slot: over the key's limit the run is answered queued, with
    no start message (its admission writes one); it runs once the holder ends. Neither
    message carries the input, and neither has it read: each run has its key."""
    dsn = settings.database_url
    async with store_for(dsn) as store, queue_for(settings) as queue:
        first = await start_workflow(store, queue, workflow=limited, input={"n": 1},
                                     workflow_id="api-limited-1")
        second = await start_workflow(store, queue, workflow=limited, input={"n": 2},
                                      workflow_id="api-limited-2")
    assert first.run is not None and first.run["status"] == "pending" and first.sent
    assert second.run is not None and second.run["status"] == "queued" and not second.sent
    assert await fetchval(dsn, "SELECT count(*) FROM outbox "
                               "WHERE workflow_id = 'api-limited-2'") == 0
    executed = await _run_counted(settings, limited, ["api-limited-1", "api-limited-2"])
    # The first's start message, then the second's admission message.
    assert executed.get("start_keyed_and_load") == 2, executed
    assert "run_input" not in executed, executed
    rows = await fetch(dsn, "SELECT workflow_id, admitted_by FROM run_admissions "
                            "WHERE workflow_id LIKE 'api-limited-%' ORDER BY workflow_id")
    # The first admitted itself at its start; the second by the first's end.
    assert [(r["workflow_id"], r["admitted_by"]) for r in rows] == [
        ("api-limited-1", "api-limited-1"), ("api-limited-2", "api-limited-1")]


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
