"""Issue 43's conditions and Events, without a cluster or a kernel: the claim's
NetworkPolicyEnforced condition (True in the pod's namespace; False where the pod could undo
it, or where nothing can enforce it: a userspace device), and a policy that selects an interface
it cannot be enforced on reported for its Event and its status entry of this node, an entry an
earlier run left removed once it no longer holds."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cnidra.api.constants import (
    CONDITION_POLICY,
    REASON_POLICY_POD_NAMESPACE,
    REASON_POLICY_REFUSED,
    REASON_POLICY_UNDOABLE,
)
from cnidra.api.refs import ObjectRef
from cnidra.nri.netpolicy import PolicyEnforcer
from cnidra.status.netpolicy import PolicyRef
from tests.nri.fakes import FakePlugins, Node, network, pod, prepare
from tests.nri.test_netpolicy_hook import NET, FakeNft, mnp, peer, sync

CLAIM = ObjectRef("ns", "c", "c-uid")
DEVICE = (CLAIM, "node", "dev0", "")
DENY = PolicyRef("MultiNetworkPolicy", "deny", "ns")


class Reports:
    def __init__(self) -> None:
        self.seen: list[tuple[PolicyRef, tuple[str, ...]]] = []

    def report(self, ref: PolicyRef, problems: Sequence[str], *, event: bool = True) -> None:
        self.seen.append((ref, tuple(problems)))


def started(
    tmp_path: Path, plugin: str = "macvlan", plugins: FakePlugins | None = None
) -> tuple[Node, PolicyEnforcer, Reports]:
    reports = Reports()
    enforcer = PolicyEnforcer(
        Node.start(tmp_path / "first").store,
        datapath=FakeNft(),
        settle=0.0,
        reports=reports,
        node_name="node-1",
    )
    node = Node.start(tmp_path, plugins, policy=enforcer)
    enforcer.store, enforcer.events, enforcer.conditions = node.store, node.status, node.status
    prepare(node.checkpoint, "c", "a-uid", ("net1", network("blue", plugin)), policy_network=NET)
    return node, enforcer, reports


def condition(node: Node) -> dict[str, Any]:
    return node.status.conditions[DEVICE][CONDITION_POLICY].to_json()


def net_admin(name: str = "a") -> dict[str, Any]:
    obj = peer(name, "198.18.0.2", {})
    obj["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["NET_ADMIN"]}}
    return obj


async def test_an_enforced_interface_has_a_true_condition_false_once_the_pod_can_undo_it(
    tmp_path: Path,
) -> None:
    node, enforcer, _ = started(tmp_path)
    sync(enforcer)
    await node.hooks.run_pod_sandbox(pod("a"))
    got = condition(node)
    assert (got["status"], got["reason"]) == ("True", REASON_POLICY_POD_NAMESPACE)
    assert "net1" in got["message"] and NET in got["message"]
    # the watch says a container has CAP_NET_ADMIN: it could delete the table
    enforcer.changed("Pod", "MODIFIED", net_admin())
    got = condition(node)
    assert (got["status"], got["reason"]) == ("False", REASON_POLICY_UNDOABLE)
    assert "containers c" in got["message"]
    # the capability dropped (a new spec): True again
    enforcer.changed("Pod", "MODIFIED", peer("a", "198.18.0.2", {}))
    assert condition(node)["status"] == "True"


async def test_a_pod_the_watch_saw_with_net_admin_is_flagged_at_attach(tmp_path: Path) -> None:
    node, enforcer, _ = started(tmp_path)
    sync(enforcer, Pod=[net_admin()])
    await node.hooks.run_pod_sandbox(pod("a"))
    assert condition(node)["reason"] == REASON_POLICY_UNDOABLE
    assert enforcer.describe(("ns", "a"))["undoableBy"] == ["c"]
    assert [e[1] for e in node.status.events].count("NetworkPolicyNotEnforced") == 1


async def test_a_device_bound_to_a_userspace_driver_is_not_enforced_and_says_so(
    tmp_path: Path,
) -> None:
    plugins = FakePlugins(userspace={"sriov"})
    node, enforcer, reports = started(tmp_path, "sriov", plugins)
    sync(enforcer, MultiNetworkPolicy=[mnp("deny", {"podSelector": {}})])
    await node.hooks.run_pod_sandbox(pod("a"))  # not failed
    assert enforcer.datapath.tables == {}  # type: ignore[attr-defined]
    got = condition(node)
    assert (got["status"], got["reason"]) == ("False", REASON_POLICY_REFUSED)
    assert "userspace driver" in got["message"]
    assert "userspace driver" in enforcer.describe(("ns", "a"))["net1"]["notEnforced"]
    enforcer.report_problems()
    [(ref, problems)] = reports.seen
    assert ref == DENY
    assert problems == (
        "pod ns/a net1 (ns/blue): the sriov device is bound to a userspace driver (vfio-pci, "
        "DPDK): no kernel interface carries its traffic",
    )


async def test_a_policy_selecting_an_unenforceable_interface_is_reported_until_it_no_longer_does(
    tmp_path: Path,
) -> None:
    node, enforcer, reports = started(tmp_path, "vhostuser")
    other = mnp("other", {"podSelector": {"matchLabels": {"app": "x"}}})  # selects nothing
    admin = {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIAdminNetworkPolicy",
        "metadata": {"name": "mgmt"},
        "spec": {"priority": 1, "subject": {"namespaces": {}}, "networks": [NET]},
    }
    sync(
        enforcer,
        MultiNetworkPolicy=[mnp("deny", {"podSelector": {}}), other],
        CNIAdminNetworkPolicy=[admin],
    )
    await node.hooks.run_pod_sandbox(pod("a"))
    enforcer.report_problems()
    assert [ref for ref, _ in reports.seen] == [
        PolicyRef("CNIAdminNetworkPolicy", "mgmt"),
        DENY,
    ]
    assert all("vhost-user" in problems[0] for _, problems in reports.seen)
    reports.seen.clear()
    enforcer.report_problems()
    assert reports.seen == []  # nothing changed, nothing told
    # the admin's policy deleted: nothing written on it; the pod gone: the tenant's cleared
    enforcer.changed("CNIAdminNetworkPolicy", "DELETED", admin)
    record = node.store.get("a-sandbox")
    assert record is not None
    enforcer.forget(record)
    enforcer.report_problems()
    assert reports.seen == [(DENY, ())]


def test_an_entry_an_earlier_run_left_is_removed_once_synced(tmp_path: Path) -> None:
    _, enforcer, reports = started(tmp_path)
    left = mnp("deny", {"podSelector": {}})
    left["status"] = {"nodes": [{"node": "node-1", "conditions": []}]}
    theirs = mnp("theirs", {"podSelector": {}})
    theirs["status"] = {"nodes": [{"node": "node-2", "conditions": []}]}
    enforcer.replace("MultiNetworkPolicy", [left, theirs])
    enforcer.report_problems()
    assert reports.seen == []  # not synced yet: nothing is known
    sync(enforcer, MultiNetworkPolicy=[left, theirs])
    enforcer.report_problems()
    assert reports.seen == [(DENY, ())]  # only this node's entry, only once
    enforcer.report_problems()
    assert reports.seen == [(DENY, ())]
