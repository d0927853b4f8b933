"""What a starting worker refuses: errors that waiting cannot fix end it at once (exit 2)."""

from __future__ import annotations

import asyncpg

from phasegate.migrate import schema_version
from phasegate.sql import migration_files
from phasegate.store import Store

__all__ = ["PERMANENT_DB_ERRORS", "PermanentStartupError", "StartupError", "check_schema",
           "one_line"]


class StartupError(Exception):
    """The worker could not reach what it needs before the startup timeout."""


class PermanentStartupError(StartupError):
    """What the worker needs answers but cannot work (exit 2): waiting would not help."""


# asyncpg's errors that retrying cannot fix: a wrong password or user, a missing database.
PERMANENT_DB_ERRORS = (asyncpg.InvalidPasswordError,
                       asyncpg.InvalidAuthorizationSpecificationError,
                       asyncpg.InvalidCatalogNameError)


def one_line(exc: BaseException) -> str:
    """An error as one line (asyncpg's messages may span several)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


async def check_schema(store: Store) -> None:
    newest = migration_files()[-1][0]
    current = await schema_version(store.pool)
    if current < newest:
        raise StartupError(f"database schema is at version {current}, this worker "
                           f"needs {newest}: run `phasegate migrate` first")
