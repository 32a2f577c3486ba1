"""Issue 43 requirement 2 in the driver: a tenant's MultiNetworkPolicy whose `policy-for` names
a network its namespace may not use (another namespace's NAD or claim network, a CNINetwork or
DeviceClass whose namespace rules leave it out) is not applied, judged by the one rule `cnidra
validate` uses against what the driver follows (CNINetworks, DeviceClasses, namespaces' labels,
the NADs each namespace's pods are on), again whenever any of those changes; the policy gets a
Warning Event and this node's status entry saying why (reason NotApplied), as does a policy
that does not decode."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cnidra.api import netpolicy as model
from cnidra.api.netpolicy_node import POLICY_NETWORK_KEY
from cnidra.kube import netpolicy as watches
from cnidra.kube.api import Api
from cnidra.kube.deviceclasses import Feeds
from cnidra.kube.events import Involved
from cnidra.nri.netpolicy import PolicyEnforcer, cninetwork_rules
from cnidra.status.netpolicy import (
    EVENT_NOT_APPLIED,
    NOT_APPLIED,
    REASON_NOT_APPLIED,
    PolicyRef,
)
from tests.nri.test_netpolicy_hook import FakeClient, FakeNft, Recorder, mnp, sync
from tests.nri.test_netpolicy_reports import Reports
from tests.status.test_policy_status import Patches, on_status_queue, settled

BLUE = PolicyRef("MultiNetworkPolicy", "p", "ns")


def cninetwork(name: str, **rules: Any) -> dict[str, Any]:
    config = {"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "macvlan"}]}
    return {"metadata": {"name": name}, "spec": {"config": config, **rules}}


def device_class(name: str, **rules: Any) -> dict[str, Any]:
    policy = {"apiVersion": "cni.networking.x-k8s.io/v1alpha1", "kind": "CNIPolicy", **rules}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "config": [{"opaque": {"driver": "cni.dra.networking.x-k8s.io", "parameters": policy}}]
        },
    }


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def on_network(name: str, ns: str, network: str, ip: str = "198.18.0.9") -> dict[str, Any]:
    status = [{"name": network, "interface": "net1", "ips": [ip], POLICY_NETWORK_KEY: network}]
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "annotations": {"k8s.v1.cni.cncf.io/network-status": json.dumps(status)},
        },
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def enforcer(tmp_path: Path) -> tuple[PolicyEnforcer, Reports]:
    from tests.nri.fakes import Node

    reports = Reports()
    found = PolicyEnforcer(
        Node.start(tmp_path).store, datapath=FakeNft(), settle=0.0, reports=reports, node_name="n1"
    )
    return found, reports


def test_a_cninetwork_the_namespace_may_not_use_is_refused_until_its_rules_admit_it(
    tmp_path: Path,
) -> None:
    policy = mnp("p", {"podSelector": {}}, "cninetwork:data")
    found, reports = enforcer(tmp_path)
    sync(
        found,
        MultiNetworkPolicy=[policy],
        Namespace=[namespace("ns", tier="tenant")],
        CNINetwork=[cninetwork("data", namespaces=["other"])],
    )
    assert found.node.tenant == {}
    assert "may be used from namespaces other, not ns" in found.refused[BLUE]
    found.report_problems()
    [(ref, problems)] = reports.seen
    assert ref == BLUE and problems[0].startswith(NOT_APPLIED + "cninetwork:data: pods of ns")
    # its rules now select the namespace by label: applied, and the entry cleared
    found.changed(
        "CNINetwork",
        "MODIFIED",
        cninetwork("data", namespaceSelector={"matchLabels": {"tier": "tenant"}}),
    )
    assert list(found.node.tenant) == ["ns/p"] and found.refused == {}
    found.report_problems()
    assert reports.seen[-1] == (BLUE, ())
    # the namespace relabelled out of it: refused again; the CNINetwork gone: still refused
    found.changed("Namespace", "MODIFIED", namespace("ns", tier="other"))
    assert found.node.tenant == {} and "namespaceSelector does not select ns" in found.refused[BLUE]
    found.changed("CNINetwork", "DELETED", cninetwork("data"))
    assert "there is no CNINetwork data" in found.refused[BLUE]


def test_a_cninetwork_named_by_networkid_is_judged_by_its_rules_alone() -> None:
    spec = {"networkID": "fast", "type": "sriov", "namespaces": ["ns"]}
    rules = cninetwork_rules({"metadata": {"name": "fast"}, "spec": spec})
    assert rules.admits("ns", {}) is None and rules.admits("x", {}) is not None
    broken = cninetwork_rules({"metadata": {"name": "b"}, "spec": {"config": 3}})
    assert broken.admits("ns", {}) is not None  # no namespace may name a broken network


def test_a_deviceclass_whose_cnipolicy_leaves_the_namespace_out_is_refused(
    tmp_path: Path,
) -> None:
    found, _ = enforcer(tmp_path)
    feeds = Feeds(found)  # the driver's one DeviceClass watch feeds the enforcer too
    sync(
        found,
        MultiNetworkPolicy=[
            mnp("p", {"podSelector": {}}, "deviceclass:fast"),
            mnp("q", {"podSelector": {}}, "deviceclass:open"),
        ],
        DeviceClass=[device_class("fast", namespaces=["other"]), device_class("open")],
    )
    assert list(found.node.tenant) == ["ns/q"]
    assert "DeviceClass fast's CNIPolicy does not cover namespace ns" in found.refused[BLUE]
    feeds.class_changed("MODIFIED", device_class("fast", namespaces=["other", "ns"]))
    assert sorted(found.node.tenant) == ["ns/p", "ns/q"]
    feeds.replace_classes([])  # no class of cnidra's any more: both refused
    assert found.node.tenant == {} and len(found.refused) == 2


def test_another_namespaces_nad_is_the_tenants_once_a_pod_of_its_namespace_is_on_it(
    tmp_path: Path,
) -> None:
    found, _ = enforcer(tmp_path)
    sync(
        found,
        MultiNetworkPolicy=[
            mnp("p", {"podSelector": {}}, "shared/blue"),
            mnp("own", {"podSelector": {}}, "blue, claim:ns/x"),
            mnp("theirs", {"podSelector": {}}, "claim:other/x"),
        ],
        Pod=[on_network("elsewhere", "other", "shared/blue")],
    )
    assert list(found.node.tenant) == ["ns/own"]  # its own NAD and claim network: always
    assert "no claim of ns uses" in found.refused[BLUE]
    assert (
        "claim-defined network is its namespace's alone"
        in found.refused[PolicyRef("MultiNetworkPolicy", "theirs", "ns")]
    )
    found.changed("Pod", "ADDED", on_network("mine", "ns", "shared/blue"))
    assert sorted(found.node.tenant) == ["ns/own", "ns/p"]
    found.changed("Pod", "DELETED", on_network("mine", "ns", "shared/blue"))
    assert "ns/p" not in found.node.tenant


def test_a_policy_that_does_not_decode_is_reported_not_applied(tmp_path: Path) -> None:
    found, reports = enforcer(tmp_path)
    broken = mnp("p", {"podSelector": {}, "ingress": "everything"})
    admin = {"metadata": {"name": "x"}, "spec": {"priority": -1}}
    sync(found, MultiNetworkPolicy=[broken], CNIAdminNetworkPolicy=[admin])
    found.report_problems()
    assert {ref for ref, _ in reports.seen} == {BLUE, PolicyRef("CNIAdminNetworkPolicy", "x")}
    assert all(p[0].startswith(NOT_APPLIED) for _, p in reports.seen)
    found.changed("MultiNetworkPolicy", "DELETED", broken)  # gone: nothing to write on
    reports.seen.clear()
    found.report_problems()
    assert reports.seen == []


async def test_the_refusal_is_written_as_this_nodes_entry_and_a_warning_event(
    tmp_path: Path,
) -> None:
    client = Patches()
    events: list[tuple[Involved, str, str]] = []
    writer, status = on_status_queue(
        Api(client), "n1", lambda about, reason, msg, *_: events.append((about, reason, msg))
    )
    found, _ = enforcer(tmp_path)
    found.reports = writer
    sync(found, MultiNetworkPolicy=[mnp("p", {"podSelector": {}}, "cninetwork:nope")])
    found.report_problems()
    task = asyncio.create_task(status.run())
    try:
        await settled(lambda: len(client.patches) == 1)
    finally:
        task.cancel()
    [entry] = client.patches[0][1]["status"]["nodes"]
    [condition] = entry["conditions"]
    assert (condition["type"], condition["status"]) == ("Enforced", "False")
    assert condition["reason"] == REASON_NOT_APPLIED
    assert condition["message"].startswith("not applied: cninetwork:nope: pods of ns may not")
    [(about, reason, message)] = events
    assert (about.name, reason) == ("p", EVENT_NOT_APPLIED)
    assert "n1" not in message and "there is no CNINetwork nope" in message  # the cluster's Event


async def test_cninetworks_are_listed_then_watched_for_the_tenancy_rule() -> None:
    client = FakeClient([cninetwork("a")], [("ADDED", cninetwork("b"))])
    feed = Recorder()
    with pytest.raises(asyncio.CancelledError):
        await watches.follow(Api(client), "CNINetwork", feed)
    assert feed.seen == [("replace", "CNINetwork", "1"), ("ADDED", "CNINetwork", "b")]
    assert [a[2].get("namespace") for a in client.asked] == [None, None]  # cluster-scoped


NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)
TARGETS = st.one_of(
    NAMES,
    st.builds(lambda a, b: f"{a}/{b}", NAMES, NAMES),
    st.builds(lambda a: f"cninetwork:{a}", NAMES),
    st.builds(lambda a: f"deviceclass:{a}", NAMES),
    st.builds(lambda a, b: f"claim:{a}/{b}", NAMES, NAMES),
    st.text(max_size=12),
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    targets=st.lists(TARGETS, min_size=1, max_size=3),
    admitted=st.lists(NAMES, max_size=2),
    spec=st.one_of(JSONISH, st.fixed_dictionaries({"namespaces": st.lists(NAMES, max_size=2)})),
    class_rules=st.dictionaries(
        st.sampled_from(["namespaces", "namespaceSelector"]), JSONISH, max_size=2
    ),
)
def test_the_driver_applies_a_policy_exactly_when_validates_rule_admits_it(
    tmp_path: Path,
    targets: list[str],
    admitted: list[str],
    spec: Any,
    class_rules: dict[str, Any],
) -> None:
    """Whatever the cluster holds (CNINetworks and DeviceClasses parsed from anything), the
    driver never raises, and applies a tenant's policy if and only if the one judge,
    `tenancy_problems` with the cluster's access, finds no error in it."""
    found, _ = enforcer(tmp_path)
    name = "net"
    network = {"metadata": {"name": name}, "spec": spec}
    admitted_net = cninetwork("ok", namespaces=admitted)
    policy = mnp("p", {"podSelector": {}}, ", ".join(targets))
    sync(
        found,
        MultiNetworkPolicy=[policy],
        CNINetwork=[network, admitted_net],
        DeviceClass=[device_class("cls", **class_rules)],
        Namespace=[namespace("ns", a="b")],
    )
    decoded, _ = model.decode_policy(policy, default_namespace="ns")
    if decoded is None:
        assert found.node.tenant == {} and BLUE in found.refused
        return
    errors = model.tenancy_problems(decoded, found.access()).errors
    assert ("ns/p" in found.node.tenant) == (not errors)
    assert (BLUE in found.refused) == bool(errors)


async def test_a_pod_attached_to_another_namespaces_nad_brings_its_policy_in_at_attach(
    tmp_path: Path,
) -> None:
    """The first table of a pod on another namespace's NAD already holds its namespace's policy
    for it: the attach itself says the namespace is on the NAD (no window before the watch)."""
    from tests.nri.fakes import Node, network, pod, prepare
    from tests.nri.test_netpolicy_hook import rules

    datapath = FakeNft()
    found = PolicyEnforcer(Node.start(tmp_path / "first").store, datapath=datapath, settle=0.0)
    node = Node.start(tmp_path, policy=found)
    found.store = node.store
    shared = "shared/blue"
    prepare(
        node.checkpoint, "c", "a-uid", ("net1", network("blue", "macvlan")), policy_network=shared
    )
    sync(found, MultiNetworkPolicy=[mnp("p", {"podSelector": {}}, shared)])
    assert found.node.tenant == {} and BLUE in found.refused
    await node.hooks.run_pod_sandbox(pod("a"))
    assert list(found.node.tenant) == ["ns/p"] and found.refused == {}
    [table] = datapath.tables.values()
    assert "default-deny ingress (ns/p)" in rules(table), rules(table)
