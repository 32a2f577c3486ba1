"""Issue 43's host-side enforcement for pods on a bridge, with real traffic: pods wired as the
bridge plugin wires them (tests/datapath/policylab.py `lab`: each pod's veth a port of `br0` in
a "node" namespace of this run), each pod's rules in an `inet` table of the node keyed on its
addresses, reached through the bridge's own nf_call_iptables (the node-wide sysctl is 0 here,
as on a node without br_netfilter's global switch), and a `bridge` table on its port that lets
through only its own MAC and addresses. A pod that flushes its own nftables (as one with
CAP_NET_ADMIN can) or takes another address gains nothing. Through the agent's reconciler too:
applied at attach from the bridge plugin's CNI result, the bridge's switch turned on and off
again when the last policed port goes (and left as found when it was on), other bridges
untouched."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.constants import CONDITION_POLICY, REASON_POLICY_HOST_SIDE
from cnidra.api.netpolicy import decode_policy
from cnidra.api.netpolicy_node import (
    BRIDGE_MARK_PREFIX,
    HOST_TABLE_PREFIX,
    SPOOF_TABLE_PREFIX,
    bridge_mark,
    host_table_name,
    spoof_table_name,
)
from cnidra.api.netpolicy_rules import (
    BridgePort,
    NamedPort,
    NetworkView,
    PodInterface,
    PodOnNetwork,
    anti_spoof_script,
    bridge_host_side,
    compile_pod,
)
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.cni.result import Result
from cnidra.datapath import netpolicy
from cnidra.nri.netpolicy import PolicyEnforcer
from cnidra.state.layout import StateLayout
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State
from tests.datapath.policylab import BRIDGE, IFNAME, Lab, ip, lab, mac_of, port_of
from tests.datapath.test_netpolicy_agent import NET, allow_from, sync
from tests.datapath.test_netpolicy_host import flush_own_ruleset
from tests.nri.fakes import RecordingStatus

pytestmark = pytest.mark.netns

NAMESPACES = {"a": "tenant-a", "b": "tenant-a", "c": "tenant-b"}
LABELS = {"a": {"app": "db"}, "b": {"app": "web"}, "c": {"app": "web"}}
HTTP = (NamedPort("http", "TCP", 8080),)
OTHER = "br1"  # a bridge of the node that no policed pod is on


def no_global_switch(switch: Path) -> None:
    """The node's sysctl hands no bridge to the inet hooks; a second bridge beside the pods'."""
    subprocess.run(
        ["ip", "netns", "exec", switch.name, "sysctl", "-qw",
         "net.bridge.bridge-nf-call-iptables=0", "net.bridge.bridge-nf-call-ip6tables=0"],
        check=True, capture_output=True, timeout=10,
    )  # fmt: skip
    ip(switch, "link", "add", OTHER, "type", "bridge")


@pytest.fixture
def bridged() -> Iterator[Lab]:
    """The lab on a node whose sysctl hands no bridge to the inet hooks, with a second bridge."""
    with lab() as lab_:
        switch = lab_.switch
        assert switch is not None
        no_global_switch(switch)
        yield lab_


def view(lab_: Lab) -> NetworkView:
    pods = tuple(
        PodOnNetwork(
            NAMESPACES[n],
            n,
            LABELS[n],
            (lab_.addresses[n], lab_.addresses6[n]),
            HTTP if n == "a" else (),
        )
        for n in sorted(lab_.pods)
    )
    return NetworkView(NET, pods, {"tenant-a": {"team": "a"}, "tenant-b": {"team": "b"}})


def port(lab_: Lab, name: str) -> BridgePort:
    addresses = (f"{lab_.addresses[name]}/24", f"{lab_.addresses6[name]}/64")
    return BridgePort(BRIDGE, port_of(name), mac_of(lab_.pods[name]), addresses)


def enforce(lab_: Lab, name: str, policy: dict[str, Any]) -> tuple[str, str]:
    """`policy` enforced for pod `name` on the node, as the driver does it: its port held to
    its addresses, its rules keyed on them; the inet and the bridge table's names."""
    decoded, _ = decode_policy(policy)
    assert decoded is not None and lab_.switch is not None
    me = next(p for p in view(lab_).pods if p.name == name)
    table = host_table_name(NET, port_of(name))
    spoof = spoof_table_name(NET, port_of(name))
    ruleset = compile_pod(me, [PodInterface(IFNAME, view(lab_))], [decoded])
    netpolicy.apply_script(lab_.switch, anti_spoof_script(port(lab_, name), spoof))
    netpolicy.apply(lab_.switch, bridge_host_side(ruleset, port(lab_, name), table))
    return table, spoof


def accepted(lab_: Lab, table: str, comment: str) -> int:
    assert lab_.switch is not None
    counted = netpolicy.counters(lab_.switch, table)
    return sum(c.packets for c in counted if c.comment == comment and c.verdict == "accept")


def dropped(lab_: Lab, table: str) -> int:
    assert lab_.switch is not None
    listing = netpolicy.run_nft(lab_.switch, ("-j", "list", "table", "bridge", table))
    return sum(c.packets for c in netpolicy.parse_counters(listing) if c.verdict == "drop")


ROWS = [
    ("b", "a", "tcp", 8080),  # web of a's namespace to a's named port http: allowed
    ("c", "a", "tcp", 8080),  # web of another namespace: not
    ("b", "a", "tcp", 5432),  # another port: not
    ("b", "a", "udp", 5353),  # isolated: nothing else gets in
    ("b", "a", "tcp6", 8080),  # over IPv6 too
    ("c", "a", "udp6", 5353),
    ("a", "b", "tcp", 8080),  # a's egress is open; the reply gets back in
    ("a", "c", "udp", 5353),
    ("c", "b", "udp", 9000),  # pods without policy: untouched
]
EXPECTED = [True, False, False, False, True, False, True, True, True]


def test_a_bridge_interface_is_policed_on_the_host_and_the_pod_cannot_undo_it(
    bridged: Lab,
) -> None:
    switch = bridged.switch
    assert switch is not None
    policy = allow_from({"app": "web"})  # from web pods of tenant-a, to a's named port http
    table, _ = enforce(bridged, "a", policy)
    # the bridge does not hand its frames to the inet hooks yet: the table sees nothing
    assert bridged.probes([("c", "a", "tcp", 8080), ("b", "a", "udp", 5353)]) == [True, True]
    netpolicy.set_bridge_nf_call(switch, BRIDGE, True)
    assert bridged.probes(ROWS) == EXPECTED
    for name in ("a", "c"):  # the pods undo what they can: nothing of this
        flush_own_ruleset(bridged.pods[name])
    assert bridged.probes(ROWS) == EXPECTED
    assert not netpolicy.bridge_nf_call(switch, OTHER)  # the other bridge as it was
    counted = netpolicy.counters(switch, table)
    assert any(c.verdict == "drop" and c.packets > 0 for c in counted)


def test_ip_blocks_with_excepts_both_ways_on_a_bridge(bridged: Lab) -> None:
    switch = bridged.switch
    assert switch is not None
    block = {"ipBlock": {"cidr": "198.18.43.0/24", "except": [f"{bridged.addresses['c']}/32"]}}
    policy = allow_from({"app": "web"})
    policy["spec"]["ingress"] = [{"from": [block]}]
    policy["spec"]["egress"] = [
        {"to": [block], "ports": [{"port": 8080}, {"protocol": "UDP", "port": 5353}]}
    ]
    policy["spec"]["policyTypes"] = ["Ingress", "Egress"]
    enforce(bridged, "a", policy)
    netpolicy.set_bridge_nf_call(switch, BRIDGE, True)
    rows = [
        ("b", "a", "tcp", 5432),  # in the block
        ("c", "a", "tcp", 5432),  # the except
        ("c", "a", "udp", 9000),
        ("a", "b", "tcp", 8080),  # egress to the block, on its ports
        ("a", "b", "udp", 5353),
        ("a", "b", "tcp", 5432),  # another port
        ("a", "c", "tcp", 8080),  # the except
        ("a", "c", "udp", 5353),
    ]
    assert bridged.probes(rows) == [True, False, False, True, True, False, False, False]


def test_a_pod_that_takes_another_address_gains_nothing(bridged: Lab) -> None:
    switch = bridged.switch
    assert switch is not None
    table, _ = enforce(bridged, "a", allow_from({"app": "web"}))
    _, spoof_c = enforce(bridged, "c", {**allow_from({}), "spec": {"podSelector": {}}})
    netpolicy.set_bridge_nf_call(switch, BRIDGE, True)
    allowed = "tenant-a/db ingress[0]"  # a's rule that lets b in
    before = accepted(bridged, table, allowed)
    bridged.readdress("c", bridged.addresses["b"])  # c (denied) takes b's address
    assert bridged.probes([("c", "a", "tcp", 8080), ("c", "a", "udp", 5353)]) == [False, False]
    assert accepted(bridged, table, allowed) == before  # never seen as b's
    assert dropped(bridged, spoof_c) > 0
    # without c's port held to its addresses, the same packets pass a's policy as b's
    netpolicy.remove(switch, spoof_c)
    # (whether c also gets a's answers depends on a's neighbour cache, which c's ARP request
    # with b's address may have rewritten: tried here, c got in)
    bridged.probe("c", "a", "tcp", 8080)
    assert accepted(bridged, table, allowed) > before
    # an address of nobody's: still nothing, and nothing to pods without policy either
    netpolicy.apply_script(switch, anti_spoof_script(port_c_before(bridged), spoof_c))
    bridged.readdress("c", "198.18.43.77")
    assert bridged.probes([("c", "a", "tcp", 8080), ("c", "b", "udp", 9000)]) == [False, False]


def port_c_before(lab_: Lab) -> BridgePort:
    """c's port as the plugin gave it (c's first address, .3), whatever c holds now."""
    return BridgePort(
        BRIDGE,
        port_of("c"),
        mac_of(lab_.pods["c"]),
        ("198.18.43.3/24", f"{lab_.addresses6['c']}/64"),
    )


def record(lab_: Lab, name: str) -> SandboxRecord:
    claim = ObjectRef("tenant-a", f"claim-{name}", f"uid-{name}")
    att = Attachment(
        claim,
        "net",
        IFNAME,
        {"cniVersion": "1.0.0", "name": "blue", "plugins": [{"type": "bridge", "bridge": BRIDGE}]},
        "node",
        "blue",
        policy_network=NET,
    )
    result = {  # as the bridge plugin answers: the bridge, the host's end, the pod's end
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": BRIDGE, "mac": "02:00:00:00:00:aa"},
            {"name": port_of(name), "mac": "02:00:00:00:00:bb"},
            {"name": IFNAME, "mac": mac_of(lab_.pods[name]), "sandbox": str(lab_.pods[name])},
        ],
        "ips": [{"address": f"{lab_.addresses[name]}/24", "interface": 2}],
    }
    pod = ObjectRef("tenant-a", name, f"pod-{name}")
    return SandboxRecord(
        f"sb-{name}", pod, str(lab_.pods[name]), State.ADDED, (Attached(att, result),)
    )


def ours(switch: Path) -> list[str]:
    prefixes = (HOST_TABLE_PREFIX, SPOOF_TABLE_PREFIX, BRIDGE_MARK_PREFIX)
    return sorted(t for t in netpolicy.list_tables(switch) if t.startswith(prefixes))


async def restarted(store: SandboxStore, lab_: Lab) -> PolicyEnforcer:
    """A driver started again on the same records: restored, synced, applied, swept."""
    again = PolicyEnforcer(store, settle=0.0, host_netns=str(lab_.switch), bridge_on_host=True)
    again.restore()
    sync(again, lab_, allow_from({"app": "web"}))
    await again.apply_dirty()
    await again.remove_doomed()
    return again


async def test_the_reconciler_polices_a_bridge_on_the_host_and_leaves_it_as_found(
    tmp_path: Path,
) -> None:
    with lab(("a", "b")) as lab_:
        switch = lab_.switch
        assert switch is not None
        no_global_switch(switch)
        host = str(switch)
        store = SandboxStore(StateLayout(tmp_path))
        status = RecordingStatus()
        enforcer = PolicyEnforcer(
            store, settle=0.0, host_netns=host, conditions=status, bridge_on_host=True
        )
        a, b = record(lab_, "a"), record(lab_, "b")
        for r in (a, b):
            store.put_blocking(r)
        table = host_table_name(NET, port_of("a"))
        # not synced: the default deny, on the host; the bridge switched on and marked
        result = Result(a.attachments[0].result or {})
        await enforcer.at_add(a, LABELS["a"], a.attachments[0].attachment, None, result)
        assert netpolicy.bridge_nf_call(switch, BRIDGE)
        assert ours(switch) == sorted(
            [table, spoof_table_name(NET, port_of("a")), bridge_mark(BRIDGE)]
        )
        assert lab_.probes([("b", "a", "tcp", 8080)]) == [False]
        # synced: web reaches a's http port, nothing else, whatever a does to its own nftables
        sync(enforcer, lab_, allow_from({"app": "web"}))
        result_b = Result(b.attachments[0].result or {})
        await enforcer.at_add(b, LABELS["b"], b.attachments[0].attachment, None, result_b)
        enforcer.attached(a)
        enforcer.attached(b)
        await enforcer.apply_dirty()
        rows = [("b", "a", "tcp", 8080), ("b", "a", "tcp", 5432), ("a", "b", "udp", 5353)]
        assert lab_.probes(rows) == [True, False, True]
        flush_own_ruleset(lab_.pods["a"])
        assert lab_.probes(rows) == [True, False, True]
        described = enforcer.describe(("tenant-a", "a"))
        assert described[IFNAME]["hostInterface"] == port_of("a")
        assert described[IFNAME]["bridge"] == BRIDGE and described[IFNAME]["table"] == table
        conditions = [c[CONDITION_POLICY] for c in status.conditions.values()]
        assert {c.reason for c in conditions} == {REASON_POLICY_HOST_SIDE}
        assert all("a port of bridge br0" in c.message for c in conditions)
        # a goes: its tables go, the bridge stays switched on for b
        enforcer.forget(a)
        await enforcer.remove_doomed()
        assert table not in ours(switch) and spoof_table_name(NET, port_of("a")) not in ours(switch)
        assert netpolicy.bridge_nf_call(switch, BRIDGE)
        # a restart: b's tables and the mark are the kernel's; b still policed, still on
        # (and a port's table of a pod that went while the driver was down, swept)
        left = spoof_table_name(NET, "p-gone")
        netpolicy.run_nft(host, ("add", "table", "bridge", left))
        await store.remove(a.sandbox_id)
        again = await restarted(store, lab_)
        assert netpolicy.bridge_nf_call(switch, BRIDGE)
        assert left not in ours(switch) and spoof_table_name(NET, port_of("b")) in ours(switch)
        # b goes too: no table of cnidra's left, the bridge switched off again as found, the
        # other bridge never touched
        again.forget(b)
        await again.remove_doomed()
        assert ours(switch) == []
        assert not netpolicy.bridge_nf_call(switch, BRIDGE)
        assert not netpolicy.bridge_nf_call(switch, OTHER)
        assert lab_.probes([("b", "a", "tcp", 5432)]) == [True]


async def test_a_bridge_switched_on_before_is_left_on(tmp_path: Path) -> None:
    with lab(("a", "b")) as lab_:
        switch = lab_.switch
        assert switch is not None
        netpolicy.set_bridge_nf_call(switch, BRIDGE, True)  # the admin's
        store = SandboxStore(StateLayout(tmp_path))
        enforcer = PolicyEnforcer(store, settle=0.0, host_netns=str(switch), bridge_on_host=True)
        a = record(lab_, "a")
        store.put_blocking(a)
        result = Result(a.attachments[0].result or {})
        await enforcer.at_add(a, LABELS["a"], a.attachments[0].attachment, None, result)
        assert bridge_mark(BRIDGE) not in ours(switch)
        enforcer.forget(a)
        await enforcer.remove_doomed()
        assert ours(switch) == []
        assert netpolicy.bridge_nf_call(switch, BRIDGE)


def shown(switch: Path, bridge: str) -> tuple[int, int]:
    """(nf_call_iptables, nf_call_ip6tables) of `bridge` as iproute2 reads them."""
    out = subprocess.run(
        ["ip", "-n", switch.name, "-j", "-d", "link", "show", bridge],
        check=True, capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    data = json.loads(out.stdout)[0]["linkinfo"]["info_data"]
    return int(data["nf_call_iptables"]), int(data["nf_call_ip6tables"])


def test_the_switch_is_the_bridges_own_as_iproute2_sees_it(bridged: Lab) -> None:
    switch = bridged.switch
    assert switch is not None
    assert shown(switch, BRIDGE) == (0, 0) and not netpolicy.bridge_nf_call(switch, BRIDGE)
    netpolicy.set_bridge_nf_call(switch, BRIDGE, True, mark=bridge_mark(BRIDGE))
    assert shown(switch, BRIDGE) == (1, 1) and netpolicy.bridge_nf_call(switch, BRIDGE)
    assert shown(switch, OTHER) == (0, 0)
    assert ours(switch) == [bridge_mark(BRIDGE)]
    netpolicy.set_bridge_nf_call(switch, BRIDGE, False, mark=bridge_mark(BRIDGE))
    assert shown(switch, BRIDGE) == (0, 0) and ours(switch) == []
    for wrong in (port_of("a"), "nosuchbridge"):  # a port is no bridge; a name of nothing
        with pytest.raises(netpolicy.NftError):
            netpolicy.bridge_nf_call(switch, wrong)
        with pytest.raises(netpolicy.NftError):
            netpolicy.set_bridge_nf_call(switch, wrong, True)
