"""Ages for ``phasegate purge --older-than``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from phasegate.retention import parse_age


@pytest.mark.parametrize(("text", "expected"), [
    ("90s", timedelta(seconds=90)), ("15m", timedelta(minutes=15)), ("12h", timedelta(hours=12)),
    ("7d", timedelta(days=7)), ("2w", timedelta(weeks=2)), (" 1.5D ", timedelta(hours=36)),
])
def test_parse_age(text: str, expected: timedelta) -> None:
    assert parse_age(text) == expected


@pytest.mark.parametrize("text", ["", "7", "d", "-1d", "7 days", "1y"])
def test_parse_age_refuses_other_shapes(text: str) -> None:
    with pytest.raises(ValueError, match="not an age"):
        parse_age(text)
