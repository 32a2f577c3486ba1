"""The node's policy over several networks (cnidra.api.netpolicy_node): pods read from their
network-status annotation, one table per pod and network, events returning what changed, the
watch lagging the attach, and whole-set replaces."""

from __future__ import annotations

import json
from typing import Any

from cnidra.api.netpolicy import decode_policy
from cnidra.api.netpolicy_node import (
    POLICY_NETWORK_KEY,
    NodePolicy,
    PodFacts,
    named_ports,
    pod_facts,
    table_name,
)

BLUE, RED = "ns/blue", "claim:ns/red"


def obj(name: str, networks: dict[str, str], labels: dict[str, str], phase: str = "Running") -> Any:
    status = [
        {"name": n, "interface": f"net{i}", "ips": [ip], POLICY_NETWORK_KEY: n}
        for i, (n, ip) in enumerate(networks.items())
    ] + [{"name": "multus-net", "interface": "net9", "ips": ["10.0.0.1"]}]
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "labels": labels,
            "annotations": {"k8s.v1.cni.cncf.io/network-status": json.dumps(status)},
        },
        "spec": {
            "containers": [
                {"ports": [{"name": "http", "containerPort": 80}, {"containerPort": 81}]}
            ]
        },
        "status": {"phase": phase},
    }


def policy(name: str, network: str, spec: dict[str, Any]) -> Any:
    found, issues = decode_policy(
        {
            "apiVersion": "k8s.cni.cncf.io/v1beta1",
            "kind": "MultiNetworkPolicy",
            "metadata": {
                "name": name,
                "namespace": "ns",
                "annotations": {"k8s.v1.cni.cncf.io/policy-for": network},
            },
            "spec": spec,
        }
    )
    assert found is not None, issues.items
    return found


def test_a_pod_is_read_from_its_network_status() -> None:
    facts = pod_facts(obj("a", {BLUE: "198.18.0.1", RED: "198.18.1.1"}, {"app": "db"}))
    assert facts is not None
    assert facts.networks == {BLUE: ("198.18.0.1",), RED: ("198.18.1.1",)}  # not multus-net
    assert [p.name for p in facts.ports] == ["http"]
    assert pod_facts(obj("a", {BLUE: "198.18.0.1"}, {}, phase="Succeeded")) is None
    assert pod_facts(obj("a", {}, {})) is None  # no interface of cnidra's
    broken = obj("a", {BLUE: "198.18.0.1"}, {})
    broken["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"] = "{"
    assert pod_facts(broken) is None
    assert named_ports({"containers": [{"ports": [{"name": "x", "containerPort": True}]}]}) == ()


def test_one_table_per_pod_and_network_and_events_say_which_changed() -> None:
    node = NodePolicy()
    a = PodFacts("ns", "a", {"app": "db"}, (), {BLUE: (), RED: ()})
    assert node.set_local(a, BLUE, "net1") == {(("ns", "a"), BLUE)}
    assert node.set_local(a, RED, "net2") == {(("ns", "a"), RED)}
    blue, red = node.ruleset(("ns", "a"), BLUE), node.ruleset(("ns", "a"), RED)
    assert blue is not None and red is not None
    assert (blue.table, red.table) == (
        table_name(BLUE),
        table_name(RED),
    ) and blue.table != red.table
    deny = policy("deny", BLUE, {"podSelector": {}})
    assert node.set_policy(deny) == {(("ns", "a"), BLUE)}  # red is not its network
    assert node.applying(("ns", "a"), BLUE) == ["ns/deny"] and node.policed(RED) == []
    # a peer on blue: a's blue table lists it only once a rule names it
    web = {
        "podSelector": {},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}],
    }
    node.set_policy(policy("deny", BLUE, web))
    peer = pod_facts(obj("b", {BLUE: "198.18.0.2"}, {"app": "web"}))
    assert peer is not None
    assert node.set_pod(peer) == {(("ns", "a"), BLUE)}
    blue = node.ruleset(("ns", "a"), BLUE)
    assert blue is not None and any("198.18.0.2" in s.elements for s in blue.sets)
    assert node.set_pod(peer) == set()  # nothing new
    assert node.remove_pod(("ns", "b")) == {(("ns", "a"), BLUE)}
    assert node.remove_policy("ns/deny") == {(("ns", "a"), BLUE)}
    assert node.remove_policy("ns/deny") == set()


def test_the_watch_lagging_the_attach_keeps_the_local_address() -> None:
    node = NodePolicy()
    node.set_local(PodFacts("ns", "a", {"app": "db"}, (), {BLUE: ("198.18.0.1",)}), BLUE, "net1")
    late = pod_facts(obj("a", {RED: "198.18.1.1"}, {"app": "db", "v": "2"}))  # no blue yet
    assert late is not None
    node.set_pod(late)
    assert node.pods[("ns", "a")].networks[BLUE] == ("198.18.0.1",)
    assert node.pods[("ns", "a")].labels == {"app": "db", "v": "2"}
    # a replace that lists no local pod keeps it: its sandbox record decides
    node.replace_pods([])
    assert ("ns", "a") in node.pods
    node.remove_local(("ns", "a"))
    assert node.networks == {} and node.local == {}


def test_replaces_remove_what_the_list_lacks() -> None:
    node = NodePolicy()
    node.set_local(PodFacts("ns", "a", {}, (), {BLUE: ()}), BLUE, "net1")
    node.replace_policies([policy("deny", BLUE, {"podSelector": {}})], admin=False)
    assert node.applying(("ns", "a"), BLUE) == ["ns/deny"]
    assert node.replace_policies([], admin=False) == {(("ns", "a"), BLUE)}
    node.replace_namespaces({"ns": {"team": "a"}})
    assert node.namespace_labels == {"ns": {"team": "a"}}
    node.replace_namespaces({})
    assert node.namespace_labels == {}
