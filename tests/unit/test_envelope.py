from __future__ import annotations

import hashlib
import json

import pytest
from pydantic import ValidationError

from phasegate.envelope import (
    MAX_SEQ,
    Envelope,
    canonical_json,
    dedup_id,
    message_group_id,
    phase_message,
    start_message,
    state_hash,
    successor_message,
)


def test_start_message_may_omit_seq_and_phase():
    envelope = Envelope.model_validate({"v": 1, "kind": "start", "workflow_id": "wf-1",
                                        "workflow": "w", "input": {"a": 1}})
    assert envelope.seq == 0 and envelope.phase is None and envelope.branch == "main"


def test_dedup_id_is_sha256_of_workflow_branch_seq():
    assert dedup_id("wf-1", "main", 3) == hashlib.sha256(b"wf-1:main:3").hexdigest()
    assert phase_message("wf-1", "w", 3, "p").dedup_id == dedup_id("wf-1", "main", 3)
    assert dedup_id("wf-1", "main", 3, epoch=1) != dedup_id("wf-1", "main", 3)


def test_a_race_deadline_message_has_its_own_dedup_id():
    """Its seq is the forking message's: with the same id SQS would drop it as a duplicate."""
    deadline = Envelope.model_validate({"v": 1, "kind": "deadline", "workflow_id": "wf-1",
                                        "workflow": "w", "seq": 3, "phase": "merge"})
    assert deadline.dedup_id == hashlib.sha256(b"wf-1:main:3:deadline").hexdigest()
    assert deadline.dedup_id != phase_message("wf-1", "w", 3, "p").dedup_id
    with pytest.raises(ValidationError):
        Envelope.model_validate({"v": 1, "kind": "deadline", "workflow_id": "wf-1",
                                 "workflow": "w", "seq": 3})


@pytest.mark.parametrize("received", [
    start_message("wf-1", "w", {"a": 1}, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"),
    phase_message("wf-1", "w", 4, "p4", branch="b2"),
    start_message("wf-1", "w", None).model_copy(update={"classification": "regulated",
                                                        "region": "eu"}),
])
def test_a_successor_is_the_message_full_validation_would_build(received):
    built = successor_message(received, "w", "next")
    validated = phase_message(received.workflow_id, "w", received.seq + 1, "next",
                              received.branch, received.traceparent)
    assert built == validated and built.to_json() == validated.to_json()
    assert built.dedup_id == validated.dedup_id and built.group_id == validated.group_id
    assert Envelope.model_validate_json(built.to_json()) == validated


def test_a_successor_past_the_bounds_fails_as_full_validation_does():
    with pytest.raises(ValidationError, match="seq"):
        successor_message(phase_message("wf-1", "w", MAX_SEQ, "p"), "w", "next")
    with pytest.raises(ValidationError, match="phase"):
        successor_message(phase_message("wf-1", "w", 1, "p"), "w", "n" * 201)


def test_group_id_is_the_workflow_id_and_branch_suffix():
    assert message_group_id("wf-1") == "wf-1"
    assert message_group_id("wf-1", "b2") == "wf-1/b2"


@pytest.mark.parametrize("body", [
    {"v": 2, "kind": "start", "workflow_id": "a", "workflow": "w"},
    {"v": 1, "kind": "explode", "workflow_id": "a", "workflow": "w"},
    {"v": 1, "kind": "phase", "workflow_id": "a", "workflow": "w", "seq": 1},
    {"v": 1, "kind": "phase", "workflow_id": "a", "workflow": "w", "seq": 1, "phase": "p",
     "input": {}},
    {"v": 1, "kind": "start", "workflow_id": "jane.doe@example.com", "workflow": "w"},
    {"v": 1, "kind": "start", "workflow_id": "a", "workflow": "w", "extra": 1},
    {"v": 1, "kind": "start", "workflow_id": "a", "workflow": "w", "seq": -1},
])
def test_malformed_envelopes_are_rejected(body):
    with pytest.raises(ValidationError):
        Envelope.model_validate(body)


def test_round_trip_and_canonical_hash():
    message = start_message("wf-9", "w", {"b": 1, "a": [1, 2]})
    assert Envelope.model_validate_json(message.to_json()) == message
    canonical = canonical_json({"b": 1, "a": "é"})
    assert canonical == '{"a":"é","b":1}'
    expected = hashlib.sha256(json.dumps({"b": 1, "a": "é"}, sort_keys=True,
                                         separators=(",", ":"), ensure_ascii=False).encode())
    assert state_hash(canonical) == expected.hexdigest()


@pytest.mark.parametrize("phase", [
    "plain", "é-accent", "emoji-\U0001F600", "quote\"back\\slash", "ctl\x00\x01\x1f\t\n",
    "del\x7f", "ff\ufffe", "slash/and<>&", "\u2028line-sep",
])
@pytest.mark.parametrize("extra", [
    {},
    {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
    {"region": "eu-west", "classification": "regulated"},
    {"branch": "b.1-x"},
])
def test_a_body_is_the_same_text_through_either_encoder(phase, extra):
    """Without an input, to_json takes pydantic's encoder when its text is what json.dumps
    writes: the body of an envelope never depends on the branch taken."""
    for message in (phase_message("wf-1", f"w-{phase}", 7, phase, **{
                        k: v for k, v in extra.items() if k in ("branch", "traceparent")}),
                    Envelope(v=1, kind="merge", workflow_id="wf-1", workflow="w", seq=3,
                             phase=phase, **extra)):
        expected = json.dumps(message.model_dump(exclude_none=True), separators=(",", ":"))
        assert message.to_json() == expected
        assert Envelope.model_validate_json(message.to_json()) == message


@pytest.mark.parametrize("value", [1e16, 0.1, -0.0, 2**63, "é", {"nested": [None, True]}])
def test_a_start_body_with_its_input_is_json_dumps_text(value):
    message = start_message("wf-2", "w", {"v": value})
    assert message.to_json() == json.dumps(message.model_dump(exclude_none=True),
                                           separators=(",", ":"))


def test_non_json_state_is_refused():
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})
    with pytest.raises(TypeError):
        canonical_json({"x": object()})
