"""``record``: a frozen dataclass to the type checker, a plain dataclass at run time.

A frozen dataclass sets each field through ``object.__setattr__`` in its ``__init__``; a
plain one assigns it. For the values a worker builds on every phase (the run's position, the
commit, the outcome, the received message: twelve per transition through SQS) that was about
1.5 µs more per seventeen-field object (docs/benchmarks-rounds.md, "Records built by
assignment"). mypy still refuses any assignment to a field (``dataclass_transform`` with
``frozen_default``), and the values hash and compare as a frozen dataclass's do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    """``@dataclass(frozen=True)`` as far as code that type-checks can tell: read-only fields,
    ``==`` and ``hash`` by value. A record's subclass is decorated with ``@record`` too."""
    return dataclass(unsafe_hash=True)(cls)
