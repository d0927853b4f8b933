"""phasegate: durable multi-phase workflows on SQS FIFO and PostgreSQL.

``import phasegate`` is the SDK face: what a workflow author needs, re-exported from the shared
core. The data plane (``phasegate.worker``), the control plane (``phasegate.orchestrator``) and
the CLI (``phasegate.cli``) are imported by name when needed.

The names load lazily: ``phasegate worker`` imports this package before it installs its early
SIGTERM handler (phasegate/cli.py), and the SDK's modules pull in asyncpg and pydantic.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phasegate.branch_review import Retry
    from phasegate.branches import BelowTierError, BranchResult, ForkError
    from phasegate.context import Context
    from phasegate.race_deadline import RaceDeadlineExceeded
    from phasegate.signals import SignalError, SignalResult, send_signal
    from phasegate.staleness import Stale, StalenessError
    from phasegate.steps import StepMismatchError, StepOutputError
    from phasegate.storable import UnstorableValue
    from phasegate.tiers import Grade, TierDefinitionError
    from phasegate.waits import WaitError
    from phasegate.workflow import (
        NonRetryableError,
        Registry,
        Workflow,
        WorkflowDefinitionError,
    )

# name -> the core module that defines it
_EXPORTS = {
    "BelowTierError": "phasegate.branches",
    "BranchResult": "phasegate.branches",
    "Context": "phasegate.context",
    "ForkError": "phasegate.branches",
    "Grade": "phasegate.tiers",
    "NonRetryableError": "phasegate.workflow",
    "RaceDeadlineExceeded": "phasegate.race_deadline",
    "Registry": "phasegate.workflow",
    "Retry": "phasegate.branch_review",
    "SignalError": "phasegate.signals",
    "SignalResult": "phasegate.signals",
    "Stale": "phasegate.staleness",
    "StalenessError": "phasegate.staleness",
    "StepMismatchError": "phasegate.steps",
    "StepOutputError": "phasegate.steps",
    "TierDefinitionError": "phasegate.tiers",
    "UnstorableValue": "phasegate.storable",
    "WaitError": "phasegate.waits",
    "Workflow": "phasegate.workflow",
    "WorkflowDefinitionError": "phasegate.workflow",
    "send_signal": "phasegate.signals",
}

__all__ = [
    "BelowTierError",
    "BranchResult",
    "Context",
    "ForkError",
    "Grade",
    "NonRetryableError",
    "RaceDeadlineExceeded",
    "Registry",
    "Retry",
    "SignalError",
    "SignalResult",
    "Stale",
    "StalenessError",
    "StepMismatchError",
    "StepOutputError",
    "TierDefinitionError",
    "UnstorableValue",
    "WaitError",
    "Workflow",
    "WorkflowDefinitionError",
    "send_signal",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'phasegate' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
