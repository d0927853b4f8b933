"""When group commit gives its connection back at once: the pool has nothing free to hand out.

One look at asyncpg's queue of free holders; a pool without that queue (another asyncpg)
is asked through its public counters instead. Both read the same state: the real pool is
tested in tests/integration/test_group_commit.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from phasegate.group_commit import GroupCommit


class CountingPool:
    """Public counters only, as asyncpg.Pool reports them."""

    def __init__(self, *, idle: int, size: int, max_size: int) -> None:
        self.idle, self.size, self.max_size = idle, size, max_size

    def get_idle_size(self) -> int:
        return self.idle

    def get_size(self) -> int:
        return self.size

    def get_max_size(self) -> int:
        return self.max_size


class QueuePool(CountingPool):
    def __init__(self, free: int, **counters: int) -> None:
        super().__init__(**counters)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        for _ in range(free):
            self._queue.put_nowait(object())


def busy(pool: Any) -> bool:
    group = GroupCommit(pool, single_sql="", batch_sql="", window_s=0.001)
    return group._pool_busy()


@pytest.mark.parametrize(("counters", "expected"), [
    ({"idle": 0, "size": 4, "max_size": 4}, True),
    ({"idle": 1, "size": 4, "max_size": 4}, False),
    ({"idle": 0, "size": 3, "max_size": 4}, False),  # one more can be opened
])
def test_without_the_queue_the_public_counters_decide(counters: dict[str, int], expected: bool):
    assert busy(CountingPool(**counters)) is expected


def test_the_queue_of_free_holders_decides_when_there_is_one():
    # Counters that would say "busy": the queue, which asyncpg keeps exactly, wins.
    counters = {"idle": 0, "size": 4, "max_size": 4}
    assert busy(QueuePool(1, **counters)) is False
    assert busy(QueuePool(0, **counters)) is True
