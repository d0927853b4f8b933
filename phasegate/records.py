"""``record``: a frozen dataclass to the type checker, a plain dataclass at run time.

A frozen dataclass sets each field through ``object.__setattr__`` in its ``__init__``; a
plain one assigns it. For the values a worker builds on every phase (the run's position, the
commit, the outcome, the received message) that was 1.8 µs per seventeen-field object on this
project's machines, several times a phase (docs/benchmarks.md, "Records built by
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
    ``==`` and ``hash`` by value. Its subclasses are records too."""
    return dataclass(unsafe_hash=True)(cls)
