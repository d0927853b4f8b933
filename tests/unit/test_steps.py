"""The step protocol and the receipt ledger, on the in-memory ledger the package ships."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from phasegate import Context
from phasegate.steps import (
    MemoryLedger,
    StepMismatchError,
    StepOutputError,
    Steps,
    StepScope,
    delivery_key,
    idempotency_key,
)
from phasegate.workflow import NonRetryableError

SCOPE = StepScope("wf_1", "main", 3, "w1")


class Downstream:
    """Counts calls by idempotency key; acts once per key."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.effects: dict[str, dict[str, Any]] = {}

    async def write(self, text: str, *, idempotency_key: str) -> dict[str, Any]:
        self.calls.append(idempotency_key)
        return self.effects.setdefault(idempotency_key,
                                       {"id": len(self.effects) + 1, "text": text})


def test_idempotency_key_is_the_first_32_hex_of_sha256_of_the_position():
    expected = hashlib.sha256(b"wf_1:main:3:2").hexdigest()[:32]
    assert idempotency_key("wf_1", "main", 3, 2) == expected
    assert len(expected) == 32
    assert idempotency_key("wf_1", "main", 4, 2) != expected
    assert delivery_key("wf_1", "b", "a") != delivery_key("wf_1", "b", "a2")


async def test_completed_write_is_replayed_without_calling_and_reads_run_again():
    ledger, down = MemoryLedger(), Downstream()
    reads: list[int] = []

    async def read() -> dict[str, int]:
        reads.append(1)
        return {"n": len(reads)}

    async def attempt() -> tuple[Any, Any]:
        steps = Steps(ledger, SCOPE)
        first = await steps.step("read", read)
        wrote = await steps.step("write", down.write, "hello", category="write")
        return first, wrote

    first_read, first_write = await attempt()
    second_read, second_write = await attempt()
    assert down.calls == [idempotency_key("wf_1", "main", 3, 2)]
    assert first_write == second_write == {"id": 1, "text": "hello"}
    assert (first_read, second_read) == ({"n": 1}, {"n": 2})  # the read ran again
    assert ledger.steps[("wf_1", "main", 3, 2)].status == "completed"


async def test_a_pre_execution_step_is_called_again_with_the_same_key():
    ledger, down = MemoryLedger(), Downstream()

    async def dies_after_the_effect(text: str, *, idempotency_key: str) -> Any:
        await down.write(text, idempotency_key=idempotency_key)
        raise ConnectionError("the worker died before recording")

    with pytest.raises(ConnectionError):
        await Steps(ledger, SCOPE).step("write", dies_after_the_effect, "x", category="write")
    assert ledger.steps[("wf_1", "main", 3, 1)].status == "pre_execution"
    result = await Steps(ledger, SCOPE).step("write", down.write, "x", category="write")
    assert down.calls[0] == down.calls[1]
    assert len(down.effects) == 1 and result == {"id": 1, "text": "x"}


async def test_cached_read_runs_once():
    ledger = MemoryLedger()
    calls: list[int] = []

    def read() -> list[int]:  # sync functions work too
        calls.append(1)
        return [len(calls)]

    assert await Steps(ledger, SCOPE).step("r", read, cache=True) == [1]
    assert await Steps(ledger, SCOPE).step("r", read, cache=True) == [1]
    assert calls == [1]


async def test_output_that_is_not_json_is_a_clear_error_at_the_call_site():
    steps = Steps(MemoryLedger(), SCOPE)
    with pytest.raises(StepOutputError, match=r"step 'bad' \(step_seq 1\) returned set"):
        await steps.step("bad", lambda: {1, 2})
    with pytest.raises(StepOutputError) as info:
        await steps.step("nan", lambda idempotency_key: float("nan"), category="execute")
    assert isinstance(info.value, NonRetryableError) and isinstance(info.value, TypeError)


async def test_outputs_come_back_as_a_replay_would_return_them():
    steps = Steps(MemoryLedger(), SCOPE)
    assert await steps.step("t", lambda: (1, 2)) == [1, 2]


async def test_a_different_step_at_a_recorded_position_is_refused():
    ledger, down = MemoryLedger(), Downstream()
    await Steps(ledger, SCOPE).step("post", down.write, "x", category="write")
    with pytest.raises(StepMismatchError, match="'post'"):
        await Steps(ledger, SCOPE).step("delete", down.write, "x", category="write")
    with pytest.raises(ValueError, match="category"):
        await Steps(ledger, SCOPE).step("post", down.write, category="mutate")  # type: ignore[arg-type]


async def test_deliveries_are_made_once_and_pending_skips_finished_batches():
    ledger, down = MemoryLedger(), Downstream()

    async def send(body: str, *, idempotency_key: str) -> dict[str, Any]:
        return await down.write(body, idempotency_key=idempotency_key)

    steps = Steps(ledger, SCOPE)
    assert await steps.pending(["b1", "b2", "b1"]) == ["b1", "b2"]
    first = await steps.deliver("b1", "a1", send, "report")
    await steps.batch_done("b1")
    later = Steps(ledger, StepScope("wf_1", "main", 7))  # another phase of the same run
    assert await later.deliver("b1", "a1", send, "report") == first
    assert await later.pending(["b1", "b2"]) == ["b2"]
    assert len(down.calls) == 1
    with pytest.raises(ValueError):
        await later.deliver("b1", "", send)


async def test_context_without_a_ledger_says_so():
    ctx = Context(workflow_id="w", workflow="f", phase="p", seq=0, branch="main", attempt=1,
                  worker_id="x", schema_version=1)
    with pytest.raises(RuntimeError, match="no step ledger"):
        await ctx.step("s", lambda: 1)
    ctx.steps = Steps(MemoryLedger(), StepScope("w", "main", 0))
    assert await ctx.step("s", lambda: 1) == 1
