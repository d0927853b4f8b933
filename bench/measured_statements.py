"""The statements ``bench.statement_costs`` measures: their labels, their bodies as a ``DO``
loop runs them inside the server (``$w`` the run, ``$s`` the phase), their SQL and each hop's
arguments as a worker sends them, alone and a batch of runs' hops per statement, what a
measured database holds before the first of them (``SETUP``), and what puts its runs back at
seq 0 between rounds (``BACK_TO_SEQ_0``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phasegate.sql import queries

RUNS = 16
STATE = '{"a": 1, "b": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

# Each body runs RUNS x phases times, $w the run (0..RUNS-1), $s the phase, then COMMIT.
COMMIT_HOP = "phasegate_commit_phase, a continued hop (chain lease)"
CONTINUE_HOP = "phasegate_continue_phase, a continued hop (migration 0021)"
# What no design that keeps a checkpoint row per phase can skip: the row itself, with the
# table's indexes, CHECKs and foreign key (which locks the run row: nothing else in the
# transaction did).
CHECKPOINT_ALONE = "checkpoint INSERT alone (no run row, no position)"
LOAD = "phasegate_load_for_phase, the check before a phase (a running run)"
BACK_TO_SEQ_0 = ("DELETE FROM checkpoints; DELETE FROM outbox; "
                 "UPDATE workflow_runs SET next_seq = 0, updated_at = now(); "
                 "UPDATE run_positions SET next_seq = 0, chain_holder = NULL, "
                 "chain_until = NULL")

SERVER_STATEMENTS = {
    "floor INSERT (one row, primary key)":
        f"INSERT INTO bench_floor VALUES ('r' || w, s, '{STATE}')",
    "phasegate_commit_phase, a continued hop (chain lease)":
        f"PERFORM * FROM phasegate_commit_phase('r' || w, 'main', s, 'p' || s, 1, '{STATE}', "
        "'h', 'p' || (s + 1), 'running', NULL, NULL, NULL, 'w1', NULL, 'd' || w || '-' || s, "
        "'g', '{\"v\":1}', NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'w1', 600, NULL)",
    CONTINUE_HOP:
        f"PERFORM phasegate_continue_phase('r' || w, 'main', s, 'p' || s, 1, '{STATE}', "
        "'h', 'p' || (s + 1), NULL, NULL, NULL, 'w1', NULL, NULL, NULL, NULL, NULL, 'w1', 600, "
        f"'{TRACE}')",
    "UPDATE workflow_runs SET next_seq (HOT, ten indexes, triggers on)":
        "UPDATE workflow_runs SET next_seq = s + 1, updated_at = now() "
        "WHERE workflow_id = 'r' || w AND next_seq = s AND status = 'running'",
    "the same UPDATE on a copy with every index and CHECK, no trigger":
        "UPDATE runs_indexed SET next_seq = s + 1, updated_at = now() "
        "WHERE workflow_id = 'r' || w AND next_seq = s AND status = 'running'",
    "the same UPDATE on a copy with every index, no CHECK, no trigger":
        "UPDATE runs_unchecked SET next_seq = s + 1, updated_at = now() "
        "WHERE workflow_id = 'r' || w AND next_seq = s AND status = 'running'",
    "the same UPDATE on a copy with only the primary key":
        "UPDATE runs_bare SET next_seq = s + 1, updated_at = now() "
        "WHERE workflow_id = 'r' || w AND next_seq = s AND status = 'running'",
    "UPDATE run_positions SET next_seq (HOT, primary key only)":
        "UPDATE run_positions SET next_seq = s + 1, updated_at = now() "
        "WHERE workflow_id = 'r' || w",
}

SETUP = f"""
CREATE TABLE bench_floor (workflow_id text, seq integer, state jsonb,
                          PRIMARY KEY (workflow_id, seq));
INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, current_phase,
                           schema_version, input)
SELECT 'r' || w, 'wf', 'running', 0, 'p0', 1, '{{}}' FROM generate_series(0, {RUNS - 1}) w;
CREATE TABLE runs_indexed (LIKE workflow_runs INCLUDING ALL) WITH (fillfactor = 70);
INSERT INTO runs_indexed SELECT * FROM workflow_runs;
CREATE TABLE runs_unchecked (LIKE workflow_runs INCLUDING ALL EXCLUDING CONSTRAINTS)
    WITH (fillfactor = 70);
INSERT INTO runs_unchecked SELECT * FROM workflow_runs;
CREATE TABLE runs_bare (LIKE workflow_runs INCLUDING DEFAULTS) WITH (fillfactor = 70);
ALTER TABLE runs_bare ADD PRIMARY KEY (workflow_id);
INSERT INTO runs_bare SELECT * FROM workflow_runs;
"""


# The statements a worker sends for one hop, as its store sends them (sql/queries.sql).
COMMIT_CALLS: dict[str, tuple[str, Callable[[int, int], tuple[object, ...]]]] = {
    "floor INSERT (one row, primary key)":
        ("INSERT INTO bench_floor (workflow_id, seq, state) VALUES ($1, $2, $3::jsonb)",
         lambda w, s: (f"r{w}", s, STATE)),
    CHECKPOINT_ALONE:
        ("INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, "
         "state, state_hash, worker_id) VALUES ($1, 'main', $2, $3, 'phase', 1, $4::jsonb, "
         "'h', 'w1')",
         lambda w, s: (f"r{w}", s, f"p{s}", STATE)),
    COMMIT_HOP:
        (queries()["commit_phase"],
         lambda w, s: (f"r{w}", "main", s, f"p{s}", 1, STATE, "h", f"p{s + 1}", "running",
                       None, None, None, "w1", None, f"d{w}-{s}", "g",
                       '{"traceparent": "' + TRACE + '"}',
                       None, None, None, None, None, None, None, "w1", 600.0, None)),
    CONTINUE_HOP:
        (queries()["continue_phase"],
         lambda w, s: (f"r{w}", "main", s, f"p{s}", 1, STATE, "h", f"p{s + 1}", None, None,
                       None, "w1", None, None, None, None, None, "w1", 600.0, TRACE)),
    # With continuation off every hop is these two: the check before the phase, then a
    # commit that writes the successor's outbox row (which the worker then sends).
    LOAD: (queries()["load_for_phase"], lambda w, s: (f"r{w}", "main", s)),
    "phasegate_commit_phase, a plain advance (outbox row)":
        (queries()["commit_phase"],
         lambda w, s: (f"r{w}", "main", s, f"p{s}", 1, STATE, "h", f"p{s + 1}", "running",
                       None, None, None, "w1", None, f"d{w}-{s}", f"r{w}",
                       '{"v":1,"kind":"phase","workflow_id":"r' + str(w) + '","workflow":"wf",'
                       '"seq":' + str(s + 1) + ',"phase":"p' + str(s + 1) + '","traceparent":"'
                       + TRACE + '"}',
                       None, None, None, None, None, None, None, None, 0.0, None)),
    "phasegate_advance_phase, a plain advance (migration 0027)":
        (queries()["advance_phase"],
         lambda w, s: (f"r{w}", "main", s, f"p{s}", 1, STATE, "h", f"p{s + 1}", None, None,
                       None, "w1", None, None, None, None, None, f"d{w}-{s}", f"r{w}",
                       '{"v":1,"kind":"phase","workflow_id":"r' + str(w) + '","workflow":"wf",'
                       '"seq":' + str(s + 1) + ',"phase":"p' + str(s + 1) + '","traceparent":"'
                       + TRACE + '"}')),
}
# Hops per statement in the batches section (16 groups batch about four to five).
BATCH = 4


def _commit_phases_hops(ws: list[int], s: int) -> tuple[Any, ...]:
    n = len(ws)
    return ([f"r{w}" for w in ws], ["main"] * n, [s] * n, [f"p{s}"] * n, [1] * n,
            [STATE] * n, ["h"] * n, [f"p{s + 1}"] * n, ["running"] * n, [None] * n,
            [None] * n, [None] * n, ["w1"] * n, [None] * n, [f"d{w}-{s}" for w in ws],
            [f"r{w}" for w in ws], ['{"traceparent": "' + TRACE + '"}'] * n, [None] * n,
            [None] * n, [None] * n, [None] * n, [None] * n, [None] * n, [None] * n,
            ["w1"] * n, [600.0] * n, [None] * n)


def _continue_phases_hops(ws: list[int], s: int) -> tuple[Any, ...]:
    n = len(ws)
    return ([f"r{w}" for w in ws], ["main"] * n, [s] * n, [f"p{s}"] * n, [1] * n,
            [STATE] * n, ["h"] * n, [f"p{s + 1}"] * n, [None] * n, [None] * n, [None] * n,
            ["w1"] * n, [None] * n, [None] * n, [None] * n, [None] * n, [None] * n,
            ["w1"] * n, [600.0] * n, [TRACE] * n)


CONTINUE_BATCH = "continued hops through phasegate_continue_phases (migration 0024)"

BATCH_CALLS = {
    "continued hops as rows of phasegate_commit_phases":
        (queries()["commit_phases"], _commit_phases_hops),
    CONTINUE_BATCH: (queries()["continue_phases"], _continue_phases_hops),
}
