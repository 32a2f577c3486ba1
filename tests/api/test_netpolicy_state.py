"""The node's policy tables kept current by events (cnidra.api.netpolicy_state): after any run of
pod, policy and namespace events the tables are exactly what compiling every local pod from
scratch gives, the keys each event returns are the tables that changed, and an address change
compiles nothing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra.api.netpolicy import (
    AdminNetworkPolicy,
    MultiNetworkPolicy,
    decode_admin_policy,
    decode_policy,
)
from cnidra.api.netpolicy_rules import NamedPort, PodInterface, PodOnNetwork, compile_pod
from cnidra.api.netpolicy_state import NetworkTables, PodKey

NET = "n0/blue"
NAMES = [f"p{i}" for i in range(6)]
LOCAL = {("n0", "p0"): "net1", ("n1", "p1"): "net1", ("n0", "p2"): "net2"}


def namespace_of(name: str) -> str:
    return f"n{int(name[1:]) % 2}"


@st.composite
def pods(draw: st.DrawFn) -> PodOnNetwork:
    name = draw(st.sampled_from(NAMES))
    i = int(name[1:]) + 1
    epoch = draw(st.integers(0, 3))
    addresses = [f"198.18.{epoch}.{i}"] + (
        [f"2001:db8::{epoch}:{i}"] if draw(st.booleans()) else []
    )
    port = draw(st.sampled_from([None, 8080, 9090]))
    return PodOnNetwork(
        namespace_of(name),
        name,
        {"app": draw(st.sampled_from("abc"))},
        tuple(addresses),
        (NamedPort("http", "TCP", port),) if port else (),
    )


SELECTOR = st.sampled_from([{}, {"matchLabels": {"app": "a"}}, {"matchLabels": {"app": "b"}}])
TEAM = st.sampled_from([{}, {"matchLabels": {"team": "x"}}])
PEER = st.one_of(
    st.fixed_dictionaries({"podSelector": SELECTOR}),
    st.fixed_dictionaries({"namespaceSelector": TEAM}),
    st.fixed_dictionaries({"namespaceSelector": TEAM, "podSelector": SELECTOR}),
    st.just({"ipBlock": {"cidr": "198.18.0.0/23", "except": ["198.18.1.0/24"]}}),
)
PORTS = st.sampled_from([[], [{"port": "http"}], [{"port": 80}, {"port": "http"}]])
RULE = st.fixed_dictionaries({"ports": PORTS}, optional={"peers": st.lists(PEER, max_size=2)})


def _rule(raw: dict[str, Any], key: str) -> dict[str, Any]:
    out: dict[str, Any] = {"ports": raw["ports"]}
    if "peers" in raw:
        out[key] = raw["peers"]
    return out


@st.composite
def tenants(draw: st.DrawFn) -> MultiNetworkPolicy:
    name = draw(st.sampled_from(["t1", "t2", "t3"]))
    spec = {
        "podSelector": draw(SELECTOR),
        "ingress": [_rule(r, "from") for r in draw(st.lists(RULE, max_size=2))],
        "egress": [_rule(r, "to") for r in draw(st.lists(RULE, max_size=2))],
        "policyTypes": ["Ingress", "Egress"],
    }
    policy, issues = decode_policy(
        {
            "apiVersion": "k8s.cni.cncf.io/v1beta1",
            "kind": "MultiNetworkPolicy",
            "metadata": {
                "name": name,
                "namespace": draw(st.sampled_from(["n0", "n1"])),
                "annotations": {
                    "k8s.v1.cni.cncf.io/policy-for": draw(st.sampled_from([NET, "n0/red"]))
                },
            },
            "spec": spec,
        }
    )
    assert policy is not None, issues.items
    return policy


@st.composite
def admins(draw: st.DrawFn) -> AdminNetworkPolicy:
    peer = draw(
        st.one_of(
            st.fixed_dictionaries({"namespaces": TEAM}),
            st.fixed_dictionaries(
                {
                    "pods": st.fixed_dictionaries(
                        {"namespaceSelector": TEAM, "podSelector": SELECTOR}
                    )
                }
            ),
            st.just({"networks": ["198.18.2.0/24"]}),
        )
    )
    rule = {"action": draw(st.sampled_from(["Allow", "Deny", "Pass"])), "from": [peer]}
    policy, issues = decode_admin_policy(
        {
            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
            "kind": "CNIAdminNetworkPolicy",
            "metadata": {"name": draw(st.sampled_from(["a1", "a2"]))},
            "spec": {
                "priority": draw(st.integers(0, 3)),
                "subject": {"namespaces": draw(TEAM)},
                "networks": [NET],
                "ingress": [rule],
                "egress": [{**{k: v for k, v in rule.items() if k != "from"}, "to": [peer]}],
            },
        }
    )
    assert policy is not None, issues.items
    return policy


EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("pod"), pods()),
        st.tuples(st.just("gone"), st.sampled_from(NAMES)),
        st.tuples(st.just("relabel"), st.sampled_from(NAMES), st.sampled_from("abc")),
        st.tuples(st.just("policy"), st.one_of(tenants(), admins())),
        st.tuples(st.just("unpolicy"), st.sampled_from(["n0/t1", "n1/t2", "admin/a1", "n0/t3"])),
        st.tuples(st.just("labels"), st.sampled_from(["n0", "n1"]), TEAM),
    ),
    max_size=14,
)


def scratch(state: NetworkTables) -> dict[PodKey, Any]:
    view = state.view()
    return {
        key: compile_pod(
            state.pods[key],
            [PodInterface(ifname, view)],
            list(state.tenant.values()),
            list(state.admin.values()),
        )
        for key, ifname in state.local.items()
        if key in state.pods
    }


@settings(max_examples=400, deadline=None)
@given(st.lists(pods(), max_size=6), EVENTS)
def test_the_tables_are_always_what_compiling_from_scratch_gives(
    start: list[PodOnNetwork], events: list[tuple[Any, ...]]
) -> None:
    state = NetworkTables(NET, LOCAL, start, {"n0": {"team": "x"}, "n1": {}})
    assert state.tables == scratch(state)
    for event in events:
        before = dict(state.tables)
        kind = event[0]
        if kind == "pod":
            changed = state.set_pod(event[1])
        elif kind == "relabel":  # its labels alone
            key = (namespace_of(event[1]), event[1])
            pod = state.pods.get(key)
            changed = (
                set() if pod is None else state.set_pod(replace(pod, labels={"app": event[2]}))
            )
        elif kind == "gone":
            name = event[1]
            changed = state.remove_pod((namespace_of(name), name))
        elif kind == "policy":
            changed = state.set_policy(event[1])
        elif kind == "unpolicy":
            changed = state.remove_policy(event[1])
        else:
            changed = state.set_namespace_labels(event[1], event[2].get("matchLabels", {}))
        assert state.tables == scratch(state), event
        differ = {k for k in state.tables if before.get(k) != state.tables[k]}
        assert changed == differ, event


def test_an_address_change_compiles_nothing() -> None:
    web = PodOnNetwork("n0", "p1", {"app": "b"}, ("198.18.0.2",), (NamedPort("http", "TCP", 80),))
    db = PodOnNetwork("n0", "p0", {"app": "a"}, ("198.18.0.1",))
    policy, _ = decode_policy(
        {
            "apiVersion": "k8s.cni.cncf.io/v1beta1",
            "kind": "MultiNetworkPolicy",
            "metadata": {
                "name": "t",
                "namespace": "n0",
                "annotations": {"k8s.v1.cni.cncf.io/policy-for": NET},
            },
            "spec": {
                "podSelector": {"matchLabels": {"app": "a"}},
                "ingress": [{"from": [{"podSelector": {}}]}],
                "egress": [{"to": [{"podSelector": {}}], "ports": [{"port": "http"}]}],
            },
        }
    )
    assert policy is not None
    state = NetworkTables(NET, {("n0", "p0"): "net1"}, [db, web], {}, [policy])
    compiles = state.compiles
    before = state.tables[("n0", "p0")]
    moved = PodOnNetwork("n0", "p1", {"app": "b"}, ("198.18.0.9",), web.ports)
    assert state.set_pod(moved) == {("n0", "p0")}
    assert state.compiles == compiles
    script = state.tables[("n0", "p0")].update_from(before)
    assert "198.18.0.9 . tcp . 80" in script and "delete element" in script
    assert state.tables == scratch(state)
