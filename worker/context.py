"""``Context``: what a running phase can see and do."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import structlog


@dataclass
class Context:
    """Handed to every phase. Identity of the run, the attempt, and in-phase progress.

    ``progress(state)`` publishes the phase's latest partial state in memory (cheap, no I/O);
    the worker persists it as an ``emergency`` checkpoint when it must (memory pressure), and a
    restarted phase finds it again as ``resumed_progress``.
    """

    workflow_id: str
    workflow: str
    phase: str
    seq: int
    branch: str
    attempt: int
    worker_id: str
    schema_version: int
    resumed_progress: Any = None
    log: Any = field(default=None, repr=False)
    _progress: Any = field(default=None, repr=False)
    _progress_version: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.log is None:
            self.log = structlog.get_logger("phasegate.phase")

    def progress(self, state: Any) -> None:
        """Publish the latest in-phase partial state (kept in memory until a flush needs it)."""
        self._progress = copy.deepcopy(state)
        self._progress_version += 1

    @property
    def latest_progress(self) -> tuple[int, Any]:
        return self._progress_version, self._progress
