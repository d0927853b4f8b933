"""phasegate control plane: start, inspect and steer workflows; relay the outbox."""

from __future__ import annotations

from typing import Any

__all__ = ["start_workflow"]


def __getattr__(name: str) -> Any:
    # Lazy, so `phasegate worker` can install its early SIGTERM handler (phasegate/cli.py)
    # before the heavy imports (aioboto3) instead of after them.
    if name == "start_workflow":
        from phasegate.orchestrator.starter import start_workflow

        return start_workflow
    raise AttributeError(f"module 'phasegate.orchestrator' has no attribute {name!r}")
