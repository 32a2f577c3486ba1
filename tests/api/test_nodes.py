"""Node selectors as the scheduler reads them: terms ORed, requirements of a term ANDed."""

from __future__ import annotations

from typing import Any

from cnidra.api.nodes import selects


def term(*, fields: list[Any] | None = None, exprs: list[Any] | None = None) -> dict[str, Any]:
    return {"matchFields": fields or [], "matchExpressions": exprs or []}


def name_in(*names: str) -> dict[str, Any]:
    return {"key": "metadata.name", "operator": "In", "values": list(names)}


def test_ored_terms_select_a_node_any_of_them_selects() -> None:
    selector = {"nodeSelectorTerms": [term(fields=[name_in("a")]), term(fields=[name_in("b")])]}
    assert selects(selector, "b", {}) and not selects(selector, "c", {})


def test_requirements_of_one_term_must_all_hold() -> None:
    rack = {"key": "rack", "operator": "In", "values": ["r1"]}
    selector = {"nodeSelectorTerms": [term(fields=[name_in("a", "b")], exprs=[rack])]}
    assert selects(selector, "a", {"rack": "r1"})
    assert not selects(selector, "a", {"rack": "r2"})
    assert selects(selector, "a", None)  # labels not known: only the name can refute


def test_operators() -> None:
    def one(op: str, *values: str) -> dict[str, Any]:
        req = {"key": "k", "operator": op, "values": list(values)}
        return {"nodeSelectorTerms": [term(exprs=[req])]}

    assert selects(one("Exists"), "n", {"k": "x"}) and not selects(one("Exists"), "n", {})
    assert selects(one("DoesNotExist"), "n", {}) and not selects(
        one("DoesNotExist"), "n", {"k": ""}
    )
    assert selects(one("NotIn", "x"), "n", {"k": "y"}) and not selects(
        one("NotIn", "x"), "n", {"k": "x"}
    )
    assert selects(one("Gt", "3"), "n", {"k": "4"}) and not selects(one("Gt", "3"), "n", {"k": "3"})
    assert selects(one("Lt", "3"), "n", {"k": "2"}) and not selects(one("Lt", "x"), "n", {"k": "2"})


def test_no_selector_selects_every_node_and_an_empty_term_none() -> None:
    assert selects(None, "n", {}) and selects({}, "n", {})
    assert not selects({"nodeSelectorTerms": [term()]}, "n", {})
