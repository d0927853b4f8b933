"""What PostgreSQL's jsonb can hold, checked before anything is written.

A start's input, a phase's returned state and an API request body all end up in jsonb columns.
jsonb refuses a NUL character (``\\u0000``) and text that is not valid UTF-8 (a lone surrogate),
and deeply nested JSON costs recursion in every reader (Python's ``json`` and the database's
own parser). Catching these here turns a database error deep in a transaction, which would be
retried forever, into one clear, non-retryable refusal naming the place in the value.
"""

from __future__ import annotations

import math
from typing import Any

# Deeper than any real document; far below the recursion limits of json, pydantic and jsonb.
MAX_JSON_DEPTH = 64
# A value stored per run or per phase; state lives in Postgres, but a checkpoint row is copied
# into every later read, so it is bounded. 1 MiB of canonical JSON.
MAX_STATE_BYTES = 1_048_576


class UnstorableValue(ValueError):
    """A value that jsonb cannot hold or that exceeds a documented limit.

    ``where`` is a JSON-path-like pointer (``$.items[3].name``); ``reason`` never contains the
    value itself, so it is safe to log and to return to an API caller.
    """

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


def check_storable(value: Any, *, where: str = "$", max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise :class:`UnstorableValue` unless ``value`` is JSON that jsonb stores unchanged.

    Iterative, so hostile nesting cannot raise ``RecursionError`` here.
    """
    stack: list[tuple[Any, str, int]] = [(value, where, 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, dict | list) and depth > max_depth:
            raise UnstorableValue(path, f"nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise UnstorableValue(path, "object keys must be strings")
                _check_text(key, path, "an object key")
                stack.append((child, f"{path}.{_safe_key(key)}", depth + 1))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
        elif isinstance(item, str):
            _check_text(item, path, "a string")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise UnstorableValue(path, "NaN and Infinity are not JSON")
        elif item is None or isinstance(item, bool | int):
            continue
        else:
            raise UnstorableValue(path, f"{type(item).__name__} is not a JSON type")


def plainly_storable(value: Any, canonical: str, *, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """A quick yes from what :func:`check_storable` checks, for a value whose JSON text is
    ``canonical`` (``json.dumps`` with ``allow_nan=False`` and ``ensure_ascii=False``, which
    refuses NaN and the types JSON has none for): the text holds no NUL and no lone surrogate
    (one pass in C over the whole text instead of one call per string), and the value is
    dicts with string keys, lists and scalars, at most ``max_depth`` containers deep (a tuple,
    which json writes as a list, is not). False sends the caller to check_storable, which
    names the place, or finds nothing: an escaped backslash before ``u0000`` in a string
    reads like a NUL here."""
    if "\\u0000" in canonical:
        return False
    if not canonical.isascii():
        try:
            canonical.encode("utf-8")
        except UnicodeEncodeError:
            return False
    if not isinstance(value, _CONTAINERS):
        return not isinstance(value, tuple)
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return False
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    return False
            children = item.values()
        else:
            children = item
        for child in children:
            if isinstance(child, _CONTAINERS):
                stack.append((child, depth + 1))
            elif isinstance(child, tuple):
                return False
    return True


# A tuple, not ``dict | list``: that union is built anew at every call (115 against 67 ns an
# isinstance on this machine).
_CONTAINERS = (dict, list)


def check_storable_size(canonical: str, *, where: str = "$",
                        max_bytes: int = MAX_STATE_BYTES) -> None:
    """Raise unless the canonical JSON text fits the documented size limit."""
    size = len(canonical.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise UnstorableValue(where, f"{size} bytes of JSON exceed the limit of {max_bytes}")


def _check_text(text: str, path: str, what: str) -> None:
    if "\x00" in text:
        raise UnstorableValue(path, f"{what} contains a NUL character (\\u0000)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UnstorableValue(path, f"{what} contains a lone surrogate (not valid UTF-8)") from None


def _safe_key(key: str) -> str:
    # The pointer names where the problem is without echoing arbitrary user text.
    if key.isidentifier() and len(key) <= 40:
        return key
    return "<key>"
