"""The parameters' bound (cnidra.api.parameters.bounds_problem) answers as it always did: its
fast check for the JSON types is exact, the same verdict and the same message as the plain
iterative walk, for every value (JSON or not), at and around the depth and size limits."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra.api import parameters
from cnidra.api.parameters import bounds_problem


def reference(value: Any, max_depth: int, max_bytes: int) -> str | None:
    """bounds_problem as it was before its fast check (the walk alone, then the size)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return f"is nested more than {max_depth} levels deep"
        if isinstance(item, Mapping):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str) and len(item) > max_bytes:
            return f"holds a string of {len(item)} characters; at most {max_bytes} are allowed"
    try:
        size = len(json.dumps(value, separators=(",", ":")))
    except (TypeError, ValueError) as exc:
        return f"is not JSON data: {exc}"
    if size > max_bytes:
        return f"is {size} bytes; at most {max_bytes} are allowed"
    return None


class View(Mapping[str, Any]):
    """A Mapping that is no dict: walked as one, but not JSON."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class Text(str):
    """A str that is no str exactly."""


class Items(list[Any]):
    """A list that is no list exactly."""


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.text(max_size=12).map(Text),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(Items),
        st.lists(inner, max_size=3).map(tuple),  # not walked into (not JSON's list)
        st.dictionaries(st.text(max_size=4), inner, max_size=4),
        st.dictionaries(st.text(max_size=4), inner, max_size=3).map(View),
    ),
    max_leaves=40,
)


@settings(max_examples=600, deadline=None)
@given(VALUES, st.integers(1, 6), st.one_of(st.integers(0, 40), st.integers(40, 3000)))
def test_the_fast_check_answers_as_the_walk(value: Any, depth: int, size: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parameters, "MAX_DEPTH", depth)
        patch.setattr(parameters, "MAX_BYTES", size)
        assert bounds_problem(value) == reference(value, depth, size)


def nested(levels: int, leaf: Any, kind: str = "list") -> Any:
    value = leaf
    for _ in range(levels - 1):
        value = [value] if kind == "list" else {"k": value}
    return value


@pytest.mark.parametrize("kind", ["list", "dict"])
@pytest.mark.parametrize("leaf", [1, None, True, 1.5, "x", [], {}])
def test_at_and_past_the_depth_limit(kind: str, leaf: Any) -> None:
    limit = parameters.MAX_DEPTH
    for levels in (limit - 1, limit, limit + 1, limit + 2):
        value = nested(levels, leaf, kind)
        assert bounds_problem(value) == reference(value, limit, parameters.MAX_BYTES), levels
    assert bounds_problem(nested(limit, 1, kind)) is None
    assert "nested more than" in str(bounds_problem(nested(limit + 1, 1, kind)))


def test_at_and_past_the_size_limit() -> None:
    limit = parameters.MAX_BYTES
    for value in (
        {"a": "x" * limit},
        {"a": "x" * (limit + 1)},
        ["x" * (limit + 1), nested(40, 1)],
        [nested(40, 1), "x" * (limit + 1)],
        {"a": "x" * (limit // 2), "b": "y" * (limit // 2)},
        {"a": {1, 2}},
        {"a": "\u00e9" * (limit // 8)},  # its bound is past the limit, its text is not
        {"a": "\u00e9" * (limit // 6)},  # nor is its text
        {1: "a"},  # not the exact JSON types: the exact path answers
        {"a": (1, 2)},
    ):
        assert bounds_problem(value) == reference(value, parameters.MAX_DEPTH, limit), value
    assert bounds_problem({"a": "\u00e9" * (limit // 8)}) is None
    assert "bytes; at most" in str(bounds_problem({"a": "\u00e9" * (limit // 6)}))


JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**25), max_value=10**25),
    st.sampled_from([10**20 - 1, -(10**20) + 1, 10**20, -(10**20)]),
    st.floats(),  # NaN and the infinities too: json.dumps writes them
    st.sampled_from([-1.2345678901234567e-308, -2.2250738585072014e-308, 5e-324, -1.7e308]),
    st.text(),  # every code point: escapes of 6 and 12 characters
    st.sampled_from(["\U0001f600" * 3, '\x00\x1f\\"', "\ud800"]),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(), inner)),
    max_leaves=30,
)


@settings(max_examples=600, deadline=None)
@given(JSON_VALUES)
def test_the_bound_is_never_below_the_text(value: Any) -> None:
    """What lets the fast check skip json.dumps: its bound is never short of the text."""
    bound = parameters._bound(value, 1)
    if bound is not None:
        assert bound >= len(json.dumps(value, separators=(",", ":")))
