"""Workflow code a careless or hostile user might write (``PHASEGATE_WORKFLOW_MODULES=
tests.hostile.workflows_hostile``). Each must end its run in a defined state; none may end a
worker."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from phasegate import Context, Workflow

exits = Workflow("exits")


@exits.phase("leave")
async def leave(ctx: Context, state: Any) -> Any:
    sys.exit(3)


interrupts = Workflow("interrupts")


@interrupts.phase("ctrl_c")
async def ctrl_c(ctx: Context, state: Any) -> Any:
    raise KeyboardInterrupt


cancels = Workflow("cancels")


@cancels.phase("self_cancel")
async def self_cancel(ctx: Context, state: Any) -> Any:
    raise asyncio.CancelledError  # not the worker's cancellation: a phase failure


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


# What the phase returns is chosen by the start input: {"return": <kind>}.
RETURNS: dict[str, Any] = {
    "nul": {"text": "before\x00after"},
    "surrogate": {"text": "lone \ud800 surrogate"},
    "surrogate_key": {"\udfff": 1},
    "deep": {"tree": nested(200)},
    "huge": {"blob": "x" * (1_048_576 + 10)},
    "nan": {"ratio": float("nan")},
    "infinity": {"ratio": float("inf")},
    "not_json": {"obj": object()},
    "int_key": {1: "a"},
}

returns = Workflow("returns")


@returns.phase("give")
async def give(ctx: Context, state: Any) -> Any:
    return RETURNS[state["return"]]


hangs = Workflow("hangs")


@hangs.phase("forever")  # bounded by PHASEGATE_PHASE_TIMEOUT_S
async def forever(ctx: Context, state: Any) -> Any:
    await asyncio.Event().wait()


hangs_own = Workflow("hangs_own")


@hangs_own.phase("forever_own", timeout_s=0.5)  # its own limit, below the setting
async def forever_own(ctx: Context, state: Any) -> Any:
    await asyncio.Event().wait()


# schema_version 2 whose upcaster ends the interpreter: code outside any phase, reached by
# the transition itself (loading a version-1 checkpoint).
legacy = Workflow("legacy", schema_version=2)


@legacy.upcast(from_version=1)
def exit_on_upcast(state: Any) -> Any:
    sys.exit("upcaster gave up")


@legacy.phase("first")
async def legacy_first(ctx: Context, state: Any) -> Any:
    return state


@legacy.phase("second")
async def legacy_second(ctx: Context, state: Any) -> Any:
    return state


good = Workflow("good")


@good.phase("one")
async def good_one(ctx: Context, state: Any) -> Any:
    return {"n": (state or {}).get("n", 0) + 1}


@good.phase("two")
async def good_two(ctx: Context, state: Any) -> Any:
    return {"n": state["n"] + 1}


# Waits for an approval (a signal), then keeps what it got: a forged message for "act" must
# not end the wait.
gated = Workflow("gated")


@gated.phase("ask")
async def gated_ask(ctx: Context, state: Any) -> Any:
    ctx.wait_for_signal("approval", timeout_s=3600)
    return state


@gated.phase("act")
async def gated_act(ctx: Context, state: Any) -> Any:
    return {"approval": ctx.signal}


# The fuzzer's state generator: the start input describes the state the phase returns, in
# storable JSON, and the phase builds the hostile value (a start input could not carry it).
shapes = Workflow("shapes")

TOKENS = {"<NUL>": "\x00", "<SUR>": "\ud800", "<LOW>": "\udfff"}


def build(spec: Any) -> Any:
    if isinstance(spec, str):
        for token, char in TOKENS.items():
            spec = spec.replace(token, char)
        return spec
    if isinstance(spec, list):
        return [build(item) for item in spec]
    if isinstance(spec, dict):
        if "$deep" in spec:
            return nested(int(spec["$deep"]))
        if "$int" in spec:
            return 10 ** int(spec["$int"])
        if "$float" in spec:
            return float(spec["$float"])
        return {build(key): build(value) for key, value in spec.items()}
    return spec


@shapes.phase("shape")
async def shape(ctx: Context, state: Any) -> Any:
    return build(state["emit"]) if isinstance(state, dict) and "emit" in state else state


@shapes.phase("after")
async def after_shape(ctx: Context, state: Any) -> Any:
    return state
