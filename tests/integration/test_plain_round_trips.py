"""What timers, signals, reviews, per-key concurrency, rate limits and schedules cost a plain
transition -- a workflow that uses none of them: nothing. And each engine statement is one
round trip: described once per connection, not before every execution. Counted on the wire
by the round-trip proxy the benchmarks use (bench/pgcount.py), between an in-process worker
and a real PostgreSQL."""

from __future__ import annotations

import re
from typing import Any

from bench.common import RoundTripProxy
from phasegate import Context, Workflow
from phasegate.orchestrator.starter import start_workflow
from phasegate.sql import queries
from phasegate.workflow import Registry
from tests.helpers import all_done, queue_for, running_worker, store_for, wait_for

plain = Workflow("plain-rt", schema_version=1)


@plain.phase("one")
async def one(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "one": True}


@plain.phase("two")
async def two(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "two": True}


@plain.phase("three")
async def three(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "three": True}


RUNS = 4
TRANSITIONS = RUNS * 3
_WS = re.compile(r"\s+")
# Statements of the features under test: a plain transition must run none of them.
FEATURE_FILES = ("flow.sql", "signals.sql")
FEATURE_QUERIES = ("room_entry", "room_checkpoint", "room_settle_run", "start_keyed",
                   "start_keyed_and_load")


def _names() -> dict[str, str]:
    """The proxy labels a statement by its first 60 characters; map those to query names."""
    names = {}
    for file in ("queries.sql", *FEATURE_FILES):
        for name, sql in queries(file).items():
            names[_WS.sub(" ", sql)[:60]] = f"{file}:{name}"
    return names


async def test_a_plain_transition_runs_no_statement_of_the_flow_features(settings) -> None:
    dsn = settings.database_url
    port = int(dsn.rsplit(":", 1)[1].split("/", 1)[0])
    with RoundTripProxy(upstream_port=port) as proxy:
        proxied = dsn.replace(f":{port}/", f":{proxy.port}/", 1)
        worker_settings = settings.model_copy(update={"database_url": proxied})
        ids = []
        async with store_for(dsn) as store, queue_for(settings) as queue:
            for i in range(RUNS):
                ids.append((await start_workflow(store, queue, workflow=plain,
                                                 input={"i": i})).workflow_id)
        async with running_worker(worker_settings, Registry([plain])):
            await wait_for(lambda: all_done(dsn, ids), what="plain runs completed")
        counts = await proxy.counts()
    names = _names()
    executed: dict[str, int] = {}
    described: dict[str, int] = {}
    for label, n in counts.items():
        kind, _, text = label.partition(":")
        if kind in ("exec", "describe"):
            tally = executed if kind == "exec" else described
            name = names.get(text, "other")
            tally[name] = tally.get(name, 0) + n
    features = {n for n in executed if n.startswith(FEATURE_FILES)
                or n.split(":")[-1] in FEATURE_QUERIES}
    assert features == set(), executed
    # The transition itself: one load (a start's: start_and_load), one commit and one
    # mark_sent per phase at most (group commit and the batcher may fold several into one
    # statement).
    per_transition = {n: c / TRANSITIONS for n, c in executed.items()
                      if n.startswith("queries.sql:")}
    print("statements per transition:", per_transition, "all:", executed,
          "round trips:", counts.get("round_trips"))
    loads = per_transition.get("queries.sql:load_for_phase", 0) \
        + per_transition.get("queries.sql:load_for_phases", 0) \
        + per_transition.get("queries.sql:start_and_load", 0)
    commits = per_transition.get("queries.sql:commit_phase", 0) \
        + per_transition.get("queries.sql:commit_phases", 0)
    assert 0 < loads <= 1 and 0 < commits <= 1
    # One round trip per statement: the worker's connections describe each engine query once
    # (phasegate/unnamed_statements.py), then send it in one write; plain asyncpg without
    # named statements describes it before every execution.
    engine = [n for n in executed if n.startswith("queries.sql:")]
    for name in engine:
        assert described.get(name, 0) <= min(executed[name], worker_settings.db_pool_max), (
            name, described, executed)
    assert sum(described.get(n, 0) for n in engine) < sum(executed[n] for n in engine)
