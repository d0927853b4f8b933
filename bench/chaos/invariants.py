"""The invariants I1-I9, checked at the end from the database and the downstream ledger.

I1 every run completed (or its message quarantined) - 0 lost;
I2 exactly one phase checkpoint per (workflow, branch, seq), no gaps, phases in order;
I3 exactly one downstream effect per idempotency key, one key per (workflow, seq, step), every
   committed phase's effect present, the key is the design's deterministic key;
I4 phases committed in order, never two of one run at once: for every run,
   effect(0) < commit(0) < effect(1) < commit(1) < ... (first effect attempt of a seq after
   the previous seq's commit, before its own), commit times strictly increasing;
I5 every poison message quarantined with the expected reason code, no payload in the reason,
   and the run whose group it was sent into completed;
I6 every fault kind in the schedule actually fired (counted);
I7 the run drained within a bound after the last fault;
I8 (``--branching``) every chaos-tree run has exactly its 7 chains' checkpoints, each of its 3
   forks fanned in once (one merge message, on the fork's parent chain) and saw every leaf.
I9 every run that has not ended has its position (run_positions, migration 0017) equal to its
   run row, and no other run has one: the stall report and the relay see the runs as they are.
   updated_at is the position's own during a local chain (migration 0021: a continued hop
   moves only the position's), so there the position's is never older than the run row's.
   A chain that holds a live lease may have its position behind its run row until its
   worker's next heartbeat (migration 0030), and only such a chain.
I10 (``--keyed``) a concurrency key never had more runs holding a slot than its limit, and
   some run waited for one (bench/chaos/keyed.py samples it through the run).
I11 (``--waits``) every waiting run kept its timer and got its signal once
   (bench/chaos/waits.py).

I2 and I4 are about one chain per run and apply to the linear runs; I3 covers every chain.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench.chaos.downstream import Ledger
from bench.chaos.poison import EXPECTED_CODE
from bench.chaos.workload import (
    FIRST_STEP_SEQ,
    PHASES,
    TREE_FANOUT,
    expected_key,
    is_tree,
    tree_chains,
)


@dataclass(frozen=True)
class SentPoison:
    kind: str
    message_id: str
    marker: str
    live_workflow_id: str | None


# What the runner's own queries meet while Postgres restarts under the schedule: each caller
# skips or retries on these, and fails loudly on anything else.
DATABASE_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)


@dataclass
class Result:
    name: str
    ok: bool
    detail: str


def _sample(items: list[Any], n: int = 5) -> str:
    return ", ".join(map(str, items[:n])) + (f" (+{len(items) - n} more)" if len(items) > n
                                             else "")


async def check_all(dsn: str, *, started: list[str], ledger: Ledger,
                    poisons: list[SentPoison], faults_expected: list[str],
                    faults_fired: dict[str, int], drain_s: float | None,
                    drain_bound_s: float) -> list[Result]:
    connection = await asyncpg.connect(dsn)
    try:
        runs = {r["workflow_id"]: r for r in await connection.fetch(
            "SELECT workflow_id, status, next_seq, error FROM workflow_runs")}
        checkpoints = await connection.fetch(
            "SELECT workflow_id, branch, seq, phase, state::text AS state, worker_id, "
            "created_at FROM checkpoints WHERE kind = 'phase' ORDER BY workflow_id, seq")
        quarantine = await connection.fetch("SELECT message_id, workflow_id, reason "
                                            "FROM quarantine")
        forks = await connection.fetch(
            "SELECT workflow_id, parent_branch, fork_seq, status, resolution FROM forks")
        merges = await connection.fetch(
            "SELECT workflow_id, branch, seq FROM outbox WHERE body LIKE '%\"kind\":\"merge\"%'")
        stray_positions = await connection.fetch(STRAY_POSITIONS)
    finally:
        await connection.close()
    chains: dict[str, list[asyncpg.Record]] = defaultdict(list)
    for row in checkpoints:
        chains[row["workflow_id"]].append(row)
    linear = [w for w in started if not is_tree(w)]
    results = [
        i1_no_run_lost(started, runs),
        i2_one_checkpoint_per_seq(linear, chains),
        i3_one_effect_per_key(started, chains, ledger),
        i4_in_order_never_concurrent(linear, chains, ledger),
        i5_poison_quarantined(poisons, quarantine, runs),
        i6_faults_fired(faults_expected, faults_fired),
        i7_drained(drain_s, drain_bound_s),
        i9_positions_match([r["workflow_id"] for r in stray_positions]),
    ]
    trees = [w for w in started if is_tree(w)]
    if trees:
        results.append(i8_trees_merged_once(trees, chains, forks, merges))
    return results


def i1_no_run_lost(started: list[str], runs: dict[str, Any]) -> Result:
    missing = [w for w in started if w not in runs]
    unfinished = [f"{w}:{runs[w]['status']}@{runs[w]['next_seq']}"
                  f"{' ' + str(runs[w]['error'])[:80] if runs[w]['error'] else ''}"
                  for w in started if w in runs and runs[w]["status"] != "completed"]
    extra = [w for w in runs if w not in set(started)]
    ok = not missing and not unfinished and not extra
    return Result("I1 every run completed, 0 lost", ok,
                  f"{len(started) - len(missing) - len(unfinished)}/{len(started)} completed"
                  + (f"; missing {_sample(missing)}" if missing else "")
                  + (f"; unfinished {_sample(unfinished)}" if unfinished else "")
                  + (f"; unexpected runs {_sample(extra)}" if extra else ""))


def i2_one_checkpoint_per_seq(started: list[str],
                              chains: dict[str, list[asyncpg.Record]]) -> Result:
    bad = []
    for wid in started:
        chain = chains.get(wid, [])
        seqs = [(r["branch"], r["seq"], r["phase"]) for r in chain]
        if seqs != [("main", i, p) for i, p in enumerate(PHASES)]:
            bad.append(f"{wid}:{[s[1] for s in seqs]}")
    total = sum(len(chains.get(w, [])) for w in started)
    return Result("I2 one checkpoint per (workflow, branch, seq), no gaps", not bad,
                  f"{total} checkpoints for {len(started)} runs x {len(PHASES)} phases"
                  + (f"; bad chains {_sample(bad)}" if bad else ""))


def i3_one_effect_per_key(started: list[str], chains: dict[str, list[asyncpg.Record]],
                          ledger: Ledger) -> Result:
    problems: list[str] = []
    keys_by_step: dict[tuple[str, str, int, int], set[str]] = defaultdict(set)
    for attempt in ledger.attempts:
        keys_by_step[(attempt.workflow_id, attempt.branch, attempt.seq,
                      attempt.step_seq)].add(attempt.key)
    multi = [k for k, v in ledger.applied.items() if v != 1]
    if multi:
        problems.append(f"keys applied more than once: {_sample(multi)}")
    for (wid, branch, seq, step_seq), keys in keys_by_step.items():
        if len(keys) != 1:
            problems.append(f"{wid}/{seq}/{step_seq} used {len(keys)} different keys")
        elif next(iter(keys)) != expected_key(wid, branch, seq, step_seq):
            problems.append(f"{wid}/{seq}/{step_seq} key is not the deterministic key")
    for wid in started:
        for row in chains.get(wid, []):
            step = (wid, row["branch"], row["seq"], FIRST_STEP_SEQ)
            step_keys = keys_by_step.get(step)
            if not step_keys:
                problems.append(f"{wid}/{row['seq']} committed without its effect")
                continue
            state = json.loads(row["state"])
            effect_id = ledger.effects.get(next(iter(step_keys)))
            if state.get("effects", [])[row["seq"]:row["seq"] + 1] != [effect_id]:
                problems.append(f"{wid}/{row['seq']} checkpoint does not hold its effect id")
    committed = {(w, r["branch"], r["seq"]) for w in started for r in chains.get(w, [])}
    orphans = [k for k in keys_by_step if k[:3] not in committed]
    if orphans:
        problems.append(f"effects for phases never committed: {_sample(orphans)}")
    return Result("I3 exactly one effect per idempotency key", not problems,
                  f"{len(ledger.effects)} effects, {len(ledger.attempts)} attempts"
                  + (f"; {_sample(problems)}" if problems else ""))


def i4_in_order_never_concurrent(started: list[str], chains: dict[str, list[asyncpg.Record]],
                                 ledger: Ledger) -> Result:
    first_attempt: dict[tuple[str, int], float] = {}
    for attempt in ledger.attempts:
        key = (attempt.workflow_id, attempt.seq)
        first_attempt[key] = min(first_attempt.get(key, attempt.at), attempt.at)
    bad = []
    for wid in started:
        previous_commit: float | None = None
        for row in chains.get(wid, []):
            commit = row["created_at"].timestamp()
            effect = first_attempt.get((wid, row["seq"]))
            if previous_commit is not None and commit <= previous_commit:
                bad.append(f"{wid}/{row['seq']} committed before seq {row['seq'] - 1}")
            if effect is not None and previous_commit is not None and effect <= previous_commit:
                bad.append(f"{wid}/{row['seq']} ran before seq {row['seq'] - 1} committed")
            if effect is not None and effect >= commit:
                bad.append(f"{wid}/{row['seq']} first effect after its own commit")
            previous_commit = commit
    return Result("I4 phases in order, never two of one run at once", not bad,
                  f"{sum(len(c) for c in chains.values())} commits ordered"
                  + (f"; {_sample(bad)}" if bad else ""))


def i5_poison_quarantined(poisons: list[SentPoison], quarantine: list[asyncpg.Record],
                          runs: dict[str, Any]) -> Result:
    by_message: dict[str, list[str]] = defaultdict(list)
    for row in quarantine:
        by_message[row["message_id"]].append(row["reason"])
    bad = []
    for poison in poisons:
        reasons = by_message.get(poison.message_id)
        if not reasons:
            bad.append(f"{poison.kind} {poison.message_id} not quarantined")
            continue
        if not all(r.startswith(EXPECTED_CODE[poison.kind] + ":") for r in reasons):
            bad.append(f"{poison.kind} quarantined as {reasons[0][:60]!r}")
        if any(poison.marker in r for r in reasons):
            bad.append(f"{poison.kind} reason echoes payload data")
        live = poison.live_workflow_id
        if live and (live not in runs or runs[live]["status"] != "completed"):
            bad.append(f"{poison.kind}: its group's run {live} did not continue")
    kinds = sorted({p.kind for p in poisons})
    return Result("I5 every poison quarantined with a reason, its group continued", not bad,
                  f"{len(poisons)} poison messages of {len(kinds)} kinds, "
                  f"{len(quarantine)} quarantine rows" + (f"; {_sample(bad)}" if bad else ""))


def i6_faults_fired(expected: list[str], fired: dict[str, int]) -> Result:
    missing = [k for k in expected if fired.get(k, 0) <= 0]
    shown = ", ".join(f"{k}={fired.get(k, 0)}" for k in sorted(set(expected) | set(fired)))
    return Result("I6 every scheduled fault kind fired", not missing,
                  shown + (f"; NEVER FIRED: {', '.join(missing)}" if missing else ""))


def i7_drained(drain_s: float | None, bound_s: float) -> Result:
    ok = drain_s is not None and drain_s <= bound_s
    shown = "never drained" if drain_s is None else f"{drain_s:.1f}s"
    return Result("I7 drained within the bound after the last fault", ok,
                  f"{shown} after the last fault (bound {bound_s:.0f}s)")


# Runs whose position differs from their run row (other than a live chain's, a heartbeat
# behind), lacks, or should not exist (ended runs).
STRAY_POSITIONS = """
SELECT coalesce(r.workflow_id, p.workflow_id) AS workflow_id
  FROM (SELECT * FROM workflow_runs
         WHERE status NOT IN ('completed', 'failed', 'cancelled')) r
  FULL JOIN run_positions p USING (workflow_id)
 WHERE ((r.workflow, r.status, r.next_seq, r.current_phase, r.tier, r.tier_label)
        IS DISTINCT FROM
        (p.workflow, p.status, p.next_seq, p.current_phase, p.tier, p.tier_label)
        AND NOT (p.chain_holder IS NOT NULL AND p.chain_until > now()
                 AND r.status = 'running' AND p.status = 'running'
                 AND p.next_seq < r.next_seq))
    OR NOT coalesce(p.updated_at >= r.updated_at, false)
"""


def i9_positions_match(stray: list[str]) -> Result:
    return Result("I9 every live run's position matches its run row, no other run has one",
                  not stray, f"{len(stray)} runs disagree"
                  + (f": {_sample(stray)}" if stray else ""))


def i8_trees_merged_once(trees: list[str], chains: dict[str, list[asyncpg.Record]],
                         forks: list[asyncpg.Record], merges: list[asyncpg.Record]) -> Result:
    expected = {(branch, seq, phase) for branch, steps in tree_chains().items()
                for seq, phase in steps}
    expected_forks = {("main", 0)} | {(f"f0.b{a}", 1) for a in range(TREE_FANOUT)}
    forks_by: dict[str, list[asyncpg.Record]] = defaultdict(list)
    for fork in forks:
        forks_by[fork["workflow_id"]].append(fork)
    merges_by: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for merge in merges:
        merges_by[merge["workflow_id"]].append((merge["branch"], merge["seq"]))
    bad = []
    for wid in trees:
        rows = chains.get(wid, [])
        got = [(r["branch"], r["seq"], r["phase"]) for r in rows]
        if len(got) != len(set(got)) or set(got) != expected:
            bad.append(f"{wid}: checkpoints {sorted(set(got) ^ expected)[:3]}")
        its = forks_by.get(wid, [])
        if {(f["parent_branch"], f["fork_seq"]) for f in its} != expected_forks or any(
                (f["status"], f["resolution"]) != ("merged", "fan_in") for f in its):
            bad.append(f"{wid}: forks {[tuple(f)[1:] for f in its]}")
        if sorted(merges_by.get(wid, [])) != sorted((p, s + 1) for p, s in expected_forks):
            bad.append(f"{wid}: merge messages {sorted(merges_by.get(wid, []))}")
        final = [r for r in rows if r["branch"] == "main" and r["phase"] == "publish"]
        if final and json.loads(final[0]["state"]).get("leaves") != TREE_FANOUT ** 2:
            bad.append(f"{wid}: the final state did not see every leaf")
    return Result("I8 every branching run: each chain once, each fork merged once", not bad,
                  f"{len(trees)} branching runs, {len(forks)} forks, {len(merges)} merges"
                  + (f"; {_sample(bad)}" if bad else ""))
