"""The purge of stale worker presence rows (phasegate/presence.py): rows of workers killed,
scaled in or stopped, once not seen for ``PHASEGATE_PRESENCE_RETENTION_S``.

A supervised task of the orchestrator that never ends of its own: a failed round (the
database down) is logged and the next one tries again. Every orchestrator replica runs one; a
DELETE of rows another replica deleted first deletes nothing.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress

import asyncpg
import structlog

from phasegate.presence import purge_stale

log = structlog.get_logger("phasegate.presence")

# Rounds are at most this far apart: stale rows cost nothing but a line each on no page.
MAX_INTERVAL_S = 60.0


class PresencePurger:
    def __init__(self, pool: asyncpg.Pool, retention_s: float) -> None:
        self.pool = pool
        self.retention_s = retention_s
        self.interval_s = max(1.0, min(MAX_INTERVAL_S, retention_s / 4))
        self.purged = 0
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        while not self._stop.is_set():
            await self.purge_once()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval_s)

    async def purge_once(self) -> int:
        try:
            purged = await purge_stale(self.pool, self.retention_s)
        except Exception as exc:
            log.warning("presence_purge_failed", error=type(exc).__name__)
            return 0
        if purged:
            self.purged += purged
            log.info("presence_purged", rows=purged, older_than_s=self.retention_s)
        return purged
