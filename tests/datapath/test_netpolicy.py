"""Network policy proved with real traffic (cnidra.api.netpolicy_rules compiled, applied by
cnidra.datapath.netpolicy with nft in each pod's namespace): three pods on a bridge
(tests/datapath/policylab.py), TCP and UDP probes in both directions, and a table of
(policies, probes, expected) rows that is the semantics (docs/network-policy.md has it too).

The pods: a (namespace tenant-a, app=db), b (tenant-a, app=web), c (tenant-b, app=web); their
namespaces are labelled team=a and team=b; every pod names TCP 8080 `http` and UDP 5353 `dns`.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest

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
    compile_pod,
)
from cnidra.cni import netns
from cnidra.datapath import netpolicy
from tests.datapath.policylab import IFNAME, Lab, lab, socket_in, stream

pytestmark = pytest.mark.netns

NETWORK = "tenant-a/blue"
NAMESPACES = {"a": "tenant-a", "b": "tenant-a", "c": "tenant-b"}
LABELS = {"a": {"app": "db"}, "b": {"app": "web"}, "c": {"app": "web"}}
NAMESPACE_LABELS = {"tenant-a": {"team": "a"}, "tenant-b": {"team": "b"}}
PORTS = (NamedPort("http", "TCP", 8080), NamedPort("dns", "UDP", 5353))


def mnp(
    spec: dict[str, Any], namespace: str = "tenant-a", policy_for: str = NETWORK
) -> MultiNetworkPolicy:
    doc = {
        "apiVersion": "k8s.cni.cncf.io/v1beta1",
        "kind": "MultiNetworkPolicy",
        "metadata": {
            "name": f"p{abs(hash(repr(spec))) % 10_000}",
            "namespace": namespace,
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": policy_for},
        },
        "spec": spec,
    }
    policy, issues = decode_policy(doc)
    assert policy is not None, issues.items
    return policy


def admin(priority: int, ingress: list[dict[str, Any]], name: str = "adm") -> AdminNetworkPolicy:
    doc = {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIAdminNetworkPolicy",
        "metadata": {"name": name},
        "spec": {
            "priority": priority,
            "subject": {"namespaces": {}},
            "networks": [NETWORK],
            "ingress": ingress,
        },
    }
    policy, issues = decode_admin_policy(doc)
    assert policy is not None, issues.items
    return policy


DB = {"matchLabels": {"app": "db"}}
WEB = {"matchLabels": {"app": "web"}}
TEAM_B = {"matchLabels": {"team": "b"}}


def view(lab_: Lab) -> NetworkView:
    return NetworkView(
        NETWORK,
        tuple(
            PodOnNetwork(
                NAMESPACES[p], p, LABELS[p], (lab_.addresses[p], lab_.addresses6[p]), PORTS
            )
            for p in sorted(lab_.pods)
        ),
        NAMESPACE_LABELS,
    )


def compile_for(
    lab_: Lab, pod: str, tenant: list[MultiNetworkPolicy], admins: list[AdminNetworkPolicy]
) -> Ruleset:
    v = view(lab_)
    me = next(p for p in v.pods if p.name == pod)
    return compile_pod(me, [PodInterface(IFNAME, v)], tenant, admins)


def enforce(
    lab_: Lab,
    tenant: list[MultiNetworkPolicy],
    admins: list[AdminNetworkPolicy] = (),  # type: ignore[assignment]
    previous: dict[str, Ruleset] | None = None,
) -> dict[str, Ruleset]:
    applied = {}
    for pod, ns in lab_.pods.items():
        rs = compile_for(lab_, pod, tenant, list(admins))
        netpolicy.apply(ns, rs, (previous or {}).get(pod))
        applied[pod] = rs
    return applied


# (what the row shows, tenant policies, admin policies, [(src, dst, proto, port, expected)])
Row = tuple[
    str, list[MultiNetworkPolicy], list[AdminNetworkPolicy], list[tuple[str, str, str, int, bool]]
]
ROWS: list[Row] = [
    (
        "no policy selects a pod: unrestricted both ways",
        [],
        [],
        [
            ("b", "a", "tcp", 5432, True),
            ("c", "a", "udp", 5353, True),
            ("a", "c", "tcp", 8080, True),
        ],
    ),
    (
        "default deny ingress (podSelector, no rules): nothing in, egress unaffected",
        [mnp({"podSelector": DB})],
        [],
        [
            ("b", "a", "tcp", 5432, False),
            ("c", "a", "udp", 5353, False),
            ("a", "b", "tcp", 5432, True),
            ("a", "c", "udp", 5353, True),
            ("c", "b", "tcp", 5432, True),  # b is not selected
        ],
    ),
    (
        "default deny egress (policyTypes Egress): nothing out, ingress unaffected",
        [mnp({"podSelector": DB, "policyTypes": ["Egress"]})],
        [],
        [
            ("a", "b", "tcp", 5432, False),
            ("a", "c", "udp", 5353, False),
            ("b", "a", "tcp", 5432, True),
        ],
    ),
    (
        "podSelector peer: pods of the policy's namespace only",
        [mnp({"podSelector": DB, "ingress": [{"from": [{"podSelector": WEB}]}]})],
        [],
        [
            ("b", "a", "tcp", 5432, True),
            ("b", "a", "udp", 9000, True),
            ("c", "a", "tcp", 5432, False),
        ],
    ),
    (
        "IPv6: pods' IPv6 addresses are peers too; neighbour discovery passes a default deny",
        [mnp({"podSelector": DB, "ingress": [{"from": [{"podSelector": WEB}]}]})],
        [],
        [
            ("b", "a", "tcp6", 5432, True),
            ("b", "a", "udp6", 9000, True),
            ("c", "a", "tcp6", 5432, False),
            ("a", "c", "tcp6", 5432, True),
        ],
    ),
    (
        "IPv6 default deny both ways: ND still passes, nothing else",
        [mnp({"podSelector": DB, "policyTypes": ["Ingress", "Egress"]})],
        [],
        [
            ("b", "a", "tcp6", 5432, False),
            ("a", "b", "udp6", 5353, False),
            ("b", "c", "tcp6", 8080, True),
        ],
    ),
    (
        "namespaceSelector peer: every pod of the selected namespaces",
        [mnp({"podSelector": DB, "ingress": [{"from": [{"namespaceSelector": TEAM_B}]}]})],
        [],
        [("c", "a", "tcp", 5432, True), ("b", "a", "tcp", 5432, False)],
    ),
    (
        "namespaceSelector and podSelector in one peer: both must match",
        [
            mnp(
                {
                    "podSelector": DB,
                    "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": WEB}]}],
                }
            )
        ],
        [],
        [("c", "a", "tcp", 5432, True), ("b", "a", "udp", 5353, True)],
    ),
    (
        "ipBlock with except: the CIDR without the exception",
        [
            mnp(
                {
                    "podSelector": DB,
                    "ingress": [
                        {
                            "from": [
                                {
                                    "ipBlock": {
                                        "cidr": "198.18.43.0/24",
                                        "except": ["198.18.43.3/32"],
                                    }
                                }
                            ]
                        }
                    ],
                }
            )
        ],
        [],
        [("b", "a", "tcp", 5432, True), ("c", "a", "tcp", 5432, False)],
    ),
    (
        "named port (ingress): the selected pod's own port of that name",
        [mnp({"podSelector": DB, "ingress": [{"ports": [{"port": "http"}]}]})],
        [],
        [
            ("b", "a", "tcp", 8080, True),
            ("b", "a", "tcp", 5432, False),
            ("c", "a", "tcp", 8080, True),
        ],
    ),
    (
        "endPort range, TCP only: inside the range, not above it, not UDP",
        [mnp({"podSelector": DB, "ingress": [{"ports": [{"port": 3000, "endPort": 3100}]}]})],
        [],
        [
            ("b", "a", "tcp", 3050, True),
            ("b", "a", "tcp", 3200, False),
            ("b", "a", "udp", 9000, False),
        ],
    ),
    (
        "protocol UDP: that protocol's port only",
        [mnp({"podSelector": DB, "ingress": [{"ports": [{"protocol": "UDP", "port": 5353}]}]})],
        [],
        [
            ("b", "a", "udp", 5353, True),
            ("b", "a", "tcp", 5432, False),
            ("b", "a", "udp", 9000, False),
        ],
    ),
    (
        "named port (egress): the peer pod's port of that name, to the selected peers only",
        [
            mnp(
                {
                    "podSelector": DB,
                    "policyTypes": ["Egress"],
                    "egress": [{"to": [{"podSelector": WEB}], "ports": [{"port": "http"}]}],
                }
            )
        ],
        [],
        [
            ("a", "b", "tcp", 8080, True),
            ("a", "b", "tcp", 5432, False),
            ("a", "c", "tcp", 8080, False),
        ],
    ),
    (
        "two policies select a pod: the union of what they allow",
        [
            mnp({"podSelector": DB, "ingress": [{"from": [{"podSelector": WEB}]}]}),
            mnp({"podSelector": DB, "ingress": [{"from": [{"namespaceSelector": TEAM_B}]}]}),
        ],
        [],
        [("b", "a", "tcp", 5432, True), ("c", "a", "tcp", 5432, True)],
    ),
    (
        "a policy for another network does not apply here",
        [mnp({"podSelector": DB}, policy_for="tenant-a/red")],
        [],
        [("b", "a", "tcp", 5432, True)],
    ),
    (
        "admin Deny: a tenant allow-all cannot widen it",
        [mnp({"podSelector": DB, "ingress": [{}]})],
        [admin(10, [{"action": "Deny", "from": [{"namespaces": TEAM_B}]}])],
        [
            ("c", "a", "tcp", 5432, False),
            ("c", "a", "udp", 5353, False),
            ("b", "a", "tcp", 5432, True),
        ],
    ),
    (
        "admin Allow: a tenant default deny cannot narrow it",
        [mnp({"podSelector": DB})],
        [admin(10, [{"action": "Allow", "from": [{"namespaces": TEAM_B}]}])],
        [("c", "a", "tcp", 5432, True), ("b", "a", "tcp", 5432, False)],
    ),
    (
        "admin Pass: on to the tenant tier, whose default deny then holds; priority orders",
        [mnp({"podSelector": DB})],
        [
            admin(5, [{"action": "Pass", "from": [{"namespaces": TEAM_B}]}], name="first"),
            admin(9, [{"action": "Allow", "from": [{"namespaces": {}}]}], name="later"),
        ],
        [("c", "a", "tcp", 5432, False), ("b", "a", "tcp", 5432, True)],
    ),
]


@pytest.mark.parametrize(("what", "tenant", "admins", "probes"), ROWS, ids=[r[0] for r in ROWS])
def test_semantics(
    what: str,
    tenant: list[MultiNetworkPolicy],
    admins: list[AdminNetworkPolicy],
    probes: list[tuple[str, str, str, int, bool]],
) -> None:
    with lab() as lab_:
        enforce(lab_, tenant, admins)
        got = lab_.probes([(s, d, p, n) for s, d, p, n, _ in probes])
        wrong = [
            f"{s}->{d} {p}/{n}: expected {'pass' if e else 'blocked'}"
            for (s, d, p, n, e), g in zip(probes, got, strict=True)
            if g != e
        ]
        assert not wrong, f"{what}: " + "; ".join(wrong)


def test_a_policy_edit_never_opens_a_window() -> None:
    """Datagrams from b (allowed) and from c (denied) stream to a while a's policy is rewritten
    40 times, whole, between two shapes that both allow b and deny c: every one of b's arrives
    and none of c's (no moment with half a policy, nor with none). An established TCP
    connection keeps working through the edits, and after an edit that denies b it still does
    (conntrack: established traffic stays allowed), while a new connection is refused."""
    by_pod = mnp({"podSelector": DB, "ingress": [{"from": [{"podSelector": WEB}]}]})
    by_block = mnp(
        {"podSelector": DB, "ingress": [{"from": [{"ipBlock": {"cidr": "198.18.43.2/32"}}]}]}
    )
    with lab() as lab_:
        applied = enforce(lab_, [by_pod])
        conn = socket_in(lab_.pods["b"], socket.SOCK_STREAM)
        conn.settimeout(2)
        with conn:
            conn.connect((lab_.addresses["a"], 5432))
            with stream(lab_, "a", 9999, ("b", "c")) as flow:
                for i in range(40):
                    new = compile_for(lab_, "a", [by_block if i % 2 == 0 else by_pod], [])
                    script = netpolicy.apply(lab_.pods["a"], new, applied["a"])
                    assert script.startswith("flush table")  # the rules rewritten in place
                    applied["a"] = new
                    conn.sendall(b"ping")
                    assert conn.recv(16) == b"ping"
                    # datagrams between each edit and the next, however slowly a loaded
                    # machine runs the sender (not a total it may not reach in 40 edits)
                    sent = flow.sent
                    deadline = time.monotonic() + 30
                    while flow.sent < sent + 8 and time.monotonic() < deadline:
                        time.sleep(0.002)
            assert flow.sent > 300
            # every one of b's, but for those the kernel dropped outside nftables (a loaded
            # machine's full queues: 1 of 1,272 was seen once during a clean-clone `make test`
            # beside three other test runs), and one more: with the test's CPU throttled to
            # 30 % of a core, 1 of 1,448 went missing with no counter saying where, in 1 run of
            # 5 (a policy's drop is never a kernel counter's; a window in an edit would drop
            # b's datagrams for as long as it lasts, and let c's in, which stays refused)
            lost = flow.sent - flow.got[lab_.addresses["b"]]
            assert 0 <= lost <= flow.kernel_drops + 1, (flow.got, flow.sent, flow.kernel_drops)
            assert flow.got[lab_.addresses["c"]] == 0, (flow.got, flow.sent)
            deny_all = compile_for(lab_, "a", [mnp({"podSelector": DB})], [])
            netpolicy.apply(lab_.pods["a"], deny_all, applied["a"])
            conn.sendall(b"still")
            assert conn.recv(16) == b"still"
            assert lab_.probe("b", "a", "tcp", 5432) is False


def test_an_address_change_is_a_set_update() -> None:
    """b moves to a new address: a's table changes by set elements only (the old address
    deleted, the new one added), and b is allowed again at its new address."""
    allow_b = mnp({"podSelector": DB, "ingress": [{"from": [{"podSelector": WEB}]}]})
    with lab() as lab_:
        applied = enforce(lab_, [allow_b])
        assert lab_.probe("b", "a", "tcp", 5432)
        lab_.readdress("b", "198.18.43.12")
        assert not lab_.probe("b", "a", "tcp", 5432)  # not yet told
        new = compile_for(lab_, "a", [allow_b], [])
        script = netpolicy.apply(lab_.pods["a"], new, applied["a"])
        lines = script.splitlines()
        assert lines and all(ln.startswith(("add element", "delete element")) for ln in lines), (
            script
        )
        assert "add element inet cnidra if0_in_t_0_p4 { 198.18.43.12 }" in script
        assert "delete element" in script and "198.18.43.2 }" in script
        assert lab_.probe("b", "a", "tcp", 5432)


def test_counters_and_removal() -> None:
    """Every rule counts: the accepting rule and the default deny say what they saw, by policy;
    removing the table leaves nothing, and removing it again (or from a gone pod) is fine."""
    policy = mnp({"podSelector": DB, "ingress": [{"from": [{"podSelector": WEB}]}]})
    with lab() as lab_:
        enforce(lab_, [policy])
        assert lab_.probes([("b", "a", "tcp", 5432), ("c", "a", "tcp", 5432)]) == [True, False]
        found = netpolicy.counters(lab_.pods["a"])
        allowed = [c for c in found if c.comment == f"{policy.ref} ingress[0]" and c.packets]
        denied = [c for c in found if c.comment.startswith("default-deny ingress") and c.packets]
        assert allowed and allowed[0].verdict == "accept"
        assert denied and denied[0].verdict == "drop" and denied[0].packets >= 1
        assert netpolicy.exists(lab_.pods["a"])
        netpolicy.remove(lab_.pods["a"])
        assert not netpolicy.exists(lab_.pods["a"])
        netpolicy.remove(lab_.pods["a"])
        assert lab_.probe("c", "a", "tcp", 5432)
    netpolicy.remove("/run/netns/cnidra-gone-namespace")


def test_a_refused_batch_changes_nothing() -> None:
    """nft refuses a bad batch whole: the table applied before stays as it was."""
    policy = mnp({"podSelector": DB})
    with lab(("a", "b")) as lab_:
        applied = enforce(lab_, [policy])
        with pytest.raises(netpolicy.NftError, match="nft -f -"):
            netpolicy.run_nft(lab_.pods["a"], ("-f", "-"), applied["a"].script() + "bogus line\n")
        assert not lab_.probe("b", "a", "tcp", 5432)


def _kernel_sets(ns: Path) -> dict[str, set[str]]:
    listing = json.loads(netpolicy.run_nft(ns, ("-j", "list", "table", "inet", "cnidra")))
    found: dict[str, set[str]] = {}
    for item in listing["nftables"]:
        if "set" not in item:
            continue
        elements = set()
        for e in item["set"].get("elem", []):
            if isinstance(e, dict) and "prefix" in e:
                elements.add(f"{e['prefix']['addr']}/{e['prefix']['len']}")
            elif isinstance(e, dict) and "concat" in e:
                elements.add(" . ".join(str(x) for x in e["concat"]))
            else:
                elements.add(str(e))
        found[item["set"]["name"]] = elements
    return found


def _kernel_rules(ns: Path) -> list[str]:
    """The comment of every rule of the table ("" for those without one)."""
    listing = json.loads(netpolicy.run_nft(ns, ("-j", "list", "table", "inet", "cnidra")))
    return [i["rule"].get("comment", "") for i in listing["nftables"] if "rule" in i]


def test_updates_leave_the_kernel_with_the_new_sets() -> None:
    """A run of updates (pods moving; an ipBlock edited: its interval set's networks deleted
    and added; an egress rule dropped and restored: rules rewritten in place, sets and chains
    deleted and made) applied one after another leaves in the kernel the sets of the last
    ruleset, and as many rules."""
    steps = [
        ("198.18.43.2", "198.18.0.0/24", True),
        ("198.18.43.12", "198.18.0.0/24", True),
        ("198.18.43.12", "198.18.0.0/23", True),
        ("198.18.43.22", "198.18.4.0/22", False),  # no egress rule: rules and sets go
        ("198.18.43.22", "198.18.4.0/22", True),  # and come back
        ("198.18.43.2", "198.18.0.0/24", True),
    ]
    with netns.temporary("cnidra-np-sets") as ns:
        previous = None
        for web_ip, cidr, egress in steps:
            pods = (
                PodOnNetwork("tenant-a", "a", LABELS["a"], ("198.18.43.1",), PORTS),
                PodOnNetwork("tenant-a", "b", LABELS["b"], (web_ip,), PORTS),
            )
            policy = mnp(
                {
                    "podSelector": DB,
                    "ingress": [{"from": [{"podSelector": WEB}, {"ipBlock": {"cidr": cidr}}]}],
                    "policyTypes": ["Ingress", "Egress"],
                    "egress": [{"to": [{"podSelector": WEB}], "ports": [{"port": "http"}]}]
                    if egress
                    else [],
                }
            )
            v = NetworkView(NETWORK, pods, NAMESPACE_LABELS)
            rs = compile_pod(pods[0], [PodInterface(IFNAME, v)], [policy])
            netpolicy.apply(ns, rs, previous)
            previous = rs
            want = {s.name: set(s.elements) for s in rs.sets}
            assert _kernel_sets(ns) == want
            comments = [
                m[1] if (m := re.search(r'comment "(.*)"', r)) else ""
                for c in rs.chains
                for r in c.rules
            ]
            assert sorted(_kernel_rules(ns)) == sorted(comments)


def _policy_for_sets(cidr: str) -> MultiNetworkPolicy:
    return mnp(
        {
            "podSelector": DB,
            "ingress": [{"from": [{"podSelector": WEB}, {"ipBlock": {"cidr": cidr}}]}],
            "egress": [{"to": [{"podSelector": WEB}], "ports": [{"port": "http"}]}],
        }
    )


def _ruleset(web_ip: str, policy: MultiNetworkPolicy) -> Ruleset:
    pods = (
        PodOnNetwork("tenant-a", "a", LABELS["a"], ("198.18.43.1",), PORTS),
        PodOnNetwork("tenant-a", "b", LABELS["b"], (web_ip,), PORTS),
    )
    return compile_pod(
        pods[0], [PodInterface(IFNAME, NetworkView(NETWORK, pods, NAMESPACE_LABELS))], [policy]
    )


def _comments(rs: Ruleset) -> list[str]:
    return sorted(
        m[1] if (m := re.search(r'comment "(.*)"', r)) else "" for c in rs.chains for r in c.rules
    )


def test_a_resync_reads_the_kernel_and_rewrites_in_place() -> None:
    """After a restart the driver knows nothing of what it applied: apply without `previous`
    reads the table back and rewrites it in place (no table deleted), ending with exactly the
    new rules and sets; read back, the kernel's sets are the compiler's (a /32 in an interval
    set, a concatenation, IPv4 addresses)."""
    first = _ruleset("198.18.43.2", _policy_for_sets("198.18.0.66/32"))
    second = _ruleset("198.18.43.12", _policy_for_sets("198.18.4.0/22"))
    with netns.temporary("cnidra-np-resync") as ns:
        assert netpolicy.apply(ns, first).startswith("add table")  # nothing there yet
        back = netpolicy.read_back(ns)
        assert back is not None
        assert {s.name: s.elements for s in back.sets} == {s.name: s.elements for s in first.sets}
        assert netpolicy.apply(ns, second).startswith("flush table")
        assert _kernel_sets(ns) == {s.name: set(s.elements) for s in second.sets}
        assert sorted(_kernel_rules(ns)) == _comments(second)
        netpolicy.apply(ns, second)  # again: the same table
        assert _kernel_sets(ns) == {s.name: set(s.elements) for s in second.sets}


def test_a_previous_out_of_step_with_the_kernel_is_recovered() -> None:
    """`previous` says b was at .2, the kernel has .5 (an update lost): deleting .2 fails the
    batch, so apply reads the kernel's table and rewrites from it."""
    policy = _policy_for_sets("198.18.0.0/24")
    with netns.temporary("cnidra-np-step") as ns:
        netpolicy.apply(ns, _ruleset("198.18.43.5", policy))
        wrong = _ruleset("198.18.43.2", policy)
        target = _ruleset("198.18.43.12", policy)
        netpolicy.apply(ns, target, wrong)
        assert _kernel_sets(ns) == {s.name: set(s.elements) for s in target.sets}
    with pytest.raises(netpolicy.NamespaceGone):
        netpolicy.read_back("/run/netns/cnidra-gone-namespace-np")
