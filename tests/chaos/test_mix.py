"""The chaos workload's mix (bench/chaos/mix.py): which kind each run is, its id and its start.

The expected sequences are worked out by hand from the rules the runner's loop applied before
the mix had a module of its own: a tree every ``branching_every`` runs first, then the keyed
bursts of bench/chaos/keyed.py, then a wait run where ``i % wait_every == wait_every // 2``.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.chaos import mix
from bench.chaos.config import ChaosConfig
from bench.chaos.keyed import KEYED_BURST
from bench.chaos.mix import plan_run

# The one-letter kinds of the tables below, by workflow.
KINDS = {"chaos": "x", "chaos-tree": "t", "chaos-keyed": "k", "chaos-paced": "p",
         "chaos-wait": "w"}
PREFIXES = {"x": "cx", "t": "ct", "k": "ck", "p": "cr", "w": "cw"}


def kinds(config: ChaosConfig, count: int) -> str:
    return "".join(KINDS[plan_run(i, config).kind] for i in range(count))


def test_without_shares_every_run_is_plain_and_paced() -> None:
    config = ChaosConfig(seed=3, workflows=50)
    assert kinds(config, 50) == "x" * 50
    assert all(plan_run(i, config).paced for i in range(50))
    assert not any(plan_run(i, config).signalled for i in range(50))


def test_the_mix_of_the_documented_chaos_command() -> None:
    # --branching 5 --keyed 3 --waits 3: a tree claims its index before a keyed burst does,
    # so the bursts at 15, 25 and 35 lose that run (as the runner's loop always did).
    config = ChaosConfig(seed=11, workflows=120, branching_every=5, keyed_every=3,
                         wait_every=3)
    #                     0         1         2         3
    #                     012345678901234567890123456789012345
    assert kinds(config, 36) == "twxxwtkkkxtxxwxtkkxwtxwxptpxwxtwxppt"
    for i in range(36):
        plan = plan_run(i, config)
        assert plan.prefix == PREFIXES[KINDS[plan.kind]]
        assert plan.signalled == (plan.kind == "chaos-wait")
    ordinals = {i: plan_run(i, config).keyed_ordinal for i in range(36)}
    assert {i: n for i, n in ordinals.items() if n is not None} == {
        6: 0, 7: 1, 8: 2, 16: 4, 17: 5, 24: 6, 26: 8, 33: 9, 34: 10}
    # Only the first run of a burst waits for the pace; 16 and 26 follow a tree at once.
    unpaced = [i for i in range(36) if not plan_run(i, config).paced]
    assert unpaced == [7, 8, 16, 17, 26, 34]


def test_keyed_bursts_stay_together_and_wait_runs_never_take_their_place() -> None:
    # The CI's first mix (tests/chaos/test_chaos.py): one run in three keyed, waits every 4th.
    config = ChaosConfig(seed=11, workflows=120, keyed_every=3, wait_every=4)
    plans = [plan_run(i, config) for i in range(120)]
    keyed = [p for p in plans if p.keyed_ordinal is not None]
    assert len(keyed) == 39  # 13 of the 40 blocks of three, every third
    for first in range(0, len(keyed), KEYED_BURST):
        burst = keyed[first:first + KEYED_BURST]
        assert [p.index for p in burst] == list(range(burst[0].index,
                                                      burst[0].index + KEYED_BURST))
        assert [p.keyed_ordinal for p in burst] == list(range(first, first + KEYED_BURST))
        assert len({p.kind for p in burst}) == 1
        assert [p.paced for p in burst] == [True] + [False] * (KEYED_BURST - 1)
    # Two bursts of chaos-keyed, then two of chaos-paced, in turn.
    assert [p.prefix for p in keyed[::KEYED_BURST]][:6] == ["ck", "ck", "cr", "cr", "ck", "ck"]
    waits = [p.index for p in plans if p.signalled]
    assert waits[:6] == [2, 10, 14, 18, 22, 30]  # 6, 26 and 34 are keyed
    assert all(p.index % 4 == 2 and p.keyed_ordinal is None for p in plans if p.signalled)


def test_a_workflow_id_is_prefix_seed_index_and_salt() -> None:
    config = ChaosConfig(seed=11, workflows=120, branching_every=5, keyed_every=3)
    assert plan_run(7, config).workflow_id(11, 0xABC) == "ck11_00007_00000abc"
    assert plan_run(5, config).workflow_id(11, 0xDEADBEEF) == "ct11_00005_deadbeef"
    assert plan_run(1, config).workflow_id(11, 1) == "cx11_00001_00000001"


async def test_a_keyed_run_starts_through_start_keyed_the_others_through_start_workflow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    async def keyed(store: object, queue: object, i: int, ordinal: int, wid: str) -> None:
        calls.append(("keyed", i, ordinal, wid))

    async def workflow(store: object, queue: object, *, workflow: Any, input: dict[str, Any],
                       workflow_id: str) -> None:
        calls.append(("workflow", workflow.name, input, workflow_id))

    monkeypatch.setattr(mix, "start_keyed", keyed)
    monkeypatch.setattr(mix, "start_workflow", workflow)
    config = ChaosConfig(seed=11, workflows=120, branching_every=5, keyed_every=3,
                         wait_every=3)
    for i in (0, 1, 2, 7):
        await plan_run(i, config).start(None, None, f"id{i}")  # type: ignore[arg-type]
    assert calls == [("workflow", "chaos-tree", {"i": 0}, "id0"),
                     ("workflow", "chaos-wait", {"i": 1}, "id1"),
                     ("workflow", "chaos", {"i": 2}, "id2"),
                     ("keyed", 7, 1, "id7")]
