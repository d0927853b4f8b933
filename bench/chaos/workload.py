"""The chaos workload: a 5-phase workflow whose every phase makes one write step against the
downstream test service (bench/chaos/downstream.py), keyed by the step's idempotency key.
With ``--branching`` a share of the runs is ``chaos-tree`` instead: a fork of 2 on main whose
branches fork 2 again (6 branches, 3 forks, 11 phases), every phase making the same write step.
With ``--keyed`` a share is ``chaos-keyed`` or ``chaos-paced``: the same five phases under a
concurrency key, with a limit on the runs that hold a slot or on admissions per window; with
``--waits`` a share is ``chaos-wait``: the same five phases with a timer and a signal wait.

Loaded by worker processes with ``PHASEGATE_WORKFLOW_MODULES=bench.chaos.workload``; the
downstream's URL comes from ``PHASEGATE_CHAOS_DOWNSTREAM_URL``. ``chaos-other`` exists only so
a poison message can name a live run under the wrong workflow.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

import aiohttp

from phasegate import Context, Workflow

DOWNSTREAM_ENV = "PHASEGATE_CHAOS_DOWNSTREAM_URL"
PHASES = ("plan", "fetch", "transform", "write", "publish")
STEP_NAME = "effect"
LONG_PHASE_S = 6.0  # > the chaos run's 4 s visibility timeout
FIRST_STEP_SEQ = 1  # steps are numbered 1, 2, ... in call order (phasegate/steps.py)

chaos = Workflow("chaos", schema_version=1)
chaos_other = Workflow("chaos-other", schema_version=1)


class DownstreamError(Exception):
    """The downstream answered with an error; the phase is retried (same key)."""


def expected_key(workflow_id: str, branch: str, seq: int, step_seq: int) -> str:
    """The design's key, computed here independently of the engine: the first 32 hex chars
    of sha256(workflow_id:branch:seq:step_seq)."""
    return hashlib.sha256(f"{workflow_id}:{branch}:{seq}:{step_seq}".encode()).hexdigest()[:32]


async def apply_effect(ctx: Context, step_seq: int, *,
                       idempotency_key: str) -> dict[str, Any]:
    """The write step's function: call the downstream with the key the engine hands us."""
    url = os.environ[DOWNSTREAM_ENV] + "/effect"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session, \
            session.post(url, json={
                "key": idempotency_key, "workflow_id": ctx.workflow_id, "branch": ctx.branch,
                "seq": ctx.seq, "step_seq": step_seq, "worker_id": ctx.worker_id}) as response:
        if response.status != 200:
            raise DownstreamError(f"downstream answered {response.status}")
        result: dict[str, Any] = await response.json()
    return {"effect_id": result["effect_id"], "key": idempotency_key}


async def write_step(ctx: Context) -> dict[str, Any]:
    """The phase's one write step: step_seq 1, recorded before and after it runs."""
    result: dict[str, Any] = await ctx.step(STEP_NAME, apply_effect, ctx, FIRST_STEP_SEQ,
                                            category="write")
    return result


def work_seconds(workflow_id: str, seq: int) -> float:
    """Deterministic work per phase: mostly milliseconds, but one phase in 30 runs longer than
    the visibility timeout, so its lease lives on the heartbeat alone (and is lost when SQS
    misbehaves: then two workers run that phase at once)."""
    digest = int(hashlib.sha256(f"{workflow_id}:{seq}".encode()).hexdigest()[:8], 16)
    return LONG_PHASE_S if digest % 30 == 0 else (digest % 20) / 1000


def _make_phase(name: str, workflow: Workflow, *, waits: bool = False) -> None:
    async def phase(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(work_seconds(ctx.workflow_id, ctx.seq))  # the phase's own work
        effect = await write_step(ctx)
        state = {**state, "trail": [*state.get("trail", []), name],
                 "effects": [*state.get("effects", []), effect["effect_id"]]}
        if waits:
            state = _wait_after(ctx, name, state)
        return state

    phase.__name__ = f"chaos_{name}"
    workflow.phase(name)(phase)


# -- the keyed workload (``--keyed``): the same five phases, at most KEYED_LIMIT runs of a key
# past their start at once (docs/how-to/concurrency.md); the rest wait `queued` in Postgres.
KEYED_PREFIX = "ck"  # the workflow ids of chaos-keyed runs start with it
KEYED_LIMIT = 2
KEYED_KEYS = ("tenant-a", "tenant-b")


def _tenant(input: dict[str, Any]) -> str:
    return str(input["tenant"])


chaos_keyed = Workflow("chaos-keyed", schema_version=1, concurrency_key=_tenant,
                       max_concurrency=KEYED_LIMIT)


# The rate-limited kind of the keyed workload: the same keys, at most PACED_RATE admissions per
# key in any PACED_WINDOW_S (docs/how-to/concurrency.md "Rate limits"), no cap on how many run.
PACED_PREFIX = "cr"  # the workflow ids of chaos-paced runs start with it
# One admission per key in any 4 s: of a burst of runs of one key started together
# (bench/chaos/keyed.py), all but the first meet the rate, so the relay's wake-ups carry part
# of every chaos run.
PACED_RATE = 1
PACED_WINDOW_S = 4.0
chaos_paced = Workflow("chaos-paced", schema_version=1, concurrency_key=_tenant,
                       rate=(PACED_RATE, PACED_WINDOW_S))


def is_keyed(workflow_id: str) -> bool:
    """A run of either kind of the keyed workload."""
    return workflow_id.startswith((KEYED_PREFIX, PACED_PREFIX))


def keyed_kind(workflow_id: str) -> Workflow:
    """The workflow of a keyed workload's run, from its id's prefix."""
    return chaos_paced if workflow_id.startswith(PACED_PREFIX) else chaos_keyed


# -- the waiting workload (``--waits``): the same five phases, a timer after `fetch` and a wait
# for a signal after `write` (docs/how-to/timers.md, signals.md); the runner sends the signal
# from outside the fleet (bench/chaos/waits.py).
WAIT_PREFIX = "cw"  # the workflow ids of chaos-wait runs start with it
WAIT_TIMER_S = 0.5
WAIT_SIGNAL = "go"
WAIT_SIGNAL_TIMEOUT_S = 600.0  # far past any chaos run: a timeout means a lost signal
chaos_wait = Workflow("chaos-wait", schema_version=1)


def is_wait(workflow_id: str) -> bool:
    return workflow_id.startswith(WAIT_PREFIX)


def _wait_after(ctx: Context, name: str, state: dict[str, Any]) -> dict[str, Any]:
    if name == "fetch":
        ctx.defer_next(WAIT_TIMER_S)
    elif name == "write":
        ctx.wait_for_signal(WAIT_SIGNAL, timeout_s=WAIT_SIGNAL_TIMEOUT_S)
    elif name == "publish":  # the phase after the wait: what the signal carried (None: timeout)
        state = {**state, "signal": ctx.signal}
    return state


for _name in PHASES:
    _make_phase(_name, chaos)
    _make_phase(_name, chaos_keyed)
    _make_phase(_name, chaos_paced)
    _make_phase(_name, chaos_wait, waits=True)


# -- the branching workload: plan -> [expand -> [leaf] x 2 -> collect] x 2 -> gather -> publish
TREE_PREFIX = "ct"  # the workflow ids of chaos-tree runs start with it
TREE_FANOUT = 2
chaos_tree = Workflow("chaos-tree", schema_version=1)


def is_tree(workflow_id: str) -> bool:
    return workflow_id.startswith(TREE_PREFIX)


def tree_chains() -> dict[str, list[tuple[int, str]]]:
    """Every chain of a chaos-tree run and its checkpoints (seq, phase), exactly once."""
    chains: dict[str, list[tuple[int, str]]] = {"main": [(0, "plan"), (1, "gather"),
                                                          (2, "publish")]}
    for a in range(TREE_FANOUT):
        chains[f"f0.b{a}"] = [(1, "expand"), (2, "collect")]
        for b in range(TREE_FANOUT):
            chains[f"f0.b{a}.f1.b{b}"] = [(2, "leaf")]
    return chains


async def _tree_step(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    """The phase's work and write step; ``effects`` stays indexed by seq along every chain
    (a branch's input carries the forking state's effects), as I3 checks."""
    await asyncio.sleep(work_seconds(f"{ctx.workflow_id}/{ctx.branch}", ctx.seq))
    effect = await write_step(ctx)
    return {**state, "effects": [*state.get("effects", []), effect["effect_id"]]}


@chaos_tree.phase("plan")
async def tree_plan(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    state = await _tree_step(ctx, state)
    ctx.fork([{"effects": state["effects"]}] * TREE_FANOUT, merge="gather")
    return state


@chaos_tree.phase("expand")
async def tree_expand(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    state = await _tree_step(ctx, state)
    ctx.fork([{"effects": state["effects"]}] * TREE_FANOUT, merge="collect")
    return state


@chaos_tree.phase("leaf")
async def tree_leaf(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**await _tree_step(ctx, state), "leaves": 1}


async def _tree_merge(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    state = await _tree_step(ctx, state)
    return {**state, "leaves": sum(r.state["leaves"] for r in ctx.merged if r.ok)}


chaos_tree.merge("collect")(_tree_merge)
chaos_tree.merge("gather")(_tree_merge)


@chaos_tree.phase("publish")
async def tree_publish(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return await _tree_step(ctx, state)


@chaos_other.phase("only")
async def other_only(ctx: Context, state: Any) -> Any:
    return state
