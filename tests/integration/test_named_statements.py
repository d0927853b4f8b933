"""Statements named by their text (``PHASEGATE_DATABASE_POOLER=pgbouncer``,
phasegate/named_statements.py) against real Postgres: directly, through Debian's PgBouncer 1.18
in transaction mode (6 server connections, no ``max_prepared_statements``), through a
current PgBouncer (1.24, which tracks each client's named statements itself and closes a client
that binds a name it never parsed, or parses one twice), and through the same 1.24 with
``max_prepared_statements = 0`` (the default of 1.21 to 1.23: no tracking, as 1.18). Every call
answers, each client
connection parses each name once, each server connection learns each statement once, and what
cannot be named (a transaction, a statement the server dropped, a result type changed by DDL)
still answers.

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

pytestmark = pytest.mark.parametrize(
    "db_route", ["direct", "pgbouncer", "pgbouncer-current", "pgbouncer-current-untracked"],
    indirect=True)

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
        # Each client connection parsed each name once, before its first Bind (a second
        # Parse of a name would have closed it through PgBouncer 1.24): the test's two, and
        # the pool's own set-up queries.
        ours = {statement_name(QUERY), statement_name("SELECT $1::text AS a, $2::int[] AS b")}
        for connection in connections:
            assert connection.parsed_first == len(connection.parsed_names)
        assert ours <= frozenset().union(*(c.parsed_names for c in connections))
        # Direct, each client connection is its own server connection, which its own Parse
        # taught; PgBouncer 1.24 prepares each server connection itself. Through 1.18 or 1.24
        # untracked, 24 clients share 6 server connections, which learn the names from misses.
        if db_route in ("direct", "pgbouncer-current"):
            assert sum(c.missed for c in connections) == 0

        async def a_round_without_a_miss() -> bool:
            before = sum(c.missed for c in _connections(pool))
            await asyncio.gather(*(client(i) for i in range(CLIENTS)))
            return sum(c.missed for c in _connections(pool)) == before

        # Once every server connection holds both names, nothing is parsed again.
        await wait_for(a_round_without_a_miss, timeout=60, what="a round with no Parse")
        async with pool.acquire() as connection:
            # By the query's text: PgBouncer 1.24 prepares it on the server under its own name.
            statements = {r["statement"] for r in await connection.fetch(
                "SELECT statement FROM pg_prepared_statements")}
        assert QUERY in statements
    finally:
        await pool.close()


async def test_a_query_in_a_transaction_stays_unnamed(database_url: str, db_route: str):
    if db_route != "direct":
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
    if db_route == "pgbouncer-current":
        pytest.skip("PgBouncer 1.24 prepares its server connections itself (and takes a "
                    "client's DEALLOCATE ALL as forgetting the client's own statements)")
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
    """Should a Parse never stick (every Parse lost on its way), a call gives up naming after
    MISSES_PER_CALL rounds and is sent as ``transaction`` sends it: it still answers."""
    if db_route == "pgbouncer-current":
        pytest.skip("PgBouncer 1.24 closes a client whose Parse it never saw")

    async def lost(self: TextNamedStatementConnection, statement: object,
                   timeout: float | None) -> None:
        return None

    monkeypatch.setattr(TextNamedStatementConnection, "_parse", lost)
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
        assert connection.missed == connection.parsed_first == 0
        assert connection.described == 3
    finally:
        await connection.close()


async def test_a_pooler_that_discards_everything_after_each_transaction_costs_a_round_trip(
        pg_server_dsn: str, database_url: str, db_route: str):
    """PgBouncer resetting each server connection after every transaction (``DISCARD ALL``,
    even in transaction mode) and not tracking named statements: every named call after the
    first misses, and its Parse and Bind then share one transaction, so every call still
    answers, named, with one miss each."""
    if db_route != "direct":
        pytest.skip("runs its own PgBouncer in front of the direct route's database")
    with PgBouncer.in_front_of(pg_server_dsn, server_pool=2, extra={
            "server_reset_query": "DISCARD ALL", "server_reset_query_always": "1"}) as bouncer:
        assert not bouncer.tracks_prepared_statements
        connection = await connect(bouncer.route(database_url), pooler="pgbouncer")
        before = _prepares("missed"), _prepares("first")
        try:
            for i in range(6):
                assert await connection.fetchval(QUERY, i) == i * 2
            # The first call's Parse went before its Bind, in the same transaction.
            assert (connection.parsed_first, connection.missed) == (1, 5)
            # What an operator sees.
            assert (_prepares("missed") - before[0], _prepares("first") - before[1]) == (5, 1)
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
        # Its own first Parse, then the EXECUTE's own error: never a miss of ours.
        assert (connection.parsed_first, connection.missed) == (1, 0)
        assert connection.unnamed_after_misses == 0
        assert await connection.fetchval(QUERY, 1) == 2
    finally:
        await connection.close()


async def test_past_the_names_a_connection_may_parse_a_query_goes_out_unnamed(
        database_url: str, db_route: str, monkeypatch: pytest.MonkeyPatch):
    """A connection parses at most PARSED_MAX names in its life (it never parses one twice, so
    it never forgets one): a query past that answers, sent unnamed, and the names it has keep
    going out named."""
    connection = await connect(database_url, pooler="pgbouncer")
    try:
        assert await connection.fetchval(QUERY, 1) == 2
        monkeypatch.setattr(named_statements, "PARSED_MAX", len(connection.parsed_names))
        parsed = connection.parsed_names
        assert await connection.fetchval("SELECT $1::int + 1", 1) == 2
        assert statement_name("SELECT $1::int + 1") not in connection.parsed_names
        assert connection.parsed_names == parsed
        assert await connection.fetchval(QUERY, 2) == 4
        assert statement_name(QUERY) in connection.kept_names
        assert connection.unnamed_after_misses == 0
    finally:
        await connection.close()
