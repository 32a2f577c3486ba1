"""Reading untrusted bytes into documents, the way kubectl and libcni read them, and never
more expensively: every entry point (the CLI, prepare, the webhook, convert) goes through here.

- YAML (Kubernetes manifests): libyaml's C parser where installed; duplicate keys refused (as
  kubectl does); keys must be strings; implicit timestamps stay strings (kubectl's YAML-to-JSON
  does the same); explicit YAML-only types (`!!binary`, `!!set`, `!!omap`, `!!pairs`, Python
  tags) refused with their line; NaN and infinities refused (JSON has none).
- JSON (`.conf`, `.conflist`, a NAD's `spec.config`): strict, as libcni's Go decoder: no trailing
  commas, no comments, no NaN/Infinity, duplicate keys refused (Go keeps the last silently, which
  hides mistakes; kubectl refuses them in manifests).
- Bounds on everything: input size, nesting depth, integer length (Python's own 4300-digit
  limit), and the size YAML aliases expand to (an alias bomb is refused, not expanded).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import yaml

MAX_INPUT_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 100
MAX_NODES = 1_000_000  # values a document may hold once its aliases are expanded

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's C parser where present


class LoadError(ValueError):
    """Bytes that are not a document cnidra reads; the message says where and why."""


class _StrictLoader(_Base):  # type: ignore[misc]
    pass


def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        where = f"line {key_node.start_mark.line + 1} column {key_node.start_mark.column + 1}"
        if not isinstance(key, str):
            raise LoadError(f"{where}: a key must be a string, got {type(key).__name__} {key!r}")
        if key in out:
            raise LoadError(f"{where}: duplicate key {key!r}")
        out[key] = loader.construct_object(value_node, deep=True)
    return out


def _refuse(tag: str) -> Any:
    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        mark = node.start_mark
        raise LoadError(
            f"line {mark.line + 1} column {mark.column + 1}: {tag} is a YAML-only type that "
            "JSON and Kubernetes objects cannot hold"
        )

    return construct


def _timestamp_as_text(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _mapping)
_StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_text)
for _tag in ("binary", "set", "omap", "pairs"):
    _StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse(f"!!{_tag}"))


def _text(data: bytes, name: str) -> str:
    if len(data) > MAX_INPUT_BYTES:
        raise LoadError(f"{name} is {len(data)} bytes; at most {MAX_INPUT_BYTES} are read")
    if b"\0" in data:
        raise LoadError(f"{name} is binary (it holds NUL bytes), not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LoadError(
            f"{name} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})"
        ) from None


def _nesting(text: str, name: str) -> None:
    """Refuse text whose brackets nest deeper than MAX_DEPTH, before a parser recurses into it
    (Python's JSON reader raises RecursionError, libyaml's composer can overflow the C stack).
    Quoted strings are skipped; a bracket inside a YAML plain or block scalar counts, which can
    only refuse a document with more than MAX_DEPTH unbalanced brackets in its text."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    depth = 0
    for token in _TOKENS.finditer(text):
        ch = token.group()
        if ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise LoadError(f"{name} is nested more than {MAX_DEPTH} levels deep")
        elif ch in "]}":
            depth = max(depth - 1, 0)


# a quoted string (opened at the start or after a separator, as YAML and JSON open one: a
# quote inside a plain scalar, as in don't, opens nothing), or a bracket
_TOKENS = re.compile(r"""(?<![^\s:\[{,\-?])(?:"(?:[^"\\]|\\.)*"|'(?:[^']|'')*')|[\[\]{}]""")


def load_yaml(data: bytes, name: str = "input") -> list[Any]:
    """Every document of a (multi-document) YAML stream, empty documents dropped."""
    text = _text(data, name)
    _nesting(text, name)
    try:
        docs = [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    except LoadError as exc:
        raise LoadError(f"{name}: {exc}") from None
    except RecursionError:
        raise LoadError(f"{name} is nested too deeply to read") from None
    except yaml.YAMLError as exc:
        raise LoadError(f"{name} is not YAML: {exc}") from None
    except ValueError as exc:  # an integer over Python's digit limit, and the like
        raise LoadError(f"{name}: {exc}") from None
    for i, doc in enumerate(docs):
        check_tree(doc, f"{name} document {i}")
    return docs


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise LoadError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise LoadError(f"{name} is not JSON (JSON has no NaN or Infinity)")


def load_json(text: str | bytes, name: str = "input") -> Any:
    """Strict JSON, as libcni reads a .conf/.conflist."""
    if isinstance(text, bytes):
        text = _text(text, name)
    _nesting(text, name)
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
    except LoadError as exc:
        raise LoadError(f"{name}: {exc}") from None
    except RecursionError:
        raise LoadError(f"{name} is nested too deeply to read") from None
    except json.JSONDecodeError as exc:
        raise LoadError(
            f"{name} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:
        raise LoadError(f"{name}: {exc}") from None
    check_tree(value, name)
    return value


def check_tree(value: Any, name: str) -> None:
    """Depth, NaN/Infinity, and the size aliases expand to (each shared value counted once per
    place it appears, computed once per value, so the check itself stays linear)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, int, bool]] = [(value, 1, False)]
    while stack:
        item, depth, done = stack.pop()
        if depth > MAX_DEPTH:
            raise LoadError(f"{name} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(item, float) and (math.isnan(item) or math.isinf(item)):
            raise LoadError(f"{name} holds {item}, which JSON and Kubernetes objects cannot")
        if not isinstance(item, Mapping | list):
            continue
        children = list(item.values()) if isinstance(item, Mapping) else item
        if done:
            total = 1 + sum(sizes.get(id(c), 1) for c in children)
            if total > MAX_NODES:
                raise LoadError(
                    f"{name} expands to more than {MAX_NODES} values (YAML aliases?); refused"
                )
            sizes[id(item)] = total
        elif id(item) not in sizes:
            stack.append((item, depth, True))
            stack.extend((c, depth + 1, False) for c in children)
