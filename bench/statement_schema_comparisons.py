"""The sections that compare a schema before a migration with the newest, in interleaved
rounds on databases at each: what migrations 0022 (rules), 0025 and 0026 (schemas), 0028
(loads), 0029 (rows), 0030 (chains) and 0031 (positions) save each statement.
"""

from __future__ import annotations

from bench.measured_statements import (
    BATCH,
    COMMIT_HOP,
    CONTINUE_BATCH,
    CONTINUE_HOP,
    LOAD,
    SERVER_STATEMENTS,
    STATE,
)
from bench.statement_databases import _at_schemas, _from_seq_0
from bench.statement_timing import _calls, _hops

# The schema before migration 0022 (its row rules re-read from text by every statement).
RULES_BEFORE = 21
# The schemas the schemas section compares with the newest: before migration 0025 (the
# checkpoints' foreign key checked by every insert) and before 0026 (their history index
# written by every phase).
SCHEMAS_BEFORE = (24, 25)


async def rules(server_dsn: str, phases: int, rounds: int) -> dict[str, list[float]]:
    """The two commit functions' continued hops on a database at schema v21 and on one at the
    newest, in interleaved rounds: what migration 0022's row rules save each commit."""
    databases = await _at_schemas(server_dsn, RULES_BEFORE)
    found: dict[str, list[float]] = {}
    for _ in range(rounds):
        for statement in (COMMIT_HOP, CONTINUE_HOP):
            for schema, dsn in databases.items():
                await _from_seq_0(dsn)
                found.setdefault(f"{statement}, schema {schema}", []).append(
                    await _hops(dsn, SERVER_STATEMENTS[statement], phases))
    return found


async def schemas(server_dsn: str, phases: int, rounds: int
                  ) -> dict[str, list[dict[str, float]]]:
    """A continued hop on databases at schemas v24, v25 and the newest, in interleaved rounds:
    inside the server (wall), as a worker sends it alone and BATCH per statement (wall, client
    CPU, server CPU, WAL): what the checkpoints' foreign key (0025) and their history index
    (0026) cost each hop."""
    databases = await _at_schemas(server_dsn, *SCHEMAS_BEFORE)
    found: dict[str, list[dict[str, float]]] = {}
    for _ in range(rounds):
        for schema, dsn in databases.items():
            await _from_seq_0(dsn)
            found.setdefault(f"inside the server, schema {schema}", []).append(
                {"wall_us": await _hops(dsn, SERVER_STATEMENTS[CONTINUE_HOP], phases)})
            found.setdefault(f"alone, as sent, schema {schema}", []).append(
                await _calls(dsn, CONTINUE_HOP, phases))
            found.setdefault(f"{BATCH} per statement, as sent, schema {schema}", []).append(
                await _calls(dsn, CONTINUE_BATCH, phases, batch=BATCH))
    return found


# The schema the loads section compares with the newest: before migration 0028 (the claim's
# UPDATEs prepared for every message).
LOADS_BEFORE = 27


async def loads(server_dsn: str, phases: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    """The check before a phase of a running run on databases at schema v27 and the newest
    (analyzed, as a database in use is), in interleaved rounds: inside the server (wall) and
    as a worker sends it (wall, client CPU, server CPU)."""
    databases = await _at_schemas(server_dsn, LOADS_BEFORE)
    inside = "PERFORM * FROM phasegate_load_for_phase('r' || w, 'main', s)"
    found: dict[str, list[dict[str, float]]] = {}
    for _ in range(rounds):
        for schema, dsn in databases.items():
            await _from_seq_0(dsn, analyze=True)
            found.setdefault(f"inside the server, schema {schema}", []).append(
                {"wall_us": await _hops(dsn, inside, phases)})
            found.setdefault(f"alone, as sent, schema {schema}", []).append(
                await _calls(dsn, LOAD, phases))
    return found


# The schema the rows section compares with the newest: before migration 0029 (the row rules'
# functions called by every write, through one CHECK per table).
ROWS_BEFORE = 28
# What the rows section sends: the commits that name no rule's column but next_seq (a
# continued hop, a plain advance), and those that name status unchanged (the general commit,
# group commit's rows).
ROWS_CALLS = (CONTINUE_HOP, "phasegate_advance_phase, a plain advance (migration 0027)",
              COMMIT_HOP)
ROWS_BATCHES = (CONTINUE_BATCH, "continued hops as rows of phasegate_commit_phases")


ADVANCE_INSIDE = (
    f"PERFORM * FROM phasegate_advance_phase('r' || w, 'main', s, 'p' || s, 1, '{STATE}', 'h', "
    "'p' || (s + 1), NULL, NULL, NULL, 'w1', NULL, NULL, NULL, NULL, NULL, "
    "'d' || w || '-' || s, 'g', '{\"v\":1}')")
ROWS_INSIDE = {CONTINUE_HOP: SERVER_STATEMENTS[CONTINUE_HOP],
               "phasegate_advance_phase, a plain advance (migration 0027)": ADVANCE_INSIDE,
               COMMIT_HOP: SERVER_STATEMENTS[COMMIT_HOP]}


async def _against(server_dsn: str, phases: int, rounds: int, before: int,
                   inside: dict[str, str], calls: tuple[str, ...],
                   batches: tuple[str, ...]) -> dict[str, list[dict[str, float]]]:
    """Statements on databases at schema ``before`` and the newest, in interleaved rounds:
    ``inside`` run in the server (wall, the WAL flush off: the steadier figure), ``calls`` and
    ``batches`` as a worker sends them (wall, client CPU, server CPU, WAL per hop)."""
    databases = await _at_schemas(server_dsn, before)
    found: dict[str, list[dict[str, float]]] = {}
    for _ in range(rounds):
        for label, body in inside.items():
            for schema, dsn in databases.items():
                await _from_seq_0(dsn)
                found.setdefault(f"{label}, inside the server, schema {schema}", []).append(
                    {"wall_us": await _hops(dsn, body, phases)})
        for label in (*calls, *batches):
            for schema, dsn in databases.items():
                batch = BATCH if label in batches else 1
                found.setdefault(f"{label}, schema {schema}", []).append(
                    await _calls(dsn, label, phases, batch=batch))
    return found


async def rows(server_dsn: str, phases: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    """The commit statements at schema v28 and the newest: what migration 0029 (the row rules
    checked only by a write that can break them) saves each commit."""
    return await _against(server_dsn, phases, rounds, ROWS_BEFORE, ROWS_INSIDE, ROWS_CALLS,
                          ROWS_BATCHES)


# The schema before migration 0030 (every continued hop wrote its run's position).
CHAINS_BEFORE = 29


async def chains(server_dsn: str, phases: int,
                 rounds: int) -> dict[str, list[dict[str, float]]]:
    """A chain's continued hops at schema v29 and the newest, alone and four per statement:
    each run's first hop takes the lease, the others hold it (``phases`` hops a run), so this
    is a chain's steady state: what migration 0030 (the position left to the heartbeat while
    the lease lives) saves each hop."""
    return await _against(server_dsn, phases, rounds, CHAINS_BEFORE,
                          {CONTINUE_HOP: SERVER_STATEMENTS[CONTINUE_HOP]}, (CONTINUE_HOP,),
                          (CONTINUE_BATCH,))


# The schema before migration 0031 (the position trigger on every update, stood down by a
# flag the hot commits set on and off).
POSITIONS_BEFORE = 30


async def positions(server_dsn: str, phases: int,
                    rounds: int) -> dict[str, list[dict[str, float]]]:
    """The commit statements at schema v30 and the newest: a continued hop and a plain advance
    (which set the flag at v30 and pass the trigger by its columns since), and the general
    commit (which names status and keeps the flag), alone and four per statement."""
    return await _against(server_dsn, phases, rounds, POSITIONS_BEFORE, ROWS_INSIDE,
                          ROWS_CALLS, ROWS_BATCHES)
