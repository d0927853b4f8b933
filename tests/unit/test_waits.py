"""ctx.defer_next / ctx.wait_for_signal: what a phase may ask for, and the clear refusals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from phasegate import Context, WaitError
from phasegate.waits import MAX_WAIT_S, Wait


def ctx(branch: str = "main") -> Context:
    return Context(workflow_id="w", workflow="f", phase="p", seq=0, branch=branch, attempt=1,
                   worker_id="t", schema_version=1)


def test_defer_next_seconds_and_until() -> None:
    c = ctx()
    c.defer_next(5)
    assert c.wait == Wait(seconds=5.0)
    assert c.wait.commit_fields() == {"wait_s": 5.0, "wait_until": None, "wait_signal": None}
    moment = datetime.now(UTC) + timedelta(days=30)
    c = ctx()
    c.defer_next(until=moment)
    assert c.wait == Wait(until=moment)


def test_naive_datetime_is_refused_with_a_clear_error() -> None:
    with pytest.raises(WaitError, match="timezone-aware"):
        ctx().defer_next(until=datetime.now() + timedelta(hours=1))  # naive: the point


@pytest.mark.parametrize(("args", "kwargs", "match"), [
    ((), {}, "exactly one"),
    ((1,), {"until": datetime.now(UTC)}, "exactly one"),
    ((-1,), {}, "between 0 and"),
    ((MAX_WAIT_S + 1,), {}, "between 0 and"),
    ((float("nan"),), {}, "between 0 and"),
    ((float("inf"),), {}, "between 0 and"),
    (("5",), {}, "must be a number"),
    ((True,), {}, "must be a number"),
    ((), {"until": datetime.now(UTC) + timedelta(days=400)}, "days ahead"),
    ((), {"until": "2030-01-01"}, "must be a datetime"),
])
def test_bad_timers_are_refused(args: tuple[Any, ...], kwargs: dict[str, Any],
                                match: str) -> None:
    with pytest.raises(WaitError, match=match):
        ctx().defer_next(*args, **kwargs)


def test_wait_for_signal_and_its_refusals() -> None:
    c = ctx()
    c.wait_for_signal("approval", timeout_s=60)
    assert c.wait == Wait(seconds=60.0, signal="approval")
    with pytest.raises(WaitError, match="already asked"):
        c.defer_next(1)
    with pytest.raises(WaitError, match="signal name"):
        ctx().wait_for_signal("no spaces", timeout_s=1)
    with pytest.raises(WaitError, match=r"'phasegate\.' are reserved"):
        ctx().wait_for_signal("phasegate.approve", timeout_s=1)
    with pytest.raises(WaitError, match="between 0 and"):
        ctx().wait_for_signal("x", timeout_s=-1)
    with pytest.raises(WaitError, match="main chain"):
        ctx(branch="b1").defer_next(1)


def test_a_wait_and_a_fork_do_not_mix() -> None:
    c = ctx()
    c.defer_next(1)
    with pytest.raises(WaitError, match="cannot also fork"):
        c.fork([1, 2], merge="m")
