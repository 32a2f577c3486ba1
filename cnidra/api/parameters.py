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


def _within(item: Any, depth: int) -> bool:
    """Whether `_walk` finds nothing wrong below `item` (at `depth`): the same rules, answered
    faster for the exact JSON types every config is made of (no ABC check per value); the
    message, only for a config that has a problem, is `_walk`'s. Recursion at most MAX_DEPTH
    deep: a value deeper is a problem at once."""
    if depth > MAX_DEPTH:
        return False
    kind = type(item)
    if kind is str:
        return len(item) <= MAX_BYTES
    if kind is dict:
        children: Any = item.values()
    elif kind is list:
        children = item
    elif kind is int or kind is float or kind is bool or item is None:
        return True
    elif isinstance(item, Mapping):
        children = item.values()
    elif isinstance(item, list):
        children = item
    else:
        return not isinstance(item, str) or len(item) <= MAX_BYTES
    below = depth + 1
    for child in children:
        kind = type(child)
        if kind is str:
            if len(child) > MAX_BYTES or below > MAX_DEPTH:
                return False
        elif kind is int or kind is bool or child is None:
            if below > MAX_DEPTH:
                return False
        elif not _within(child, below):
            return False
    return True


def bounds_problem(value: Any) -> str | None:
    """Why a config is refused before it is read any further, or None."""
    problem = None if _within(value, 1) else _walk(value)
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
