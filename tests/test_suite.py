"""The suite itself: every test can fail (it asserts, expects an exception, or calls a helper
that does), and under pytest-xdist each worker has a namespace tag of its own (issue 40)."""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from cnidra.cni import netns
from tests.conftest import RUN_TAG

TESTS = Path(__file__).parent
ROOT = TESTS.parent

# a call whose name says it checks
CHECKING_NAME = re.compile(r"^_?(assert|check|expect|verify)")
# pytest's ways of expecting a failure
EXPECTING = {"raises", "fail", "warns", "deprecated_call", "RaisesGroup"}

# Tests whose claim is that nothing raises: what they call raising (an exception out of a
# parser, a hypothesis property, a timeout) is the failure. Each with the reason; keep it short.
DOES_NOT_RAISE = {
    "tests/observe/test_interfaces.py::test_any_text_parses_without_error": (
        "fuzzer: /proc/net/dev's parser takes any text"
    ),
    "tests/test_netlink.py::test_any_bytes_parse_or_are_unreadable": (
        "fuzzer: the netlink parser raises Unreadable or nothing"
    ),
}


@dataclass
class Module:
    path: Path
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    imported: dict[str, tuple[Path, str]] = field(default_factory=dict)  # from tests.x import y


@cache
def module(path: Path) -> Module:
    tree = ast.parse(path.read_text(), str(path))
    found = Module(path)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.functions[node.name] = node
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] not in ("tests", "testbed"):
                continue
            source = ROOT.joinpath(*parts).with_suffix(".py")
            if not source.exists():
                source = ROOT.joinpath(*parts, "__init__.py")
            for alias in node.names:
                found.imported[alias.asname or alias.name] = (source, alias.name)
    return found


def called(function: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):
                names.append(node.func.attr)
            elif isinstance(node.func, ast.Name):
                names.append(node.func.id)
    return names


def raises_assertion(node: ast.AST) -> bool:
    """`raise AssertionError(...)`: an assert with a report of its own."""
    if not isinstance(node, ast.Raise) or node.exc is None:
        return False
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "AssertionError"


def checks(where: Module, function: ast.FunctionDef | ast.AsyncFunctionDef, seen: set[int]) -> bool:
    """Whether `function` asserts, expects an exception, or calls a checking helper: one whose
    name says so, or one of its module's (or of a tests module it imports from) that checks."""
    key = id(function)
    if key in _verdicts:
        return _verdicts[key]
    if key in seen:
        return False
    seen.add(key)
    _verdicts[key] = verdict = _checks(where, function, seen)
    return verdict


_verdicts: dict[int, bool] = {}


def _checks(
    where: Module, function: ast.FunctionDef | ast.AsyncFunctionDef, seen: set[int]
) -> bool:
    if any(isinstance(node, ast.Assert) or raises_assertion(node) for node in ast.walk(function)):
        return True
    names = called(function)
    if any(name in EXPECTING or CHECKING_NAME.match(name) for name in names):
        return True
    for name in names:
        if name in where.functions and checks(where, where.functions[name], seen):
            return True
        if name in where.imported:
            source, original = where.imported[name]
            other = module(source) if source.exists() else None
            if (
                other
                and original in other.functions
                and checks(other, other.functions[original], seen)
            ):
                return True
    return False


@cache
def all_tests() -> list[tuple[str, Module, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for path in sorted(TESTS.rglob("test_*.py")):
        where = module(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_function and node.name.startswith("test_"):
                where.functions.setdefault(node.name, node)
                found.append((f"{path.relative_to(ROOT)}::{node.name}", where, node))
    return found


def test_every_test_can_fail() -> None:
    silent = [
        name
        for name, where, function in all_tests()
        if name not in DOES_NOT_RAISE and not checks(where, function, set())
    ]
    assert not silent, (
        "these tests assert nothing (no assert, no pytest.raises, no helper that checks): make "
        "each check what it names, or add it to DOES_NOT_RAISE with the reason:\n  "
        + "\n  ".join(silent)
    )


def test_the_allow_list_names_only_tests_that_exist_and_need_it() -> None:
    tests = {name: (where, function) for name, where, function in all_tests()}
    stale = [name for name in DOES_NOT_RAISE if name not in tests]
    assert not stale, f"DOES_NOT_RAISE names tests that are gone: {stale}"
    needless = [name for name in DOES_NOT_RAISE if checks(*tests[name], set())]
    assert not needless, f"these assert now: take them off DOES_NOT_RAISE: {needless}"


def test_the_checker_finds_a_test_without_an_assertion(tmp_path: Path) -> None:
    """The check above can fail: a module with one silent test among checking ones."""
    path = tmp_path / "test_sample.py"
    path.write_text(
        "import pytest\n"
        "from tests.conftest import ip\n"
        "def helper(x):\n    assert x\n"
        "def quiet(x):\n    return x\n"
        "def test_asserts():\n    assert 1\n"
        "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n"
        "def test_helper():\n    helper(1)\n"
        "def test_named():\n    assert_fine()\n"
        "def test_reports():\n    raise AssertionError('found')\n"
        "async def test_silent():\n    quiet(1)\n    ip(None)\n"
    )
    where = module(path)
    verdicts = {
        name: checks(where, function, set())
        for name, function in where.functions.items()
        if name.startswith("test_")
    }
    assert verdicts == {
        "test_asserts": True,
        "test_raises": True,
        "test_helper": True,
        "test_named": True,
        "test_reports": True,
        "test_silent": False,
    }


def test_each_process_has_its_own_namespace_tag() -> None:
    """tests/conftest.py tags this process's namespaces with its pid: under pytest-xdist, the
    worker's, not the controller's (the worker's parent), so one worker's leak check never
    counts another's namespaces."""
    pid, parent = os.getpid(), os.getppid()
    assert (RUN_TAG, os.environ[netns.TAG_VARIABLE]) == (f"t{pid}", f"t{pid}")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        assert f"t{parent}" != RUN_TAG
