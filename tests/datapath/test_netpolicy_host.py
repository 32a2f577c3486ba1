"""Issue 43's host-side enforcement with real traffic: pods wired as the ptp plugin wires them
(tests/datapath/policylab.py `routed_lab`: each pod's veth ends in a "node" namespace of this
run that routes between them), their tables on the host's ends of the veths, where a pod with
CAP_NET_ADMIN cannot undo them: a pod that flushes its own nftables is still held. Through the
agent's reconciler too: applied at attach from the CNI result's host veth, the claim's
condition says so, removed when the pod goes, and a table a previous run left behind is swept
after a restart while the live one stays."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.constants import CONDITION_POLICY, REASON_POLICY_HOST_SIDE
from cnidra.api.netpolicy import decode_policy
from cnidra.api.netpolicy_node import HOST_TABLE_PREFIX, host_table_name
from cnidra.api.netpolicy_rules import (
    NetworkView,
    PodInterface,
    PodOnNetwork,
    compile_pod,
    host_side,
)
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.cni.result import Result
from cnidra.datapath import netpolicy
from cnidra.nri.netpolicy import PolicyEnforcer
from cnidra.state.layout import StateLayout
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State
from tests.datapath.policylab import IFNAME, Lab, host_veth, routed_lab
from tests.datapath.test_netpolicy_agent import NET, allow_from, pod_object, sync
from tests.nri.fakes import RecordingStatus

pytestmark = pytest.mark.netns

NAMESPACES = {"a": "tenant-a", "b": "tenant-a", "c": "tenant-b"}
LABELS = {"a": {"app": "db"}, "b": {"app": "web"}, "c": {"app": "web"}}


def view(lab_: Lab) -> NetworkView:
    pods = tuple(
        PodOnNetwork(NAMESPACES[n], n, LABELS[n], (lab_.addresses[n],)) for n in sorted(lab_.pods)
    )
    return NetworkView(NET, pods, {"tenant-a": {"team": "a"}, "tenant-b": {"team": "b"}})


def flush_own_ruleset(ns: Path) -> None:
    """What a pod with CAP_NET_ADMIN can do: every table of its own namespace gone."""
    subprocess.run(["ip", "netns", "exec", ns.name, "nft", "flush", "ruleset"], check=True)


def test_a_table_on_the_hosts_end_holds_and_the_pod_cannot_undo_it() -> None:
    doc = allow_from({"app": "web"})
    doc["spec"]["ingress"][0]["ports"] = [{"port": 8080}]
    policy, _ = decode_policy(doc)
    assert policy is not None
    with routed_lab() as lab_:
        assert lab_.host is not None
        a = view(lab_).pods[0]
        table = host_table_name(NET, host_veth("a"))
        ruleset = compile_pod(a, [PodInterface(IFNAME, view(lab_))], [policy])
        netpolicy.apply(lab_.host, host_side(ruleset, host_veth("a"), table))
        rows = [
            ("b", "a", "tcp", 8080),  # web of a's namespace: allowed
            ("c", "a", "tcp", 8080),  # web of another namespace: not
            ("b", "a", "tcp", 5432),  # another port: not
            ("c", "a", "udp", 5353),  # isolated: nothing else gets in
            ("a", "b", "tcp", 8080),  # a's egress is open; the reply gets back in
            ("a", "c", "udp", 5353),
        ]
        expected = [True, False, False, False, True, True]
        assert lab_.probes(rows) == expected
        flush_own_ruleset(lab_.pods["a"])  # the pod undoes what it can: nothing of this
        flush_own_ruleset(lab_.pods["c"])
        assert lab_.probes(rows) == expected
        counted = netpolicy.counters(lab_.host, table)
        assert any(c.verdict == "drop" and c.packets > 0 for c in counted)


def record(lab_: Lab, name: str) -> SandboxRecord:
    claim = ObjectRef("tenant-a", f"claim-{name}", f"uid-{name}")
    att = Attachment(
        claim,
        "net",
        IFNAME,
        {"cniVersion": "1.0.0", "name": "blue", "plugins": [{"type": "ptp"}]},
        "node",
        "blue",
        policy_network=NET,
    )
    result = {  # as ptp answers: the host's end first, without a sandbox
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": host_veth(name), "mac": "02:00:00:00:00:01"},
            {"name": IFNAME, "sandbox": str(lab_.pods[name])},
        ],
        "ips": [{"address": f"{lab_.addresses[name]}/32", "interface": 1}],
    }
    pod = ObjectRef("tenant-a", name, f"pod-{name}")
    return SandboxRecord(
        f"sb-{name}", pod, str(lab_.pods[name]), State.ADDED, (Attached(att, result),)
    )


def synced(enforcer: PolicyEnforcer, lab_: Lab, policy: dict[str, Any]) -> None:
    sync(enforcer, lab_, policy)
    for kind_obj in [pod_object_routed(lab_, n) for n in ("a", "b")]:
        enforcer.changed("Pod", "MODIFIED", kind_obj)


def pod_object_routed(lab_: Lab, name: str) -> dict[str, Any]:
    obj = pod_object(lab_, name)
    obj["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["NET_ADMIN"]}}
    return obj


async def test_the_reconciler_enforces_on_the_hosts_end_and_removes_what_it_left(
    tmp_path: Path,
) -> None:
    with routed_lab(("a", "b")) as lab_:
        assert lab_.host is not None
        host = str(lab_.host)
        store = SandboxStore(StateLayout(tmp_path))
        status = RecordingStatus()
        enforcer = PolicyEnforcer(store, settle=0.0, host_netns=host, conditions=status)
        a, b = record(lab_, "a"), record(lab_, "b")
        for r in (a, b):
            store.put_blocking(r)
        table = host_table_name(NET, host_veth("a"))
        # not synced: the default deny, on the host's end
        result = Result(a.attachments[0].result or {})
        await enforcer.at_add(a, LABELS["a"], a.attachments[0].attachment, None, result)
        assert netpolicy.exists(lab_.host, table)
        assert not netpolicy.exists(lab_.pods["a"], "cnidra_" + table[8:])
        assert lab_.probes([("b", "a", "tcp", 8080)]) == [False]
        # synced: web reaches a's http port, nothing else; a has CAP_NET_ADMIN, which does
        # not matter here
        synced(enforcer, lab_, allow_from({"app": "web"}))
        enforcer.attached(a)
        await enforcer.apply_dirty()
        assert lab_.probes([("b", "a", "tcp", 8080), ("b", "a", "tcp", 5432)]) == [True, False]
        described = enforcer.describe(("tenant-a", "a"))
        assert described[IFNAME]["hostInterface"] == host_veth("a")
        assert described[IFNAME]["table"] == table and described[IFNAME]["netns"] == host
        assert "undoableBy" not in described
        [condition] = status.conditions.values()
        assert condition[CONDITION_POLICY].reason == REASON_POLICY_HOST_SIDE
        assert condition[CONDITION_POLICY].status == "True"
        assert enforcer.tables() == [(("tenant-a", "a"), NET, host, table)]
        # a restart: the record says a is attached; a table of a pod that went meanwhile is
        # swept once synced, a's is rewritten and kept
        left = host_table_name(NET, "h-gone")
        netpolicy.run_nft(host, ("add", "table", "inet", left))
        netpolicy.run_nft(host, ("add", "table", "inet", "someone-elses"))
        again = PolicyEnforcer(store, settle=0.0, host_netns=host)
        again.restore()
        synced(again, lab_, allow_from({"app": "web"}))
        await again.apply_dirty()
        await again.remove_doomed()
        found = netpolicy.list_tables(host)
        assert table in found and left not in found and "someone-elses" in found
        assert lab_.probes([("b", "a", "tcp", 8080), ("b", "a", "tcp", 5432)]) == [True, False]
        # the pod goes: its table on the host goes too
        again.forget(a)
        await again.remove_doomed()
        ours = [t for t in netpolicy.list_tables(host) if t.startswith(HOST_TABLE_PREFIX)]
        assert ours == [host_table_name(NET, host_veth("b"))]  # b's (restored) stays
        assert lab_.probe("b", "a", "tcp", 5432)
