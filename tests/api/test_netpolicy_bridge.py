"""The compiler's part of a bridge interface's host-side policy (issue 43): the pod's port read
from the bridge plugin's CNI result (`bridge_port`, which parses what a plugin answered, so it
is fuzzed), its rules keyed on its addresses (`bridge_host_side`), its anti-spoofing `bridge`
table (`anti_spoof_script`), and the names of the tables and marks. Pure: the kernel's answer to
them is tests/datapath/test_netpolicy_bridge.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra.api.netpolicy import decode_policy
from cnidra.api.netpolicy_node import (
    bridge_mark,
    family_of,
    host_table_name,
    marked_bridge,
    spoof_table_name,
    table_name,
)
from cnidra.api.netpolicy_rules import (
    BridgePort,
    NetworkView,
    PodInterface,
    PodOnNetwork,
    UnenforceableInterface,
    anti_spoof_script,
    bridge_host_side,
    bridge_port,
    compile_pod,
    link_local,
)

MAC = "0a:58:c6:12:00:05"
PLUGIN = {"type": "bridge", "bridge": "br-blue"}


def result(**changes: Any) -> dict[str, Any]:
    """As the bridge plugin answers: the bridge, the host's end of the veth, the pod's end."""
    answer: dict[str, Any] = {
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "br-blue", "mac": "02:00:00:00:00:aa"},
            {"name": "veth1234", "mac": "02:00:00:00:00:bb"},
            {"name": "net1", "mac": MAC.upper(), "sandbox": "/var/run/netns/x"},
        ],
        "ips": [
            {"address": "198.18.7.5/24", "interface": 2},
            {"address": "2001:db8:7::5/64", "interface": 2},
        ],
    }
    answer.update(changes)
    return answer


def test_the_port_is_read_from_the_plugins_result() -> None:
    port = bridge_port(PLUGIN, result())
    assert port == BridgePort("br-blue", "veth1234", MAC, ("198.18.7.5/24", "2001:db8:7::5/64"))
    assert port.ips(4) == ["198.18.7.5"]
    assert port.ips(6) == ["2001:db8:7::5", "fe80::858:c6ff:fe12:5"]  # and its link-local
    assert link_local("02:00:00:00:00:01") == "fe80::ff:fe00:1"


def test_the_plugins_default_bridge_is_not_the_port() -> None:
    answer = result()
    answer["interfaces"][0]["name"] = "cni0"
    port = bridge_port({"type": "bridge"}, answer)
    assert port is not None and (port.bridge, port.port) == ("cni0", "veth1234")


@pytest.mark.parametrize(
    ("plugin", "answer"),
    [
        (PLUGIN, None),
        (PLUGIN, result(ips=[])),  # nothing to key the rules on: the pod's namespace
        (PLUGIN, result(interfaces=result()["interfaces"][1:])),  # bridge not named: two
        ({"type": "bridge", "bridge": "other"}, result()),  # two host interfaces
        (PLUGIN, result(interfaces=result()["interfaces"][:2])),  # no pod interface
        (
            PLUGIN,
            result(interfaces=[*result()["interfaces"][:2], {"name": "net1", "sandbox": "x"}]),
        ),
        (PLUGIN, result(ips=[{"address": "not an address", "interface": 2}])),
        ({**PLUGIN, "vlanTrunk": [{"id": 10}]}, result()),  # tagged frames: not for br_netfilter
    ],
)
def test_a_result_that_does_not_say_enough_is_no_port(
    plugin: dict[str, Any], answer: dict[str, Any] | None
) -> None:
    assert bridge_port(plugin, answer) is None


def compiled(ifname: str = "net1") -> Any:
    policy, _ = decode_policy(
        {
            "apiVersion": "k8s.cni.cncf.io/v1beta1",
            "kind": "MultiNetworkPolicy",
            "metadata": {
                "namespace": "t",
                "name": "p",
                "annotations": {"k8s.v1.cni.cncf.io/policy-for": "t/blue"},
            },
            "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 80}]}]},
        }
    )
    assert policy is not None
    me = PodOnNetwork("t", "me", {}, ("198.18.7.5",))
    view = NetworkView("t/blue", (me,), {})
    return compile_pod(me, [PodInterface(ifname, view)], [policy])


def test_the_pods_rules_are_keyed_on_its_addresses_on_the_host() -> None:
    port = bridge_port(PLUGIN, result())
    assert port is not None
    moved = bridge_host_side(compiled(), port, "cnidra_hx")
    chains = {c.name: c for c in moved.chains}
    v4, v6 = "{ 198.18.7.5 }", "{ 2001:db8:7::5, fe80::858:c6ff:fe12:5 }"
    assert chains["forward"].hook == "forward"
    assert chains["forward"].rules == (
        f"ip daddr {v4} jump if0_in",
        f"ip6 daddr {v6} jump if0_in",
        f"ip saddr {v4} jump if0_out",
        f"ip6 saddr {v6} jump if0_out",
    )
    assert chains["input"].rules == (f"ip saddr {v4} jump if0_out", f"ip6 saddr {v6} jump if0_out")
    assert chains["output"].rules == (f"ip daddr {v4} jump if0_in", f"ip6 daddr {v6} jump if0_in")
    assert not any(
        "iifname" in r or "oifname" in r for c in moved.chains if c.hook for r in c.rules
    )
    inner = [c for c in compiled().chains if c.hook is None]
    assert [c for c in moved.chains if c.hook is None] == inner  # the pod's rules as compiled
    assert moved.table == "cnidra_hx"


def test_the_port_lets_through_only_the_pods_own_addresses() -> None:
    port = bridge_port(PLUGIN, result())
    assert port is not None
    script = anti_spoof_script(port, "cnidra_sx").splitlines()
    assert script[:3] == [
        "add table bridge cnidra_sx",
        "delete table bridge cnidra_sx",
        "table bridge cnidra_sx {",
    ]
    chain = script[3]
    assert "type filter hook prerouting priority filter; policy accept;" in chain
    for match in (
        f'iifname "veth1234" ether saddr != {MAC} counter drop',
        'iifname "veth1234" ether type { 8021q, 8021ad } counter drop',
        "ip saddr != { 0.0.0.0, 198.18.7.5 } counter drop",
        "arp saddr ip != { 0.0.0.0, 198.18.7.5 } counter drop",
        f"arp saddr ether != {MAC} counter drop",
        "ip6 saddr != { ::, 2001:db8:7::5, fe80::858:c6ff:fe12:5 } counter drop",
        "icmpv6 type nd-neighbor-advert @th,64,128 != { 0x20010db8000700000000000000000005, "
        "0xfe800000000000000858c6fffe120005 } counter drop",
    ):
        assert match in chain


def test_names_nft_cannot_match_exactly_are_refused() -> None:
    port = BridgePort("br-blue", 'veth"x', MAC, ("198.18.7.5/24",))
    with pytest.raises(UnenforceableInterface):
        bridge_host_side(compiled(), port, "t")
    with pytest.raises(UnenforceableInterface):
        anti_spoof_script(port, "t")
    with pytest.raises(UnenforceableInterface):
        anti_spoof_script(BridgePort("br", "veth1", "zz:zz", ("198.18.7.5/24",)), "t")
    with pytest.raises(UnenforceableInterface):  # no line break smuggled into the script
        anti_spoof_script(BridgePort("br", "veth1", MAC + "\n", ("198.18.7.5/24",)), "t")


def test_table_names_say_their_family() -> None:
    assert family_of(spoof_table_name("t/blue", "veth1")) == "bridge"
    assert family_of(bridge_mark("br-blue")) == "bridge"
    assert family_of(host_table_name("t/blue", "veth1")) == "inet"
    # a pod's table is cnidra_ and 12 hex, which may begin with b: never taken for a mark
    assert all(family_of(table_name(f"t/{n}")) == "inet" for n in range(200))
    assert spoof_table_name("t/blue", "veth1") != spoof_table_name("t/blue", "veth2")
    assert marked_bridge(bridge_mark("br-blue")) == "br-blue"
    assert marked_bridge("cnidra_mzz") is None and marked_bridge("other") is None


@given(st.text(min_size=1, max_size=15))
def test_a_mark_names_its_bridge(bridge: str) -> None:
    assert marked_bridge(bridge_mark(bridge)) == bridge


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 5) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
NAMES = st.sampled_from(["br-blue", "cni0", "veth1234", "net1", 'x"y', "", "eth0 "])
INTERFACE = st.fixed_dictionaries(
    {"name": NAMES},
    optional={
        "mac": st.sampled_from([MAC, MAC.upper(), "zz", "", "02:00:00:00:00:0g", MAC + "\n"])
        | JSONISH,
        "sandbox": st.sampled_from(["/var/run/netns/x", ""]) | JSONISH,
    },
)
IP = st.fixed_dictionaries(
    {
        "address": st.sampled_from(
            ["198.18.7.5/24", "2001:db8::1/64", "198.18.7.5", "300.1.1.1/8", "", "fe80::1/64"]
        )
        | JSONISH
    },
    optional={"interface": st.integers(-1, 4) | JSONISH},
)
RESULTS = st.fixed_dictionaries(
    {},
    optional={
        "interfaces": st.lists(INTERFACE | JSONISH, max_size=4) | JSONISH,
        "ips": st.lists(IP | JSONISH, max_size=3) | JSONISH,
    },
)


@settings(max_examples=400, deadline=None)
@given(RESULTS, st.sampled_from([PLUGIN, {"type": "bridge"}, {**PLUGIN, "vlanTrunk": [{}]}]))
def test_any_result_gives_a_port_that_holds_or_none(
    answer: dict[str, Any], plugin: dict[str, Any]
) -> None:
    """Whatever a plugin answered: no port (enforced in the pod's namespace), or a port whose
    tables are written, or refused as UnenforceableInterface; never another exception, never a
    port without an address, a MAC or its own name in every rule."""
    try:
        port = bridge_port(plugin, answer)
    except (TypeError, AttributeError) as exc:  # pragma: no cover - the property's failure
        pytest.fail(f"bridge_port raised {exc!r} on {answer!r}")
    if port is None:
        return
    assert port.addresses and port.port != port.bridge and port.mac == port.mac.lower()
    try:
        script = anti_spoof_script(port, "cnidra_sx")
        moved = bridge_host_side(compiled(), port, "cnidra_hx")
    except UnenforceableInterface:
        return
    rules = script.split("chain prerouting", 1)[1].split("; ")[1:-1]
    assert all(r.startswith(f'iifname "{port.port}"') for r in rules if "drop" in r)
    forward = next(c for c in moved.chains if c.name == "forward")
    assert forward.rules and all(" @" not in r and "jump if0_" in r for r in forward.rules)
