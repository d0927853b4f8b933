"""The databases the statements are measured on: a fresh one migrated to a given schema, one
with the measured statements' setup, one of each schema a section compares, and any of them put
back to seq 0 so each round starts from the same pages.
"""

from __future__ import annotations

import uuid

import asyncpg

from bench.common import with_database
from bench.measured_statements import BACK_TO_SEQ_0, SETUP
from phasegate.migrate import migrate


async def fresh_database(server: str, target: int | None = None) -> str:
    """A new database, migrated to ``target`` (default: the newest schema)."""
    admin = await asyncpg.connect(server)
    try:
        name = f"stmt_{uuid.uuid4().hex[:10]}"
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = with_database(server, name)
    await migrate(dsn, target=target)
    return dsn


async def _from_seq_0(dsn: str, *, analyze: bool = False) -> None:
    """Every run back at seq 0, no checkpoint, no outbox or floor row, the written tables
    vacuumed (and analyzed, with ``analyze``): each round starts from the same pages."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(BACK_TO_SEQ_0 + "; DELETE FROM bench_floor")
        for table in ("workflow_runs", "run_positions", "checkpoints", "outbox", "bench_floor"):
            await connection.execute(f"VACUUM {'ANALYZE ' if analyze else ''}{table}")
    finally:
        await connection.close()


async def _at_schemas(server_dsn: str, *before: int) -> dict[str, str]:
    """Fresh databases with the setup: one at each schema of ``before``, one at the newest."""
    targets: list[tuple[str, int | None]] = [(f"v{b}", b) for b in before]
    return {schema: await _with_setup(server_dsn, target)
            for schema, target in [*targets, ("newest", None)]}


async def _with_setup(server_dsn: str, target: int | None = None) -> str:
    """A fresh database at schema ``target`` (None: the newest) holding the setup."""
    dsn = await fresh_database(server_dsn, target)
    setup = await asyncpg.connect(dsn)
    try:
        await setup.execute(SETUP)
    finally:
        await setup.close()
    return dsn
