"""The control plane's named queries (``queries.sql``), parsed like the worker's."""

from __future__ import annotations

from functools import cache
from importlib import resources

from phasegate.sql import parse_queries


@cache
def queries() -> dict[str, str]:
    return parse_queries(resources.files(__package__).joinpath("queries.sql").read_text())
