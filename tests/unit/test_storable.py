"""phasegate/storable.py: what jsonb can hold, refused with a pointer and never the value; and the
checks built on it (worker/guards.py, the strict envelope)."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from pydantic import ValidationError

from phasegate.envelope import Envelope, start_message
from phasegate.queue import Received
from phasegate.storable import (
    MAX_JSON_DEPTH,
    MAX_STATE_BYTES,
    UnstorableValue,
    check_storable,
    check_storable_size,
)
from phasegate.worker.guards import (
    PhaseTimeout,
    call_phase,
    group_mismatch,
    phase_timeout,
    refused_start,
    storable,
)
from phasegate.workflow import Workflow, WorkflowDefinitionError

SECRET = "s3cret-value"


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value", [
    None, True, 0, -(10**30), 1.5, "", "héllo \U0001f600 \u202e", [], {}, {"a": [1, {"b": None}]},
    nested(MAX_JSON_DEPTH - 1),
])
def test_what_jsonb_holds_passes(value):
    check_storable(value)


@pytest.mark.parametrize(("value", "where", "reason"), [
    ({"a": SECRET + "\x00"}, "$.a", "a string contains a NUL character (\\u0000)"),
    ({"a": [SECRET + "\ud800"]}, "$.a[0]", "a string contains a lone surrogate"),
    ({SECRET + "\x00": 1}, "$", "an object key contains a NUL character"),
    ({"\udfff": 1}, "$", "an object key contains a lone surrogate"),
    ({1: SECRET}, "$", "object keys must be strings"),
    ({"x": float("nan")}, "$.x", "NaN and Infinity are not JSON"),
    ({"x": float("-inf")}, "$.x", "NaN and Infinity are not JSON"),
    ({"x": {SECRET}}, "$.x", "set is not a JSON type"),
    ({"x": b"bytes"}, "$.x", "bytes is not a JSON type"),
    ({"a b c": {"d": "\x00"}}, "$.<key>.d", "a string contains a NUL"),
])
def test_unstorable_values_name_where_and_why_never_the_value(value, where, reason):
    with pytest.raises(UnstorableValue) as caught:
        check_storable(value)
    assert caught.value.where == where
    assert caught.value.reason.startswith(reason)
    assert SECRET not in str(caught.value)


def test_depth_is_bounded_without_recursion():
    check_storable(nested(MAX_JSON_DEPTH - 1))
    with pytest.raises(UnstorableValue, match="nested deeper than 64 levels"):
        check_storable(nested(MAX_JSON_DEPTH + 1))
    # Far past the interpreter's recursion limit: still a clean refusal.
    with pytest.raises(UnstorableValue):
        check_storable(nested(sys.getrecursionlimit() * 20))
    check_storable(nested(10), max_depth=11)


def test_size_is_measured_in_utf8_bytes():
    check_storable_size("x" * MAX_STATE_BYTES)
    with pytest.raises(UnstorableValue, match="1048577 bytes of JSON exceed the limit"):
        check_storable_size("x" * (MAX_STATE_BYTES + 1))
    with pytest.raises(UnstorableValue, match="4 bytes"):
        check_storable_size("\U0001f600", max_bytes=3)


def test_storable_returns_the_canonical_text_or_names_the_place():
    assert storable({"b": 1, "a": "é"}, "state") == '{"a":"é","b":1}'
    with pytest.raises(UnstorableValue, match=r"^state\.a: a string contains a NUL"):
        storable({"a": "\x00"}, "state")
    with pytest.raises(UnstorableValue, match=r"^state: not JSON \(ValueError\)"):
        storable(10**5000, "state")  # past Python's int-to-text limit
    with pytest.raises(UnstorableValue, match="exceed the limit"):
        storable({"blob": "x" * MAX_STATE_BYTES}, "state")


def _walked_then_encoded(value: object, where: str) -> str:
    """What storable did before it encoded first: the full walk, then the encoding."""
    check_storable(value, where=where)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


BIG_STATE = {"messages": [{"role": "user", "content": "x" * 400, "meta": {"n": i, "ok": True}}
                          for i in range(250)], "step": 3}


@pytest.mark.parametrize("value", [
    None, True, 0, 1.5, "é", [], {}, {"a": [1, {"b": None}]}, BIG_STATE,
    nested(MAX_JSON_DEPTH - 1), nested(MAX_JSON_DEPTH), nested(MAX_JSON_DEPTH + 1),
    {"a": "\\u0000 is six characters"}, {"a": "\x00"}, {"k\x00": 1}, ["\ud800"],
    {"\udfff": 1}, {1: "a"}, {True: 1}, {None: 1}, (1, 2), {"a": (1,)}, [[1], ("x",)],
    {"x": float("nan")}, {"x": {1}}, {"x": b"b"}, {"x": object()}, 10**5000,
    nested(sys.getrecursionlimit() * 2),
], ids=lambda v: type(v).__name__)
def test_storable_answers_as_the_full_walk_does(value):
    """The text checked first (no NUL, no lone surrogate, the value's shape plain) and the full
    walk only on a doubt: every value gets the canonical text, or the refusal naming the same
    place for the same reason, as walking it in full first gave."""
    try:
        expected: object = _walked_then_encoded(value, "state")
    except (UnstorableValue, TypeError, ValueError, RecursionError) as exc:
        expected = exc
    try:
        got: object = storable(value, "state")
    except UnstorableValue as exc:
        got = exc
    if isinstance(expected, UnstorableValue):
        assert isinstance(got, UnstorableValue)
        assert (got.where, got.reason) == (expected.where, expected.reason)
    elif isinstance(expected, BaseException):  # the walk passed, json refused
        assert isinstance(got, UnstorableValue) and got.reason.startswith("not JSON")
    else:
        assert got == expected


WF = Workflow("unit-wf")


@WF.phase("first")
async def first(ctx, state):
    return state


@WF.phase("second", timeout_s=0.05)
async def second(ctx, state):
    await asyncio.Event().wait()


def start(**fields):
    return Envelope.model_validate({"v": 1, "kind": "start", "workflow_id": "w-1",
                                    "workflow": "unit-wf", **fields})


@pytest.mark.parametrize(("fields", "code"), [
    ({"seq": 3}, "start_seq"),
    ({"phase": "second"}, "start_phase"),
    ({"branch": "b1"}, "start_branch"),
    ({"input": {"a": "\x00"}}, "unstorable_input"),
    ({"input": nested(100)}, "unstorable_input"),
])
def test_a_start_is_checked_in_full_before_any_row(fields, code):
    refused = refused_start(start(**fields), WF)
    assert refused is not None and refused[0] == code


def test_a_good_start_passes():
    assert refused_start(start(phase="first", input={"n": 1}), WF) is None
    assert refused_start(start_message("w-1", "unit-wf", None), WF) is None


@pytest.mark.parametrize("v", [True, 1.0, "1", 2, None])
def test_v_must_be_the_integer_1(v):
    with pytest.raises(ValidationError):
        start(v=v)


@pytest.mark.parametrize("seq", [True, 1.0, "1", -1, 2**31])
def test_seq_is_a_strict_postgres_integer(seq):
    with pytest.raises(ValidationError):
        start(seq=seq)


def received(group):
    return Received("m", "r", "{}", group, 1)


def test_group_must_be_the_runs_group():
    main = start()
    branch = Envelope.model_validate({"v": 1, "kind": "phase", "workflow_id": "w-1",
                                      "workflow": "unit-wf", "seq": 1, "phase": "second",
                                      "branch": "b1"})
    assert group_mismatch(received("w-1"), main) is None
    assert group_mismatch(received("w-1/b1"), branch) is None
    for group in ("w-1/b1", "other", None):
        assert group_mismatch(received(group), main) is not None
    assert group_mismatch(received("w-1"), branch) is not None


def test_phase_timeout_setting_and_decorator():
    one, two = WF.phases
    assert phase_timeout(one, 3600.0) == 3600.0
    assert phase_timeout(one, 0.0) is None
    assert phase_timeout(two, 0.0) == 0.05
    with pytest.raises(WorkflowDefinitionError):
        WF.phase("third", timeout_s=-1)


async def test_a_timed_out_phase_raises_phase_timeout_and_its_own_timeouts_stay_its_own():
    _, two = WF.phases
    with pytest.raises(PhaseTimeout, match=r"phase second ran longer than 0\.05s"):
        await call_phase(two, None, None, phase_timeout(two, 0))  # type: ignore[arg-type]

    own = Workflow("own-timeout")

    @own.phase("p")
    async def raises_timeout(ctx, state):
        raise TimeoutError("the phase's own")

    with pytest.raises(TimeoutError) as caught:
        await call_phase(own.phases[0], None, None, 10.0)  # type: ignore[arg-type]
    assert not isinstance(caught.value, PhaseTimeout)


def test_unstorable_message_is_json_safe():
    exc = UnstorableValue("$.a", "a string contains a NUL character (\\u0000)")
    json.dumps(str(exc))
    assert str(exc).encode("utf-8")
