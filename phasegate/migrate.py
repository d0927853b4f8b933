"""Apply the numbered SQL migrations under a transaction-scoped advisory lock.

A transaction lock (not a session lock) keeps this correct behind PgBouncer in transaction
mode; two concurrent runs serialise on it and the second finds nothing left to do.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from phasegate.db import connect
from phasegate.sql import migration_files, queries

# An arbitrary constant: "phasegate" folded into a bigint. Changing it would let an old and a
# new release migrate at once.
MIGRATION_LOCK_KEY = 0x7068617365676174


@dataclass(frozen=True)
class MigrationReport:
    applied: list[str]
    current_version: int


async def migrate(dsn: str, *, target: int | None = None) -> MigrationReport:
    """Bring the database at ``dsn`` up to ``target`` (default: the newest migration)."""
    # Through a pooler too: the lock is transaction-scoped and no statement is named.
    connection = await connect(dsn)
    try:
        return await migrate_connection(connection, target=target)
    finally:
        await connection.close()


async def migrate_connection(connection: asyncpg.Connection, *,
                             target: int | None = None) -> MigrationReport:
    applied: list[str] = []
    q = queries("schema.sql")
    async with connection.transaction():
        await connection.execute(q["migration_lock"], MIGRATION_LOCK_KEY)
        await connection.execute(q["migrations_table"])
        done = {row["version"] for row in await connection.fetch(q["migrations_applied"])}
        for version, name, sql in migration_files():
            if target is not None and version > target:
                break
            if version in done:
                continue
            await connection.execute(sql)
            await connection.execute(q["migration_record"], version, name)
            applied.append(f"{version:04d}_{name}")
        current = await connection.fetchval(q["schema_version"])
    return MigrationReport(applied=applied, current_version=int(current))


async def schema_version(pool: asyncpg.Pool) -> int:
    """The newest migration applied to the database behind ``pool`` (0 before the first)."""
    q = queries("schema.sql")
    if not await pool.fetchval(q["migrations_table_exists"]):
        return 0
    return int(await pool.fetchval(q["schema_version"]))
