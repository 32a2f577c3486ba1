"""Does a node selector select this node? The scheduler's semantics (core/v1 NodeSelector):
terms are ORed; within a term every matchExpression (labels) and matchField (only
`metadata.name`) must hold. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cnidra.api.hostside import NodeFacts
from cnidra.api.networks import NamedNetwork


@dataclass(frozen=True)
class NodeView:
    """What prepare and the hook need to know of this node: the host link behind each device the
    inventory publishes, the links that carry the node itself, the node's labels."""

    links: Mapping[str, str] = field(default_factory=dict)
    protected: frozenset[str] = frozenset()
    labels: Mapping[str, str] | None = None
    # each published device's attributes as its ResourceSlice has them (device metadata)
    attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # devices that stand for a named network this node serves (CNINetworks), by device name
    networks: Mapping[str, NamedNetwork] = field(default_factory=dict)
    # every link of the node as the host-side judgement needs it (cnidra.api.hostside)
    facts: NodeFacts = field(default_factory=NodeFacts)


def selects(
    selector: Mapping[str, Any] | None, node: str, labels: Mapping[str, str] | None
) -> bool:
    """True when `selector` (None: no selector) selects the node. With `labels` None (not
    known) label expressions are taken to hold: only what can be checked refutes."""
    if not selector:
        return True
    terms = selector.get("nodeSelectorTerms") or []
    return any(_term(t, node, labels) for t in terms if isinstance(t, Mapping))


def _term(term: Mapping[str, Any], node: str, labels: Mapping[str, str] | None) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term selects nothing
    for req in fields:
        if req.get("key") != "metadata.name" or not _requirement(req, node):
            return False
    if labels is None:
        return True
    return all(_requirement(req, labels.get(req.get("key", ""))) for req in expressions)


def _requirement(req: Mapping[str, Any], value: str | None) -> bool:
    op, values = req.get("operator"), list(req.get("values") or [])
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def named_nodes(selector: Mapping[str, Any] | None) -> set[str]:
    """Node names a selector's `metadata.name In` fields mention, for messages."""
    names: set[str] = set()
    for term in (selector or {}).get("nodeSelectorTerms") or []:
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In":
                names.update(req.get("values") or [])
    return names
