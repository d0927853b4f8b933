"""Statements named by their text (``PHASEGATE_DATABASE_POOLER=pgbouncer``,
phasegate/named_statements.py) against real Postgres, directly and through Debian's PgBouncer
1.18 in transaction mode (6 server connections, no ``max_prepared_statements``): every call
answers, each server connection learns each statement once, and what cannot be named (a
transaction, a statement the server dropped, a result type changed by DDL) still answers.

Through the pooler, the tests with one client rely on PgBouncer handing that client the server
connection it released last (its default, ``server_round_robin = 0``): the statement a test
drops or outdates is on the server connection its next call reaches.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from prometheus_client import REGISTRY

from bench.pgbouncer import PgBouncer
from phasegate import named_statements
from phasegate.db import connect, create_pool
from phasegate.named_statements import TextNamedStatementConnection, statement_name
from tests.helpers import wait_for

pytestmark = pytest.mark.parametrize("db_route", ["direct", "pgbouncer"], indirect=True)

CLIENTS = 24  # four times PgBouncer's server pool
QUERY = "SELECT $1::int * 2"


def _prepares(outcome: str) -> float:
    value = REGISTRY.get_sample_value("phasegate_db_statement_prepares_total",
                                      {"outcome": outcome})
    return value or 0.0


def _connections(pool: asyncpg.Pool) -> list[TextNamedStatementConnection]:
    return [holder._con for holder in pool._holders if holder._con is not None]


async def test_every_call_answers_and_the_server_connections_learn_each_name_once(
        database_url: str, db_route: str):
    pool = await create_pool(database_url, min_size=CLIENTS, max_size=CLIENTS,
                             pooler="pgbouncer")
    try:
        async def client(i: int) -> None:
            for _ in range(10):
                assert await pool.fetchval(QUERY, i) == i * 2
                row = await pool.fetchrow("SELECT $1::text AS a, $2::int[] AS b", str(i), [i])
                assert (row["a"], row["b"]) == (str(i), [i])

        await asyncio.gather(*(client(i) for i in range(CLIENTS)))
        connections = _connections(pool)
        missed = sum(c.missed for c in connections)
        # Direct, each client connection is its own server connection: one Parse of each
        # name each. Through the pooler, 24 clients share 6 server connections.
        assert missed >= 1

        async def a_round_without_a_miss() -> bool:
            before = sum(c.missed for c in _connections(pool))
            await asyncio.gather(*(client(i) for i in range(CLIENTS)))
            return sum(c.missed for c in _connections(pool)) == before

        # Once every server connection holds both names, nothing is parsed again.
        await wait_for(a_round_without_a_miss, timeout=60, what="a round with no Parse")
        async with pool.acquire() as connection:
            names = {r["name"] for r in await connection.fetch(
                "SELECT name FROM pg_prepared_statements")}
        assert statement_name(QUERY) in names
    finally:
        await pool.close()


async def test_a_query_in_a_transaction_stays_unnamed(database_url: str, db_route: str):
    if db_route == "pgbouncer":
        pytest.skip("which server connection holds a name is the pooler's choice: direct only")
    connection = await connect(database_url, pooler="pgbouncer")
    try:
        prepared = "SELECT name FROM pg_prepared_statements"
        async with connection.transaction():
            assert await connection.fetchval(QUERY, 3) == 6
            assert statement_name(QUERY) not in {
                r["name"] for r in await connection.fetch(prepared)}
        assert await connection.fetchval(QUERY, 4) == 8
        assert statement_name(QUERY) in {r["name"] for r in await connection.fetch(prepared)}
    finally:
        await connection.close()


async def test_a_statement_the_server_dropped_is_prepared_again(database_url: str,
                                                                db_route: str):
    connection = await connect(database_url, pooler="pgbouncer")
    try:
        assert await connection.fetchval(QUERY, 1) == 2
        missed = connection.missed
        await connection.execute("DEALLOCATE ALL")  # as a DISCARD ALL between two clients
        assert await connection.fetchval(QUERY, 2) == 4
        assert connection.missed > missed
        assert connection.unnamed_after_misses == 0
    finally:
        await connection.close()


async def test_a_result_type_changed_by_ddl_is_named_afresh(database_url: str, db_route: str):
    """The server refuses a statement prepared before the function's result type changed
    ("cached plan must not change result type"); the connection names the query anew, and the
    call answers with the new type."""
    connection = await connect(database_url, pooler="pgbouncer")
    try:
        await connection.execute(
            "CREATE FUNCTION answer() RETURNS integer LANGUAGE sql AS 'SELECT 42'")
        for _ in range(3):
            assert await connection.fetchval("SELECT answer()") == 42
        await connection.execute("DROP FUNCTION answer()")
        await connection.execute(
            "CREATE FUNCTION answer() RETURNS text LANGUAGE sql AS 'SELECT ''forty-two'''")
        assert await connection.fetchval("SELECT answer()") == "forty-two"
        assert connection.generation == 1
        assert await connection.fetchval("SELECT answer()") == "forty-two"
        assert connection.generation == 1
    finally:
        await connection.close()


async def test_a_name_the_server_never_keeps_goes_out_unnamed(
        database_url: str, db_route: str, monkeypatch: pytest.MonkeyPatch):
    """Should a Parse never stick (every miss's Parse lost), a call gives up naming after
    MISSES_PER_CALL rounds and is sent as ``transaction`` sends it: it still answers."""
    async def forgetful(self: TextNamedStatementConnection, statement: object,
                        timeout: float | None) -> None:
        self.missed += 1

    monkeypatch.setattr(TextNamedStatementConnection, "_prepare_here", forgetful)
    connection = await connect(database_url, pooler="pgbouncer")
    try:
        assert await connection.fetchval(QUERY, 5) == 10
        assert connection.missed == named_statements.MISSES_PER_CALL
        assert connection.unnamed_after_misses == 1
    finally:
        await connection.close()


async def test_a_statement_cache_of_zero_names_nothing(database_url: str, db_route: str):
    connection = await connect(database_url, pooler="pgbouncer", statement_cache=0)
    try:
        for i in range(3):
            assert await connection.fetchval(QUERY, i) == i * 2
        assert connection.missed == 0
        assert connection.described == 3
    finally:
        await connection.close()


async def test_a_pooler_that_discards_everything_after_each_transaction_costs_a_round_trip(
        pg_server_dsn: str, database_url: str, db_route: str):
    """PgBouncer resetting each server connection after every transaction (``DISCARD ALL``,
    even in transaction mode): every named call misses, and its Parse and Bind then share one
    transaction, so every call still answers, named, with one miss each."""
    if db_route == "pgbouncer":
        pytest.skip("runs its own PgBouncer in front of the direct route's database")
    with PgBouncer.in_front_of(pg_server_dsn, server_pool=2, extra={
            "server_reset_query": "DISCARD ALL", "server_reset_query_always": "1"}) as bouncer:
        connection = await connect(bouncer.route(database_url), pooler="pgbouncer")
        before = _prepares("missed")
        try:
            for i in range(6):
                assert await connection.fetchval(QUERY, i) == i * 2
            assert connection.missed == 6
            assert _prepares("missed") - before == 6  # what an operator sees
            assert connection.already_there == 0
            assert connection.unnamed_after_misses == 0
        finally:
            await connection.close()


async def test_a_querys_own_missing_statement_fails_as_anywhere(database_url: str,
                                                                db_route: str):
    connection = await connect(database_url, pooler="pgbouncer")
    try:
        with pytest.raises(asyncpg.InvalidSQLStatementNameError, match="no_such_statement"):
            await connection.fetch("EXECUTE no_such_statement")
        # At most its own first Parse (the name was new to the server), never the 4 rounds.
        assert connection.missed <= 1
        assert connection.unnamed_after_misses == 0
        assert await connection.fetchval(QUERY, 1) == 2
    finally:
        await connection.close()
