"""Statements named by their text, prepared on each client connection before its first use,
and again on a server connection that lacks them.

With ``PHASEGATE_DATABASE_POOLER=pgbouncer`` a query outside an explicit transaction is sent as
a named statement whose name is a hash of its text: the server parses and plans it once per
server connection, and every later call is Bind + Execute + Sync, with no Parse.

Each client connection sends Parse + Describe of a name before its first Bind of it, with no
Sync between them, so that Bind reaches the server connection the Parse did even through a
transaction pooler. PgBouncer 1.21 or later with ``max_prepared_statements`` set (200 by default
since 1.24) tracks named statements per client connection and closes a client that binds a
name it never parsed; having parsed, the client's later Binds work on any server connection,
PgBouncer preparing the statement there itself.

Without that tracking (PgBouncer before 1.21, or ``max_prepared_statements = 0``) a later Bind
may reach a server connection that never saw the name; the server answers ``prepared statement
"…" does not exist`` before executing anything, and the connection then sends Parse + Describe
of that name, without a Sync, and the Bind after it. Each server connection learns each
statement once.

The name depends only on the text, so every client connection sharing a server connection
means the same statement by it. A ``Parse`` of a name the server connection already holds (it
learnt it from another client) fails with ``already exists``, again before anything runs: the
Bind is sent (again). After ``MISSES_PER_CALL`` rounds of misses the call goes out unnamed, as
``transaction`` sends it.

What is not named:

- a query inside an explicit transaction: an error there would abort the transaction, so it
  is the unnamed statement, as with ``transaction``;
- anything asyncpg names or describes for itself (``prepare()``, cursors);
- everything when ``PHASEGATE_DB_STATEMENT_CACHE_SIZE`` is 0.

A server connection that holds a name prepared before DDL changed the query's result type
answers ``cached plan must not change result type`` at the Bind, before anything runs: the
connection then names its queries afresh (a new generation, in the text as a comment and so in
the hash) and sends the call again, described and prepared with the new types.

Not for RDS Proxy: a named statement that outlives its transaction pins the client to one
server connection there (docs/how-to/poolers.md).
"""

from __future__ import annotations

import hashlib
from typing import Any

from asyncpg import exceptions
from asyncpg.protocol.protocol import PreparedStatementState

from phasegate import metrics, unnamed_statements
from phasegate.unnamed_statements import KeptStatements, Key, UnnamedStatementConnection

# A name PostgreSQL keeps whole (NAMEDATALEN 64) and no other client would choose.
NAME_PREFIX = "phasegate_"
NAME_HASH_CHARS = 32
# Misses in one call before it goes out unnamed. A miss whose Parse succeeds is followed by a
# Bind on the same server connection, which then finds the statement; only a Parse that finds
# the name present (and a Bind that then lands on a server connection without it, after the
# Sync) makes another round. That takes another client's transaction on the server connection
# between the miss and the Parse, four times in a row: rare while the server connections learn
# a name, and impossible once every one holds it.
MISSES_PER_CALL = 4
# Names one client connection parses in its life; a query that would need one more goes out
# unnamed. A name parsed is never parsed again by the same client (PgBouncer's tracking closes a
# client that parses a name it already holds), so the set is never cleared; phasegate's own
# statements are a few dozen.
PARSED_MAX = 4 * unnamed_statements.DESCRIPTIONS_KEPT

_FIRST = metrics.STATEMENT_PREPARES.labels(outcome="first")
_MISSED = metrics.STATEMENT_PREPARES.labels(outcome="missed")
_ALREADY_THERE = metrics.STATEMENT_PREPARES.labels(outcome="already_there")
_UNNAMED = metrics.STATEMENT_PREPARES.labels(outcome="unnamed")


def statement_text(query: str, generation: int = 0) -> str:
    """What is parsed under the name: ``query``, and after DDL changed a result type, the
    query behind a comment naming the generation. PgBouncer's own tracking keys the server's
    statements by their text, so a new name over the same text would reach the statement
    prepared with the old result type again."""
    return query if not generation else f"/* phasegate generation {generation} */ {query}"


def statement_name(query: str, generation: int = 0) -> str:
    """The name of ``query``'s statement: the same on every client connection."""
    text = statement_text(query, generation)
    return NAME_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:NAME_HASH_CHARS]


class TextNamedStatementConnection(UnnamedStatementConnection):
    """An asyncpg connection whose queries outside a transaction are statements named by their
    text (``statement_name``), prepared again wherever the server lacks them.

    ``parsed_first`` counts the Parses sent before a name's first Bind on this connection,
    ``missed`` the Parse rounds sent after a miss, ``already_there`` the Parses that found the
    name present, ``unnamed_after_misses`` the calls sent unnamed after ``MISSES_PER_CALL``
    rounds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._named = KeptStatements(unnamed_statements.DESCRIPTIONS_KEPT)
        self._generation = 0
        self._naming_off = False
        # The names this client connection has sent a Parse of (``_introduce``).
        self._parsed: set[str] = set()
        self.parsed_first = 0
        self.missed = 0
        self.already_there = 0
        self.unnamed_after_misses = 0

    @property
    def kept_names(self) -> frozenset[str]:
        """The names of the statements this connection sends named now."""
        return frozenset(statement.name for statement in self._named.statements())

    @property
    def parsed_names(self) -> frozenset[str]:
        """The names this connection has sent a Parse of before their first Bind."""
        return frozenset(self._parsed)

    @property
    def generation(self) -> int:
        """How many times DDL made this connection name its queries afresh."""
        return self._generation

    def keep_descriptions(self, size: int) -> None:
        super().keep_descriptions(size)
        self._named.resize(size)

    def _names(self, named: str | bool | None, use_cache: bool) -> bool:
        return (not named and use_cache and not self._naming_off and not self._stmt_cache_enabled
                and self._named.size > 0 and not self.is_in_transaction())

    def _name_available(self, query: str) -> bool:
        """Whether ``query`` can go named: parsed here already, or room for one more name."""
        return (len(self._parsed) < PARSED_MAX
                or statement_name(query, self._generation) in self._parsed)

    # asyncpg's own signatures (a timeout argument among them), overridden as they are.
    async def _get_statement(self, query: str, timeout: float | None, *,  # noqa: ASYNC109
                             named: str | bool | None = False, use_cache: bool = True,
                             ignore_custom_codec: bool = False,
                             record_class: Any = None) -> Any:
        if not self._names(named, use_cache) or not self._name_available(query):
            return await super()._get_statement(
                query, timeout, named=named, use_cache=use_cache,
                ignore_custom_codec=ignore_custom_codec, record_class=record_class)
        key = self._description_key(query, record_class, ignore_custom_codec)
        statement = self._named.get(key)
        if statement is None:
            statement = await self._describe_named(query, timeout, key)
            self._named.put(key, statement)
        if statement.name not in self._parsed:
            await self._introduce(statement, timeout)
        return statement

    async def _describe_named(self, query: str, timeout: float | None,  # noqa: ASYNC109
                              key: Key) -> Any:
        """A named statement's state, described through the unnamed statement: a Parse of the
        name here could find it present on this server connection (another client's) and
        fail, and the description is all the client needs. The name's own first Parse on this
        connection comes next (``_introduce``), right before its first Bind."""
        _, record_class, ignore_custom_codec = key
        text = statement_text(query, self._generation)
        statement = PreparedStatementState(statement_name(query, self._generation), text,
                                           self._protocol, record_class, ignore_custom_codec)
        await self._protocol.prepare("", text, timeout, state=statement,
                                     record_class=record_class,
                                     ignore_custom_codec=ignore_custom_codec)
        missing = statement._init_types()
        tries = 0
        while missing:  # as asyncpg's own _get_statement: types it has no codec for yet
            types, _ = await self._introspect_types(missing, timeout)
            self._protocol.get_settings().register_data_types(types)
            missing = statement._init_types()
            tries += 1
            if tries > 5:
                raise exceptions.InternalClientError(
                    f"could not resolve the types of a query in {tries} attempts")
        statement._init_codecs()
        self.described += 1
        return statement

    async def _do_execute(self, query: str, executor: Any,
                          timeout: float | None,  # noqa: ASYNC109
                          retry: bool = True, *, ignore_custom_codec: bool = False,
                          record_class: Any = None) -> Any:
        key = self._description_key(query, record_class, ignore_custom_codec)
        for _ in range(MISSES_PER_CALL):
            try:
                return await super()._do_execute(
                    query, executor, timeout, retry, ignore_custom_codec=ignore_custom_codec,
                    record_class=record_class)
            except exceptions.InvalidSQLStatementNameError as exc:
                kept = self._named.get(key)
                # Only our statement's own miss: a query's own EXECUTE of a missing statement
                # fails as it would anywhere.
                if kept is None or self.is_in_transaction() or kept.name not in str(exc):
                    raise
                await self._prepare_here(kept, timeout)
            except exceptions.InvalidCachedStatementError:
                # A server connection holds the name with the result type it had before DDL
                # (refused at Bind, before anything ran): every query is named afresh, so each
                # is described and prepared again with its new types.
                if self.is_in_transaction():
                    raise
                self._generation += 1
                self._named.clear()
            except BaseException:
                self._named.pop(key)
                raise
        self.unnamed_after_misses += 1
        _UNNAMED.inc()
        self._named.pop(key)
        return await self._unnamed(query, executor, timeout, retry, ignore_custom_codec,
                                   record_class)

    async def _introduce(self, statement: Any, timeout: float | None) -> None:  # noqa: ASYNC109
        """The first Parse of a name on this client connection, right before its first Bind: a
        pooler that tracks named statements per client (PgBouncer's
        ``max_prepared_statements``) closes a client that binds a name it never parsed, and
        one that parses a name twice. So the name counts as parsed once the Parse is sent,
        whatever its answer: a Parse lost on the way shows as a miss, or as a closed
        connection the pool replaces, never as a second Parse."""
        self.parsed_first += 1
        _FIRST.inc()
        self._parsed.add(statement.name)
        await self._parse(statement, timeout)

    async def _prepare_here(self, statement: Any, timeout: float | None) -> None:  # noqa: ASYNC109
        """A miss: the statement parsed again where the Bind found it missing."""
        self.missed += 1
        _MISSED.inc()
        await self._parse(statement, timeout)

    async def _parse(self, statement: Any, timeout: float | None) -> None:  # noqa: ASYNC109
        """Parse + Describe of the statement's name with no Sync after it: the Bind that
        follows reaches the same server connection, even through a transaction pooler."""
        try:
            await self._protocol.prepare(statement.name, statement.query, timeout,
                                         state=statement, record_class=statement.record_class,
                                         ignore_custom_codec=statement.ignore_custom_codec)
        except exceptions.DuplicatePreparedStatementError:
            self.already_there += 1
            _ALREADY_THERE.inc()

    async def _unnamed(self, query: str, executor: Any, timeout: float | None,  # noqa: ASYNC109
                       retry: bool, ignore_custom_codec: bool, record_class: Any) -> Any:
        """This one call as ``transaction`` sends it."""
        self._naming_off = True
        try:
            return await super()._do_execute(
                query, executor, timeout, retry, ignore_custom_codec=ignore_custom_codec,
                record_class=record_class)
        finally:
            self._naming_off = False

    def _drop_local_statement_cache(self) -> None:
        super()._drop_local_statement_cache()
        self._named.clear()
