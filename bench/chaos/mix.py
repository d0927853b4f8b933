"""The workload mix: which kind each run of a chaos run is, its workflow id and how it starts.

Run ``i`` is a ``chaos-tree`` run every ``branching_every`` runs; else keyed (``chaos-keyed``
or ``chaos-paced``) in the bursts of bench/chaos/keyed.py, one in ``keyed_every``; else a
``chaos-wait`` run every ``wait_every`` runs (half-way between two starts of the cycle); else
a plain ``chaos`` run. A new workload kind is a new branch of ``plan_run`` and a share in
ChaosConfig; the runner's loop only paces, starts and records what the plan says.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.chaos.config import ChaosConfig
from bench.chaos.keyed import in_burst, keyed_ordinal, keyed_prefix, start_keyed
from bench.chaos.workload import (
    TREE_PREFIX,
    WAIT_PREFIX,
    chaos,
    chaos_tree,
    chaos_wait,
    keyed_kind,
)
from phasegate import Workflow
from phasegate.orchestrator.starter import start_workflow
from phasegate.queue import Queue
from phasegate.store import Store

PLAIN_PREFIX = "cx"  # the workflow ids of plain chaos runs start with it


@dataclass(frozen=True)
class RunPlan:
    """Run ``index`` of the workload: its workflow (its kind) and its id's prefix."""

    index: int
    workflow: Workflow
    prefix: str
    # Which keyed run this is (bench/chaos/keyed.py keyed_ordinal); None: not keyed.
    keyed_ordinal: int | None = None

    @property
    def kind(self) -> str:
        return self.workflow.name

    @property
    def paced(self) -> bool:
        """Started at the workload's pace; a keyed run after the first of its burst starts at
        once, so the burst's runs of one key meet its limit together."""
        return not in_burst(self.keyed_ordinal)

    @property
    def signalled(self) -> bool:
        """The run waits for a signal the runner sends it (bench/chaos/waits.py)."""
        return self.workflow is chaos_wait

    def workflow_id(self, seed: int, salt: int) -> str:
        """The run's id; ``salt`` (32 random bits from the runner's seeded generator) keeps
        ids of two runs of one seed apart."""
        return f"{self.prefix}{seed}_{self.index:05d}_{salt:08x}"

    async def start(self, store: Store, queue: Queue, workflow_id: str) -> None:
        if self.keyed_ordinal is not None:
            await start_keyed(store, queue, self.index, self.keyed_ordinal, workflow_id)
            return
        await start_workflow(store, queue, workflow=self.workflow, input={"i": self.index},
                             workflow_id=workflow_id)


def plan_run(index: int, config: ChaosConfig) -> RunPlan:
    """The kind of run ``index``; the first kind whose share claims the index wins."""
    every = config.branching_every
    if every > 0 and index % every == 0:
        return RunPlan(index, chaos_tree, TREE_PREFIX)
    ordinal = keyed_ordinal(index, config.keyed_every)
    if ordinal is not None:
        prefix = keyed_prefix(ordinal)
        return RunPlan(index, keyed_kind(prefix), prefix, keyed_ordinal=ordinal)
    wait_every = config.wait_every
    if wait_every > 0 and index % wait_every == wait_every // 2:
        return RunPlan(index, chaos_wait, WAIT_PREFIX)
    return RunPlan(index, chaos, PLAIN_PREFIX)
