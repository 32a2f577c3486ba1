"""One opaque config's parameters, read once, the same way by every reader: `cnidra validate`,
the admission webhook and prepare. Pure: no I/O.

- **One set of bounds.** Real CNIConfigs are a few KiB and a dozen levels deep; a config
  nested deeper than `MAX_DEPTH` or larger than `MAX_BYTES` (as compact JSON) is refused before
  anything else reads it, iteratively, so no input can exhaust the stack.
- **One form.** `config` may be written as an object or as a string of JSON (the form a
  NetworkAttachmentDefinition uses); the string is parsed here, by the strict bounded reader
  (`cnidra.api.loading.load_json`: duplicate keys, NaN, over-long integers and deep nesting
  refused), so the policy and the validator only ever see the object the plugins will get.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cnidra.api.issues import FieldPath, Issues
from cnidra.api.loading import LoadError, load_json

MAX_DEPTH = 32
MAX_BYTES = 64 * 1024


# The most characters json.dumps writes for one character of a string (ensure_ascii: a
# character beyond the BMP is two \uXXXX escapes), and for a float (its repr: sign, 17 digits,
# point, exponent; or -Infinity)
_PER_CHAR = 12
_FLOAT_CHARS = 24
_INT_BOUND = 10**20  # an int below it in size is at most 21 characters


def _bound(item: Any, depth: int) -> int | None:
    """At least the length of `item`'s compact JSON text (at `depth`), when it is made of
    JSON's exact types (dict with str keys, list, str, int, float, bool, None) and `_walk`
    finds nothing wrong in it; None otherwise (then the exact path answers). No ABC check per
    value and no text written: what a config of the usual few KiB costs. Recursion at most
    MAX_DEPTH deep: a value deeper is None at once."""
    if depth > MAX_DEPTH:
        return None
    kind = type(item)
    if kind is str:
        return _PER_CHAR * len(item) + 2 if len(item) <= MAX_BYTES else None
    if kind is dict:
        total = 2
        for key, value in item.items():
            if type(key) is not str:
                return None
            size = _bound(value, depth + 1)
            if size is None:
                return None
            total += _PER_CHAR * len(key) + 4 + size  # "key":value,
        return total
    if kind is list:
        total = 2
        for value in item:
            size = _bound(value, depth + 1)
            if size is None:
                return None
            total += size + 1
        return total
    if kind is int:
        return 21 if -_INT_BOUND < item < _INT_BOUND else None
    if kind is float:
        return _FLOAT_CHARS
    if kind is bool or item is None:
        return 5
    return None


def bounds_problem(value: Any) -> str | None:
    """Why a config is refused before it is read any further, or None."""
    bound = _bound(value, 1)
    if bound is not None and bound <= MAX_BYTES:
        return None  # within the depth, no string too long, and its text is short enough
    problem = _walk(value)
    if problem is not None:
        return problem
    try:
        size = len(json.dumps(value, separators=(",", ":")))
    except (TypeError, ValueError) as exc:
        return f"is not JSON data: {exc}"
    if size > MAX_BYTES:
        return f"is {size} bytes; at most {MAX_BYTES} are allowed"
    return None


def _walk(value: Any) -> str | None:
    """The first value too deep or string too long, iteratively (no input exhausts the stack)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"is nested more than {MAX_DEPTH} levels deep"
        if isinstance(item, Mapping):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str) and len(item) > MAX_BYTES:
            return f"holds a string of {len(item)} characters; at most {MAX_BYTES} are allowed"
    return None


def read_parameters(raw: Any, path: FieldPath, issues: Issues) -> Any:
    """The parameters with a string `config` parsed; what is refused is reported at `path`
    and left out (a config that cannot be read is dropped, so nothing downstream sees it)."""
    problem = bounds_problem(raw)
    if problem:
        issues.error(path, problem)
        return None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("config"), str):
        return raw
    out = dict(raw)
    text = out.pop("config")
    try:
        config = load_json(text, "the JSON text")
    except LoadError as exc:
        issues.error(path / "config", f"is a string but not a network configuration: {exc}")
        return out
    problem = bounds_problem({"config": config})
    if problem:
        issues.error(path / "config", problem)
        return out
    out["config"] = config
    return out
