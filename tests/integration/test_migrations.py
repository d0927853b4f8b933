"""Migrations from an empty database, run twice, and run concurrently."""

from __future__ import annotations

import asyncio

from phasegate.migrate import migrate
from phasegate.sql import migration_files
from tests.helpers import fetch, fetchval


async def test_from_empty_then_again_is_a_no_op(empty_database_url):
    first = await migrate(empty_database_url)
    newest = migration_files()[-1][0]
    assert first.current_version == newest
    assert len(first.applied) == len(migration_files())
    tables = {r["tablename"] for r in await fetch(
        empty_database_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"workflow_runs", "checkpoints", "outbox", "quarantine",
            "phasegate_migrations"} <= tables
    second = await migrate(empty_database_url)
    assert second.applied == [] and second.current_version == newest


async def test_concurrent_runs_apply_each_migration_once(empty_database_url):
    reports = await asyncio.gather(*(migrate(empty_database_url) for _ in range(4)))
    applied = [name for report in reports for name in report.applied]
    assert sorted(applied) == sorted(f"{v:04d}_{n}" for v, n, _ in migration_files())
    assert await fetchval(empty_database_url,
                          "SELECT count(*) FROM phasegate_migrations") == len(migration_files())


async def test_upgrade_from_the_first_release(empty_database_url):
    """A database at 0001 (the first release) upgrades to the newest."""
    await migrate(empty_database_url, target=1)
    assert await fetchval(empty_database_url,
                          "SELECT max(version) FROM phasegate_migrations") == 1
    report = await migrate(empty_database_url)
    assert report.current_version == migration_files()[-1][0]
