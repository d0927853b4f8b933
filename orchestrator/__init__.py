"""phasegate control plane: start, inspect and steer workflows; relay the outbox."""

from orchestrator.starter import start_workflow

__all__ = ["start_workflow"]
