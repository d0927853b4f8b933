"""phasegate through PgBouncer in transaction mode (6 server connections): what breaks a naive
asyncpg client there does not break phasegate's connections, migrations or workers.

The engine's end-to-end modules run through the same PgBouncer as well (tests/conftest.py,
``db_route``); this module checks the pieces and the failure the pooler mode exists for.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs

from bench.pgbouncer import PgBouncer
from phasegate.db import connect, create_pool
from phasegate.migrate import migrate
from phasegate.named_statements import statement_name
from phasegate.orchestrator.starter import start_workflow
from phasegate.sql import migration_files, queries
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import all_done, make_settings, queue_for, running_worker, store_for, wait_for

CLIENTS = 24  # four times the server pool: server connections really are shared
# The statements of a transition's check and commit (phasegate/sql/queries.sql).
HOT_PATH = frozenset({"load_for_phase", "load_for_phases", "commit_phase", "commit_phases",
                      "continue_phase", "continue_phases", "advance_phase"})


async def _hammer(pool: asyncpg.Pool) -> None:
    async def client(i: int) -> None:
        for _ in range(20):
            assert await pool.fetchval("SELECT $1::int * 2", i) == i * 2
            async with pool.acquire() as connection, connection.transaction():
                assert await connection.fetchval("SELECT $1::text", str(i)) == str(i)
    await asyncio.gather(*(client(i) for i in range(CLIENTS)))


async def _connections_after_every_run(pooled: str, pooler: str, database_url: str,
                                       queue_pair, sqs_endpoint) -> list[Any]:
    """Twelve chain runs through ``pooled`` by a worker in ``pooler`` mode, waited for until
    every one is done; the worker's pool connections as they were then."""
    workflows.LEDGER_DSN = pooled
    settings = make_settings(pooled, queue_pair, sqs_endpoint, database_pooler=pooler)
    async with store_for(pooled) as store, queue_for(settings) as queue:
        ids = [(await start_workflow(store, queue, workflow=workflows.chain,
                                     input={"n": i})).workflow_id for i in range(12)]
    async with running_worker(settings, Registry([workflows.chain])) as worker:
        await wait_for(lambda: all_done(database_url, ids), what="runs done")
        assert worker.store is not None
        return [h._con for h in worker.store.pool._holders if h._con is not None]


async def test_named_statements_fail_through_the_pooler_and_phasegates_do_not(
        pgbouncer: PgBouncer, database_url: str):
    pooled = pgbouncer.route(database_url)
    # The failure the issue reported: asyncpg's statement cache (named statements) through a
    # transaction-mode pooler. If this stops failing, the pooler is not really pooling.
    naive = await create_pool(pooled, min_size=CLIENTS, max_size=CLIENTS, pooler="none")
    try:
        with pytest.raises(asyncpg.PostgresError):
            await _hammer(naive)
    finally:
        await naive.close()
    safe = await create_pool(pooled, min_size=CLIENTS, max_size=CLIENTS)
    try:
        await _hammer(safe)
    finally:
        await safe.close()


async def test_migrate_through_the_pooler(pgbouncer: PgBouncer, empty_database_url: str):
    pooled = pgbouncer.route(empty_database_url)
    # Two at once: the transaction-scoped advisory lock serialises them through the pooler.
    reports = await asyncio.gather(migrate(pooled), migrate(pooled))
    newest = migration_files()[-1][0]
    assert sorted(len(r.applied) for r in reports) == [0, len(migration_files())]
    assert {r.current_version for r in reports} == {newest}
    connection = await connect(pooled)
    try:
        assert await connection.fetchval(
            "SELECT max(version) FROM phasegate_migrations") == newest
    finally:
        await connection.close()


async def test_worker_logs_the_fifo_quota_it_runs_under(pgbouncer: PgBouncer, database_url: str,
                                                        queue_pair, sqs_endpoint):
    workflows.LEDGER_DSN = pgbouncer.route(database_url)
    settings = make_settings(pgbouncer.route(database_url), queue_pair, sqs_endpoint)
    async with store_for(settings.database_url or "") as store, queue_for(settings) as queue:
        wid = (await start_workflow(store, queue, workflow=workflows.chain,
                                    input={"n": 1})).workflow_id
    with capture_logs() as logs:
        async with running_worker(settings, Registry([workflows.chain])):
            await wait_for(lambda: all_done(database_url, [wid]), what="run done")
    quota = [e for e in logs if e["event"] == "sqs_quota"]
    assert len(quota) == 1
    assert quota[0]["mode"] == "high_throughput"
    assert quota[0]["calls_per_s_per_group"] == 300
    assert not [e for e in logs if e["event"] == "sqs_quota_standard_fifo"]


async def test_a_worker_with_named_statements_through_the_pooler(
        pgbouncer: PgBouncer, database_url: str, queue_pair, sqs_endpoint):
    """PHASEGATE_DATABASE_POOLER=pgbouncer through PgBouncer 1.18 (6 server connections, no
    max_prepared_statements): every run completes, and the hot path's statements went out as
    statements named by their text (parsed once per server connection, not per call)."""
    connections = await _connections_after_every_run(
        pgbouncer.route(database_url), "pgbouncer", database_url, queue_pair, sqs_endpoint)
    # Each server connection learnt the statements from a miss. (While they are learning, a
    # call may bounce between one that lacks a name and one that has it and go out unnamed
    # after MISSES_PER_CALL rounds: rare, and not an error, so not asserted.)
    assert sum(c.missed for c in connections) >= 1
    # The hot path's statements went out named (the runs completing says the server
    # connections answered them).
    kept = frozenset().union(*(c.kept_names for c in connections))
    hot_path = {statement_name(text) for name, text in queries().items() if name in HOT_PATH}
    assert kept & hot_path


@pytest.mark.parametrize("pooler", ["transaction", "pgbouncer", "none"])
async def test_a_worker_through_a_current_pgbouncer(
        pooler: str, pgbouncer_current: PgBouncer, database_url: str, queue_pair, sqs_endpoint):
    """A current PgBouncer (1.24, 6 server connections, ``max_prepared_statements`` at its
    default 200: it tracks each client's named statements, prepares them on its server
    connections itself, and closes a client that binds a name it never parsed or parses one
    twice). Every pooler mode completes every run through it; the text-named one parses each
    name once per client connection and never misses."""
    connections = await _connections_after_every_run(
        pgbouncer_current.route(database_url), pooler, database_url, queue_pair, sqs_endpoint)
    if pooler == "pgbouncer":
        for connection in connections:
            assert connection.parsed_first == len(connection.parsed_names)
            assert connection.missed == connection.unnamed_after_misses == 0
        hot_path = {statement_name(text) for name, text in queries().items()
                    if name in HOT_PATH}
        assert hot_path & frozenset().union(*(c.kept_names for c in connections))


@pytest.mark.parametrize("pooler", ["transaction", "pgbouncer"])
async def test_a_worker_through_a_current_pgbouncer_that_tracks_no_statement(
        pooler: str, pgbouncer_current_untracked: PgBouncer, database_url: str, queue_pair,
        sqs_endpoint):
    """PgBouncer 1.24 with ``max_prepared_statements = 0`` (the default of 1.21 to 1.23): it
    passes each Parse and Bind to whichever server connection the transaction has. Both modes
    meant for a pooler complete every run; the text-named one's server connections learn the
    names from misses, as through 1.18, and each client connection parses each name once."""
    connections = await _connections_after_every_run(
        pgbouncer_current_untracked.route(database_url), pooler, database_url, queue_pair,
        sqs_endpoint)
    if pooler == "pgbouncer":
        assert sum(c.missed for c in connections) >= 1
        for connection in connections:
            assert connection.parsed_first == len(connection.parsed_names)


async def test_after_ddl_a_current_pgbouncer_serves_asyncpgs_cache_the_old_plan(
        pgbouncer_current: PgBouncer, database_url: str):
    """Why ``none`` stays direct-only even where PgBouncer tracks named statements: PgBouncer
    keys the server's statements by their text, so once DDL changes a query's result type,
    asyncpg's statement prepared again under a new name reaches the old plan, and every call
    fails until PgBouncer recycles its server connections (a migration during a rolling
    deploy changes functions' results). The text-named mode puts its new generation in the
    text, and answers. (One client: PgBouncer hands it the server connection it released last,
    the one that prepared the old plan.)"""
    pooled = pgbouncer_current.route(database_url)
    old = "CREATE FUNCTION answer() RETURNS integer LANGUAGE sql AS 'SELECT 42'"
    new = "CREATE FUNCTION answer() RETURNS text LANGUAGE sql AS 'SELECT ''forty-two'''"
    outcomes = {}
    for pooler in ("none", "pgbouncer"):
        connection = await connect(pooled, pooler=pooler)
        try:
            await connection.execute(f"DROP FUNCTION IF EXISTS answer(); {old}")
            for _ in range(3):
                assert await connection.fetchval("SELECT answer()") == 42
            await connection.execute(f"DROP FUNCTION answer(); {new}")
            answers = []
            for _ in range(2):
                try:
                    answers.append(await connection.fetchval("SELECT answer()"))
                except asyncpg.InvalidCachedStatementError:
                    answers.append("refused")
            outcomes[pooler] = answers
        finally:
            await connection.close()
    assert outcomes == {"none": ["refused", "refused"], "pgbouncer": ["forty-two", "forty-two"]}
