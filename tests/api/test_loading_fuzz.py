"""No bytes crash, hang or balloon the readers: every input is either documents or a LoadError
with a message, through every entry point that parses (validate's loader, convert, the NAD
config reader, the parameters' bound). Property-based, with hypothesis."""

from __future__ import annotations

import json
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cnidra.api.convert import ConvertError, read_sources
from cnidra.api.loading import LoadError, load_json, load_yaml
from cnidra.api.parameters import bounds_problem
from cnidra.api.validate import validate_documents

YAML_PIECES = [
    "a: 1\n", "a: 1\na: 2\n", "? [x]\n: y\n", "~: z\n", "x: 2001-12-14\n", "x: !!binary aGk=\n",
    "x: !!set {a}\n", "x: .nan\n", "x: .inf\n", "x: &a [1]\ny: *a\n", "---\n", "- [\n", "{", "}",
    "kind: NetworkAttachmentDefinition\n", "spec: {config: '{\"type\": \"bridge\"}'}\n",
    "spec: [1]\n", "metadata: []\n", "kind: ResourceClaim\napiVersion: resource.k8s.io/v1\n",
    "spec: {devices: {requests: [{name: n}], config: [{opaque: "
    "{driver: cni.dra.networking.x-k8s.io, parameters: {}}}]}}\n",
    "x: 99999999999999999999999999999999999999\n", "\t", "x: !!python/object:os.system ls\n",
    "x: '\\u0000'\n", "x: \"\\xff\"\n",
]  # fmt: skip
JSON_PIECES = ['{"a": 1', ', "a": 2', "}", "[", "]", "NaN", "Infinity", ",", '"x"', "1e999", "-"]


def readers(data: bytes) -> None:
    """Every reader on the same bytes: each answers or says why not, never raises else."""
    for read in (load_yaml, load_json):
        try:
            docs = read(data)
        except LoadError as exc:
            assert str(exc)
            continue
        if read is load_yaml:
            validate_documents(docs)
    try:
        read_sources(data)
    except ConvertError as exc:
        assert str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(YAML_PIECES), max_size=8), st.binary(max_size=40))
def test_yaml_shapes_never_crash(pieces: list[str], noise: bytes) -> None:
    readers("".join(pieces).encode() + noise)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(JSON_PIECES), max_size=12))
def test_json_shapes_never_crash(pieces: list[str]) -> None:
    readers("".join(pieces).encode())


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 20000), st.sampled_from(["[", '{"a": ', "- "]))
def test_any_depth_is_refused_or_read_quickly(depth: int, opener: str) -> None:
    closer = {"[": "]", '{"a": ': "}", "- ": ""}[opener]
    body = (opener * depth + "1" + closer * depth).encode()
    start = time.process_time()  # this process's CPU: a loaded machine's wait does not count
    readers(body)
    assert time.process_time() - start < 5


def test_an_alias_bomb_is_refused_without_expanding() -> None:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 10):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    start = time.process_time()  # this process's CPU: a loaded machine's wait does not count
    try:
        load_yaml("\n".join(lines).encode())
        raise AssertionError("an alias bomb was read")
    except LoadError as exc:
        assert "expands to more than" in str(exc)
    assert time.process_time() - start < 1


def test_the_parameters_bound_is_iterative() -> None:
    """The one bound validate, the webhook and prepare hold a config to."""
    deep: Any = 1
    for _ in range(100_000):
        deep = [deep]
    assert "nested more than" in str(bounds_problem(deep))
    assert bounds_problem(json.loads('{"a": [1, {"b": 2}]}')) is None
