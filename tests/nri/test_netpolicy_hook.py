"""Issue 43's wiring without a cluster or a kernel: the policy enforcer on the NRI hook path (a
table right after the ADD, from memory; a default deny until synced; a failure fails the pod
closed), fed by watch events (a fake Api), applying changes, resyncing after a restart,
flagging what it cannot enforce, and the drops read for the metrics."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.netpolicy_node import POLICY_NETWORK_KEY, PodFacts, table_name
from cnidra.api.netpolicy_rules import Ruleset
from cnidra.datapath import netpolicy as nft
from cnidra.datapath.netpolicy import RuleCounter
from cnidra.kube import netpolicy as watches
from cnidra.kube.api import Api
from cnidra.nri.lifecycle import AttachError
from cnidra.nri.netpolicy import (
    APPLY_CONCURRENCY,
    APPLY_RETRY,
    KINDS,
    REASON_NOT_ENFORCED,
    Local,
    PolicyEnforcer,
    read_drops,
)
from tests.nri.fakes import Node, network, pod, prepare

NET = "ns/blue"
NETNS = "/run/netns/a-sandbox"
TABLE = table_name(NET)


@dataclass
class FakeNft:
    """Tables by (netns, table), every call kept; `failing`: apply raises NftError."""

    tables: dict[tuple[str, str], Ruleset] = field(default_factory=dict)
    calls: list[tuple[str, str, Ruleset | None]] = field(default_factory=list)
    failing: bool = False
    counted: list[RuleCounter] = field(default_factory=list)

    def apply(
        self, netns: str, ruleset: Ruleset, previous: Ruleset | None = None, *, timeout: float
    ) -> str:
        self.calls.append(("apply", netns, previous))
        if self.failing:
            raise nft.NftError("nft: Error: Could not process rule")
        self.tables[(netns, ruleset.table)] = ruleset
        return "batch"

    def remove(self, netns: str, table: str = "", *, timeout: float) -> None:
        self.calls.append(("remove", netns, None))
        self.tables.pop((netns, table), None)

    def counters(self, netns: str, table: str, *, timeout: float) -> list[RuleCounter]:
        return self.counted

    def list_tables(self, netns: str, *, timeout: float) -> list[str]:
        return sorted(t for n, t in self.tables if n == netns)


def mnp(name: str, spec: Mapping[str, Any], network: str = NET) -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1beta1",
        "kind": "MultiNetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": network},
            "uid": "x",
            "resourceVersion": "1",
        },
        "spec": spec,
    }


def peer(name: str, ip: str, labels: Mapping[str, str], namespace: str = "ns") -> dict[str, Any]:
    status = [{"name": NET, "interface": "net1", "ips": [ip], POLICY_NETWORK_KEY: NET}]
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": {"k8s.v1.cni.cncf.io/network-status": json.dumps(status)},
        },
        "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 80}]}]},
        "status": {"phase": "Running"},
    }


def sync(enforcer: PolicyEnforcer, **objects: list[dict[str, Any]]) -> None:
    for kind in KINDS:
        enforcer.replace(kind, objects.get(kind, []))


def rules(ruleset: Ruleset) -> str:
    return "\n".join(r for c in ruleset.chains for r in c.rules)


def started(tmp_path: Path, datapath: FakeNft, plugin: str = "macvlan") -> tuple[Node, Any]:
    enforcer = PolicyEnforcer(
        Node.start(tmp_path).store, datapath=datapath, settle=0.0
    )  # the store is replaced below: one Node, one store
    node = Node.start(tmp_path, policy=enforcer)
    enforcer.store = node.store
    enforcer.events = node.status
    prepare(node.checkpoint, "c", "a-uid", ("net1", network("blue", plugin)), policy_network=NET)
    return node, enforcer


async def test_not_synced_the_interface_gets_a_default_deny(tmp_path: Path) -> None:
    datapath = FakeNft()
    node, enforcer = started(tmp_path, datapath)
    await node.hooks.run_pod_sandbox(pod("a"))
    table = datapath.tables[(NETNS, TABLE)]
    assert 'iifname "net1" jump if0_in' in rules(table)
    assert "default-deny egress (ns/cnidra-not-synced)" in rules(table)  # named as such
    assert "drop" in rules(table) and "default-deny ingress" in rules(table)
    # synced without a policy for the network: the table is written again, open
    sync(enforcer)
    await enforcer.apply_dirty()
    assert "default-deny" not in rules(datapath.tables[(NETNS, TABLE)])


async def test_synced_the_table_follows_policies_and_peers(tmp_path: Path) -> None:
    datapath = FakeNft()
    node, enforcer = started(tmp_path, datapath)
    allow_web = {
        "podSelector": {},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}],
    }
    sync(
        enforcer, MultiNetworkPolicy=[mnp("p", allow_web)], Namespace=[{"metadata": {"name": "ns"}}]
    )
    assert enforcer.synced
    await node.hooks.run_pod_sandbox(pod("a"))
    table = datapath.tables[(NETNS, TABLE)]
    assert "ns/p ingress[0]" in rules(table)
    assert not any(s.elements for s in table.sets)  # no web pod yet
    enforcer.changed("Pod", "ADDED", peer("w", "198.18.0.9", {"app": "web"}))
    await enforcer.apply_dirty()
    table = datapath.tables[(NETNS, TABLE)]
    assert any("198.18.0.9" in s.elements for s in table.sets)
    previous = datapath.calls[-1][2]
    assert previous is not None  # an update from what was applied: element changes only
    # the policy goes: the table opens again
    enforcer.changed("MultiNetworkPolicy", "DELETED", mnp("p", allow_web))
    await enforcer.apply_dirty()
    assert "ns/p" not in rules(datapath.tables[(NETNS, TABLE)])
    assert enforcer.describe(("ns", "a"))["net1"]["policies"] == []


async def test_changes_reach_the_kernel_within_a_second_through_the_task(tmp_path: Path) -> None:
    datapath = FakeNft()
    node, enforcer = started(tmp_path, datapath)
    sync(enforcer)
    await node.hooks.run_pod_sandbox(pod("a"))
    assert datapath.calls == []  # no policy governs it: no table to make
    task = asyncio.create_task(enforcer.run())
    try:
        enforcer.changed("MultiNetworkPolicy", "ADDED", mnp("deny", {"podSelector": {}}))
        for _ in range(3000):  # within 30 s: a bound for a hang, not for a slow machine
            table = datapath.tables.get((NETNS, TABLE))
            if table is not None and "default-deny" in rules(table):
                break
            await asyncio.sleep(0.01)
        assert "default-deny ingress (ns/deny)" in rules(datapath.tables[(NETNS, TABLE)])
        assert enforcer.describe(("ns", "a"))["net1"]["policies"] == ["ns/deny"]
    finally:
        task.cancel()


async def test_a_table_that_cannot_be_applied_fails_the_pod_closed(tmp_path: Path) -> None:
    datapath = FakeNft(failing=True)
    node, enforcer = started(tmp_path, datapath)
    sync(enforcer, MultiNetworkPolicy=[mnp("deny", {"podSelector": {}})])
    with pytest.raises(AttachError, match="network policy on net1 could not be applied"):
        await node.hooks.run_pod_sandbox(pod("a"))
    assert node.store.get("a-sandbox") is None  # rolled back
    assert [c.command for c in node.plugins.calls][-1] == "DEL"


async def test_no_policy_governing_a_new_interface_no_table_is_made_or_removed(
    tmp_path: Path,
) -> None:
    """Synced, and no policy for the pod's network: its table would accept everything, as no
    table does, so its ADD runs no nft; a policy that comes makes it."""
    datapath = FakeNft(failing=True)  # any nft run would fail the pod
    node, enforcer = started(tmp_path, datapath)
    sync(enforcer, MultiNetworkPolicy=[mnp("elsewhere", {"podSelector": {}}, network="ns/other")])
    await node.hooks.run_pod_sandbox(pod("a"))
    assert datapath.calls == [] and enforcer.unneeded == {(NETNS, TABLE)}
    await enforcer.apply_dirty()  # a pod's change or a peer's: still nothing to make
    assert datapath.calls == []
    await node.hooks.stop_pod_sandbox(pod("a"))
    assert datapath.calls == [] and enforcer.unneeded == set()
    # a second pod, then a policy for its network: the table is made, and removed at its DEL
    datapath.failing = False
    prepare(
        node.checkpoint, "c2", "b-uid", ("net1", network("blue", "macvlan")), policy_network=NET
    )
    await node.hooks.run_pod_sandbox(pod("b"))
    assert datapath.calls == []
    enforcer.changed("MultiNetworkPolicy", "ADDED", mnp("deny", {"podSelector": {}}))
    await enforcer.apply_dirty()
    b_netns = "/run/netns/b-sandbox"
    assert "default-deny ingress (ns/deny)" in rules(datapath.tables[(b_netns, TABLE)])
    assert enforcer.unneeded == set()
    calls = len(datapath.calls)
    await node.hooks.stop_pod_sandbox(pod("b"))  # the table goes with the namespace
    assert len(datapath.calls) == calls and enforcer.applied == {}


async def test_an_interface_policy_cannot_reach_is_flagged_not_failed(tmp_path: Path) -> None:
    datapath = FakeNft()
    node, enforcer = started(tmp_path, datapath, plugin="vhostuser")
    sync(enforcer, MultiNetworkPolicy=[mnp("deny", {"podSelector": {}})])
    await node.hooks.run_pod_sandbox(pod("a"))
    assert datapath.tables == {}
    [(_, _, message)] = [e for e in node.status.events if e[1] == REASON_NOT_ENFORCED]
    assert "vhost-user" in message
    described = enforcer.describe(("ns", "a"))["net1"]
    assert described["policies"] == ["ns/deny"] and "vhost-user" in described["notEnforced"]
    # a privileged container could delete the tables: flagged too
    privileged = peer("a", "198.18.0.2", {})
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    enforcer.local[("ns", "a")].unenforced.clear()
    enforcer.node.local[("ns", "a")] = {NET: "net1"}
    enforcer.changed("Pod", "MODIFIED", privileged)
    assert enforcer.describe(("ns", "a"))["undoableBy"] == ["c"]
    assert sum(1 for e in node.status.events if e[1] == REASON_NOT_ENFORCED) == 2


async def test_off_nothing_is_applied(tmp_path: Path) -> None:
    datapath = FakeNft()
    node, enforcer = started(tmp_path, datapath)
    enforcer.enabled = False
    await node.hooks.run_pod_sandbox(pod("a"))
    assert datapath.calls == []


async def test_a_restart_reads_the_records_and_rewrites_the_tables_in_place(
    tmp_path: Path,
) -> None:
    datapath = FakeNft()
    node, enforcer = started(tmp_path, datapath)
    sync(enforcer, MultiNetworkPolicy=[mnp("deny", {"podSelector": {}})])
    await node.hooks.run_pod_sandbox(pod("a"))
    again = PolicyEnforcer(node.store, datapath=datapath, settle=0.0)
    again.restore()
    assert again.node.local == {("ns", "a"): {NET: "net1"}}
    await again.apply_dirty()
    assert datapath.calls[-1][0] == "apply"  # nothing before the sync
    calls = len(datapath.calls)
    sync(again, MultiNetworkPolicy=[mnp("deny", {"podSelector": {}})])
    await again.apply_dirty()
    assert len(datapath.calls) == calls + 1
    assert datapath.calls[-1] == ("apply", NETNS, None)  # no record: read back, rewritten
    assert "ns/deny" in rules(datapath.tables[(NETNS, TABLE)])


async def test_an_unplug_removes_the_networks_table_and_a_gone_sandbox_is_forgotten(
    tmp_path: Path,
) -> None:
    datapath = FakeNft()
    node, enforcer = started(tmp_path, datapath)
    sync(enforcer, MultiNetworkPolicy=[mnp("deny", {"podSelector": {}})])
    await node.hooks.run_pod_sandbox(pod("a"))
    record = node.store.get("a-sandbox")
    assert record is not None and (NETNS, TABLE) in datapath.tables
    await enforcer.detached(record, [a.attachment for a in record.attachments])
    assert (NETNS, TABLE) not in datapath.tables and enforcer.node.local == {}
    assert datapath.calls[-1] == ("remove", NETNS, None)
    enforcer.forget(record)
    assert enforcer.local == {}


async def test_an_unplug_of_an_interface_no_policy_governs_runs_no_nft(tmp_path: Path) -> None:
    datapath = FakeNft()
    node, enforcer = started(tmp_path, datapath)
    sync(enforcer)
    await node.hooks.run_pod_sandbox(pod("a"))
    record = node.store.get("a-sandbox")
    assert record is not None and datapath.calls == []
    await enforcer.detached(record, [a.attachment for a in record.attachments])
    assert datapath.calls == [] and enforcer.unneeded == set() and enforcer.node.local == {}


def test_drops_are_read_per_network_and_policy(tmp_path: Path) -> None:
    datapath = FakeNft(
        counted=[
            RuleCounter("if0_in", "default-deny ingress (ns/p)", "drop", 7, 700),
            RuleCounter("if0_in_admin", "admin/x ingress[0] mgmt", "drop", 2, 200),
            RuleCounter("if0_in", "ns/p ingress[0]", "accept", 9, 900),
        ]
    )
    enforcer = PolicyEnforcer(Node.start(tmp_path).store, datapath=datapath)
    enforcer.node.local[("ns", "a")] = {NET: "net1"}
    from cnidra.nri.netpolicy import Local

    enforcer.local[("ns", "a")] = Local(NETNS, "s", None)
    enforcer.applied[(NETNS, TABLE)] = Ruleset((), ())
    assert read_drops(enforcer, datapath) == [(NET, "default-deny", 7), (NET, "admin/x", 2)]


class FakeClient:
    """The session's AsyncClient as Api calls it: a list, then a watch of events."""

    def __init__(self, listed: list[Any], events: list[tuple[str, Any]]) -> None:
        self.listed, self.events = listed, events
        self.asked: list[tuple[str, Any, dict[str, Any]]] = []

    async def list(self, kind: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.asked.append(("list", kind, kwargs))
        for obj in self.listed:
            yield obj

    async def watch(self, kind: Any, **kwargs: Any) -> AsyncIterator[tuple[str, Any]]:
        self.asked.append(("watch", kind, kwargs))
        for event in self.events:
            yield event
        raise asyncio.CancelledError  # end the test's loop


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, ...]] = []

    def replace(self, kind: str, objects: Any) -> None:
        self.seen.append(("replace", kind, str(len(objects))))

    def changed(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        self.seen.append((event, kind, obj["metadata"]["name"]))


async def test_a_kind_is_listed_then_watched_across_every_namespace() -> None:
    client = FakeClient(
        [{"metadata": {"name": "p"}}],
        [
            ("ADDED", {"metadata": {"name": "q"}}),
            ("BOOKMARK", {}),
            ("DELETED", {"metadata": {"name": "p"}}),
        ],
    )
    feed = Recorder()
    with pytest.raises(asyncio.CancelledError):
        await watches.follow(Api(client), "MultiNetworkPolicy", feed)
    assert feed.seen == [
        ("replace", "MultiNetworkPolicy", "1"),
        ("ADDED", "MultiNetworkPolicy", "q"),
        ("DELETED", "MultiNetworkPolicy", "p"),
    ]
    assert [a[2].get("namespace") for a in client.asked] == ["*", "*"]


def test_the_drops_are_exported_per_network_and_policy() -> None:
    from cnidra.observe import metrics

    metrics.POLICY_DROPS.source = lambda: [(NET, "default-deny", 7), (NET, "default-deny", 3)]
    try:
        value = metrics.REGISTRY.get_sample_value(
            "cnidra_netpolicy_dropped_packets_total", {"network": NET, "policy": "default-deny"}
        )
    finally:
        metrics.POLICY_DROPS.source = lambda: ()
    assert value == 10


def test_a_tenant_policy_for_another_namespaces_claim_network_is_not_applied(
    tmp_path: Path,
) -> None:
    enforcer = PolicyEnforcer(Node.start(tmp_path).store)
    enforcer.replace("MultiNetworkPolicy", [mnp("theirs", {"podSelector": {}}, "claim:other/x")])
    enforcer.replace("MultiNetworkPolicy", [mnp("ours", {"podSelector": {}}, "claim:ns/x")])
    assert list(enforcer.node.tenant) == ["ns/ours"]


async def test_an_interface_name_nft_cannot_match_is_refused_and_forgotten(tmp_path: Path) -> None:
    datapath = FakeNft()
    enforcer = PolicyEnforcer(Node.start(tmp_path).store, datapath=datapath, settle=0.0)
    node = Node.start(tmp_path / "n", policy=enforcer)
    enforcer.store = node.store
    prepare(
        node.checkpoint, "c", "a-uid", ('ne"t1', network("blue", "macvlan")), policy_network=NET
    )
    sync(enforcer)
    with pytest.raises(AttachError, match="network policy on ne"):
        await node.hooks.run_pod_sandbox(pod("a"))
    assert enforcer.node.local == {} and datapath.tables == {}
    enforcer.changed("MultiNetworkPolicy", "ADDED", mnp("deny", {"podSelector": {}}))  # no raise


async def test_a_changes_tables_are_applied_at_most_four_at_once(tmp_path: Path) -> None:
    class Slow(FakeNft):
        def __init__(self) -> None:
            super().__init__()
            self.now = 0
            self.most = 0
            self.lock = threading.Lock()
            self.overlapped = threading.Event()

        def apply(
            self, netns: str, ruleset: Ruleset, previous: Ruleset | None = None, *, timeout: float
        ) -> str:
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
                if self.now > 1:
                    self.overlapped.set()
            # until a second apply is under way: on a loaded machine threads started together
            # need not overlap within a 50 ms sleep; applies made one at a time wait 5 s each
            self.overlapped.wait(5)
            time.sleep(0.05)
            with self.lock:
                self.now -= 1
            return super().apply(netns, ruleset, previous, timeout=timeout)

    datapath = Slow()
    enforcer = PolicyEnforcer(Node.start(tmp_path).store, datapath=datapath, settle=0.0)
    for i in range(10):  # ten local pods, each on the network
        enforcer.local[("ns", f"p{i}")] = Local(f"/run/netns/p{i}", f"sb{i}", None)
    sync(enforcer)
    for i in range(10):
        enforcer.node.set_local(PodFacts("ns", f"p{i}", {}, (), {NET: ()}), NET, "net1")
    enforcer.dirty = {(("ns", f"p{i}"), NET) for i in range(10)}
    await enforcer.apply_dirty()
    assert len(datapath.tables) == 10
    assert 1 < datapath.most <= APPLY_CONCURRENCY


async def test_a_table_that_fails_is_applied_again_on_its_own_backoff(tmp_path: Path) -> None:
    """A failed nft run is marked again after its backoff (1 s, then doubling), each table on
    its own pace; once it applies, its pace is forgotten."""
    datapath = FakeNft()
    node, enforcer = started(tmp_path, datapath)
    sync(enforcer, MultiNetworkPolicy=[mnp("deny", {"podSelector": {}})])
    await node.hooks.run_pod_sandbox(pod("a"))
    datapath.failing = True
    enforcer.changed("Pod", "ADDED", peer("w", "198.18.0.9", {"app": "web"}))
    enforcer.changed("MultiNetworkPolicy", "ADDED", mnp("other", {"podSelector": {}}))
    await enforcer.apply_dirty()
    [change] = enforcer.apply_backoffs
    first = enforcer.apply_backoffs[change]._next  # the next step: grown from the first
    assert first == 2 * APPLY_RETRY and not enforcer.dirty  # marked again later, not now
    enforcer.dirty.add(change)
    await enforcer.apply_dirty()
    assert enforcer.apply_backoffs[change]._next == 4 * APPLY_RETRY
    datapath.failing = False
    enforcer.dirty.add(change)
    await enforcer.apply_dirty()
    assert enforcer.apply_backoffs == {}
    assert "ns/other" in rules(datapath.tables[(NETNS, TABLE)])
