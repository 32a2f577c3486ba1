"""MultiNetworkPolicy and CNIAdminNetworkPolicy decoded (cnidra.api.netpolicy): what Multus users
write reads as written, NetworkPolicy's defaulting, every bad input an error at its field path
saying what is allowed, the network naming of `policy-for`, and the tenancy rule."""

from __future__ import annotations

import copy
import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cnidra.api.issues import ROOT, Issues
from cnidra.api.netpolicy import (
    POLICY_FOR_ANNOTATION,
    Action,
    CatalogAccess,
    IPBlock,
    Selector,
    Target,
    TargetKind,
    admin_crd,
    crd,
    decode_admin_policy,
    decode_ip_block,
    decode_policy,
    decode_selector,
    decode_targets,
    interface_target,
    ordered_admin,
    tenancy_problems,
)
from cnidra.api.networks import NamedNetwork
from cnidra.api.policy import CNIPolicy, LabelSelector
from cnidra.api.validate import validate_documents

FOR = POLICY_FOR_ANNOTATION


def mnp(spec: dict[str, Any], policy_for: Any = "tenant-a/blue", **meta: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "tenant-a", **meta}
    if policy_for is not None:
        metadata["annotations"] = {FOR: policy_for}
    return {
        "apiVersion": "k8s.cni.cncf.io/v1beta1",
        "kind": "MultiNetworkPolicy",
        "metadata": metadata,
        "spec": spec,
    }


def anp(spec: dict[str, Any], name: str = "a") -> dict[str, Any]:
    return {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIAdminNetworkPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


def errors(issues: Issues) -> list[str]:
    return [str(i) for i in issues.errors]


# ------------------------------------------------------------------ reads as written


def test_a_multus_policy_reads_as_written() -> None:
    doc = mnp(
        {
            "podSelector": {"matchLabels": {"app": "db"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        {"podSelector": {"matchLabels": {"app": "web"}}},
                        {"namespaceSelector": {"matchLabels": {"team": "x"}}},
                        {
                            "namespaceSelector": {
                                "matchExpressions": [
                                    {"key": "env", "operator": "In", "values": ["prod"]}
                                ]
                            },
                            "podSelector": {},
                        },
                        {"ipBlock": {"cidr": "198.18.0.0/16", "except": ["198.18.1.0/24"]}},
                    ],
                    "ports": [
                        {"port": 5432},
                        {"protocol": "UDP", "port": "dns"},
                        {"protocol": "SCTP", "port": 3000, "endPort": 3100},
                    ],
                }
            ],
            "egress": [{}],
        },
        policy_for="tenant-a/blue, other/red,green",
    )
    policy, issues = decode_policy(doc)
    assert not issues.items
    assert policy is not None
    assert [t.key for t in policy.targets] == ["tenant-a/blue", "other/red", "tenant-a/green"]
    assert policy.policy_types == {"Ingress", "Egress"}
    (rule,) = policy.ingress
    assert rule.peers[0].namespace_selector is None  # the policy's own namespace
    assert rule.peers[1].pod_selector is None  # every pod of the selected namespaces
    assert rule.peers[3].ip_block == IPBlock(
        ipaddress.ip_network("198.18.0.0/16"), (ipaddress.ip_network("198.18.1.0/24"),)
    )
    assert [(p.protocol, p.port, p.end_port) for p in rule.ports] == [
        ("TCP", 5432, None),
        ("UDP", "dns", None),
        ("SCTP", 3000, 3100),
    ]
    assert policy.egress[0].peers == () and policy.egress[0].ports == ()  # allow all egress
    assert policy.selects("tenant-a", {"app": "db"})
    assert not policy.selects("tenant-b", {"app": "db"})  # its namespace's pods only


@pytest.mark.parametrize(
    ("spec", "types"),
    [
        ({"podSelector": {}}, {"Ingress"}),  # default deny ingress
        ({"podSelector": {}, "ingress": [{}]}, {"Ingress"}),
        ({"podSelector": {}, "egress": [{}]}, {"Ingress", "Egress"}),
        ({"podSelector": {}, "egress": []}, {"Ingress"}),
        ({"podSelector": {}, "policyTypes": ["Egress"]}, {"Egress"}),  # default deny egress
    ],
)
def test_policy_types_default_as_networkpolicy(spec: dict[str, Any], types: set[str]) -> None:
    policy, issues = decode_policy(mnp(spec))
    assert policy is not None and not issues.items
    assert policy.policy_types == types


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("blue", "tenant-a/blue"),
        ("other/blue", "other/blue"),
        ("cninetwork:data-a", "cninetwork:data-a"),
        ("deviceclass:sriov.example.com", "deviceclass:sriov.example.com"),
        ("claim:tenant-a/blue", "claim:tenant-a/blue"),
        ("  claim:tenant-a/blue  ", "claim:tenant-a/blue"),
    ],
)
def test_network_naming(text: str, key: str) -> None:
    issues = Issues()
    (target,) = decode_targets(text, "tenant-a", ROOT, issues)
    assert not issues.items
    assert target.key == key


# ------------------------------------------------------------------ every error at its path

BAD: list[tuple[dict[str, Any], str, str]] = [
    # (spec or whole doc, the path, a fragment of the message)
    ({}, "spec.podSelector", "is required"),
    ({"podSelector": [], "x": 1}, "spec.x", "allowed: podSelector, ingress, egress, policyTypes"),
    ({"podSelector": []}, "spec.podSelector", "must be a label selector object"),
    (
        {"podSelector": {"matchLabels": {"a b": "x"}}},
        'spec.podSelector.matchLabels["a b"]',
        "is not a label key",
    ),
    (
        {"podSelector": {"matchLabels": {"a": "-x"}}},
        "spec.podSelector.matchLabels.a",
        "is not a label value",
    ),
    (
        {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}},
        "spec.podSelector.matchExpressions[0].operator",
        "must be one of In, NotIn, Exists, DoesNotExist",
    ),
    (
        {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
        "spec.podSelector.matchExpressions[0].values",
        "must not be empty with operator In",
    ),
    (
        {
            "podSelector": {
                "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
            }
        },
        "spec.podSelector.matchExpressions[0].values",
        "must be empty with operator Exists",
    ),
    (
        {"podSelector": {}, "ingress": [{"from": [{}]}]},
        "spec.ingress[0].from[0]",
        "is empty: set podSelector, namespaceSelector or ipBlock",
    ),
    (
        {"podSelector": {}, "ingress": [{"to": []}]},
        "spec.ingress[0].to",
        "allowed: from, ports",
    ),
    (
        {"podSelector": {}, "egress": [{"from": []}]},
        "spec.egress[0].from",
        "allowed: to, ports",
    ),
    (
        {
            "podSelector": {},
            "ingress": [{"from": [{"ipBlock": {"cidr": "198.18.0.0/16"}, "podSelector": {}}]}],
        },
        "spec.ingress[0].from[0]",
        "ipBlock stands alone",
    ),
    (
        {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {}}]}]},
        "spec.ingress[0].from[0].ipBlock.cidr",
        "is required",
    ),
    (
        {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "198.18.0.1"}}]}]},
        "spec.ingress[0].from[0].ipBlock.cidr",
        "needs a prefix length",
    ),
    (
        {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "300.1.0.0/16"}}]}]},
        "spec.ingress[0].from[0].ipBlock.cidr",
        "is not a CIDR",
    ),
    (
        {
            "podSelector": {},
            "ingress": [
                {"from": [{"ipBlock": {"cidr": "198.18.0.0/16", "except": ["198.19.0.0/24"]}}]}
            ],
        },
        "spec.ingress[0].from[0].ipBlock.except[0]",
        "must lie strictly inside cidr 198.18.0.0/16",
    ),
    (
        {
            "podSelector": {},
            "ingress": [
                {"from": [{"ipBlock": {"cidr": "198.18.0.0/16", "except": ["2001:db8::/64"]}}]}
            ],
        },
        "spec.ingress[0].from[0].ipBlock.except[0]",
        "is not of the family",
    ),
    (
        {"podSelector": {}, "ingress": [{"ports": [{"protocol": "ICMP"}]}]},
        "spec.ingress[0].ports[0].protocol",
        "must be one of TCP, UDP, SCTP",
    ),
    (
        {"podSelector": {}, "ingress": [{"ports": [{"port": 0}]}]},
        "spec.ingress[0].ports[0].port",
        "must be a port number 1-65535",
    ),
    (
        {"podSelector": {}, "ingress": [{"ports": [{"port": 70000}]}]},
        "spec.ingress[0].ports[0].port",
        "must be a port number 1-65535",
    ),
    (
        {"podSelector": {}, "ingress": [{"ports": [{"port": "Web_Port"}]}]},
        "spec.ingress[0].ports[0].port",
        "is not a port name",
    ),
    (
        {"podSelector": {}, "ingress": [{"ports": [{"port": 80, "endPort": 79}]}]},
        "spec.ingress[0].ports[0].endPort",
        "79 is below port 80",
    ),
    (
        {"podSelector": {}, "ingress": [{"ports": [{"port": "http", "endPort": 90}]}]},
        "spec.ingress[0].ports[0].endPort",
        "cannot follow a named port",
    ),
    (
        {"podSelector": {}, "ingress": [{"ports": [{"endPort": 90}]}]},
        "spec.ingress[0].ports[0].endPort",
        "needs port",
    ),
    (
        {"podSelector": {}, "policyTypes": ["Ingress", "Ingress"]},
        "spec.policyTypes[1]",
        "Ingress is listed twice",
    ),
    (
        {"podSelector": {}, "policyTypes": ["ingress"]},
        "spec.policyTypes[0]",
        "must be Ingress or Egress",
    ),
    ({"podSelector": {}, "policyTypes": []}, "spec.policyTypes", "must not be empty"),
    ({"podSelector": {}, "ingress": {}}, "spec.ingress", "must be a list of rules"),
]


@pytest.mark.parametrize(("spec", "path", "fragment"), BAD)
def test_every_bad_input_is_an_error_at_its_path(
    spec: dict[str, Any], path: str, fragment: str
) -> None:
    policy, issues = decode_policy(mnp(spec))
    assert policy is None
    assert any(str(i.path) == path and fragment in i.message for i in issues.errors), errors(issues)


@pytest.mark.parametrize(
    ("policy_for", "fragment"),
    [
        (None, "is required: the networks the policy is for"),
        ("", "is required"),
        ("a/b,,c", "entry 1 is empty"),
        ("Blue", "is not a network"),
        ("vlan:blue", "unknown network kind 'vlan'"),
        ("claim:blue", "claim:<namespace>/<config name>"),
        ("cninetwork:Blue", "is not a Kubernetes object name"),
        ("nad:a/b", "write a NetworkAttachmentDefinition as namespace/name"),
    ],
)
def test_bad_policy_for(policy_for: Any, fragment: str) -> None:
    policy, issues = decode_policy(mnp({"podSelector": {}}, policy_for=policy_for))
    assert policy is None
    where = f'metadata.annotations["{FOR}"]'
    assert any(str(i.path) == where and fragment in i.message for i in issues.errors), errors(
        issues
    )


def test_header_and_metadata_errors() -> None:
    doc = mnp({"podSelector": {}})
    doc["apiVersion"] = "k8s.cni.cncf.io/v1"
    doc["metadata"]["name"] = "Not_A_Name"
    _, issues = decode_policy(doc)
    paths = {str(i.path) for i in issues.errors}
    assert paths == {"apiVersion", "metadata.name"}
    assert "must be k8s.cni.cncf.io/v1beta1" in errors(issues)[0]


# ------------------------------------------------------------------ the admin tier


ADMIN_OK = {
    "priority": 10,
    "subject": {"namespaces": {"matchLabels": {"tier": "tenant"}}},
    "networks": ["tenant-a/blue", "cninetwork:data-a"],
    "ingress": [
        {"name": "no-mgmt", "action": "Deny", "from": [{"networks": ["198.18.9.0/24"]}]},
        {
            "action": "Pass",
            "from": [
                {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"a": "b"}}}}
            ],
            "ports": [
                {"portNumber": {"protocol": "UDP", "port": 53}},
                {"portRange": {"start": 1000, "end": 2000}},
                {"namedPort": "http"},
            ],
        },
    ],
    "egress": [{"action": "Allow", "to": [{"namespaces": {}}]}],
}


def test_admin_policy_reads_as_written() -> None:
    policy, issues = decode_admin_policy(anp(ADMIN_OK))
    assert not issues.items and policy is not None
    assert policy.priority == 10
    assert [t.key for t in policy.targets] == ["tenant-a/blue", "cninetwork:data-a"]
    assert [r.action for r in policy.ingress] == [Action.DENY, Action.PASS]
    assert [(p.protocol, p.port, p.end_port) for p in policy.ingress[1].ports] == [
        ("UDP", 53, None),
        ("TCP", 1000, 2000),
        ("", "http", None),
    ]
    assert policy.selects({"tier": "tenant"}, {}) and not policy.selects({}, {})


ADMIN_BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"priority": 1001}, "spec.priority", "an integer 0 (evaluated first) to 1000"),
    ({"priority": True}, "spec.priority", "an integer 0"),
    ({"subject": {"namespaces": {}, "pods": {}}}, "spec.subject", "exactly one of namespaces"),
    ({"subject": {"pods": {"podSelector": {}}}}, "spec.subject.pods.namespaceSelector", "required"),
    ({"networks": []}, "spec.networks", "is required"),
    ({"networks": ["blue"]}, "spec.networks[0]", "write a NAD as namespace/name"),
    (
        {"ingress": [{"action": "Reject", "from": [{"namespaces": {}}]}]},
        "spec.ingress[0].action",
        "must be one of Allow, Deny, Pass",
    ),
    ({"ingress": [{"action": "Deny"}]}, "spec.ingress[0].from", "at least one peer"),
    (
        {"ingress": [{"action": "Deny", "from": [{"namespaces": {}, "networks": []}]}]},
        "spec.ingress[0].from[0]",
        "exactly one of namespaces, pods, networks",
    ),
    (
        {"egress": [{"action": "Deny", "to": [{"networks": ["x"]}]}]},
        "spec.egress[0].to[0].networks[0]",
        "needs a prefix length",
    ),
    (
        {
            "egress": [
                {
                    "action": "Deny",
                    "to": [{"namespaces": {}}],
                    "ports": [{"portRange": {"start": 9, "end": 8}}],
                }
            ]
        },
        "spec.egress[0].ports[0].portRange.end",
        "8 is below start 9",
    ),
    (
        {"egress": [{"action": "Deny", "to": [{"namespaces": {}}], "ports": [{"port": 8}]}]},
        "spec.egress[0].ports[0].port",
        "allowed: portNumber, portRange, namedPort",
    ),
    (
        {"ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}] * 101},
        "spec.ingress",
        "at most 100",
    ),
]


@pytest.mark.parametrize(("change", "path", "fragment"), ADMIN_BAD)
def test_admin_errors_at_their_paths(change: dict[str, Any], path: str, fragment: str) -> None:
    policy, issues = decode_admin_policy(anp({**ADMIN_OK, **change}))
    assert policy is None
    assert any(str(i.path) == path and fragment in i.message for i in issues.errors), errors(issues)


def test_admin_policy_is_cluster_scoped() -> None:
    doc = anp(ADMIN_OK)
    doc["metadata"]["namespace"] = "x"
    _, issues = decode_admin_policy(doc)
    assert [str(i.path) for i in issues.errors] == ["metadata.namespace"]


def test_admin_order_is_priority_then_name() -> None:
    docs = [anp({**ADMIN_OK, "priority": p}, name=n) for p, n in ((5, "b"), (1, "z"), (5, "a"))]
    policies = [decode_admin_policy(d)[0] for d in docs]
    assert [p.name for p in ordered_admin(p for p in policies if p)] == ["z", "a", "b"]


# ------------------------------------------------------------------ tenancy


def _policy(policy_for: str):  # type: ignore[no-untyped-def]
    policy, issues = decode_policy(mnp({"podSelector": {}}, policy_for=policy_for))
    assert policy is not None, errors(issues)
    return policy


def test_a_tenant_writes_for_its_namespace_and_what_its_pods_may_use() -> None:
    allowed = {"cninetwork:shared", "other/open"}

    def access(namespace: str, target: Target) -> str | None:
        return None if target.key in allowed else "not in its namespaces"

    ok = _policy("blue, tenant-a/red, claim:tenant-a/x, cninetwork:shared, other/open")
    assert not tenancy_problems(ok, access).items
    bad = _policy("claim:other/x, cninetwork:private, deviceclass:gold, other/closed")
    found = errors(tenancy_problems(bad, access))
    assert len(found) == 4
    assert "a claim-defined network is its namespace's alone" in found[0]
    assert "cninetwork:private: pods of tenant-a may not use it" in found[1]
    offline = tenancy_problems(_policy("cninetwork:shared"), None)
    assert not offline.errors and len(offline.warnings) == 1


# ------------------------------------------------------------------ properties

LABEL = st.from_regex(r"\A[a-z]([a-z0-9-]{0,8}[a-z0-9])?\Z")
SELECTOR = st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": st.dictionaries(LABEL, LABEL, max_size=3),
        "matchExpressions": st.lists(
            st.one_of(
                st.fixed_dictionaries(
                    {
                        "key": LABEL,
                        "operator": st.sampled_from(["In", "NotIn"]),
                        "values": st.lists(LABEL, min_size=1, max_size=3),
                    }
                ),
                st.fixed_dictionaries(
                    {"key": LABEL, "operator": st.sampled_from(["Exists", "DoesNotExist"])}
                ),
            ),
            max_size=3,
        ),
    },
)


@st.composite
def ip_blocks(draw: st.DrawFn) -> dict[str, Any]:
    prefix = draw(st.integers(15, 28))
    base = ipaddress.ip_network("198.18.0.0/15")
    cidr = draw(st.sampled_from(list(base.subnets(new_prefix=prefix))[:64]))
    holes = draw(
        st.lists(st.integers(prefix + 1, 32), max_size=3).map(
            lambda lens: [next(cidr.subnets(new_prefix=n)) for n in lens]
        )
    )
    return {"cidr": str(cidr), **({"except": [str(h) for h in holes]} if holes else {})}


PEER = st.one_of(
    st.fixed_dictionaries({"podSelector": SELECTOR}),
    st.fixed_dictionaries({"namespaceSelector": SELECTOR}),
    st.fixed_dictionaries({"podSelector": SELECTOR, "namespaceSelector": SELECTOR}),
    st.fixed_dictionaries({"ipBlock": ip_blocks()}),
)
PORT = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "protocol": st.sampled_from(["TCP", "UDP", "SCTP"]),
            "port": st.integers(1, 65535),
        },
    ),
    st.integers(1, 60000).flatmap(
        lambda p: st.fixed_dictionaries({"port": st.just(p), "endPort": st.integers(p, 65535)})
    ),
    st.fixed_dictionaries({"port": st.from_regex(r"\A[a-z]{1,15}\Z")}),
)


def rules(peers_key: str) -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(
        st.fixed_dictionaries(
            {},
            optional={peers_key: st.lists(PEER, max_size=3), "ports": st.lists(PORT, max_size=3)},
        ),
        max_size=3,
    )


SPEC = st.fixed_dictionaries(
    {"podSelector": SELECTOR},
    optional={
        "ingress": rules("from"),
        "egress": rules("to"),
        "policyTypes": st.sampled_from([["Ingress"], ["Egress"], ["Ingress", "Egress"]]),
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPEC)
def test_every_valid_policy_decodes_as_written(spec: dict[str, Any]) -> None:
    policy, issues = decode_policy(mnp(spec))
    assert policy is not None, errors(issues)
    assert len(policy.ingress) == len(spec.get("ingress", []))
    assert len(policy.egress) == len(spec.get("egress", []))
    for rule, raw in zip(policy.ingress, spec.get("ingress", []), strict=True):
        assert len(rule.peers) == len(raw.get("from", []))
        assert len(rule.ports) == len(raw.get("ports", []))
        for port, raw_port in zip(rule.ports, raw.get("ports", []), strict=True):
            assert port.protocol == raw_port.get("protocol", "TCP")
            assert port.port == raw_port.get("port")
    if "policyTypes" in spec:
        assert policy.policy_types == set(spec["policyTypes"])
    else:
        assert "Ingress" in policy.policy_types
        assert ("Egress" in policy.policy_types) == bool(spec.get("egress"))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3)
    ),
    max_leaves=12,
)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPEC, st.data(), JSON)
def test_junk_anywhere_never_raises_and_is_reported_at_or_above_it(
    spec: dict[str, Any], data: st.DataObject, junk: Any
) -> None:
    doc = mnp(spec)
    paths = [p for p in _paths(doc["spec"]) if p]
    if not paths:
        return
    where = data.draw(st.sampled_from(paths))
    broken = copy.deepcopy(doc)
    holder = broken["spec"]
    for seg in where[:-1]:
        holder = holder[seg]
    holder[where[-1]] = junk
    policy, issues = decode_policy(broken)  # never raises
    if policy is None:
        assert issues.errors
        # an error lies on the path to the junk (a parent that now reads wrong) or under it;
        # a null is an absent field, whose error may be on a sibling that needs it (endPort
        # without port)
        full = ("spec", *where) if junk is not None else ("spec", *where[:-1])
        assert any(
            tuple(i.path.segments)[: len(full)] == full[: len(i.path.segments)]
            for i in issues.errors
        ), (where, errors(issues))


@settings(max_examples=200, deadline=None)
@given(ip_blocks(), st.integers(0, 2**17 - 1))
def test_ip_block_is_its_cidr_without_its_exceptions(raw: dict[str, Any], offset: int) -> None:
    issues = Issues()
    block = decode_ip_block(raw, ROOT, issues)
    assert block is not None, errors(issues)
    address = ipaddress.ip_address(int(ipaddress.ip_address("198.18.0.0")) + offset)
    inside = address in block.cidr and not any(address in e for e in block.excepts)
    assert inside == any(address in n for n in block.networks())
    parts = block.networks()
    assert all(not a.overlaps(b) for i, a in enumerate(parts) for b in parts[i + 1 :])


@settings(max_examples=100, deadline=None)
@given(SELECTOR, st.dictionaries(LABEL, LABEL, max_size=4))
def test_selector_matches_as_kubernetes(raw: dict[str, Any], labels: dict[str, str]) -> None:
    issues = Issues()
    sel = decode_selector(raw, ROOT, issues)
    assert isinstance(sel, Selector)
    expected = all(labels.get(k) == v for k, v in raw.get("matchLabels", {}).items())
    for req in raw.get("matchExpressions", []):
        value = labels.get(req["key"])
        expected &= {
            "In": value in req.get("values", []),
            "NotIn": value not in req.get("values", []),
            "Exists": value is not None,
            "DoesNotExist": value is None,
        }[req["operator"]]
    assert sel.matches(labels) == expected


def test_target_kinds_never_meet() -> None:
    issues = Issues()
    targets = decode_targets("a/x, cninetwork:x, deviceclass:x, claim:a/x", "a", ROOT, issues)
    assert len({t.key for t in targets}) == 4
    assert [t.kind for t in targets] == [
        TargetKind.NAD,
        TargetKind.CNINETWORK,
        TargetKind.DEVICECLASS,
        TargetKind.CLAIM,
    ]


ROOT_DIR = Path(__file__).parents[2]


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (crd, "multi-networkpolicies.k8s.cni.cncf.io"),
        (admin_crd, "cniadminnetworkpolicies.cni.networking.x-k8s.io"),
    ],
)
def test_the_chart_crds_are_the_ones_the_code_defines(make: Any, name: str) -> None:
    path = ROOT_DIR / "charts" / "cnidra" / "crds" / f"{name}.yaml"
    assert yaml.safe_load(path.read_text()) == make()
    assert path.read_text() in (ROOT_DIR / "deploy" / "crds.yaml").read_text()
    version = make()["spec"]["versions"][0]
    columns = {c["name"] for c in version["additionalPrinterColumns"]}
    assert "Networks" in columns and "Age" in columns
    # the drivers' reports (cnidra.status.netpolicy): a status subresource, one entry a node
    assert "Not-Enforced-On" in columns and version["subresources"] == {"status": {}}
    nodes = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["nodes"]
    assert nodes["x-kubernetes-list-type"] == "map"
    assert nodes["x-kubernetes-list-map-keys"] == ["node"]


def test_validate_judges_policy_documents() -> None:
    good = mnp({"podSelector": {}}, policy_for="blue, cninetwork:data")
    bad = mnp({"podSelector": {}, "ingress": [{"ports": [{"port": 0}]}]})
    admin_bad = anp({**ADMIN_OK, "priority": -1})
    reports = validate_documents([good, bad, anp(ADMIN_OK), admin_bad])
    assert [r.kind for r in reports] == [
        "MultiNetworkPolicy",
        "MultiNetworkPolicy",
        "CNIAdminNetworkPolicy",
        "CNIAdminNetworkPolicy",
    ]
    assert not reports[0].issues.errors and not reports[2].issues.items
    # the tenancy rule: a CNINetwork the input does not hold is not judged, and says so
    [unjudged] = reports[0].issues.warnings
    assert unjudged.message.startswith("cninetwork:data: whether tenant-a may use it")
    assert [str(i.path) for i in reports[1].issues.errors] == ["spec.ingress[0].ports[0].port"]
    assert [str(i.path) for i in reports[3].issues.errors] == ["spec.priority"]


def test_an_interface_is_on_the_network_its_reference_names() -> None:
    base = {"claim_namespace": "tenant-a", "config_name": "blue"}
    assert interface_target(**base, attachment_definition=("other", "red")).key == "other/red"
    assert interface_target(**base, cninetwork="data-a").key == "cninetwork:data-a"
    assert interface_target(**base, device_class="gold").key == "deviceclass:gold"
    assert interface_target(**base, device_class="gold", claim_defined=True).key == (
        "claim:tenant-a/blue"
    )
    assert interface_target(**base).key == "claim:tenant-a/blue"


def test_catalog_access_is_what_the_cluster_lets_the_namespace_use() -> None:
    shared = NamedNetwork("CNINetwork shared", {}, ROOT, True, namespaces=("tenant-a",))
    labelled = NamedNetwork(
        "CNINetwork lab", {}, ROOT, True, namespace_selector=LabelSelector(matchLabels={"t": "x"})
    )
    gold = CNIPolicy.model_validate({"namespaces": ["tenant-b"]})
    access = CatalogAccess(
        {"shared": shared, "lab": labelled},
        {"gold": gold, "open": None},
        {"tenant-a": {"t": "x"}},
        {"tenant-a": frozenset({"other/used"})},
    )
    policy = _policy(
        "cninetwork:shared, cninetwork:lab, deviceclass:open, other/used, "
        "cninetwork:nope, deviceclass:gold, other/unused, deviceclass:nope"
    )
    found = errors(tenancy_problems(policy, access))
    assert len(found) == 4, found
    assert "there is no CNINetwork nope" in found[0]
    assert "CNIPolicy does not cover namespace tenant-a" in found[1]
    assert "no claim of tenant-a uses" in found[2]
    assert "there is no DeviceClass nope" in found[3]
