"""The "can continue locally" decision (worker/continuation.py): every condition that sends the
run through SQS instead, one at a time; and the "may its message be a leased send" one."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from phasegate import Context, Workflow
from phasegate.envelope import phase_message
from phasegate.tiers import PhaseOutcome
from phasegate.worker.continuation import (
    Chain,
    ContinuationConfig,
    Leases,
    can_continue,
    can_send_leased,
    end_chain,
)
from phasegate.worker.outcomes import Action, Settlement

plain = Workflow("plain", schema_version=1)
ON = ContinuationConfig(enabled=True, max_hops=3, max_s=30.0)


async def _step(ctx: Context, state: Any) -> Any:
    return state


for _name in ("a", "b", "c"):
    plain.phase(_name)(_step)

ADVANCE = PhaseOutcome("advance", "b", "running")
ENVELOPE = phase_message("wf-1", "plain", 0, "a")


def decide(config: ContinuationConfig = ON, chain: Chain | None = None, **overrides: Any
           ) -> bool:
    values: dict[str, Any] = {"workflow": plain, "envelope": ENVELOPE, "outcome": ADVANCE,
                              "forking": False, "stopping": False, **overrides}
    return can_continue(config, chain or Chain(), **values)


def test_a_plain_advance_on_the_main_branch_continues() -> None:
    assert decide()


@pytest.mark.parametrize("why", [
    {"config": replace(ON, enabled=False)},
    {"stopping": True},
    {"forking": True},
    {"envelope": phase_message("wf-1", "plain", 0, "a", branch="b1")},
    {"outcome": PhaseOutcome("advance", None, "completed")},
    {"outcome": PhaseOutcome("retry", "a", "running")},
    {"outcome": PhaseOutcome("escalate", "b", "awaiting_review")},
])
def test_anything_else_goes_through_the_queue(why: dict[str, Any]) -> None:
    assert not decide(**why)


def test_a_chain_is_bounded_by_hops_and_seconds() -> None:
    assert decide(chain=Chain(hops=2))
    assert not decide(chain=Chain(hops=3))
    assert not decide(chain=Chain(started=time.monotonic() - 31))


def test_workflows_with_tiers_or_staleness_and_merge_phases_do_not_continue() -> None:
    tiered = Workflow("tiered", schema_version=1, tiers=[("good", lambda state: True)])
    tiered.phase("a")(_step)
    tiered.phase("b")(_step)
    assert tiered.uses_room and not decide(workflow=tiered)
    merging = Workflow("merging", schema_version=1)
    merging.phase("a")(_step)
    merging.merge_phases.add("b")
    merging.phase("b")(_step)
    assert not decide(workflow=merging)


LEASED = ContinuationConfig(leased_send=True)


def leased(config: ContinuationConfig = LEASED, **overrides: Any) -> bool:
    values: dict[str, Any] = {"workflow": plain, "envelope": ENVELOPE, "outcome": ADVANCE,
                              "forking": False, **overrides}
    return can_send_leased(config, **values)


def test_a_plain_successor_is_a_leased_send_with_continuation_off_or_bounded() -> None:
    """Not a chain: neither continuation nor its bounds matter, only what the message is."""
    assert leased()
    assert leased(replace(LEASED, enabled=True, max_hops=1))
    assert not leased(replace(LEASED, leased_send=False))


@pytest.mark.parametrize("why", [
    {"forking": True},
    {"waiting": True},
    {"envelope": phase_message("wf-1", "plain", 0, "a", branch="b1")},
    {"outcome": PhaseOutcome("advance", None, "completed")},
    {"outcome": PhaseOutcome("retry", "a", "running")},
    {"outcome": PhaseOutcome("escalate", "b", "awaiting_review")},
])
def test_a_message_the_run_cannot_rebuild_keeps_its_outbox_row(why: dict[str, Any]) -> None:
    """A lapsed lease's message is rebuilt from the run (phasegate/chains.py): only the next
    phase of the main chain, due now, can be."""
    assert not leased(**why)


def test_leases_tell_a_leased_send_from_a_chain() -> None:
    leases = Leases(None, "w-1", 30.0)  # type: ignore[arg-type]
    assert leases.lease.holder == "w-1" and leases.sent.holder == "w-1/sent"
    assert leases.sent.seconds == leases.lease.seconds


async def test_a_chain_handed_off_through_the_queue_keeps_its_last_send() -> None:
    """The hop that ends a chain at its cap sends its successor while the received message is
    deleted: the settlement the runtime gets still carries that send, so the slot is freed
    only when it is done."""
    chain = Chain()
    chain.hops = 3

    async def sent() -> bool:
        return True

    sending = asyncio.ensure_future(sent())

    async def no_emit(row: Any, committed: float | None = None) -> bool:
        raise AssertionError("nothing pending: nothing to emit")

    settlement = await end_chain(chain, Settlement(Action.DELETE, "advanced", sending=sending),
                                 Leases(None, "w-1", 30.0), no_emit)  # type: ignore[arg-type]
    assert settlement == Settlement(Action.DELETE, "advanced")
    assert settlement.sending is sending and await sending
