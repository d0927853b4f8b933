"""The console's pure parts: the branch graph's SVG, the timeline (with failed attempts and
waits), the buttons per role and status, the session's CSRF and cookie rules, the signal
form's payload, and the client's typed runs."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from phasegate.client import Run as ClientRun
from phasegate.orchestrator.auth import Caller
from phasegate.orchestrator.console import _local, signal_payload
from phasegate.orchestrator.console_pages import allowed_actions, badge, duration, watchdog_badge
from phasegate.orchestrator.console_session import csrf_for, csrf_ok
from phasegate.orchestrator.console_svg import MAX_NODES, dag_svg
from phasegate.orchestrator.console_timeline import Attempt, Wait, timeline
from phasegate.orchestrator.views import Checkpoint, Invalid, Run

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
SVG = "{http://www.w3.org/2000/svg}"


def run(status: str = "running", phase: str | None = "combine", seq: int = 1,
        **extra: Any) -> Run:
    values: dict[str, Any] = dict(
        workflow_id="wf-1", workflow="fanout", status=status, seq=seq, base_seq=0, epoch=0,
        current_phase=phase, schema_version=1, tier=None, tier_label=None, attempts=2,
        error=None, created_at=T0, updated_at=T0, finished_at=None)
    return Run(**{**values, **extra})


def checkpoint(seq: int, phase: str, *, branch: str = "main", kind: str = "phase",
               at_s: float = 0, state: Any = None, access: str | None = None) -> Checkpoint:
    return Checkpoint(checkpoint_id=seq * 10 + len(branch), branch=branch, seq=seq,
                      phase=phase, kind=kind, schema_version=1, state_hash="0" * 64, tier=1,
                      tier_label="found", worker_id="w1",
                      created_at=T0 + timedelta(seconds=at_s), state=state, access=access)


FORK = {"fork_seq": 0, "mode": "all", "merge_phase": "combine", "status": "open",
        "resolution": None, "winner": None, "branch_count": 2, "pending": 1, "branches": [
            {"branch": "f0.b0", "status": "merged", "steps": [
                {"seq": 1, "phase": "work", "kind": "phase"}]},
            {"branch": "f0.b1", "status": "running", "steps": []}]}


def test_the_graph_draws_the_chain_the_open_merge_and_each_branch() -> None:
    cps = [checkpoint(0, "split").model_dump(mode="json")]
    svg = dag_svg(run().model_dump(mode="json"), cps, [FORK])
    root = ET.fromstring(svg)  # well-formed XML, as inline SVG must be
    labels = [t.text for t in root.iter(f"{SVG}text")]
    assert labels[-2:] == ["0 split", "1 combine"]  # the chain, then the open merge
    assert "f0.b0 merged" in labels and "f0.b1 running" in labels
    assert "style=" not in svg  # presentation attributes only (the CSP forbids inline style)


def test_the_graph_escapes_names_and_draws_only_the_last_nodes() -> None:
    cps = [checkpoint(i, "<script>x</script>").model_dump(mode="json")
           for i in range(MAX_NODES + 5)]
    svg = dag_svg(run(phase=None, seq=MAX_NODES + 5, status="completed",
                      finished_at=T0).model_dump(mode="json"), cps, [])
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    root = ET.fromstring(svg)
    assert len([g for g in root.iter(f"{SVG}g")]) == MAX_NODES
    assert "5 earlier checkpoints not drawn" in svg
    assert dag_svg(run(phase=None).model_dump(mode="json"), [], []) == ""


def test_the_timeline_measures_from_the_previous_commit_on_its_branch() -> None:
    cps = [checkpoint(0, "split", at_s=10, state={"a": 1}, access="read"),
           checkpoint(1, "work", branch="f0.b0", at_s=25),
           checkpoint(0, "split", kind="emergency", at_s=5),
           checkpoint(1, "work", branch="f0.b1", at_s=40, access="denied")]
    rows = timeline(run(), cps, {1: 3}, now=T0 + timedelta(seconds=100)).rows
    assert [(r.seq, r.branch, r.duration_s) for r in rows] == [
        (0, "main", 10.0), (1, "f0.b0", 15.0), (1, "f0.b1", 30.0), (1, "main", 90.0)]
    assert rows[0].flushes == 1 and rows[0].state is not None and '"a": 1' in rows[0].state
    assert rows[2].state is None and rows[2].access == "denied"
    assert rows[-1].current and rows[-1].retries == 3 and "2 failed attempt" in rows[-1].note


def test_buttons_follow_status_and_role() -> None:
    viewer = Caller("v", frozenset({"viewer"}))
    operator = Caller("o", frozenset({"operator", "auditor"}))
    review = run(status="awaiting_review")
    assert allowed_actions(review, viewer) == []
    assert set(allowed_actions(review, operator)) == {"approve", "reject", "cancel"}
    assert allowed_actions(run(status="failed"), operator) == ["retry", "cancel"]
    assert allowed_actions(run(status="completed"), operator) == []
    assert allowed_actions(run(status="snoozing"), operator) == []  # unknown: no rule names it
    assert badge("snoozing") == "other" and badge("failed") == "bad"
    assert duration(3725) == "1h 2m" and duration(4.25) == "4.2s" and duration(None) == "-"


def test_csrf_is_per_session_and_the_next_page_stays_here() -> None:
    assert csrf_ok("tok-a", csrf_for("tok-a"))
    assert not csrf_ok("tok-a", csrf_for("tok-b")) and not csrf_ok("tok-a", None)
    assert not csrf_ok("tok-a", "")
    for target, expected in [("/ui/runs/x?state=1", "/ui/runs/x?state=1"),
                             ("//evil.example/", "/"), ("https://evil.example/", "/"),
                             ("/\\evil.example", "/"), ("", "/")]:
        assert _local(target) == expected, target


def test_client_runs_keep_fields_a_newer_server_adds() -> None:
    body = run(status="waiting").model_dump(mode="json")
    body["due_at"] = "2026-12-01T09:00:00+00:00"
    body["a_newer_field"] = {"x": 1}
    parsed = ClientRun.from_json(body)
    assert parsed.status == "waiting" and not parsed.settled and not parsed.terminal
    assert parsed.due_at is not None and parsed.due_at.isoformat() == body["due_at"]
    assert parsed.created_at == T0 and parsed.extra["a_newer_field"] == {"x": 1}
    assert "due_at" not in parsed.extra  # a known field now
    assert ClientRun.from_json({**body, "status": "completed"}).terminal


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_timeline_breaks_out_failed_attempts_and_a_signal_wait() -> None:
    cps = [checkpoint(0, "ask", at_s=10), checkpoint(1, "act", at_s=60)]
    waits = [Wait(seq=1, deferred_at=at(10), due_at=at(40), resumed_at=at(41),
                  sent_at=at(40.5), wait_signal="approval", signal_name="approval")]
    attempts = [Attempt(branch="main", seq=1, phase="act", attempt=1, outcome="retry",
                        error="RuntimeError#ab12", worker_id="w1", failed_at=at(50))]
    rows = timeline(run(status="completed", phase=None, seq=2, finished_at=at(60)), cps, {},
                    now=at(100), attempts=attempts, waits=waits).rows
    assert [(r.kind, r.seq, r.phase) for r in rows] == [
        ("phase", 0, "ask"), ("wait", 1, "signal approval"), ("attempt", 1, "act"),
        ("phase", 1, "act")]
    wait, attempt, act = rows[1], rows[2], rows[3]
    assert wait.duration_s == 31.0 and wait.at == at(41) and not wait.current
    assert "signal came after 30s" in wait.note and "started 1.0s later" in wait.note
    assert "attempt 1 failed: RuntimeError#ab12; retried" in attempt.note
    assert attempt.at == at(50) and attempt.worker_id == "w1"
    # The phase after the wait is measured from its start, so the durations add up.
    assert act.duration_s == 19.0 and rows[0].duration_s == 10.0


def test_a_wait_in_progress_a_timer_and_a_timed_out_signal() -> None:
    cps = [checkpoint(0, "a", at_s=10), checkpoint(1, "b", at_s=30)]
    waits = [Wait(seq=1, deferred_at=at(10), due_at=at(20), resumed_at=None, sent_at=at(20.5),
                  wait_signal=None, signal_name=None),
             Wait(seq=2, deferred_at=at(30), due_at=at(630), resumed_at=None, sent_at=None,
                  wait_signal="approval", signal_name=None)]
    rows = timeline(run(status="waiting", phase="c", seq=2, waiting_for="approval",
                        due_at=at(630)), cps, {}, now=at(100), waits=waits).rows
    kinds = [(r.kind, r.phase, r.current) for r in rows]
    assert kinds == [("phase", "a", False), ("wait", "timer", False), ("phase", "b", False),
                     ("wait", "signal approval", True), ("phase", "c", True)]
    timer, waiting, current = rows[1], rows[3], rows[4]
    # Before 0015 (or when the relay held the row) the start is not recorded: the send is
    # the best bound the database has, and the page says so.
    assert timer.duration_s == 10.5 and "not recorded" in timer.note
    assert rows[2].duration_s == 9.5
    assert waiting.duration_s == 70.0 and "times out in 8m 50s" in waiting.note
    assert current.duration_s is None and current.note.startswith("waiting")
    over = Wait(seq=2, deferred_at=at(30), due_at=at(90), resumed_at=at(91), sent_at=at(90),
                wait_signal="approval", signal_name=None)
    done = timeline(run(status="running", phase="c", seq=2), cps, {}, now=at(100),
                    waits=[over]).rows
    assert "timed out after 1m 0s" in done[-2].note and done[-2].phase == "signal approval"
    assert done[-1].duration_s == 9.0  # the current phase runs since the wait ended


def test_a_failed_attempt_that_ended_the_run_says_so() -> None:
    last = Attempt(branch="main", seq=0, phase="boom", attempt=5, outcome="failed",
                   error="RuntimeError#1", worker_id=None, failed_at=at(5))
    branch = Attempt(branch="f0.b1", seq=1, phase="work", attempt=2, outcome="failed",
                     error=None, worker_id=None, failed_at=at(6))
    rows = timeline(run(status="failed", finished_at=at(6)), [], {}, now=at(9),
                    attempts=[last, branch]).rows
    assert [r.note.rsplit("; ", 1)[-1] for r in rows] == ["it failed the run",
                                                          "it failed the branch"]


def test_the_signal_form_payload_is_json_or_nothing() -> None:
    assert signal_payload("") is None and signal_payload("  \n") is None
    assert signal_payload('{"ok": true, "n": [1, 2]}') == {"ok": True, "n": [1, 2]}
    assert signal_payload("12345678901234567890") == 12345678901234567890
    for text, needle in [("{ok: true}", "not valid JSON: Expecting property name"),
                         ('{"a": 1', "not valid JSON"), ("NaN", "NaN is not JSON"),
                         ("[" * 100_000, "nests too deeply")]:
        with pytest.raises(Invalid, match=needle):
            signal_payload(text)


def test_watchdog_states_have_badges() -> None:
    assert [watchdog_badge(s) for s in ("ok", "pressure", "flushing", "off", "new")] == [
        "ok", "attn", "bad", "idle", "other"]
