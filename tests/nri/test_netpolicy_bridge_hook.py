"""Issue 43's bridge host side in the enforcer without a kernel: where a bridge interface's table
goes (the host, keyed on the pod's addresses; the pod's namespace when the driver is told so or
the CNI result does not say enough), the anti-spoofing table before it, the bridge's switch
turned on once (marked), off again when its last policed port goes, left as found when it was on,
and a mark left by an earlier run honoured after a restart. The kernel's side is
tests/datapath/test_netpolicy_bridge.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.netpolicy_node import bridge_mark, host_table_name, spoof_table_name, table_name
from cnidra.api.netpolicy_rules import Ruleset
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment, SetupFailed
from cnidra.cni.result import Result
from cnidra.datapath import netpolicy as nft
from cnidra.nri.netpolicy import PolicyEnforcer
from cnidra.state.layout import StateLayout
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State
from tests.nri.test_netpolicy_hook import NET, FakeNft, rules

HOST = "/run/netns/node"
MAC = "0a:58:c6:12:00:05"


@dataclass
class FakeBridge:
    """A bridge's switch and the scripts applied; `failing`: apply_script raises NftError."""

    on: dict[str, bool] = field(default_factory=lambda: {"br0": False, "br1": False})
    sets: list[tuple[str, bool, str]] = field(default_factory=list)
    scripts: list[str] = field(default_factory=list)
    failing: bool = False

    def bridge_nf_call(self, netns: str, bridge: str, *, timeout: float) -> bool:
        return self.on[bridge]

    def set_bridge_nf_call(
        self, netns: str, bridge: str, on: bool, *, mark: str = "", timeout: float
    ) -> None:
        self.sets.append((bridge, on, mark))
        self.on[bridge] = on

    def apply_script(self, netns: str, script: str, *, timeout: float) -> None:
        if self.failing:
            raise nft.NftError("nft: Error: Could not process rule")
        self.scripts.append(script)


def record(name: str, n: int, *, mac: str = MAC, plugin: str = "bridge") -> SandboxRecord:
    att = Attachment(
        ObjectRef("ns", f"claim-{name}", f"uid-{name}"),
        "net",
        "net1",
        {"cniVersion": "1.0.0", "name": "blue", "plugins": [{"type": plugin, "bridge": "br0"}]},
        "node",
        "blue",
        policy_network=NET,
    )
    result = {
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "br0"},
            {"name": f"veth{name}"},
            {"name": "net1", "mac": mac, "sandbox": f"/run/netns/{name}"},
        ],
        "ips": [{"address": f"198.18.7.{n}/24", "interface": 2}],
    }
    pod = ObjectRef("ns", name, f"pod-{name}")
    return SandboxRecord(
        f"sb-{name}", pod, f"/run/netns/{name}", State.ADDED, (Attached(att, result),)
    )


def enforcer(tmp_path: Path, datapath: FakeNft, bridges: FakeBridge, **kw: Any) -> PolicyEnforcer:
    store = SandboxStore(StateLayout(tmp_path))
    kw.setdefault("bridge_on_host", True)
    return PolicyEnforcer(
        store, datapath=datapath, bridge_datapath=bridges, settle=0.0, host_netns=HOST, **kw
    )


async def add(e: PolicyEnforcer, r: SandboxRecord) -> None:
    e.store.put_blocking(r)
    result = Result(r.attachments[0].result or {})
    await e.at_add(r, {}, r.attachments[0].attachment, None, result)


async def test_a_bridge_interface_is_policed_on_the_host_and_its_bridge_switched_once(
    tmp_path: Path,
) -> None:
    datapath, bridges = FakeNft(), FakeBridge()
    e = enforcer(tmp_path, datapath, bridges)
    a, b = record("a", 5), record("b", 6)
    await add(e, a)
    await add(e, b)
    table = host_table_name(NET, "vetha")
    forward = next(c for c in datapath.tables[(HOST, table)].chains if c.name == "forward")
    assert forward.rules[0].startswith("ip daddr { 198.18.7.5 } jump if0_in")
    assert not any((f"/run/netns/{n}", table_name(NET)) in datapath.tables for n in "ab")
    assert [s.splitlines()[0] for s in bridges.scripts] == [
        f"add table bridge {spoof_table_name(NET, 'vetha')}",
        f"add table bridge {spoof_table_name(NET, 'vethb')}",
    ]
    assert bridges.sets == [("br0", True, bridge_mark("br0"))]  # once, marked as cnidra's
    assert e.describe(("ns", "a"))["net1"]["bridge"] == "br0"
    e.forget(a)
    await e.remove_doomed()
    assert (HOST, table) not in datapath.tables and bridges.on["br0"]  # b is still on it
    e.forget(b)
    await e.remove_doomed()
    assert bridges.sets[-1] == ("br0", False, bridge_mark("br0")) and not bridges.on["br0"]
    assert not bridges.on["br1"] and all(s[0] == "br0" for s in bridges.sets)


async def test_a_bridge_switched_on_before_is_left_as_found(tmp_path: Path) -> None:
    datapath, bridges = FakeNft(), FakeBridge(on={"br0": True})
    e = enforcer(tmp_path, datapath, bridges)
    a = record("a", 5)
    await add(e, a)
    e.forget(a)
    await e.remove_doomed()
    assert bridges.sets == [] and bridges.on["br0"]


@pytest.mark.parametrize(
    ("options", "mac"),
    [({"bridge_on_host": False}, MAC), ({}, ""), ({}, "not a mac")],
)
async def test_else_a_bridge_interface_is_policed_in_the_pods_namespace(
    tmp_path: Path, options: dict[str, Any], mac: str
) -> None:
    datapath, bridges = FakeNft(), FakeBridge()
    e = enforcer(tmp_path, datapath, bridges, **options)
    await add(e, record("a", 5, mac=mac))
    assert list(datapath.tables) == [("/run/netns/a", table_name(NET))]
    assert "iifname" in rules(datapath.tables[("/run/netns/a", table_name(NET))])
    assert bridges.sets == [] and bridges.scripts == []


async def test_the_attach_fails_closed_when_the_port_cannot_be_held(tmp_path: Path) -> None:
    datapath, bridges = FakeNft(), FakeBridge(failing=True)
    e = enforcer(tmp_path, datapath, bridges)
    with pytest.raises(SetupFailed, match="could not be applied"):
        await add(e, record("a", 5))
    assert datapath.tables == {} and bridges.sets == []


async def test_a_mark_an_earlier_run_left_switches_its_bridge_off_after_a_restart(
    tmp_path: Path,
) -> None:
    datapath, bridges = FakeNft(), FakeBridge(on={"br0": True, "br1": False})
    datapath.tables[(HOST, bridge_mark("br0"))] = Ruleset((), ())  # listed as the kernel's
    e = enforcer(tmp_path, datapath, bridges)
    e.restore()
    for kind in ("MultiNetworkPolicy", "CNIAdminNetworkPolicy", "Namespace", "Pod"):
        e.replace(kind, [])
    await e.remove_doomed()
    assert bridges.sets == [("br0", False, bridge_mark("br0"))]
