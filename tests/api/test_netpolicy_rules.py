"""Network policy compiled to a pod's nftables table (cnidra.api.netpolicy_rules), without a
kernel: the layout (admin tier before tenant, default deny only where a policy isolates),
which policies apply to which interface, and that pods and addresses changing is a set update
while a policy changing rewrites the table. tests/datapath/test_netpolicy.py proves the rules
with traffic."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra.api.netpolicy import (
    AdminNetworkPolicy,
    MultiNetworkPolicy,
    decode_admin_policy,
    decode_policy,
)
from cnidra.api.netpolicy_rules import (
    NamedPort,
    NetworkView,
    PodInterface,
    PodOnNetwork,
    Ruleset,
    UnenforceableInterface,
    compile_pod,
    delete_script,
    enforcement,
    host_interface,
    host_side,
    undoes_pod_side,
)

NET = "tenant-a/blue"


def mnp(spec: dict[str, Any], policy_for: str = NET, name: str = "p") -> MultiNetworkPolicy:
    policy, issues = decode_policy(
        {
            "apiVersion": "k8s.cni.cncf.io/v1beta1",
            "kind": "MultiNetworkPolicy",
            "metadata": {
                "name": name,
                "namespace": "tenant-a",
                "annotations": {"k8s.v1.cni.cncf.io/policy-for": policy_for},
            },
            "spec": spec,
        }
    )
    assert policy is not None, issues.items
    return policy


def admin(spec: dict[str, Any]) -> AdminNetworkPolicy:
    policy, issues = decode_admin_policy(
        {
            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
            "kind": "CNIAdminNetworkPolicy",
            "metadata": {"name": "adm"},
            "spec": {"priority": 1, "subject": {"namespaces": {}}, "networks": [NET], **spec},
        }
    )
    assert policy is not None, issues.items
    return policy


DB = PodOnNetwork(
    "tenant-a", "db", {"app": "db"}, ("198.18.0.1/24",), (NamedPort("pg", "TCP", 5432),)
)
WEB = PodOnNetwork("tenant-a", "web", {"app": "web"}, ("198.18.0.2/24", "2001:db8::2/64"))
OTHER = PodOnNetwork("tenant-b", "web", {"app": "web"}, ("198.18.0.3/24",))


def view(*pods: PodOnNetwork, key: str = NET) -> NetworkView:
    return NetworkView(key, pods, {"tenant-a": {"team": "a"}, "tenant-b": {"team": "b"}})


def chains(rs: Ruleset) -> dict[str, tuple[str, ...]]:
    return {c.name: c.rules for c in rs.chains}


def compiled(*policies: MultiNetworkPolicy, admins: tuple[AdminNetworkPolicy, ...] = ()) -> Ruleset:
    return compile_pod(DB, [PodInterface("net1", view(DB, WEB, OTHER))], policies, admins)


def test_no_policy_accepts_everything_and_counts_it() -> None:
    c = chains(compiled())
    assert c["input"] == ('iifname "net1" jump if0_in',)
    assert c["if0_in"][-1] == 'counter accept comment "no policy isolates ingress"'
    assert c["if0_out"][-1] == 'counter accept comment "no policy isolates egress"'
    assert c["if0_in"][0] == "ct state established,related accept"


def test_a_selecting_policy_isolates_its_directions_only() -> None:
    c = chains(compiled(mnp({"podSelector": {}})))
    assert c["if0_in"][-2:] == (
        "jump if0_in_tenant",
        'counter drop comment "default-deny ingress (tenant-a/p)"',
    )
    assert c["if0_in_tenant"] == ()
    assert c["if0_out"][-1].endswith('"no policy isolates egress"')


def test_policies_for_other_networks_or_pods_do_not_apply() -> None:
    for policy in (
        mnp({"podSelector": {}}, policy_for="tenant-a/red"),
        mnp({"podSelector": {"matchLabels": {"app": "web"}}}),
    ):
        assert chains(compiled(policy))["if0_in"][-1].endswith('"no policy isolates ingress"')


def test_admin_tier_comes_before_the_tenant_tier() -> None:
    rs = compiled(
        mnp({"podSelector": {}, "ingress": [{}]}),
        admins=(admin({"ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}),),
    )
    top = chains(rs)["if0_in"]
    assert top.index("jump if0_in_admin") < top.index("jump if0_in_tenant")
    (deny4, deny6) = chains(rs)["if0_in_admin"]
    assert deny4.startswith("ip saddr @if0_in_a_0_p4 ") and deny4.endswith(
        'counter drop comment "admin/adm ingress[0]"'
    )
    assert deny6.startswith("ip6 saddr @if0_in_a_0_p6 ")
    sets = {s.name: s.elements for s in rs.sets}
    assert sets["if0_in_a_0_p4"] == {"198.18.0.1", "198.18.0.2", "198.18.0.3"}


def test_peers_ports_and_named_ports() -> None:
    rs = compiled(
        mnp(
            {
                "podSelector": {},
                "ingress": [
                    {
                        "from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                        "ports": [
                            {"port": "pg"},
                            {"protocol": "UDP", "port": 1000, "endPort": 1010},
                        ],
                    }
                ],
                "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "pg"}]}],
            }
        )
    )
    sets = {s.name: s for s in rs.sets}
    assert sets["if0_in_t_0_p4"].elements == {"198.18.0.2"}  # not tenant-b's web
    assert sets["if0_in_t_0_p6"].elements == {"2001:db8::2"}
    assert (
        "ip saddr @if0_in_t_0_p4 meta l4proto tcp th dport { 5432 } counter accept comment "
        '"tenant-a/p ingress[0]"'
    ) in chains(rs)["if0_in_tenant"]
    assert any("meta l4proto udp th dport { 1000-1010 }" in r for r in chains(rs)["if0_in_tenant"])
    # egress to a named port: each peer's own port; only db names pg
    assert sets["if0_out_t_0_n4"].elements == {"198.18.0.1 . tcp . 5432"}


def test_ip_block_except_is_an_interval_set_without_the_hole() -> None:
    rs = compiled(
        mnp(
            {
                "podSelector": {},
                "ingress": [
                    {"from": [{"ipBlock": {"cidr": "198.18.0.0/24", "except": ["198.18.0.0/25"]}}]}
                ],
            }
        )
    )
    (block,) = [s for s in rs.sets if s.name == "if0_in_t_0_b4"]
    assert block.interval and block.elements == {"198.18.0.128/25"}


def test_several_interfaces_get_chains_of_their_own() -> None:
    rs = compile_pod(
        DB,
        [PodInterface("net1", view(DB, WEB)), PodInterface("net2", view(DB, key="tenant-a/red"))],
        [mnp({"podSelector": {}}, policy_for="tenant-a/red")],
    )
    c = chains(rs)
    assert c["input"] == ('iifname "net1" jump if0_in', 'iifname "net2" jump if1_in')
    assert c["if0_in"][-1].endswith('"no policy isolates ingress"')
    assert c["if1_in"][-1].startswith("counter drop")


def test_the_script_replaces_the_table_in_one_batch() -> None:
    script = compiled(mnp({"podSelector": {}})).script()
    assert script.splitlines()[:3] == [
        "add table inet cnidra",
        "delete table inet cnidra",
        "table inet cnidra {",
    ]
    assert delete_script() == "add table inet cnidra\ndelete table inet cnidra\n"


POLICY = mnp(
    {
        "podSelector": {},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}],
        "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "pg"}]}],
    }
)
ADDRESSES = st.lists(
    st.integers(2, 250).map(lambda n: f"198.18.1.{n}/24"), max_size=3, unique=True
).map(tuple)
PODS = st.lists(
    st.tuples(
        st.sampled_from(["tenant-a", "tenant-b"]), st.sampled_from(["web", "db", "x"]), ADDRESSES
    ),
    max_size=6,
    unique_by=lambda t: (t[0], t[1]),
)


def _view(pods: list[tuple[str, str, tuple[str, ...]]]) -> NetworkView:
    return view(
        DB,
        *(
            PodOnNetwork(ns, f"{name}-{i}", {"app": name}, addrs, (NamedPort("pg", "TCP", 5432),))
            for i, (ns, name, addrs) in enumerate(pods)
        ),
    )


@settings(max_examples=100, deadline=None)
@given(PODS, PODS)
def test_pods_coming_going_and_moving_are_set_updates(
    before: list[tuple[str, str, tuple[str, ...]]], after: list[tuple[str, str, tuple[str, ...]]]
) -> None:
    old = compile_pod(DB, [PodInterface("net1", _view(before))], [POLICY])
    new = compile_pod(DB, [PodInterface("net1", _view(after))], [POLICY])
    script = new.update_from(old)
    assert old.shape() == new.shape()
    for line in script.splitlines():
        assert line.startswith(("add element inet cnidra ", "delete element inet cnidra "))
    # replaying the update on the old sets gives the new ones
    sets = {s.name: set(s.elements) for s in old.sets}
    for line in script.splitlines():
        verb, _, _, _, name, rest = line.split(" ", 5)
        elements = {e.strip() for e in rest.strip("{} ").split(",")}
        if verb == "add":
            sets[name] |= elements
        else:
            sets[name] -= elements
    assert sets == {s.name: set(s.elements) for s in new.sets}
    assert new.update_from(new) == ""


def test_a_policy_change_rewrites_the_rules_in_place() -> None:
    """Rules flushed and written again in one batch; sets both have stay (their elements
    changed), sets and chains only the old one has go; no old state: the whole table."""
    old = compiled(POLICY)
    narrower = mnp(
        {
            "podSelector": {},
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 1}]}
            ],
        }
    )
    script = compiled(narrower).update_from(old).splitlines()
    assert script[0] == "flush table inet cnidra"
    assert "delete chain inet cnidra if0_out_tenant" in script
    assert not any(line.startswith("delete set") for line in script)  # afterwards
    assert not any("set inet cnidra if0_in_t_0_p4 " in line for line in script)  # kept
    assert compiled(narrower).leftovers(old).splitlines() == [
        "delete set inet cnidra if0_out_t_0_n4",
        "delete set inet cnidra if0_out_t_0_n6",
    ]
    assert compiled(narrower).leftovers(compiled(narrower)) == ""
    assert compiled(narrower).update_from(None) == compiled(narrower).script()


def test_where_policy_is_enforced_or_refused() -> None:
    assert enforcement("macvlan").where == "pod"
    assert "CAP_NET_ADMIN" in enforcement("ipvlan").caveat
    assert enforcement("bridge").where == "pod"  # unless the driver enforces bridges on the host
    assert enforcement("bridge", bridge_on_host=True).where == "host"
    assert "nf_call_iptables" in enforcement("bridge", bridge_on_host=True).caveat
    assert enforcement("sriov", kernel_netdev=False).where is None
    assert "vfio-pci" in enforcement("sriov", kernel_netdev=False).refused
    assert enforcement("dpdk").where is None
    assert "not known" in enforcement("someone-elses").refused


def test_pods_that_could_undo_pod_side_enforcement_are_named() -> None:
    spec = {
        "initContainers": [
            {"name": "setup", "securityContext": {"capabilities": {"add": ["CAP_NET_ADMIN"]}}}
        ],
        "containers": [
            {"name": "app"},
            {"name": "priv", "securityContext": {"privileged": True}},
            {"name": "all", "securityContext": {"capabilities": {"add": ["all"]}}},
            {"name": "raw", "securityContext": {"capabilities": {"add": ["NET_RAW"]}}},
        ],
    }
    assert undoes_pod_side(spec) == ["setup", "priv", "all"]
    assert undoes_pod_side({"containers": [{"name": "app"}]}) == []


def test_what_a_user_writes_cannot_break_out_of_a_comment() -> None:
    rs = compiled(
        admins=(
            admin(
                {
                    "ingress": [
                        {
                            "name": 'x" accept\nadd rule inet cnidra input accept #\\',
                            "action": "Deny",
                            "from": [{"namespaces": {}}],
                        }
                    ]
                }
            ),
        )
    )
    (line, _) = chains(rs)["if0_in_admin"]
    assert line.endswith(
        'comment "admin/adm ingress[0] x_ accept_add rule inet cnidra input accept __"'
    )
    assert line.count('"') == 2 and "\n" not in line and "\\" not in line


def test_an_interface_name_nft_cannot_match_exactly_is_refused() -> None:
    for bad in ('net"1', "net\\1", "nét1", "net 1"):
        with pytest.raises(UnenforceableInterface, match="cannot match exactly"):
            compile_pod(DB, [PodInterface(bad, view(DB))], [])


def test_a_routed_veths_table_moves_to_the_hosts_end() -> None:
    pod = PodOnNetwork("tenant-a", "a", {"app": "db"}, ("198.18.44.1",))
    view = NetworkView(NET, (pod,), {})
    ruleset = compile_pod(pod, [PodInterface("net1", view)], [mnp({"podSelector": {}})])
    moved = host_side(ruleset, "veth1234", "cnidra_hx")
    base = {c.name: (c.hook, c.rules) for c in moved.chains if c.hook}
    assert base == {
        "forward": (
            "forward",
            ('oifname "veth1234" jump if0_in', 'iifname "veth1234" jump if0_out'),
        ),
        "input": ("input", ('iifname "veth1234" jump if0_out',)),
        "output": ("output", ('oifname "veth1234" jump if0_in',)),
    }
    # the rest as compiled: the same chains and sets, in a table of the host's
    assert [c for c in moved.chains if not c.hook] == [c for c in ruleset.chains if not c.hook]
    assert moved.sets == ruleset.sets and moved.table == "cnidra_hx"
    with pytest.raises(UnenforceableInterface):
        host_side(ruleset, 'veth"x', "cnidra_hx")


def test_ptp_is_enforced_on_the_hosts_end_bridge_in_the_pod() -> None:
    assert enforcement("ptp").where == "host"
    assert enforcement("bridge").where == "pod"  # no bridge conntrack assumed (docs)
    result = {
        "interfaces": [
            {"name": "veth1234", "mac": "02:00:00:00:00:01"},
            {"name": "net1", "sandbox": "/run/netns/x"},
        ]
    }
    assert host_interface("ptp", result) == "veth1234"
    assert host_interface("macvlan", result) is None
    assert host_interface("ptp", {"interfaces": [{"name": "net1", "sandbox": "/x"}]}) is None
    assert host_interface("ptp", None) is None
