"""A network's host-side effects judged against the node's links (cnidra.api.hostside): the
values that would change a shared host object are pinned where the tenant left them out and
refused where the tenant wrote them; the admin's pass as written."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cnidra.api.hostside import LinkFacts, NodeFacts, judge_host_side
from cnidra.api.issues import FieldPath, Issues
from cnidra.dra.prepare import PrepareError, resolve_claim
from tests.api.test_policy import DEFAULT_CLASSES, MACVLAN, claim, errors, network
from tests.dra.test_prepare import DIRS, REF, VIEW
from tests.dra.test_prepare import claim as allocated_claim

BRIDGE = LinkFacts("br-data", "bridge", 1500, ("198.18.3.1/24",), vlan_filtering=False)
DATA = LinkFacts("data0", "physical", 9000, ("198.18.2.2/24", "2001:db8:2::2/64"))
NODE = NodeFacts(
    {
        "br-data": BRIDGE,
        "data0": DATA,
        "eth0": LinkFacts("eth0", "physical", 1500, ("198.18.0.2/24",)),
    }
)
WHERE = FieldPath(("config",))


def tenant(path: tuple[Any, ...]) -> bool:
    return True


def admin(path: tuple[Any, ...]) -> bool:
    return False


def judge(
    plugin: dict[str, Any], parent: str, wrote: Any = tenant, node: NodeFacts = NODE
) -> tuple[dict[str, Any], list[str]]:
    issues = Issues()
    out = judge_host_side({"name": "n", "plugins": [plugin]}, parent, node, wrote, issues, WHERE)
    return out["plugins"][0], [str(i) for i in issues.errors]


def test_a_bridge_network_without_an_mtu_gets_the_bridges() -> None:
    plugin, errors = judge({"type": "bridge", "bridge": "br-data"}, "br-data")
    assert errors == [] and plugin["mtu"] == 1500
    big = NodeFacts({"br-data": LinkFacts("br-data", "bridge", 9000)})
    assert judge({"type": "bridge", "bridge": "br-data"}, "br-data", node=big)[0]["mtu"] == 9000


@pytest.mark.parametrize("mtu", [68, 1400, 1501, 9000])
def test_a_tenants_mtu_other_than_the_bridges_is_refused_naming_the_field(mtu: int) -> None:
    _, errors = judge({"type": "bridge", "bridge": "br-data", "mtu": mtu}, "br-data")
    assert len(errors) == 1
    assert errors[0].startswith("config.plugins[0].mtu: ")
    assert "bridge br-data's MTU 1500" in errors[0] and "tuning" in errors[0]


def test_the_bridges_own_mtu_and_the_admins_pass() -> None:
    assert judge({"type": "bridge", "mtu": 1500}, "br-data") == (
        {"type": "bridge", "mtu": 1500},
        [],
    )
    assert judge({"type": "bridge", "mtu": 68}, "br-data", admin)[1] == []


def test_a_macvlan_mtu_is_the_childs_own() -> None:
    """A child's MTU never changes its parent (the kernel refuses one above the parent's)."""
    assert judge({"type": "macvlan", "mtu": 68}, "data0") == ({"type": "macvlan", "mtu": 68}, [])


@pytest.mark.parametrize(
    "field", [{"vlan": 100}, {"vlanTrunk": [{"id": 5}]}, {"vlan": 7, "preserveDefaultVlan": False}]
)
def test_a_vlan_on_a_bridge_that_does_not_filter_vlans_is_refused(field: dict[str, Any]) -> None:
    _, errors = judge({"type": "bridge", **field}, "br-data")
    assert errors and all("does not filter VLANs" in e for e in errors)
    filtering = NodeFacts({"br-data": LinkFacts("br-data", "bridge", 1500, vlan_filtering=True)})
    assert judge({"type": "bridge", **field}, "br-data", node=filtering)[1] == []
    assert judge({"type": "bridge", **field}, "br-data", admin)[1] == []


@pytest.mark.parametrize(
    "address",
    [
        "198.18.2.2/24",
        "198.18.0.2/16",
        "198.18.3.1/24",
        "2001:db8:2::2/64",
        "::ffff:198.18.2.2/120",
    ],
)
def test_a_static_address_the_node_holds_is_refused(address: str) -> None:
    plugin = {"type": "macvlan", "ipam": {"type": "static", "addresses": [{"address": address}]}}
    _, errors = judge(plugin, "data0")
    assert len(errors) == 1 and "is an address of this node" in errors[0]
    assert errors[0].startswith("config.plugins[0].ipam.addresses[0].address: ")
    assert judge(plugin, "data0", admin)[1] == []  # the admin's class says so


@given(st.integers(min_value=3, max_value=250).filter(lambda i: i not in (1, 2)))
def test_other_addresses_of_the_segment_pass(host: int) -> None:
    address = f"198.18.2.{host}/24"
    plugin = {"type": "macvlan", "ipam": {"type": "static", "addresses": [{"address": address}]}}
    assert judge(plugin, "data0")[1] == []


def test_prepare_judges_with_the_nodes_facts() -> None:
    """Through prepare's resolve_claim: the view's facts of the allocated link."""
    view = type(VIEW)(
        links={"eth1": "br-data"}, protected=VIEW.protected, facts=NodeFacts({"br-data": BRIDGE})
    )
    c = allocated_claim()
    policy, mine = c["status"]["allocation"]["devices"]["config"]
    policy["opaque"]["parameters"]["claims"]["plugins"] = ["bridge"]
    mine["opaque"]["parameters"]["config"]["plugins"] = [{"type": "bridge", "mtu": 68}]
    with pytest.raises(PrepareError, match=r"plugins\[0\]\.mtu: 68 differs from bridge br-data"):
        resolve_claim(c, REF, "n1", DIRS, view)
    mine["opaque"]["parameters"]["config"]["plugins"] = [{"type": "bridge"}]
    [dev] = resolve_claim(c, REF, "n1", DIRS, view).devices
    assert dev.network["plugins"][0]["mtu"] == 1500
    assert dev.network["plugins"][0]["bridge"] == "br-data"


# ------------------------------------------------------------------ what the policy refuses


SEGMENT = [
    ({"type": "ipvlan", "mode": "l3"}, "ipvlan mode is the parent's"),
    ({"type": "ipvlan", "mode": "l3s"}, "ipvlan mode is the parent's"),
    ({"type": "macvlan", "bcqueuelen": 100000}, "broadcast queue is the parent's"),
    ({"type": "macvlan", "mac": "02:00:00:00:00:01"}, "parent's address filter"),
    ({"type": "bridge", "mac": "02:00:00:00:00:01"}, "to the pod's port in the bridge"),
]


@pytest.mark.parametrize(("plugin", "says"), SEGMENT)
def test_a_setting_every_pod_on_the_parent_shares_needs_the_class(
    plugin: dict[str, Any], says: str
) -> None:
    found = errors(claim(network(plugin)))
    assert any(says in e and "claims.segmentSettings" in e for e in found), found
    opened = copy.deepcopy(DEFAULT_CLASSES[0])
    opened["metadata"]["name"] = "segment-settings"
    opened["spec"]["config"][0]["opaque"]["parameters"]["claims"]["segmentSettings"] = True
    assert errors(claim(network(plugin), "segment-settings"), [opened]) == []


def test_the_values_that_change_nothing_pass() -> None:
    assert errors(claim(network({"type": "ipvlan", "mode": "l2"}))) == []
    assert errors(claim(network({"type": "ipvlan"}))) == []


def test_a_mac_through_tunings_args_needs_the_class_too() -> None:
    tuning = {"type": "tuning", "args": {"cni": {"mac": "02:00:00:00:00:01"}}}
    found = errors(claim(network(MACVLAN, tuning)))
    assert any("plugins[1].args.cni.mac" in e and "segmentSettings" in e for e in found), found


@pytest.mark.parametrize("plugin", ["macvlan", "ipvlan", "vlan"])
def test_link_in_container_is_never_a_claims(plugin: str) -> None:
    conf: dict[str, Any] = {"type": plugin, "linkInContainer": True}
    if plugin == "vlan":
        conf["vlanId"] = 10
    found = errors(claim(network(conf)))
    assert any("linkInContainer: never claim-settable" in e for e in found), found


@pytest.mark.parametrize(
    "key",
    [
        "net.ipv4.conf.net1.proxy_arp",
        "net.ipv4.conf.all.proxy_arp_pvlan",
        "net.ipv6.conf.net1.proxy_ndp",
        "net/ipv4/conf/net1/proxy_arp",
        "net.netfilter.nf_hooks_lwtunnel",
    ],
)
def test_sysctls_that_reach_beyond_the_pod_are_refused(key: str) -> None:
    for tuning in (
        {"type": "tuning", "sysctl": {key: "1"}},
        {"type": "tuning", "args": {"cni": {"sysctl": {key: "1"}}}},
    ):
        found = errors(claim(network(MACVLAN, tuning)))
        assert any("never claim-settable" in e and key in e for e in found), found
    ok = {"type": "tuning", "sysctl": {"net.ipv4.conf.net1.rp_filter": "1"}}
    assert errors(claim(network(MACVLAN, ok))) == []


def test_a_tenants_static_addresses_come_from_ipam_addresses_only() -> None:
    """static reads args.cni.ips (and CNI_ARGS IP, runtimeConfig ips) over its own: prepare
    could not lease what the plugin would really use."""
    c = allocated_claim()
    policy, mine = c["status"]["allocation"]["devices"]["config"]
    policy["opaque"]["parameters"]["claims"]["plugins"] = ["macvlan", "static"]
    mine["opaque"]["parameters"].update(
        {
            "ifName": "net1",
            "config": {
                "cniVersion": "1.1.0",
                "name": "n",
                "plugins": [
                    {**MACVLAN, "args": {"cni": {"ips": ["198.18.2.2/24"]}}},
                ],
            },
        }
    )
    with pytest.raises(PrepareError, match=r"plugins\[0\]\.args\.cni\.ips: would replace"):
        resolve_claim(c, REF, "n1", DIRS, VIEW)


def test_an_admins_mtu_in_another_spelling_is_not_overridden() -> None:
    """Go reads `MTU` as `mtu` and keeps the last: a pinned `mtu` after it would win."""
    assert judge({"type": "bridge", "MTU": 9000}, "br-data", admin) == (
        {"type": "bridge", "MTU": 9000},
        [],
    )
