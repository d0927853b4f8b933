"""One network round trip per query behind a transaction-mode pooler.

Without named prepared statements (``PHASEGATE_DATABASE_POOLER=transaction``, the default)
asyncpg sends every query twice: Parse + Describe, a wait for the server's answer (the
parameter and result types, to pick codecs), then Parse + Bind + Execute + Sync. Two round
trips and two parses on the server for one statement.

The types a query's text resolves to do not change between calls on one connection (the
schema only grows compatibly between releases: a migration never changes the result of a
function or query phasegate sends), so the first call's description, with its codecs, is kept
per connection and every later call of the same text is the single write Parse + Bind +
Execute + Sync that asyncpg already sends for an unnamed statement. Still unnamed, still one
Sync: a pooler keeps the write on one server connection, as before.

If the server's types did change (an operator's DDL under a running fleet), the call fails
with asyncpg's decoding or the server's type error, the description is dropped, and the next
call describes again. One case does not fail: a result column replaced by another type of the
same binary width (integer by real) would be decoded with the old type. Named statements are
spared that by the server ("cached plan must not change result type"); here a description
lives at most ``DESCRIPTION_LIFETIME_S`` (asyncpg's own statement lifetime), and
docs/how-to/poolers.md says to restart the fleet after DDL that changes such a type.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import asyncpg

# As asyncpg's own statement cache; phasegate/db.py sets PHASEGATE_DB_STATEMENT_CACHE_SIZE.
DESCRIPTIONS_KEPT = 100
DESCRIPTION_LIFETIME_S = 300.0


Key = tuple[object, ...]


class KeptStatements:
    """A connection's statements kept by query: at most ``size`` (the least recently used
    dropped first; 0: none), each for ``DESCRIPTION_LIFETIME_S`` after it was kept."""

    def __init__(self, size: int) -> None:
        self._kept: OrderedDict[Key, tuple[Any, float]] = OrderedDict()
        self.size = size

    def get(self, key: Key) -> Any:
        """The statement kept for ``key`` and still within its lifetime, else None."""
        kept = self._kept.get(key)
        if kept is None:
            return None
        statement, until = kept
        if time.monotonic() < until:
            self._kept.move_to_end(key)
            return statement
        del self._kept[key]
        return None

    def put(self, key: Key, statement: Any) -> None:
        if self.size:
            self._kept[key] = (statement, time.monotonic() + DESCRIPTION_LIFETIME_S)
            self.resize(self.size)

    def resize(self, size: int) -> None:
        self.size = max(size, 0)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def pop(self, key: Key) -> None:
        self._kept.pop(key, None)

    def clear(self) -> None:
        self._kept.clear()

    def statements(self) -> list[Any]:
        return [statement for statement, _ in self._kept.values()]


class UnnamedStatementConnection(asyncpg.Connection):  # type: ignore[misc]
    """An asyncpg connection that keeps the descriptions of its unnamed statements.

    Only when asyncpg's own (named) statement cache is off; with it on, asyncpg's cache is
    used unchanged. ``described`` counts the Describe round trips this connection made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._descriptions = KeptStatements(DESCRIPTIONS_KEPT)
        self.described = 0

    def keep_descriptions(self, size: int) -> None:
        """At most ``size`` queries' descriptions (least recently used dropped); 0: none."""
        self._descriptions.resize(size)

    def _description_key(self, query: str, record_class: Any,
                         ignore_custom_codec: bool) -> Key:
        if record_class is None:
            record_class = self._protocol.get_record_class()
        return (query, record_class, ignore_custom_codec)

    # asyncpg's own signatures (a timeout argument among them), overridden as they are.
    async def _get_statement(self, query: str, timeout: float | None, *,  # noqa: ASYNC109
                             named: str | bool | None = False, use_cache: bool = True,
                             ignore_custom_codec: bool = False,
                             record_class: Any = None) -> Any:
        if named or not use_cache or self._stmt_cache_enabled:
            return await super()._get_statement(
                query, timeout, named=named, use_cache=use_cache,
                ignore_custom_codec=ignore_custom_codec, record_class=record_class)
        key = self._description_key(query, record_class, ignore_custom_codec)
        kept = self._descriptions.get(key)
        if kept is not None:
            return kept
        statement = await super()._get_statement(
            query, timeout, named=named, use_cache=use_cache,
            ignore_custom_codec=ignore_custom_codec, record_class=record_class)
        self.described += 1
        # asyncpg marks an unnamed statement unprepared when its cache is off, so every
        # execution sends its Parse in the same write as Bind and Execute; a statement
        # that is still marked prepared (its Parse would be gone by the next call) is not kept.
        if not statement.name and not statement.prepared:
            self._descriptions.put(key, statement)
        return statement

    async def _do_execute(self, query: str, executor: Any,
                          timeout: float | None,  # noqa: ASYNC109
                          retry: bool = True, *, ignore_custom_codec: bool = False,
                          record_class: Any = None) -> Any:
        try:
            return await super()._do_execute(
                query, executor, timeout, retry, ignore_custom_codec=ignore_custom_codec,
                record_class=record_class)
        except BaseException:
            # Whatever failed (a constraint, a cancel, or types that changed under the kept
            # description), the next call describes the query afresh: one round trip more
            # after an error, never a stale description kept.
            self._descriptions.pop(
                self._description_key(query, record_class, ignore_custom_codec))
            raise

    def _drop_local_statement_cache(self) -> None:
        super()._drop_local_statement_cache()
        self._descriptions.clear()
