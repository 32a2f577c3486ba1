"""Network policy on secondary interfaces: MultiNetworkPolicy as Multus users write it, and
cnidra's admin tier, decoded into frozen data. Pure: no I/O. docs/network-policy.md.

Two kinds of object:

- **MultiNetworkPolicy** (`k8s.cni.cncf.io/v1beta1`, namespaced): the Kubernetes NetworkPolicy
  spec, bound to networks by the annotation `k8s.v1.cni.cncf.io/policy-for: "ns/nad, ..."`.
  Its podSelector selects pods of its own namespace only, as NetworkPolicy's does.
- **CNIAdminNetworkPolicy** (`cni.networking.x-k8s.io/v1alpha1`, cluster-scoped): the admin's,
  shaped like AdminNetworkPolicy: a priority, a subject (namespaces or pods), `spec.networks`
  naming the networks, and ordered rules whose action is Allow, Deny or Pass. It is evaluated
  before every MultiNetworkPolicy, so no tenant policy opens what it denies.

A `policy-for` entry (and an admin's `spec.networks` entry) names one network:

| written | the network |
|---|---|
| `ns/name` or `name` | the NetworkAttachmentDefinition (`name` alone: the policy's namespace) |
| `cninetwork:name` | the CNINetwork `name` (cluster-scoped) |
| `deviceclass:name` | the network the DeviceClass `name` defines (the admin's) |
| `claim:ns/name` | the network claims of namespace `ns` define with config name `name` |

A prefix holds a colon, which no object name does, so the forms never meet. A claim-defined
network is its namespace's (`cnidra-ns.<ns>.<name>` to the plugins: cnidra.api.ownership), so
`claim:` is the namespace and the config name that make that owned name.

Decoding reports every problem at once, each at its field path (cnidra.api.issues), saying what
is allowed; `tenancy_problems` then says which of a tenant's targets it may not write for.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from cnidra.api.constants import API_GROUP
from cnidra.api.issues import ROOT, FieldPath, Issues, describe

MNP_GROUP = "k8s.cni.cncf.io"
MNP_API_VERSION = f"{MNP_GROUP}/v1beta1"
MNP_KIND = "MultiNetworkPolicy"
MNP_PLURAL = "multi-networkpolicies"
POLICY_FOR_ANNOTATION = "k8s.v1.cni.cncf.io/policy-for"
ADMIN_API_VERSION = f"{API_GROUP}/v1alpha1"
ADMIN_KIND = "CNIAdminNetworkPolicy"
ADMIN_PLURAL = "cniadminnetworkpolicies"

PROTOCOLS = ("TCP", "UDP", "SCTP")
POLICY_TYPES = ("Ingress", "Egress")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
# AdminNetworkPolicy's bounds: priorities 0 (first) to 1000, at most 100 rules a direction
MAX_PRIORITY = 1000
MAX_ADMIN_RULES = 100
# bounds of what one object may hold, so what is judged and compiled stays small
MAX_TARGETS = 64
MAX_RULES = 256
MAX_PEERS = 256
MAX_PORTS = 256
MAX_EXCEPTS = 256

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


# ---------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "In":
            return value in self.values
        if self.operator == "NotIn":
            return value not in self.values
        if self.operator == "Exists":
            return value is not None
        return value is None  # DoesNotExist


@dataclass(frozen=True)
class Selector:
    """A label selector; the empty one selects everything."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.expressions
        )


EVERYTHING = Selector()


@dataclass(frozen=True)
class IPBlock:
    cidr: IPNetwork
    excepts: tuple[IPNetwork, ...] = ()

    def networks(self) -> list[IPNetwork]:
        """The CIDR without its exceptions, as disjoint networks."""
        parts: list[IPNetwork] = [self.cidr]
        for hole in self.excepts:
            nxt: list[IPNetwork] = []
            for part in parts:
                if hole.version != part.version or not part.overlaps(hole):
                    nxt.append(part)
                elif hole.supernet_of(part):  # type: ignore[arg-type]
                    continue
                else:
                    nxt.extend(part.address_exclude(hole))  # type: ignore[arg-type]
            parts = nxt
        return sorted(parts, key=lambda n: (n.version, n.network_address, n.prefixlen))


@dataclass(frozen=True)
class Peer:
    """One `from`/`to` entry: pods (selected by namespace and pod labels) or an ipBlock.
    `namespace_selector` None: the policy's own namespace."""

    pod_selector: Selector | None = None
    namespace_selector: Selector | None = None
    ip_block: IPBlock | None = None


@dataclass(frozen=True)
class PortSpec:
    """A port, a named port, or a range `port`..`end_port`; `port` None: every port."""

    protocol: str = "TCP"
    port: int | str | None = None
    end_port: int | None = None


@dataclass(frozen=True)
class Rule:
    """An ingress or egress rule: empty `peers` is every peer, empty `ports` every port."""

    peers: tuple[Peer, ...] = ()
    ports: tuple[PortSpec, ...] = ()


class TargetKind(StrEnum):
    NAD = "nad"
    CNINETWORK = "cninetwork"
    DEVICECLASS = "deviceclass"
    CLAIM = "claim"


@dataclass(frozen=True, order=True)
class Target:
    """A network a policy is for; `key` is its one spelling (what interfaces are matched by)."""

    kind: TargetKind
    name: str
    namespace: str | None = None

    @property
    def key(self) -> str:
        if self.kind is TargetKind.NAD:
            return f"{self.namespace}/{self.name}"
        if self.kind is TargetKind.CLAIM:
            return f"claim:{self.namespace}/{self.name}"
        return f"{self.kind.value}:{self.name}"

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True)
class MultiNetworkPolicy:
    namespace: str
    name: str
    targets: tuple[Target, ...]
    pod_selector: Selector
    ingress: tuple[Rule, ...]
    egress: tuple[Rule, ...]
    policy_types: frozenset[str]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return namespace == self.namespace and self.pod_selector.matches(labels)


class Action(StrEnum):
    ALLOW = "Allow"
    DENY = "Deny"
    PASS = "Pass"


@dataclass(frozen=True)
class AdminPeer:
    """`namespaces` (every pod of them), `pods` (namespace and pod selectors), or `networks`
    (CIDRs, for peers that are no pods: routers, appliances on the segment)."""

    namespace_selector: Selector | None = None
    pod_selector: Selector | None = None
    cidrs: tuple[IPNetwork, ...] = ()


@dataclass(frozen=True)
class AdminRule:
    name: str
    action: Action
    peers: tuple[AdminPeer, ...]
    ports: tuple[PortSpec, ...] = ()


@dataclass(frozen=True)
class AdminNetworkPolicy:
    name: str
    priority: int
    targets: tuple[Target, ...]
    subject_namespaces: Selector
    subject_pods: Selector
    ingress: tuple[AdminRule, ...]
    egress: tuple[AdminRule, ...]

    @property
    def ref(self) -> str:
        return f"admin/{self.name}"

    def selects(self, namespace_labels: Mapping[str, str], labels: Mapping[str, str]) -> bool:
        return self.subject_namespaces.matches(namespace_labels) and self.subject_pods.matches(
            labels
        )


# ------------------------------------------------------------------------ small readers


def _object(
    value: Any, path: FieldPath, issues: Issues, allowed: Sequence[str], what: str
) -> dict[str, Any] | None:
    """`value` as an object holding only `allowed` keys (each other key an error)."""
    if not isinstance(value, dict):
        issues.error(path, f"must be {what}, got {describe(value)}")
        return None
    for key in value:
        if key not in allowed:
            issues.error(
                path / str(key), f"is not a field of {what}; allowed: {', '.join(allowed)}"
            )
    return value


def _list(value: Any, path: FieldPath, issues: Issues, limit: int, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        issues.error(path, f"must be a list of {what}, got {describe(value)}")
        return []
    if len(value) > limit:
        issues.error(path, f"holds {len(value):,} entries; at most {limit} are allowed")
        return []
    return value


def _label_key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return f"key {key!r}: its prefix must be a DNS subdomain (lower case, at most 253)"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return (
            f"key {key!r} is not a label key: a name of at most 63 letters, digits, '-', '_' "
            "or '.', beginning and ending with a letter or digit, optionally prefixed "
            "'<dns subdomain>/'"
        )
    return None


def _label_value_problem(value: str) -> str | None:
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        return (
            f"{value!r} is not a label value: at most 63 letters, digits, '-', '_' or '.', "
            "beginning and ending with a letter or digit (or empty)"
        )
    return None


def decode_selector(value: Any, path: FieldPath, issues: Issues) -> Selector | None:
    obj = _object(
        value, path, issues, ("matchLabels", "matchExpressions"), "a label selector object"
    )
    if obj is None:
        return None
    before = issues.error_count
    labels: list[tuple[str, str]] = []
    raw_labels = obj.get("matchLabels")
    if raw_labels is not None and not isinstance(raw_labels, dict):
        issues.error(
            path / "matchLabels", f"must be an object of label: value, got {describe(raw_labels)}"
        )
    for key, label in (raw_labels or {}).items() if isinstance(raw_labels, dict) else ():
        where = path / "matchLabels" / str(key)
        problem = _label_key_problem(str(key))
        if problem:
            issues.error(where, problem)
        if not isinstance(label, str):
            issues.error(where, f"must be a string label value, got {describe(label)}")
            continue
        problem = _label_value_problem(label)
        if problem:
            issues.error(where, problem)
        labels.append((str(key), label))
    reqs: list[Requirement] = []
    for i, raw in enumerate(
        _list(obj.get("matchExpressions"), path / "matchExpressions", issues, 64, "requirements")
    ):
        where = path / "matchExpressions" / i
        req = _object(raw, where, issues, ("key", "operator", "values"), "a requirement object")
        if req is None:
            continue
        key, op, values = req.get("key"), req.get("operator"), req.get("values")
        if not isinstance(key, str):
            issues.error(where / "key", f"is required: a label key, got {describe(key)}")
        else:
            problem = _label_key_problem(key)
            if problem:
                issues.error(where / "key", problem)
        if op not in OPERATORS:
            issues.error(
                where / "operator",
                f"must be one of {', '.join(OPERATORS)}, got {describe(op)}",
            )
            continue
        if values is not None and (
            not isinstance(values, list) or not all(isinstance(v, str) for v in values)
        ):
            issues.error(where / "values", f"must be a list of strings, got {describe(values)}")
            continue
        vals = values or []
        if op in ("In", "NotIn") and not vals:
            issues.error(where / "values", f"must not be empty with operator {op}")
        if op in ("Exists", "DoesNotExist") and vals:
            issues.error(where / "values", f"must be empty with operator {op}")
        for j, v in enumerate(vals):
            problem = _label_value_problem(v)
            if problem:
                issues.error(where / "values" / j, problem)
        if isinstance(key, str):
            reqs.append(Requirement(key, op, frozenset(vals)))
    if issues.error_count > before:
        return None
    return Selector(tuple(sorted(labels)), tuple(reqs))


def _cidr(value: Any, path: FieldPath, issues: Issues) -> IPNetwork | None:
    if not isinstance(value, str):
        issues.error(path, f"must be a CIDR string such as 198.18.0.0/15, got {describe(value)}")
        return None
    if "/" not in value:
        issues.error(path, f"{value!r} is not a CIDR: it needs a prefix length (198.18.0.0/15)")
        return None
    try:
        net = ipaddress.ip_network(value, strict=False)
    except ValueError:
        issues.error(path, f"{value!r} is not a CIDR (an IPv4 or IPv6 address/prefix length)")
        return None
    if str(net) != value and net.compressed != value:
        issues.warn(path, f"{value!r} has host bits set; it is read as {net}")
    return net


def decode_ip_block(value: Any, path: FieldPath, issues: Issues) -> IPBlock | None:
    obj = _object(value, path, issues, ("cidr", "except"), "an ipBlock object (cidr, except)")
    if obj is None:
        return None
    if "cidr" not in obj:
        issues.error(path / "cidr", "is required: a CIDR such as 198.18.0.0/15")
        return None
    cidr = _cidr(obj["cidr"], path / "cidr", issues)
    excepts: list[IPNetwork] = []
    for i, raw in enumerate(
        _list(obj.get("except"), path / "except", issues, MAX_EXCEPTS, "CIDRs")
    ):
        net = _cidr(raw, path / "except" / i, issues)
        if net is None or cidr is None:
            continue
        if net.version != cidr.version:
            issues.error(path / "except" / i, f"{net} is not of the family of cidr {cidr}")
        elif not net.subnet_of(cidr) or net == cidr:  # type: ignore[arg-type]
            issues.error(
                path / "except" / i,
                f"{net} must lie strictly inside cidr {cidr} (an exception is a part of it)",
            )
        else:
            excepts.append(net)
    if cidr is None:
        return None
    return IPBlock(cidr, tuple(excepts))


def _port_number(value: Any, path: FieldPath, issues: Issues) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        issues.error(path, f"must be a port number 1-65535, got {describe(value)}")
        return None
    return value


def _port_name_problem(name: str) -> str | None:
    if (
        not 1 <= len(name) <= 15
        or not _PORT_NAME.match(name)
        or "--" in name
        or not any(c.isalpha() for c in name)
    ):
        return (
            f"{name!r} is not a port name: 1-15 lower-case letters, digits and '-', at least one "
            "letter, no '--', not beginning or ending with '-' (a container port's name)"
        )
    return None


def _protocol(value: Any, path: FieldPath, issues: Issues) -> str | None:
    if value is None:
        return "TCP"
    if value not in PROTOCOLS:
        issues.error(path, f"must be one of {', '.join(PROTOCOLS)}, got {describe(value)}")
        return None
    return str(value)


def decode_port(value: Any, path: FieldPath, issues: Issues) -> PortSpec | None:
    """A NetworkPolicyPort: protocol (TCP), port (a number or a name), endPort."""
    obj = _object(value, path, issues, ("protocol", "port", "endPort"), "a port object")
    if obj is None:
        return None
    before = issues.error_count
    protocol = _protocol(obj.get("protocol"), path / "protocol", issues)
    port = obj.get("port")
    number: int | str | None = None
    if isinstance(port, str):
        if port.isdigit():
            number = _port_number(int(port), path / "port", issues)
        else:
            problem = _port_name_problem(port)
            if problem:
                issues.error(path / "port", problem)
            number = port
    elif port is not None:
        number = _port_number(port, path / "port", issues)
    end = obj.get("endPort")
    end_port: int | None = None
    if end is not None:
        end_port = _port_number(end, path / "endPort", issues)
        if port is None:
            issues.error(path / "endPort", "needs port: a range is port..endPort")
        elif isinstance(number, str):
            issues.error(path / "endPort", "cannot follow a named port; write a port number")
        elif isinstance(number, int) and end_port is not None and end_port < number:
            issues.error(path / "endPort", f"{end_port} is below port {number}")
    if issues.error_count > before or protocol is None:
        return None
    return PortSpec(protocol, number, end_port)


def decode_target(text: str, namespace: str, path: FieldPath, issues: Issues) -> Target | None:
    """One network of `policy-for`/`spec.networks` (the module doc's table)."""
    kind_text, colon, rest = text.partition(":")
    if not colon:
        ns, _, name = text.rpartition("/")
        if (ns and not _NAMESPACE.match(ns)) or not _SUBDOMAIN.match(name) or len(name) > 253:
            issues.error(
                path,
                f"{text!r} is not a network: a NetworkAttachmentDefinition's namespace/name or "
                "name, or cninetwork:<name>, deviceclass:<name>, claim:<namespace>/<name>",
            )
            return None
        return Target(TargetKind.NAD, name, ns or namespace)
    try:
        kind = TargetKind(kind_text)
    except ValueError:
        issues.error(
            path,
            f"{text!r}: unknown network kind {kind_text!r}; allowed: cninetwork:<name>, "
            "deviceclass:<name>, claim:<namespace>/<name> (or a NAD's namespace/name)",
        )
        return None
    if kind is TargetKind.NAD:
        issues.error(path, f"{text!r}: write a NetworkAttachmentDefinition as namespace/name")
        return None
    if kind is TargetKind.CLAIM:
        ns, slash, name = rest.partition("/")
        if not slash or not _NAMESPACE.match(ns) or not _SUBDOMAIN.match(name):
            issues.error(
                path,
                f"{text!r}: a claim-defined network is claim:<namespace>/<config name> (the "
                "namespace of the claims and the name their CNI config gives the network)",
            )
            return None
        return Target(kind, name, ns)
    if not _SUBDOMAIN.match(rest) or len(rest) > 253:
        issues.error(path, f"{text!r}: {rest!r} is not a Kubernetes object name")
        return None
    return Target(kind, rest)


def decode_targets(
    value: Any, namespace: str, path: FieldPath, issues: Issues
) -> tuple[Target, ...]:
    """The comma-separated `policy-for` annotation (whitespace around entries ignored)."""
    if not isinstance(value, str) or not value.strip():
        issues.error(
            path,
            "is required: the networks the policy is for, comma-separated "
            '("ns/nad, cninetwork:name, deviceclass:name, claim:ns/name")',
        )
        return ()
    entries = [e.strip() for e in value.split(",")]
    if len(entries) > MAX_TARGETS:
        issues.error(path, f"names {len(entries)} networks; at most {MAX_TARGETS}")
        return ()
    found: list[Target] = []
    for i, entry in enumerate(entries):
        if not entry:
            issues.error(path, f"entry {i} is empty (a stray comma)")
            continue
        target = decode_target(entry, namespace, path, issues)
        if target is not None and target not in found:
            found.append(target)
    return tuple(found)


# ------------------------------------------------------------------ MultiNetworkPolicy


def _peer(value: Any, path: FieldPath, issues: Issues) -> Peer | None:
    obj = _object(
        value,
        path,
        issues,
        ("podSelector", "namespaceSelector", "ipBlock"),
        "a peer object (podSelector and/or namespaceSelector, or ipBlock)",
    )
    if obj is None:
        return None
    if not obj:
        issues.error(path, "is empty: set podSelector, namespaceSelector or ipBlock")
        return None
    if "ipBlock" in obj:
        if len(obj) > 1:
            issues.error(path, "ipBlock stands alone: it cannot be combined with selectors")
            return None
        block = decode_ip_block(obj["ipBlock"], path / "ipBlock", issues)
        return None if block is None else Peer(ip_block=block)
    pods = ns = None
    if "podSelector" in obj:
        pods = decode_selector(obj["podSelector"], path / "podSelector", issues)
        if pods is None:
            return None
    if "namespaceSelector" in obj:
        ns = decode_selector(obj["namespaceSelector"], path / "namespaceSelector", issues)
        if ns is None:
            return None
    return Peer(pod_selector=pods, namespace_selector=ns)


def _rule(value: Any, path: FieldPath, issues: Issues, peers_key: str) -> Rule | None:
    obj = _object(value, path, issues, (peers_key, "ports"), f"a rule object ({peers_key}, ports)")
    if obj is None:
        return None
    before = issues.error_count
    peers = [
        _peer(p, path / peers_key / i, issues)
        for i, p in enumerate(
            _list(obj.get(peers_key), path / peers_key, issues, MAX_PEERS, "peers")
        )
    ]
    ports = [
        decode_port(p, path / "ports" / i, issues)
        for i, p in enumerate(_list(obj.get("ports"), path / "ports", issues, MAX_PORTS, "ports"))
    ]
    if issues.error_count > before:
        return None
    return Rule(tuple(p for p in peers if p is not None), tuple(p for p in ports if p is not None))


def _metadata(
    doc: dict[str, Any], path: FieldPath, issues: Issues, *, namespaced: bool, default_ns: str
) -> tuple[str, str, dict[str, Any]]:
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        issues.error(path / "metadata", f"is required: an object with name, got {describe(meta)}")
        return "", "", {}
    name = meta.get("name")
    if not isinstance(name, str) or not _SUBDOMAIN.match(name) or len(name) > 253:
        issues.error(
            path / "metadata" / "name", f"must be a Kubernetes object name, got {describe(name)}"
        )
        name = ""
    namespace = meta.get("namespace")
    if namespaced:
        if namespace is None:
            namespace = default_ns
        elif not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
            issues.error(
                path / "metadata" / "namespace",
                f"must be a namespace name, got {describe(namespace)}",
            )
            namespace = default_ns
    elif namespace is not None:
        issues.error(
            path / "metadata" / "namespace",
            f"must not be set: {ADMIN_KIND} is cluster-scoped",
        )
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict):
        issues.error(path / "metadata" / "annotations", "must be an object of strings")
        annotations = {}
    return name, str(namespace or ""), annotations


def _header(doc: Any, path: FieldPath, issues: Issues, api_version: str, kind: str) -> bool:
    if not isinstance(doc, dict):
        issues.error(path, f"must be a {kind} object, got {describe(doc)}")
        return False
    if doc.get("apiVersion") != api_version:
        issues.error(
            path / "apiVersion", f"must be {api_version}, got {describe(doc.get('apiVersion'))}"
        )
    if doc.get("kind") != kind:
        issues.error(path / "kind", f"must be {kind}, got {describe(doc.get('kind'))}")
    return True


def decode_policy(
    doc: Any, path: FieldPath = ROOT, *, default_namespace: str = "default"
) -> tuple[MultiNetworkPolicy | None, Issues]:
    """A MultiNetworkPolicy document; None with the errors when it has any."""
    issues = Issues()
    if not _header(doc, path, issues, MNP_API_VERSION, MNP_KIND):
        return None, issues
    name, namespace, annotations = _metadata(
        doc, path, issues, namespaced=True, default_ns=default_namespace
    )
    targets = decode_targets(
        annotations.get(POLICY_FOR_ANNOTATION),
        namespace,
        path / "metadata" / "annotations" / POLICY_FOR_ANNOTATION,
        issues,
    )
    spath = path / "spec"
    spec = _object(
        doc.get("spec"),
        spath,
        issues,
        ("podSelector", "ingress", "egress", "policyTypes"),
        "a spec object (podSelector, ingress, egress, policyTypes)",
    )
    if spec is None:
        return None, issues
    if "podSelector" not in spec:
        issues.error(spath / "podSelector", "is required: {} selects every pod of the namespace")
        selector = None
    else:
        selector = decode_selector(spec["podSelector"], spath / "podSelector", issues)
    rules: dict[str, list[Rule]] = {"ingress": [], "egress": []}
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        raw = _list(spec.get(direction), spath / direction, issues, MAX_RULES, "rules")
        for i, item in enumerate(raw):
            rule = _rule(item, spath / direction / i, issues, peers_key)
            if rule is not None:
                rules[direction].append(rule)
    types: set[str] = set()
    raw_types = spec.get("policyTypes")
    if raw_types is None:
        # NetworkPolicy's defaulting: Ingress always, Egress when there are egress rules
        types = {"Ingress", *(["Egress"] if spec.get("egress") else [])}
    else:
        for i, t in enumerate(_list(raw_types, spath / "policyTypes", issues, 2, "Ingress/Egress")):
            if t not in POLICY_TYPES:
                issues.error(
                    spath / "policyTypes" / i, f"must be Ingress or Egress, got {describe(t)}"
                )
            elif t in types:
                issues.error(spath / "policyTypes" / i, f"{t} is listed twice")
            types.add(str(t))
        if isinstance(raw_types, list) and not raw_types:
            issues.error(spath / "policyTypes", "must not be empty: list Ingress, Egress or both")
    if issues.error_count or selector is None:
        return None, issues
    return (
        MultiNetworkPolicy(
            namespace,
            name,
            targets,
            selector,
            tuple(rules["ingress"]),
            tuple(rules["egress"]),
            frozenset(types),
        ),
        issues,
    )


# ------------------------------------------------------------------ CNIAdminNetworkPolicy


def _admin_pods(value: Any, path: FieldPath, issues: Issues) -> tuple[Selector, Selector] | None:
    obj = _object(
        value,
        path,
        issues,
        ("namespaceSelector", "podSelector"),
        "a pods object (namespaceSelector, podSelector)",
    )
    if obj is None:
        return None
    missing = [k for k in ("namespaceSelector", "podSelector") if k not in obj]
    for key in missing:
        issues.error(path / key, "is required ({} selects every one)")
    if missing:
        return None
    ns = decode_selector(obj["namespaceSelector"], path / "namespaceSelector", issues)
    pods = decode_selector(obj["podSelector"], path / "podSelector", issues)
    return None if ns is None or pods is None else (ns, pods)


def _admin_peer(value: Any, path: FieldPath, issues: Issues) -> AdminPeer | None:
    obj = _object(
        value,
        path,
        issues,
        ("namespaces", "pods", "networks"),
        "an admin peer object (exactly one of namespaces, pods, networks)",
    )
    if obj is None:
        return None
    if sum(k in obj for k in ("namespaces", "pods", "networks")) != 1:
        issues.error(path, "must set exactly one of namespaces, pods, networks")
        return None
    if "namespaces" in obj:
        ns = decode_selector(obj["namespaces"], path / "namespaces", issues)
        return None if ns is None else AdminPeer(namespace_selector=ns, pod_selector=EVERYTHING)
    if "pods" in obj:
        both = _admin_pods(obj["pods"], path / "pods", issues)
        return None if both is None else AdminPeer(namespace_selector=both[0], pod_selector=both[1])
    before = issues.error_count
    raw = _list(obj["networks"], path / "networks", issues, MAX_EXCEPTS, "CIDRs")
    if not raw and issues.error_count == before:
        issues.error(path / "networks", "must not be empty")
    cidrs = [_cidr(c, path / "networks" / i, issues) for i, c in enumerate(raw)]
    if issues.error_count > before:
        return None
    return AdminPeer(cidrs=tuple(c for c in cidrs if c is not None))


def _admin_port(value: Any, path: FieldPath, issues: Issues) -> PortSpec | None:
    obj = _object(
        value,
        path,
        issues,
        ("portNumber", "portRange", "namedPort"),
        "an admin port object (exactly one of portNumber, portRange, namedPort)",
    )
    if obj is None:
        return None
    if sum(k in obj for k in ("portNumber", "portRange", "namedPort")) != 1:
        issues.error(path, "must set exactly one of portNumber, portRange, namedPort")
        return None
    if "namedPort" in obj:
        name = obj["namedPort"]
        problem = _port_name_problem(name) if isinstance(name, str) else "must be a port name"
        if problem:
            issues.error(path / "namedPort", problem)
            return None
        # a named port is the container port of that name, whatever its protocol
        return PortSpec("", name)
    if "portNumber" in obj:
        where = path / "portNumber"
        num = _object(obj["portNumber"], where, issues, ("protocol", "port"), "a portNumber object")
        if num is None:
            return None
        proto = _protocol(num.get("protocol"), where / "protocol", issues)
        port = _port_number(num.get("port"), where / "port", issues)
        return None if proto is None or port is None else PortSpec(proto, port)
    where = path / "portRange"
    rng = _object(
        obj["portRange"], where, issues, ("protocol", "start", "end"), "a portRange object"
    )
    if rng is None:
        return None
    proto = _protocol(rng.get("protocol"), where / "protocol", issues)
    start = _port_number(rng.get("start"), where / "start", issues)
    end = _port_number(rng.get("end"), where / "end", issues)
    if start is not None and end is not None and end < start:
        issues.error(where / "end", f"{end} is below start {start}")
        return None
    if proto is None or start is None or end is None:
        return None
    return PortSpec(proto, start, end)


def _admin_rule(value: Any, path: FieldPath, issues: Issues, peers_key: str) -> AdminRule | None:
    obj = _object(
        value,
        path,
        issues,
        ("name", "action", peers_key, "ports"),
        f"an admin rule object (name, action, {peers_key}, ports)",
    )
    if obj is None:
        return None
    before = issues.error_count
    name = obj.get("name", "")
    if not isinstance(name, str) or len(name) > 100:
        issues.error(path / "name", f"must be a string of at most 100, got {describe(name)}")
    action = obj.get("action")
    if action not in tuple(Action):
        issues.error(path / "action", f"must be one of Allow, Deny, Pass, got {describe(action)}")
    raw_peers = _list(obj.get(peers_key), path / peers_key, issues, MAX_PEERS, "peers")
    if not raw_peers and issues.error_count == before:
        issues.error(path / peers_key, "is required: at least one peer (an admin rule names whom)")
    peers = [_admin_peer(p, path / peers_key / i, issues) for i, p in enumerate(raw_peers)]
    ports = [
        _admin_port(p, path / "ports" / i, issues)
        for i, p in enumerate(_list(obj.get("ports"), path / "ports", issues, MAX_PORTS, "ports"))
    ]
    if issues.error_count > before:
        return None
    return AdminRule(
        str(name),
        Action(str(action)),
        tuple(p for p in peers if p is not None),
        tuple(p for p in ports if p is not None),
    )


def decode_admin_policy(
    doc: Any, path: FieldPath = ROOT
) -> tuple[AdminNetworkPolicy | None, Issues]:
    """A CNIAdminNetworkPolicy document; None with the errors when it has any."""
    issues = Issues()
    if not _header(doc, path, issues, ADMIN_API_VERSION, ADMIN_KIND):
        return None, issues
    name, _, _ = _metadata(doc, path, issues, namespaced=False, default_ns="")
    spath = path / "spec"
    spec = _object(
        doc.get("spec"),
        spath,
        issues,
        ("priority", "subject", "networks", "ingress", "egress"),
        "a spec object (priority, subject, networks, ingress, egress)",
    )
    if spec is None:
        return None, issues
    priority = spec.get("priority")
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not (0 <= priority <= MAX_PRIORITY)
    ):
        issues.error(
            spath / "priority",
            f"is required: an integer 0 (evaluated first) to {MAX_PRIORITY}, got "
            f"{describe(priority)}",
        )
    subject: tuple[Selector, Selector] | None = None
    sub = _object(
        spec.get("subject"),
        spath / "subject",
        issues,
        ("namespaces", "pods"),
        "a subject object (exactly one of namespaces, pods)",
    )
    if sub is not None:
        if sum(k in sub for k in ("namespaces", "pods")) != 1:
            issues.error(spath / "subject", "must set exactly one of namespaces, pods")
        elif "namespaces" in sub:
            ns = decode_selector(sub["namespaces"], spath / "subject" / "namespaces", issues)
            subject = None if ns is None else (ns, EVERYTHING)
        else:
            subject = _admin_pods(sub["pods"], spath / "subject" / "pods", issues)
    targets: list[Target] = []
    raw_nets = _list(spec.get("networks"), spath / "networks", issues, MAX_TARGETS, "networks")
    if not raw_nets:
        issues.error(
            spath / "networks",
            "is required: the networks it is for (ns/nad, cninetwork:name, deviceclass:name, "
            "claim:ns/name)",
        )
    for i, raw in enumerate(raw_nets):
        if not isinstance(raw, str):
            issues.error(spath / "networks" / i, f"must be a string, got {describe(raw)}")
            continue
        if ":" not in raw and "/" not in raw:
            issues.error(spath / "networks" / i, f"{raw!r}: write a NAD as namespace/name")
            continue
        target = decode_target(raw.strip(), "", spath / "networks" / i, issues)
        if target is not None and target not in targets:
            targets.append(target)
    rules: dict[str, list[AdminRule]] = {"ingress": [], "egress": []}
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        raw_rules = _list(spec.get(direction), spath / direction, issues, MAX_ADMIN_RULES, "rules")
        for i, item in enumerate(raw_rules):
            rule = _admin_rule(item, spath / direction / i, issues, peers_key)
            if rule is not None:
                rules[direction].append(rule)
    if issues.error_count or subject is None or not isinstance(priority, int):
        return None, issues
    return (
        AdminNetworkPolicy(
            name,
            priority,
            tuple(targets),
            subject[0],
            subject[1],
            tuple(rules["ingress"]),
            tuple(rules["egress"]),
        ),
        issues,
    )


def interface_target(
    *,
    claim_namespace: str,
    config_name: str,
    attachment_definition: tuple[str, str] | None = None,
    cninetwork: str | None = None,
    device_class: str | None = None,
    claim_defined: bool = False,
) -> Target:
    """The network an attached interface is on, as `policy-for` names it: the reference the
    claim (or its class) made, else the DeviceClass's own network, else the claim's network
    (the prepare facts: cnidra.dra.resolve decides `claim_defined` as it names the network for
    the plugins, cnidra.api.ownership). `attachment_definition`: the NAD's namespace and name."""
    if attachment_definition is not None:
        return Target(TargetKind.NAD, attachment_definition[1], attachment_definition[0])
    if cninetwork is not None:
        return Target(TargetKind.CNINETWORK, cninetwork)
    if device_class is not None and not claim_defined:
        return Target(TargetKind.DEVICECLASS, device_class)
    return Target(TargetKind.CLAIM, config_name, claim_namespace)


# ------------------------------------------------------------------------------ tenancy


class NetworkAccess(Protocol):
    """Whether pods of `namespace` may use a cluster network or another namespace's NAD (the
    CNINetwork's namespaces, the DeviceClass's CNIPolicy): None when they may, else why not."""

    def __call__(self, namespace: str, target: Target) -> str | None: ...


def tenancy_problems(
    policy: MultiNetworkPolicy,
    access: NetworkAccess | Callable[[str, Target], str | None] | None,
    path: FieldPath = ROOT,
) -> Issues:
    """The rule: a tenant's policy is for networks of its own namespace (its NADs, its claims'
    networks), or cluster networks and other namespaces' NADs its pods may use. `access` None
    (offline: nothing to ask) leaves those to a warning."""
    issues = Issues()
    where = path / "metadata" / "annotations" / POLICY_FOR_ANNOTATION
    for target in policy.targets:
        own = target.namespace == policy.namespace
        if target.kind in (TargetKind.NAD, TargetKind.CLAIM) and own:
            continue
        if target.kind is TargetKind.CLAIM:
            issues.error(
                where,
                f"{target}: a claim-defined network is its namespace's alone; a policy of "
                f"namespace {policy.namespace} may name claim:{policy.namespace}/<name> only",
            )
            continue
        if access is None:
            issues.warn(where, f"{target}: whether {policy.namespace} may use it is not checked")
            continue
        why = access(policy.namespace, target)
        if why is not None:
            issues.error(where, f"{target}: pods of {policy.namespace} may not use it ({why})")
    return issues


@dataclass(frozen=True)
class CatalogAccess:
    """A `NetworkAccess` from what the cluster holds: the CNINetworks (their `namespaces` and
    `namespaceSelector`: cnidra.api.networks.NamedNetwork.admits), the DeviceClasses (a class's
    CNIPolicy `namespaces`/`namespaceSelector` when it has them; else every namespace may
    allocate from it), the namespaces' labels, and per namespace the other namespaces' NADs
    its claims reference (Multus lets a pod use another namespace's NAD; a policy for it is
    then its own pods' business)."""

    cninetworks: Mapping[str, Any]  # name -> NamedNetwork (anything with `admits`)
    device_classes: Mapping[str, Any]  # name -> its CNIPolicy (anything with `applies_to`) or None
    namespace_labels: Mapping[str, Mapping[str, str]]
    nads_in_use: Mapping[str, frozenset[str]]  # namespace -> "ns/name" of NADs it uses

    def __call__(self, namespace: str, target: Target) -> str | None:
        labels = self.namespace_labels.get(namespace)
        if target.kind is TargetKind.CNINETWORK:
            network = self.cninetworks.get(target.name)
            if network is None:
                return f"there is no CNINetwork {target.name}"
            why: str | None = network.admits(namespace, labels)
            return why
        if target.kind is TargetKind.DEVICECLASS:
            if target.name not in self.device_classes:
                return f"there is no DeviceClass {target.name} of cnidra's"
            policy = self.device_classes[target.name]
            if policy is None or policy.applies_to(namespace, labels) is not False:
                return None
            return f"DeviceClass {target.name}'s CNIPolicy does not cover namespace {namespace}"
        if target.kind is TargetKind.NAD:
            if target.key in self.nads_in_use.get(namespace, frozenset()):
                return None
            return (
                f"a NetworkAttachmentDefinition of namespace {target.namespace} that no claim "
                f"of {namespace} uses"
            )
        return f"a claim-defined network of namespace {target.namespace}"


def ordered_admin(policies: Iterable[AdminNetworkPolicy]) -> list[AdminNetworkPolicy]:
    """The admin tier in evaluation order: priority (0 first), then name (two policies at one
    priority are ordered by name, so every node evaluates them alike)."""
    return sorted(policies, key=lambda p: (p.priority, p.name))


# ------------------------------------------------------------------------------ the CRDs

_FREE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_RULES = {"type": "array", "maxItems": MAX_RULES, "items": _FREE}
# kubectl's JSONPath for the annotation: its dots escaped
_POLICY_FOR_PATH = ".metadata.annotations." + POLICY_FOR_ANNOTATION.replace(".", "\\.")
# what the drivers report on a policy: one entry per node where it selects an interface it
# cannot be enforced on (cnidra.status.netpolicy), each written by that node's driver alone
_CONDITION = {
    "type": "object",
    "required": ["type", "status", "reason", "message", "lastTransitionTime"],
    "properties": {
        "type": {"type": "string", "maxLength": 316},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string", "maxLength": 1024},
        "message": {"type": "string", "maxLength": 32768},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "observedGeneration": {"type": "integer", "minimum": 0},
    },
}
_STATUS = {
    "type": "object",
    "description": "Written by cnidra's drivers (docs/network-policy.md), not by hand.",
    "properties": {
        "nodes": {
            "type": "array",
            "maxItems": 5000,
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["node"],
            "items": {
                "type": "object",
                "required": ["node"],
                "properties": {
                    "node": {"type": "string", "maxLength": 253},
                    "conditions": {
                        "type": "array",
                        "maxItems": 8,
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["type"],
                        "items": _CONDITION,
                    },
                },
            },
        }
    },
}
_NOT_ENFORCED_ON = {
    "name": "Not-Enforced-On",
    "type": "string",
    "jsonPath": ".status.nodes[*].node",
}


def crd() -> dict[str, Any]:
    """The MultiNetworkPolicy CustomResourceDefinition, for clusters without Multus' (a cluster
    that has one keeps it: Helm does not replace an existing CRD). The schema is structural
    and loose below the spec's fields: cnidra's decoder says what is wrong, at its path."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{MNP_PLURAL}.{MNP_GROUP}"},
        "spec": {
            "group": MNP_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": MNP_KIND,
                "plural": MNP_PLURAL,
                "singular": "multi-networkpolicy",
                "shortNames": ["multi-policy"],
            },
            "versions": [
                {
                    "name": MNP_API_VERSION.split("/")[1],
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["podSelector"],
                                    "properties": {
                                        "podSelector": _FREE,
                                        "ingress": _RULES,
                                        "egress": _RULES,
                                        "policyTypes": {
                                            "type": "array",
                                            "maxItems": 2,
                                            "items": {"type": "string", "enum": list(POLICY_TYPES)},
                                        },
                                    },
                                },
                                "status": _STATUS,
                            },
                        }
                    },
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {
                            "name": "Networks",
                            "type": "string",
                            "jsonPath": _POLICY_FOR_PATH,
                        },
                        {"name": "Pod-Selector", "type": "string", "jsonPath": ".spec.podSelector"},
                        {"name": "Policy-Types", "type": "string", "jsonPath": ".spec.policyTypes"},
                        _NOT_ENFORCED_ON,
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


def admin_crd() -> dict[str, Any]:
    """The CNIAdminNetworkPolicy CustomResourceDefinition (cluster-scoped)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{ADMIN_PLURAL}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Cluster",
            "names": {
                "kind": ADMIN_KIND,
                "plural": ADMIN_PLURAL,
                "singular": ADMIN_KIND.lower(),
                "shortNames": ["cnianp"],
            },
            "versions": [
                {
                    "name": ADMIN_API_VERSION.split("/")[1],
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["priority", "subject", "networks"],
                                    "properties": {
                                        "priority": {
                                            "type": "integer",
                                            "minimum": 0,
                                            "maximum": MAX_PRIORITY,
                                        },
                                        "subject": _FREE,
                                        "networks": {
                                            "type": "array",
                                            "minItems": 1,
                                            "maxItems": MAX_TARGETS,
                                            "items": {"type": "string", "maxLength": 512},
                                        },
                                        "ingress": {**_RULES, "maxItems": MAX_ADMIN_RULES},
                                        "egress": {**_RULES, "maxItems": MAX_ADMIN_RULES},
                                    },
                                },
                                "status": _STATUS,
                            },
                        }
                    },
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Priority", "type": "integer", "jsonPath": ".spec.priority"},
                        {"name": "Networks", "type": "string", "jsonPath": ".spec.networks"},
                        _NOT_ENFORCED_ON,
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }
