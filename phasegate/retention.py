"""Retention ages: ``7d``-style ages and ``PHASEGATE_RETENTION_BY_CLASSIFICATION``.

Parsed here, in the core, because the settings check them when they load and the control
plane's purge (phasegate/orchestrator/purge.py) applies them.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w`` -> timedelta. Raises ValueError."""
    match = _AGE.match(text.lower())
    if not match:
        raise ValueError(f"{text!r} is not an age like 7d, 12h, 30m, 90s or 2w")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def parse_retention(text: str) -> dict[str, timedelta]:
    """``PHASEGATE_RETENTION_BY_CLASSIFICATION`` (``{"public": "7d", "regulated": "30d"}``)
    -> {classification: age}. Raises ValueError."""
    from phasegate.residency import CLASSIFICATIONS  # residency imports settings

    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError('must be a JSON object like {"public": "7d", "regulated": "30d"}') \
            from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError("must be a non-empty JSON object of classification -> age")
    ages = {}
    for classification, age in raw.items():
        if classification not in CLASSIFICATIONS:
            raise ValueError(f"{classification!r} is not one of {list(CLASSIFICATIONS)}")
        ages[classification] = parse_age(str(age))
    return ages
