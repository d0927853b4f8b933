"""Group commit: concurrent phase commits of one process share one statement.

The same machinery groups the check before the phase (``load_for_phase``, "group load"):
concurrent loads of a worker share one multi-row read.

Every commit is one round trip and one transaction (with ``synchronous_commit`` on, one WAL
flush). When several transitions of a worker commit at the same moment, they are sent as
ONE multi-row statement (``commit_phases`` in sql/queries.sql) in which each row's condition
(the run still at this seq and running) is checked on its own: a stale or duplicate commit
only loses its own row, and every caller gets its own answer.

When to send, so that batching never costs a lone commit anything:

- nothing in flight: the commit is sent at once, alone (the single-row statement, or the
  leaner statement the caller gave for it alone: a continued hop's ``continue_phase``,
  migration 0021);
- a commit statement of this store is in flight: the new one waits for it to finish, or for
  the window (``PHASEGATE_COMMIT_BATCH_WINDOW_MS``) at the latest, and goes with whatever
  else queued up meanwhile.

One connection is kept between statements while commits keep coming (a worker's chain commits
back to back): the pool's acquire and release cost a quarter of the client CPU of a statement
(``python -m bench.statement_costs``). It goes back to the pool once nothing has used it for
``IDLE_RELEASE_S``, after any error, at once when every other connection of the pool is taken
(someone may be waiting for it), and is never kept in a pool too small to spare it.

A call may bring its own statement for when it goes alone (a continued hop's
``continue_phase``), and that statement may have a multi-row form of its own (``batch_alone``:
``continue_phases``, migration 0024): a batch whose every call brought the same statement goes
as that multi-row form, with the calls' own arguments; a batch mixing them goes as the shared
multi-row statement (``commit_phases``), which takes every call.

If the multi-row statement fails as a whole (a constraint one row breaks, a deadlock between
two batches), each of its commits is retried on its own with the single-row statement, so only
the bad one fails. A lost connection is not retried here: every caller gets the error, as a
single commit would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import asyncpg

from phasegate import metrics
from phasegate.db_errors import DATABASE_DOWN

# Bounded so one statement stays small (21 arrays of this many elements) and one slow batch
# cannot hold a large share of a worker's transitions.
MAX_BATCH = 64
# How long the kept connection may sit unused before it goes back to the pool: long enough to
# span a chain's phases, short enough that a closing pool (which waits for it) barely notices.
IDLE_RELEASE_S = 0.05
# A pool smaller than this lends each statement its connection and takes it back at once:
# keeping one would leave too little for steps, heartbeats and the other group.
MIN_POOL_TO_KEEP = 3

Args: TypeAlias = tuple[Any, ...]
Result: TypeAlias = "asyncpg.Record | None"
# A call's own statement and arguments for when it goes alone; its row must carry the columns
# the single-row statement's does that the caller reads.
Alone: TypeAlias = "tuple[str, Args] | None"


class GroupCommit:
    """Batches calls of one single-row statement (``commit_phase``, ``load_for_phase``) into
    its multi-row form over one pool; see the module docstring."""

    def __init__(self, pool: asyncpg.Pool, *, single_sql: str, batch_sql: str,
                 window_s: float, max_batch: int = MAX_BATCH, name: str = "commit",
                 batch_alone: Mapping[str, str] | None = None,
                 lone_in_caller: bool = False) -> None:
        if window_s <= 0:
            raise ValueError("a group commit needs a window above 0 (0 turns it off)")
        self._pool = pool
        self._single_sql = single_sql
        self._batch_sql = batch_sql
        self._window_s = window_s
        self._max_batch = max_batch
        # A call's own statement -> its multi-row form (the module docstring).
        self._batch_alone = dict(batch_alone or {})
        # A read: a call that goes alone runs in its caller's task (see ``commit``).
        self._lone_in_caller = lone_in_caller
        self._size = metrics.GROUP_COMMIT_SIZE.labels(statement=name)
        self._fallbacks = metrics.GROUP_COMMIT_FALLBACKS.labels(statement=name)
        self._pending: list[tuple[Args, asyncio.Future[Result], Alone]] = []
        self._in_flight = 0
        self._timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        # The kept connection (see the module docstring) and its idle check.
        self._keep = pool.get_max_size() >= MIN_POOL_TO_KEEP if pool is not None else False
        self._kept: Any = None
        self._kept_used = 0.0
        self._idle_check: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.statements = 0  # multi-row statements sent (tests and bench read it)
        self.alone_batches = 0  # of those, the multi-row forms of the calls' own statements

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The pool's event loop, looked up once: ``asyncio.get_running_loop()`` makes a
        getpid() system call on every call (CPython 3.11), and a commit needed three."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    @property
    def kept_server_pid(self) -> int | None:
        """The server process of the kept connection; None when none is kept (tests)."""
        return None if self._kept is None else int(self._kept.get_server_pid())

    @property
    def queued(self) -> int:
        """Calls waiting for the next statement (tests wait on it)."""
        return len(self._pending)

    async def commit(self, args: Args, alone: Alone = None) -> Result:
        """Run one call (the single-row statement's arguments) in the next statement; its row,
        or None (a commit superseded, a run that does not exist). ``alone``: the statement and
        arguments to send instead when the call goes by itself (a leaner statement for it;
        the multi-row statement takes ``args`` like any other)."""
        if self._lone_in_caller and self._in_flight == 0 and not self._pending:
            return await self._lone(args, alone)
        loop = self._event_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._pending.append((args, future, alone))
        if self._in_flight == 0 or len(self._pending) >= self._max_batch:
            self._start_flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._window_s, self._start_flush)
        # The flush owns the outcome: a cancelled caller (shutdown) cancels only its own
        # future, which the flush then skips; its commit still goes out with the statement,
        # like a shielded single commit. (A shield here cost a future and two callbacks per
        # commit, and changed nothing: the flush never looks at a caller's task.)
        return await future

    async def _lone(self, args: Args, alone: Alone) -> Result:
        """A call with nothing in flight and nothing queued, sent from its caller's task: no
        flush task, no future. Only for statements that write nothing (``lone_in_caller``): a
        cancelled caller cancels the statement itself, which a commit must not allow (the
        module docstring). What queues meanwhile goes when it is done, as after a flush."""
        self._in_flight += 1
        self._size.observe(1)
        try:
            sql, own_args = alone if alone is not None else (self._single_sql, args)
            result: Result = await self._statement(sql, own_args, many=False)
            return result
        finally:
            self._in_flight -= 1
            if self._pending:
                self._start_flush()

    def _start_flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = (self._pending[:self._max_batch],
                                self._pending[self._max_batch:])
        if not batch:
            return
        self._in_flight += 1
        # Not a fire-and-forget task: it settles every future of its batch whatever happens,
        # and every caller awaits its future, so nothing it does goes unseen. A stopping worker
        # drains its transitions first, so no flush outlives them.
        task = self._event_loop().create_task(self._flush(batch))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self, batch: list[tuple[Args, asyncio.Future[Result], Alone]]) -> None:
        self._size.observe(len(batch))
        try:
            if len(batch) == 1:
                sql, args = self._alone(batch[0])
                results: Sequence[Result | BaseException] = [
                    await self._statement(sql, args, many=False)]
            else:
                results = await self._together([args for args, _, _ in batch],
                                                [alone for _, _, alone in batch])
        except BaseException as exc:
            results = [exc] * len(batch)
        finally:
            self._in_flight -= 1
            if self._pending:
                self._start_flush()
        for (_, future, _), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, asyncio.CancelledError):  # the loop is going away
                future.cancel()
            elif isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _alone(self, call: tuple[Args, asyncio.Future[Result], Alone]) -> tuple[str, Args]:
        args, _, alone = call
        return alone if alone is not None else (self._single_sql, args)

    async def _together(self, batch: list[Args], alone: Sequence[Alone] = ()
                        ) -> Sequence[Result | BaseException]:
        """``batch`` in one multi-row statement (the multi-row form of the calls' own statement
        when they all brought the same one and it has one); should it fail as a whole, each
        call alone (in its ``alone`` form when it has one)."""
        sql, calls = self._batch_sql, batch
        own = {form[0] for form in alone if form is not None}
        if len(own) == 1 and all(alone) and (lean := self._batch_alone.get(own.pop())):
            sql, calls = lean, [form[1] for form in alone if form is not None]
        # Rows sorted by run (every statement's first argument) so two batches lock shared
        # runs in the same order (duplicates of one message in two workers), which keeps
        # deadlocks rare; one is retried anyway.
        order = sorted(range(len(calls)), key=lambda i: calls[i][0])
        columns = [list(column) for column in zip(*(calls[i] for i in order), strict=True)]
        try:
            rows: list[asyncpg.Record] = await self._statement(sql, columns, many=True)
        except DATABASE_DOWN:  # retrying each row alone would only repeat it, slower
            raise
        except asyncpg.PostgresError:
            self._fallbacks.inc()
            forms = list(alone) or [None] * len(batch)
            statements = [form or (self._single_sql, args)
                          for args, form in zip(batch, forms, strict=True)]
            one_by_one: list[Result | BaseException] = await asyncio.gather(
                *(self._pool.fetchrow(own_sql, *own_args) for own_sql, own_args in statements),
                return_exceptions=True)
            return one_by_one
        self.statements += 1
        if sql is not self._batch_sql:
            self.alone_batches += 1
        won = {order[row["i"] - 1]: row for row in rows}
        return [won.get(i) for i in range(len(batch))]

    # -- the kept connection

    async def _statement(self, sql: str, args: Sequence[Any], *, many: bool) -> Any:
        """One statement on the kept connection (or a pool connection, kept afterwards when
        none is); any error gives the connection back to the pool, which knows what to do
        with a broken one."""
        connection, self._kept = self._kept, None
        if connection is not None and not _open(connection):  # the server ended it meanwhile
            await self._release(connection)
            connection = None
        if connection is None:
            connection = await self._pool.acquire()
        try:
            result = await (connection.fetch(sql, *args) if many
                            else connection.fetchrow(sql, *args))
        except BaseException:
            await self._release(connection)  # never masks the statement's own error
            raise
        if not self._keep or self._kept is not None or self._pool_busy():
            await self._pool.release(connection)
            return result
        self._kept = connection
        loop = self._event_loop()
        self._kept_used = loop.time()
        if self._idle_check is None:
            self._idle_check = loop.call_later(IDLE_RELEASE_S, self._release_if_idle)
        return result

    def _pool_busy(self) -> bool:
        """No connection free in the pool and none left to open: someone may be waiting for
        the one this statement used (a step, a heartbeat, the emergency flush)."""
        # asyncpg's queue of free holders (idle connections and slots not yet connected) is
        # empty exactly then: one look, where get_idle_size() and get_size() each walk every
        # holder, on every statement (4 % of a continued hop's client CPU, bench/profile.py).
        free = getattr(self._pool, "_queue", None)
        if free is not None:
            return bool(free.empty())
        idle: int = self._pool.get_idle_size()
        size: int = self._pool.get_size()
        return idle == 0 and size >= self._pool.get_max_size()

    def _release_if_idle(self) -> None:
        self._idle_check = None
        if self._kept is None:
            return
        loop = self._event_loop()
        idle_for = loop.time() - self._kept_used
        if idle_for < IDLE_RELEASE_S:  # used meanwhile: look again when it could be idle
            self._idle_check = loop.call_later(IDLE_RELEASE_S - idle_for,
                                               self._release_if_idle)
            return
        connection, self._kept = self._kept, None
        task = loop.create_task(self._release(connection))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _release(self, connection: Any) -> None:
        # A pool terminated meanwhile has already closed it.
        with contextlib.suppress(asyncpg.InterfaceError, asyncpg.PostgresError, OSError):
            await self._pool.release(connection)


def _open(connection: Any) -> bool:
    """False once the connection's socket closed: asyncpg then hands its slot back to the pool
    itself and detaches the connection we hold, which raises on every call."""
    try:
        return not connection.is_closed()
    except asyncpg.InterfaceError:
        return False
