"""The one way every phasegate process opens PostgreSQL connections.

Worker, relay, orchestrator, ``migrate`` and the CLI all connect here, so what a pooler in
transaction mode (PgBouncer ``pool_mode = transaction``, RDS Proxy) needs is decided once:

- **No session state.** phasegate never uses session ``SET``, ``LISTEN``, temporary tables or
  session advisory locks (the migration lock is ``pg_advisory_xact_lock``); the pool's release
  hook therefore sends nothing (asyncpg's default reset is a second round trip per query).
- **No named prepared statements** with ``PHASEGATE_DATABASE_POOLER=transaction`` (the
  default): asyncpg's statement cache is off, so every query is parsed as the unnamed
  statement and bound in the same write, up to one Sync, which a pooler keeps on one server
  connection. A named statement prepared on one server connection and executed on another
  fails with ``prepared statement "__asyncpg_stmt_…__" does not exist``. The connections keep
  each query's description instead (phasegate/unnamed_statements.py, up to
  ``PHASEGATE_DB_STATEMENT_CACHE_SIZE`` queries), so a query costs one round trip, not two.
- ``PHASEGATE_DATABASE_POOLER=pgbouncer`` (PgBouncer in transaction mode, any version) names
  each query outside a transaction by a hash of its text and prepares it again on a server
  connection that lacks it (phasegate/named_statements.py): parsed and planned once per server
  connection, not on every call. Not behind RDS Proxy, where a named statement pins.
- ``PHASEGATE_DATABASE_POOLER=none`` (a direct connection) keeps asyncpg's cache of
  ``PHASEGATE_DB_STATEMENT_CACHE_SIZE`` named statements: the server parses and plans a
  query once per connection instead of on every call (docs/how-to/poolers.md has the
  measurement).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal

import asyncpg

from phasegate.named_statements import TextNamedStatementConnection
from phasegate.settings import Settings
from phasegate.unnamed_statements import UnnamedStatementConnection

Pooler = Literal["transaction", "pgbouncer", "none"]
POOLERS: tuple[Pooler, ...] = ("transaction", "pgbouncer", "none")
DEFAULT_STATEMENT_CACHE_SIZE = 100
# A stuck statement must not hold a pool slot forever; the longest query phasegate sends
# (a purge batch) takes well under a second on a million rows.
COMMAND_TIMEOUT_S = 60.0
APPLICATION_NAME = "phasegate"


def statement_cache_size(pooler: Pooler, configured: int = DEFAULT_STATEMENT_CACHE_SIZE) -> int:
    """asyncpg's prepared-statement cache for this pooler mode: 0 behind a pooler."""
    if pooler not in POOLERS:
        raise ValueError(f"pooler must be one of {', '.join(POOLERS)}, not {pooler!r}")
    return configured if pooler == "none" else 0


def _connect_kwargs(pooler: Pooler, cache: int, timeout_s: float) -> dict[str, object]:
    return {"statement_cache_size": statement_cache_size(pooler, cache),
            "connection_class": (TextNamedStatementConnection if pooler == "pgbouncer"
                                 else UnnamedStatementConnection),
            "timeout": timeout_s, "command_timeout": COMMAND_TIMEOUT_S,
            "server_settings": {"application_name": APPLICATION_NAME}}


def _keeping_descriptions(cache: int) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    async def init(connection: asyncpg.Connection) -> None:
        connection.keep_descriptions(cache)
    return init


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 4,
                      pooler: Pooler = "transaction",
                      statement_cache: int = DEFAULT_STATEMENT_CACHE_SIZE,
                      connect_timeout_s: float = 10.0) -> asyncpg.Pool:
    """A pool that is safe behind a transaction-mode pooler unless ``pooler="none"``
    (``"pgbouncer"``: behind PgBouncer, not RDS Proxy)."""
    pool = await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, reset=_no_session_state,
        init=_keeping_descriptions(statement_cache),
        **_connect_kwargs(pooler, statement_cache, connect_timeout_s))
    assert pool is not None
    return pool


async def connect(dsn: str, *, pooler: Pooler = "transaction",
                  statement_cache: int = DEFAULT_STATEMENT_CACHE_SIZE,
                  connect_timeout_s: float = 10.0) -> asyncpg.Connection:
    """One connection (migrations, the demo's progress view) with the same rules as a pool."""
    connection: asyncpg.Connection = await asyncpg.connect(
        dsn, **_connect_kwargs(pooler, statement_cache, connect_timeout_s))
    connection.keep_descriptions(statement_cache)
    return connection


async def _no_session_state(connection: asyncpg.Connection) -> None:
    """Release hook of the pool. asyncpg's default sends ``SELECT pg_advisory_unlock_all();
    CLOSE ALL; UNLISTEN *; RESET ALL`` on every release: a second round trip after every
    query. phasegate keeps no session state (no SET, LISTEN, session locks or cursors outside
    a transaction), and asyncpg still rolls back a transaction left open before this runs."""


async def pool_from_settings(settings: Settings, *, dsn: str | None = None,
                             min_size: int | None = None,
                             max_size: int | None = None) -> asyncpg.Pool:
    """The pool a phasegate process uses, from its settings (DSN defaults to
    PHASEGATE_DATABASE_URL; sizes to PHASEGATE_DB_POOL_MIN / _MAX)."""
    return await create_pool(
        dsn if dsn is not None else settings.database_url or "",
        min_size=settings.db_pool_min if min_size is None else min_size,
        max_size=settings.db_pool_max if max_size is None else max_size,
        pooler=settings.database_pooler, statement_cache=settings.db_statement_cache_size,
        connect_timeout_s=settings.db_connect_timeout_s)
