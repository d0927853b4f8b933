"""Keyset cursors of the run list, and the control plane's transition rules."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from phasegate.orchestrator.control import CANCELLABLE, RULES, refuse
from phasegate.orchestrator.views import STATUSES, Invalid, Run, decode_cursor, encode_cursor
from phasegate.sql import queries


def test_cursor_round_trips_with_microseconds() -> None:
    when = datetime(2026, 11, 29, 10, 0, 0, 123456, tzinfo=UTC)
    cursor = encode_cursor(when, "wf_abc:1")
    assert "=" not in cursor
    assert decode_cursor(cursor) == (when, "wf_abc:1")


@pytest.mark.parametrize("cursor", ["", "!!!", "bm90IGpzb24", "WzFd"])
def test_bad_cursors_are_invalid(cursor: str) -> None:
    with pytest.raises(Invalid):
        decode_cursor(cursor)


def test_rules_cover_every_action_and_only_known_statuses() -> None:
    assert set(RULES) == {"cancel", "retry", "restart", "approve", "reject"}
    assert all(set(rule.allowed) <= set(STATUSES) for rule in RULES.values())
    assert "completed" not in CANCELLABLE and "cancelled" not in CANCELLABLE


def test_refusal_names_the_status_and_what_is_needed() -> None:
    now = datetime.now(UTC)
    run = Run(workflow_id="x", workflow="w", status="completed", seq=3, base_seq=0, epoch=0,
              current_phase=None, schema_version=1, tier=None, tier_label=None, attempts=0,
              error=None, created_at=now, updated_at=now, finished_at=now)
    reason = refuse(RULES["retry"], run).reason
    assert "'completed'" in reason and "needs failed" in reason


def test_queries_parse_and_list_has_its_filter_marker() -> None:
    q = queries("control.sql")
    assert {"get_run", "list_runs", "stalls", "resume_run", "cancel_run", "purge_batch"} <= set(q)
    assert "/*filters*/" in q["list_runs"]
