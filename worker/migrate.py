"""Apply the numbered SQL migrations under a transaction-scoped advisory lock.

A transaction lock (not a session lock) keeps this correct behind PgBouncer in transaction
mode; two concurrent runs serialise on it and the second finds nothing left to do.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from worker.db import connect
from worker.sql import migration_files

# An arbitrary constant: "phasegate" folded into a bigint. Changing it would let an old and a
# new release migrate at once.
MIGRATION_LOCK_KEY = 0x7068617365676174

_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS phasegate_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


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
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
        await connection.execute(_BOOKKEEPING)
        done = {row["version"] for row in
                await connection.fetch("SELECT version FROM phasegate_migrations")}
        for version, name, sql in migration_files():
            if target is not None and version > target:
                break
            if version in done:
                continue
            await connection.execute(sql)
            await connection.execute(
                "INSERT INTO phasegate_migrations (version, name) VALUES ($1, $2)", version, name)
            applied.append(f"{version:04d}_{name}")
        current = await connection.fetchval(
            "SELECT coalesce(max(version), 0) FROM phasegate_migrations")
    return MigrationReport(applied=applied, current_version=int(current))
