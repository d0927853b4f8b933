"""The successors a worker sent, kept to run from memory when they come back
(worker/own_successors.py): taken once, only for the body sent, within half the lease, and
within a count and a size."""

from __future__ import annotations

import time
from dataclasses import fields, replace

import pytest

from phasegate.envelope import phase_message, state_hash
from phasegate.store import PhaseCommit, RunPosition
from phasegate.worker.own_successors import OwnSuccessors


def _sent(n: int, state: str = '{"n": 1}') -> tuple:
    wid = f"wf_{n:024x}"
    successor = phase_message(wid, "w", 1, "b")
    position = RunPosition(wid, "w", "running", 0, 0, "a", 1, "{}", 2, 0, None, None, None,
                           '{"saved": 1}', signal_json='"hello"')
    commit = PhaseCommit(workflow_id=wid, branch="main", seq=0, phase="a", schema_version=1,
                         state_json=state, state_hash=state_hash(state), next_phase="b",
                         status="running", worker_id="w1")
    return successor, successor.to_json(), position, commit


def test_a_kept_successor_is_taken_once_as_its_commit_left_the_run() -> None:
    kept = OwnSuccessors(lease_s=30)
    successor, body, position, commit = _sent(1)
    kept.remember(successor, body, position, commit)
    hop = kept.take(successor, body)
    assert hop is not None
    assert (hop.phase, hop.state, hop.envelope) == ("b", {"n": 1}, successor)
    assert (hop.position.next_seq, hop.position.current_phase, hop.position.attempts) == (1, "b", 0)
    assert (hop.position.state_json, hop.position.state_version) == ('{"n": 1}', 1)
    # What belonged to seq 0 does not carry over to seq 1.
    assert hop.position.progress_json is None and hop.position.signal_json is None
    assert kept.take(successor, body) is None  # a second delivery goes through the load
    assert len(kept) == 0


def test_only_the_body_that_was_sent_is_taken_and_a_mismatch_forgets_it() -> None:
    kept = OwnSuccessors(lease_s=30)
    successor, body, position, commit = _sent(1)
    kept.remember(successor, body, position, commit)
    assert kept.take(successor, body.replace('"seq":1', '"seq":1 ')) is None
    assert kept.take(successor, body) is None


def test_a_successor_kept_past_half_its_lease_is_not_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = OwnSuccessors(lease_s=30)
    successor, body, position, commit = _sent(1)
    kept.remember(successor, body, position, commit)
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + 15.5)
    assert kept.take(successor, body) is None


def test_the_oldest_go_first_past_the_count_or_the_bytes() -> None:
    kept = OwnSuccessors(lease_s=30, max_kept=2)
    sent = [_sent(n) for n in range(3)]
    for item in sent:
        kept.remember(*item)
    assert len(kept) == 2
    assert kept.take(sent[0][0], sent[0][1]) is None
    assert kept.take(sent[2][0], sent[2][1]) is not None

    big = '{"s": "' + "x" * 1000 + '"}'
    kept = OwnSuccessors(lease_s=30, max_bytes=2000)
    sent = [_sent(n, big) for n in range(3)]
    for item in sent:
        kept.remember(*item)
    assert len(kept) == 1 and kept.take(sent[2][0], sent[2][1]) is not None
    # A state larger than the whole budget is never kept.
    huge = _sent(9, '{"s": "' + "x" * 3000 + '"}')
    kept.remember(*huge)
    assert len(kept) == 0


def test_the_previous_state_is_not_kept_and_the_runs_input_counts() -> None:
    kept = OwnSuccessors(lease_s=30, max_bytes=2000)
    successor, body, position, commit = _sent(1)
    # The state the committed phase started from: replaced by the commit's, so not kept.
    kept.remember(successor, body, replace(position, state_json='"' + "x" * 5000 + '"'), commit)
    hop = kept.take(successor, body)
    assert hop is not None and hop.position.state_json == commit.state_json
    kept.remember(successor, body, replace(position, input_json='"' + "x" * 3000 + '"'), commit)
    assert len(kept) == 0


def test_a_kept_body_names_its_envelope_until_it_is_taken() -> None:
    kept = OwnSuccessors(lease_s=30)
    successor, body, position, commit = _sent(1)
    assert kept.envelope_sent(body) is None
    kept.remember(successor, body, position, commit)
    assert kept.envelope_sent(body) is successor
    assert kept.envelope_sent(body + " ") is None
    assert kept.take(successor, body) is not None
    assert kept.envelope_sent(body) is None  # the second delivery is parsed as any message


def test_the_positions_a_hop_copies_are_the_fields_replaced() -> None:
    """``RunPosition.after`` and ``without_state`` build their copies field by field; a field
    added to the position and not copied there would differ from ``replace`` here."""
    _, _, _, commit = _sent(1)
    # Every field its own value, so a field either copy forgets reads as its default.
    position = RunPosition(**{f.name: f"<{f.name}>" for f in fields(RunPosition)})
    assert position.after(commit) == replace(
        position, status="running", next_seq=commit.seq + 1, current_phase=commit.next_phase,
        attempts=0, state_json=commit.state_json, state_hash=commit.state_hash,
        state_version=commit.schema_version, progress_json=None, signal_json=None)
    assert position.without_state() == replace(position, state_json=None, state_hash=None,
                                               progress_json=None, signal_json=None)
