"""What "phasegate's own database is unreachable" looks like from asyncpg.

One definition for every caller: the transition hands the message back with a backoff and
does not charge the phase's retry budget, the step ledger raises LedgerUnavailable, and the
group commit does not retry rows one by one against a link that is gone.
"""

from __future__ import annotations

import asyncpg

# InternalClientError: asyncpg's protocol state machine on a connection the server (or a
# pooler in front of it) just dropped mid-statement ("cannot switch to state ..."). It is the
# link failing, never the phase's code.
DATABASE_DOWN: tuple[type[BaseException], ...] = (
    OSError, TimeoutError, asyncpg.InterfaceError, asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError, asyncpg.exceptions.OperatorInterventionError)
