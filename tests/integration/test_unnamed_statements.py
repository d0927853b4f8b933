"""One round trip per query without named statements (phasegate/unnamed_statements.py), against
real Postgres, directly and through PgBouncer in transaction mode.

The pooler's own proof (24 clients over 6 server connections, every query a kept description
re-parsed in its Bind's write) is tests/integration/test_pooler.py's hammer; this module checks
what is kept, when it is dropped, and what a caller sees when the server's types change under
a kept description.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from phasegate import unnamed_statements
from phasegate.db import connect, create_pool

pytestmark = pytest.mark.parametrize("db_route", ["direct", "pgbouncer"], indirect=True)


async def test_a_query_is_described_once_per_connection(database_url: str):
    connection = await connect(database_url)
    try:
        for i in range(5):
            assert await connection.fetchval("SELECT $1::int * 2", i) == i * 2
        assert connection.described == 1
        row = await connection.fetchrow("SELECT $1::text AS a, $2::bigint AS b", "x", 7)
        assert (row["a"], row["b"]) == ("x", 7)
        await connection.execute("SELECT $1::int", 1)
        assert connection.described == 3
        # Still no named statement: nothing a pooler could send to the wrong server.
        assert await connection.fetchval("SELECT count(*) FROM pg_prepared_statements") == 0
        assert connection.described == 4
    finally:
        await connection.close()


async def test_a_pool_keeps_descriptions_per_connection(database_url: str):
    pool = await create_pool(database_url, min_size=2, max_size=2)
    try:
        async def call(i: int) -> int:
            return int(await pool.fetchval("SELECT $1::int + 1", i))
        assert await asyncio.gather(*(call(i) for i in range(40))) == [
            i + 1 for i in range(40)]
        holders = [holder._con for holder in pool._holders if holder._con is not None]
        assert holders and all(c.described <= 1 for c in holders)
    finally:
        await pool.close()


async def describes_of_three_calls(database_url: str, **connect_args: Any) -> int:
    """How many Describe round trips three calls of one query cost (each result checked)."""
    connection = await connect(database_url, **connect_args)
    try:
        for i in range(3):
            assert await connection.fetchval("SELECT $1::int", i) == i
        return int(connection.described)
    finally:
        await connection.close()


async def test_a_statement_cache_of_zero_keeps_nothing(database_url: str):
    assert await describes_of_three_calls(database_url, statement_cache=0) == 3


async def test_a_direct_connection_uses_named_statements_instead(database_url: str,
                                                                 db_route: str):
    if db_route == "pgbouncer":
        pytest.skip("named statements through a transaction-mode pooler fail: test_pooler.py")
    connection = await connect(database_url, pooler="none")
    try:
        for i in range(3):
            assert await connection.fetchval("SELECT $1::int", i) == i
        assert connection.described == 0
        assert await connection.fetchval("SELECT count(*) FROM pg_prepared_statements") >= 1
    finally:
        await connection.close()


async def test_types_changed_under_a_kept_description_fail_once_then_work(database_url: str):
    """An operator replaces a function with one of another result type while a connection
    keeps the old description: the next call fails with an error (never a wrong value), and
    the call after it describes the query again and returns the new type."""
    connection = await connect(database_url)
    try:
        await connection.execute(
            "CREATE FUNCTION answer() RETURNS integer LANGUAGE sql AS 'SELECT 42'")
        assert await connection.fetchval("SELECT answer()") == 42
        assert await connection.fetchval("SELECT answer()") == 42
        await connection.execute("DROP FUNCTION answer()")
        await connection.execute(
            "CREATE FUNCTION answer() RETURNS text LANGUAGE sql AS 'SELECT ''forty-two'''")
        # asyncpg finds 9 bytes where the kept description said a 4-byte integer.
        with pytest.raises(BufferError):
            await connection.fetchval("SELECT answer()")
        assert await connection.fetchval("SELECT answer()") == "forty-two"
    finally:
        await connection.close()


async def test_an_error_drops_the_description_and_the_connection_goes_on(database_url: str):
    connection = await connect(database_url)
    try:
        with pytest.raises(asyncpg.DataError):
            await connection.fetchval("SELECT 1 / $1::int", 0)
        assert await connection.fetchval("SELECT 1 / $1::int", 1) == 1
        assert connection.described == 2
        async with connection.transaction():
            assert await connection.fetchval("SELECT 1 / $1::int", 1) == 1
        assert connection.described == 2
    finally:
        await connection.close()


async def test_a_description_past_its_lifetime_is_described_again(
        database_url: str, monkeypatch: pytest.MonkeyPatch):
    assert await describes_of_three_calls(database_url) == 1
    monkeypatch.setattr(unnamed_statements, "DESCRIPTION_LIFETIME_S", 0.0)
    assert await describes_of_three_calls(database_url) == 3
