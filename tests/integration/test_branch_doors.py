"""The main chain's doors inside branches, against real Postgres and SQS: a branch whose
observed resource changed stops as `stale` (not the run) and its fork counts it like a failed
branch; a below-tier `retry` re-runs the branch phase from its first attempt's input inside
the branch's chain; a result the policy would escalate fails the branch (BelowTierError) for
the merge phase to decide."""

from __future__ import annotations

import json
from typing import Any

import pytest

from phasegate.settings import Settings
from phasegate.workflow import Registry
from tests.branch_helpers import (
    branch_settings,
    inspect_tree,
    main_state,
    main_states,
    ran,
    start,
)
from tests.helpers import all_done, fetch, fetchval, running_worker, wait_for
from tests.workflows_branch_doors import scout

MODULES = "tests.workflows_branch_doors"
REGISTRY = Registry([scout])


@pytest.fixture
def settings(database_url, queue_pair, sqs_endpoint):
    """Every checkpoint counts as old: the staleness check runs at every branch door."""
    return branch_settings(database_url, queue_pair, sqs_endpoint, stale_after_s=0.0)


async def branches(settings: Settings, wid: str) -> dict[str, tuple[str, str | None]]:
    rows = await fetch(settings.database_url or "", "SELECT branch, status, error FROM "
                       "branches WHERE workflow_id = $1", wid)
    return {r["branch"]: (r["status"], r["error"]) for r in rows}


async def chain(settings: Settings, wid: str, branch: str) -> list[tuple[Any, ...]]:
    rows = await fetch(settings.database_url or "", "SELECT seq, phase, outcome, rerun_of, "
                       "tier FROM checkpoints WHERE workflow_id = $1 AND branch = $2 AND "
                       "kind = 'phase' ORDER BY seq", wid, branch)
    return [tuple(r) for r in rows]


async def test_stale_retry_and_escalation_stay_in_their_branches(settings):
    """Four branches of an `all` fork: `stale` changes its document after reading it, `fine`
    does not, `retried` reaches the expected tier on its second attempt, `short` never does.
    The run completes; the merge sees each branch's fate."""
    wid = await start(settings, scout, {"branches": {
        "stale": {"doc": "d-stale", "change_after_read": True},
        "fine": {"doc": "d-fine"},
        "retried": {"doc": "d-retried", "found_on": 2},
        "short": {"doc": "d-short", "found_on": 9}}})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url or "", [wid]),
                       what="run completed")
    decided = await main_state(settings, wid, "decide")
    assert decided["seen"] == {
        "f0.stale": {"status": "stale", "error_type": "stale_resources", "read_attempt": None},
        "f0.fine": {"status": "merged", "error_type": None, "read_attempt": 1},
        "f0.retried": {"status": "merged", "error_type": None, "read_attempt": 2},
        "f0.short": {"status": "failed", "error_type": "BelowTierError", "read_attempt": None}}
    rows = await branches(settings, wid)
    assert rows["f0.stale"] == ("stale", "stale_resources: doc:d-stale (recorded v1, now v2)")
    assert rows["f0.fine"] == ("merged", None) and rows["f0.retried"] == ("merged", None)
    assert rows["f0.short"][0] == "failed"
    assert rows["f0.short"][1] == ("BelowTierError: below_tier: phase read reached tier 0 "
                                   "after 3 attempts, expected tier 1 (found)")
    # The stale branch never ran `use`; the run itself never stopped.
    assert await ran(settings, "use", "f0.stale") == 0
    assert await chain(settings, wid, "f0.stale") == [(1, "read", None, None, 1)]
    # Below-tier retry inside the branch: each attempt its own checkpoint, then on.
    assert await chain(settings, wid, "f0.retried") == [
        (1, "read", "retry", None, 0), (2, "read", None, 1, 1), (3, "use", None, None, 1)]
    assert await ran(settings, "read", "f0.retried") == 2
    # Escalation: two retries committed, the third attempt failed the branch.
    assert await chain(settings, wid, "f0.short") == [
        (1, "read", "retry", None, 0), (2, "read", "retry", 1, 0)]
    assert await ran(settings, "read", "f0.short") == 3
    assert await fetchval(settings.database_url or "", "SELECT status FROM workflow_runs "
                          "WHERE workflow_id = $1", wid) == "completed"
    lines = await inspect_tree(settings, MODULES, wid)
    print("\n".join(lines))  # the report quotes this tree
    # Fork order is the input's key order as jsonb keeps it (by length, then bytes).
    assert lines[1:] == [
        "├── * 0 plan  fork all -> decide: fan_in (4/4 done)",
        "│   ├── f0.fine     merged     1 read, 2 use",
        "│   ├── f0.short    failed     1 read, 2 read",
        "│   ├── f0.stale    stale      1 read",
        "│   └── f0.retried  merged     1 read, 2 read, 3 use",
        "└── * 1 decide  <- merge of f0.fine, f0.retried (failed: f0.short; stale: f0.stale)",
    ]


async def test_a_race_of_stale_branches_fails_like_a_race_of_failed_ones(settings):
    wid = await start(settings, scout, {"mode": "race", "branches": {
        "a": {"doc": "d-a", "change_after_read": True},
        "b": {"doc": "d-b", "change_after_read": True}}})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url or "", [wid], "failed"),
                       what="run failed")
    error = await fetchval(settings.database_url or "", "SELECT error FROM workflow_runs "
                           "WHERE workflow_id = $1", wid)
    assert error.startswith("every branch of the race at main seq 0 failed; the last, f0.")
    assert "stale_resources: doc:d-" in error
    assert {s for s, _ in (await branches(settings, wid)).values()} == {"stale"}


async def test_require_all_fails_the_run_when_a_branch_goes_stale(settings):
    wid = await start(settings, scout, {"require": "all", "branches": {
        "a": {"doc": "d-ra", "change_after_read": True}, "b": {"doc": "d-rb"}}})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url or "", [wid], "failed"),
                       what="run failed")
    assert await fetchval(settings.database_url or "", "SELECT error FROM workflow_runs "
                          "WHERE workflow_id = $1", wid) == (
        "branch f0.a failed (the fork requires all): stale_resources: doc:d-ra (recorded v1, "
        "now v2)")


async def test_the_merge_phase_retries_a_stale_branch_and_the_new_attempt_merges(settings):
    """The review sends the stale branch round again (a new attempt, from its first phase):
    it observes the document afresh (now v2) and merges; the run completes."""
    wid = await start(settings, scout, {"retry_stale": True, "branches": {
        "a": {"doc": "d-ret", "change_after_read": True}, "b": {"doc": "d-ok"}}})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url or "", [wid]),
                       what="run completed")
    rounds = await main_states(settings, wid, "decide")
    assert len(rounds) == 2 and rounds[0]["rounds"] == 1
    assert rounds[1]["seen"] == {
        "f0.a": {"status": "merged", "error_type": None, "read_attempt": 1},
        "f0.b": {"status": "merged", "error_type": None, "read_attempt": 1}}
    assert await ran(settings, "read", "f0.a") == 2 and await ran(settings, "use", "f0.a") == 1
    resources = await fetchval(settings.database_url or "", "SELECT resource_versions::text "
                               "FROM checkpoints WHERE workflow_id = $1 AND branch = 'f0.a' "
                               "AND phase = 'use' AND kind = 'phase'", wid)
    assert json.loads(resources) == [{"type": "doc", "id": "d-ret", "version": "v2"}]
    assert (await branches(settings, wid))["f0.a"] == ("merged", None)
