"""What prepare allows changes nothing on the node but the pod's own delta, proven by running it
(issue 39): the node-effect oracle of tests/cni/nodeoracle.py on a throwaway node shaped like a
real one (an uplink carrying the node, a data NIC holding a storage address with a neighbour
pod's macvlan on it, a shared bridge with another tenant's pod as a port).

A hypothesis strategy writes tenant ResourceClaim configs that the shipped default DeviceClass
(deploy/deviceclass.yaml, read from the file) and an example class with `ipRanges` and `vlanIDs`
may allow: every plugin and IPAM they list (macvlan and ipvlan modes, vlan, bridge with
mtu/vlan/trunks/hairpin/portIsolation/mac, tuning, sbr, vrf; static, cnidra IPAM, and
host-local, which claims may no longer use), addresses of the node, of the neighbour pods and
free ones, VLANs, MTUs from 68 to 9000, on data0 or br-data. Each goes through prepare's path
(`resolve_attachment` with the node's facts, then `Allocator.assign` over the fake apiserver,
which leases a tenant's static addresses from the CNIIPPool that owns them); what it refuses
must have changed nothing, what it allows is ADDed with the real plugins v1.9.1 and must change
nothing beyond the pod's own delta (`nodeoracle.Delta`), keep the node's and the neighbours'
addresses answered by their owners, and leave nothing after its DEL.

`make test` runs a bounded number of examples (CNIDRA_FUZZ_EXAMPLES // 4: 37, CNIDRA_FUZZ_EXAMPLES
being 150 when unset), the node built once for the test and built again only when a run left it
changed; `make fuzz` runs 5,000 (CNIDRA_FUZZ_EXAMPLES=20000), and shrinks a failing config to a
small one (the bounded run reports it as found: each shrink runs the plugins)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ipaddress
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

import cnidra.dra.resolve
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.ipam.allocator import AllocationError, Allocator
from cnidra.state.checkpoint import PreparedClaim
from tests.cni import nodeoracle as oracle
from tests.cni.nodeoracle import (
    DATA_IP,
    NODE_IP,
    NODE_NAME,
    PODA_IP,
    PODA_MAC,
    PODB_IP,
    PODB_MAC,
    ROUTER_IP,
    SEGMENT_IP,
    Node,
    Outcome,
)
from tests.conftest import CNITools
from tests.ipam.fakes import FakeApiserver, node_allocator

pytestmark = pytest.mark.netns

ROOT = Path(__file__).parents[2]
EXAMPLES = max(int(os.environ.get("CNIDRA_FUZZ_EXAMPLES", "150")) // 4, 5)
# a failing example is shrunk to a small config in the long run only: each try runs plugins,
# and shrinking one finding takes minutes (the bounded run reports the config as found)
PHASES = tuple(Phase) if EXAMPLES >= 200 else tuple(p for p in Phase if p is not Phase.shrink)

# the effects beyond the pod's own delta docs/security.md accepts ("Host-side effects"): each
# only while the doc still says so in the words `nodeoracle.DOCUMENTED` quotes
SECURITY_DOC = " ".join((ROOT / "docs" / "security.md").read_text().split())
ACCEPTED = tuple(a for a in oracle.DOCUMENTED if a.quote in SECURITY_DOC)

DEFAULT_CLASS = next(
    d
    for d in yaml.safe_load_all((ROOT / "deploy" / "deviceclass.yaml").read_text())
    if d and d["metadata"]["name"] == "cni.networking.x-k8s.io"
)


def ranged_class() -> dict[str, Any]:
    """The default class's policy with `ipRanges` and `vlanIDs`: an admin's example class."""
    out: dict[str, Any] = copy.deepcopy(DEFAULT_CLASS)
    out["metadata"]["name"] = "ranged.cni.networking.x-k8s.io"
    rules = out["spec"]["config"][0]["opaque"]["parameters"]["claims"]
    rules.update(ipRanges=["198.18.0.0/15"], vlanIDs=["100-199"])
    return out


RANGED_CLASS = ranged_class()
CLASSES = (DEFAULT_CLASS, RANGED_CLASS)

# the cluster's pools serving the tenants' namespaces: part of the data segment (podB's
# address in it, the node's not), and part of br-data's (podA's in it)
DATA_POOL = {
    "ranges": [{"subnet": "198.18.2.0/24", "rangeStart": "198.18.2.16",
                "rangeEnd": "198.18.2.127", "gateway": SEGMENT_IP}],
    "blockSize": 16,
    "namespaces": ["team-a", "team-b"],
}  # fmt: skip
BRIDGE_POOL = {
    "ranges": [{"subnet": "198.18.3.0/24", "rangeStart": "198.18.3.8",
                "rangeEnd": "198.18.3.63"}],
    "blockSize": 8,
    "namespaces": ["team-a", "team-b"],
}  # fmt: skip


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """The node, built once per test; `exercise` builds it again when a run left it changed."""
    with oracle.node_shaped(tmp_path / "state") as built:
        yield built


@pytest.fixture
def allocator(tmp_path: Path) -> Allocator:
    """cnidra IPAM of the node over the fake apiserver, with the neighbour pods' addresses
    leased to team-b's claims, as prepare leased them when those pods' claims wrote them."""
    api = FakeApiserver()
    api.pool("data-pool", DATA_POOL)
    api.pool("bridge-pool", BRIDGE_POOL)
    ipam = node_allocator(api, tmp_path / "ipam-state", NODE_NAME)
    for who, address, link in (("poda", PODA_IP, "br-data"), ("podb", PODB_IP, "data0")):
        with contextlib.suppress(AllocationError):
            asyncio.run(ipam.assign(static_claim(who, f"{address}/24", link, "team-b")))
    return ipam


def static_claim(uid: str, address: str, link: str, namespace: str) -> PreparedClaim:
    """A prepared claim whose network's static address its tenant wrote."""
    ref = ObjectRef(namespace, f"claim-{uid}", uid)
    plugin = "bridge" if link == "br-data" else "macvlan"
    network = {
        "cniVersion": "1.0.0",
        "name": "tnet",
        "plugins": [
            {"type": plugin, "ipam": {"type": "static", "addresses": [{"address": address}]}}
        ],
    }
    attachment = Attachment(
        ref, "net", "net1", network, NODE_NAME, link, network_label="tnet", tenant_static=True
    )
    return PreparedClaim(ref, (f"pod-{uid}",), (attachment,))


# ------------------------------------------------------------------ tenant configs

# the node's, the neighbours', the segment's and free addresses (in the pools' ranges and
# out), the first three often
TARGETS = [DATA_IP, PODB_IP, PODA_IP] * 2 + [
    NODE_IP, SEGMENT_IP, ROUTER_IP, "198.18.2.40", "198.18.2.77", "198.18.2.100",
    "198.18.3.40", "198.18.3.50", "198.18.2.200", "198.19.7.7",
]  # fmt: skip
ADDRESSES = st.builds(
    lambda ip, length: f"{ip}/{length}",
    st.sampled_from(TARGETS),
    st.sampled_from([24] * 6 + [32, 16]),
)
MTUS = st.one_of(st.sampled_from([68, 68, 576, 1280, 1400, 1500, 9000]), st.integers(68, 9000))
VLANS = st.sampled_from([1, 100, 150, 199, 200, 4094])
# the neighbours' MACs, and fresh ones (a low one sorts first among a bridge's ports)
MACS = st.sampled_from([PODA_MAC, PODB_MAC, "02:00:00:00:00:01", "0a:58:c6:12:09:09"])
ROUTES = st.lists(
    st.sampled_from(
        [{"dst": "198.18.8.0/24"}, {"dst": "0.0.0.0/0", "gw": SEGMENT_IP},
         {"dst": "198.18.0.0/24", "gw": SEGMENT_IP}, {"dst": "198.18.9.0/24", "gw": DATA_IP}]
    ),
    max_size=2,
    unique_by=lambda r: r["dst"],
)  # fmt: skip
# sysctls tuning writes inside the pod's namespace; only per-namespace ones (a non-namespaced
# sysctl would be the machine's)
SYSCTLS = st.dictionaries(
    st.sampled_from(
        ["net.ipv4.conf.IFNAME.arp_notify", "net.ipv4.conf.net1.arp_ignore",
         "net.ipv6.conf.IFNAME.disable_ipv6", "net.ipv4.ip_forward",
         "net.ipv4.conf.all.proxy_arp", "net.ipv4.conf.data0.proxy_arp"]
    ),
    st.sampled_from(["0", "1"]),
    min_size=1,
    max_size=2,
)  # fmt: skip

Fields = dict[str, tuple[int, st.SearchStrategy[Any]]]


def chance(draw: st.DrawFn, percent: int) -> bool:
    """True with about `percent` % (the smallest draw, where hypothesis starts and shrinks to,
    is False)."""
    return draw(st.integers(1, 100)) > 100 - percent


@st.composite
def some(draw: st.DrawFn, fields: Fields) -> dict[str, Any]:
    """Each field with its percent chance: few refusals in one config, so that many reach the
    plugins."""
    return {
        name: draw(values) for name, (percent, values) in fields.items() if chance(draw, percent)
    }


@st.composite
def ipam(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["static"] * 10 + ["cnidra"] * 9 + ["host-local"]))
    out: dict[str, Any]
    if kind == "static":
        entry = st.fixed_dictionaries(
            {"address": ADDRESSES},
            optional={"gateway": st.sampled_from([SEGMENT_IP, "198.18.3.1", DATA_IP, NODE_IP])},
        )
        out = {"type": "static", "addresses": draw(st.lists(entry, min_size=1, max_size=2))}
    elif kind == "cnidra":
        pool = draw(st.sampled_from(["data-pool"] * 3 + ["bridge-pool"] * 3 + ["nopool"]))
        out = {"type": "cnidra", "pool": pool}
    else:
        target = ipaddress.ip_address(draw(st.sampled_from(TARGETS)))
        subnet = ipaddress.ip_network(f"{target}/24", strict=False)
        out = {"type": "host-local",
               "ranges": [[{"subnet": str(subnet), "rangeStart": str(target),
                            "rangeEnd": str(target)}]]}  # fmt: skip
    if chance(draw, 25):
        out["routes"] = draw(ROUTES)
    return out


TRUNKS = st.lists(
    st.one_of(
        st.fixed_dictionaries({"id": VLANS}),
        st.fixed_dictionaries(
            {"minID": st.sampled_from([100, 150]), "maxID": st.sampled_from([150, 199, 300])}
        ),
    ),
    min_size=1,
    max_size=2,
)
PLUGIN_FIELDS: dict[str, Fields] = {
    "macvlan": {
        "mode": (60, st.sampled_from(["bridge", "bridge", "private", "vepa", "passthru"])),
        "mtu": (40, MTUS),
        "mac": (5, MACS),
        "bcqueuelen": (5, st.sampled_from([0, 100, 1000, 100000])),
    },
    "ipvlan": {"mode": (60, st.sampled_from(["l2", "l3", "l3s"])), "mtu": (40, MTUS)},
    "vlan": {"mtu": (40, MTUS)},
    "bridge": {
        "mtu": (40, MTUS),
        "vlan": (10, VLANS),
        "vlanTrunk": (8, TRUNKS),
        "hairpinMode": (30, st.booleans()),
        "portIsolation": (30, st.booleans()),
        "mac": (5, MACS),
        "preserveDefaultVlan": (10, st.booleans()),
        "enabledad": (20, st.booleans()),
    },
    "tuning": {
        "mtu": (40, MTUS),
        "mac": (5, MACS),
        "txQLen": (30, st.sampled_from([0, 100, 10000])),
        "sysctl": (40, SYSCTLS),
    },
    "sbr": {"table": (50, st.sampled_from([100, 254]))},
    "vrf": {"table": (50, st.sampled_from([100, 1001]))},
}


class Case:
    """One tenant claim: its class, the link DRA allocated, the CNIConfig it wrote."""

    def __init__(self, device_class: dict[str, Any], link: str, params: dict[str, Any]) -> None:
        self.device_class, self.link, self.params = device_class, link, params

    def __repr__(self) -> str:
        return (
            f"Case(class={self.device_class['metadata']['name']!r}, link={self.link!r}, "
            f"params={json.dumps(self.params)})"
        )


@st.composite
def tenant_claims(draw: st.DrawFn) -> Case:
    """A tenant's claim config on data0 or br-data, of a class that may allow it. Links of
    kinds the kernel lacks (this project's machine has no vlan, ipvlan or vrf) rarely: their
    ADD fails."""
    kernel = oracle.kernel_link_kinds()

    def often(kind: str, weight: int) -> list[str]:
        return [kind] * (weight if kind in kernel or kind in ("bridge", "macvlan") else 1)

    link = draw(st.sampled_from(oracle.DATA_LINKS))
    if link == "br-data":
        kinds = often("bridge", 12) + often("macvlan", 3) + often("vlan", 2) + often("ipvlan", 2)
    else:
        kinds = often("macvlan", 12) + often("vlan", 4) + often("ipvlan", 2) + ["bridge"]
    main = draw(st.sampled_from(kinds))
    plugin: dict[str, Any] = {"type": main}
    if main in ("macvlan", "ipvlan", "vlan") and (main == "vlan" or chance(draw, 40)):
        plugin["master"] = draw(st.sampled_from([link] * 19 + ["eth0"]))
    if main == "vlan":
        plugin["vlanId"] = draw(VLANS)
    if main == "bridge" and chance(draw, 40):
        plugin["bridge"] = link
    plugin.update(draw(some(PLUGIN_FIELDS[main])))
    if chance(draw, 80):
        plugin["ipam"] = draw(ipam())
    chained = []
    for extra, percent in (("tuning", 30), ("sbr", 15), ("vrf", 8 if "vrf" in kernel else 2)):
        if chance(draw, percent) and (extra != "sbr" or "ipam" in plugin):
            more: dict[str, Any] = {"type": extra}
            if extra == "vrf":
                more["vrfname"] = "vrf-blue"
            more.update(draw(some(PLUGIN_FIELDS[extra])))
            chained.append(more)
    config = {"cniVersion": "1.0.0", "name": "tnet", "plugins": [plugin, *chained]}
    device_class = draw(st.sampled_from([DEFAULT_CLASS] * 3 + [RANGED_CLASS]))
    return Case(device_class, link, {"ifName": "net1", "config": config})


def kind_of(outcome: Outcome) -> str:
    """A short name of what happened, for hypothesis' statistics."""
    if outcome.refused:
        message = outcome.refused.split("; ")[0].split(": ", 1)[-1]
        return f"refused: {message[:70]}"
    if outcome.add_failed:
        return f"ADD failed: {outcome.add_failed[:70]}"
    plugins = (outcome.attachment.network.get("plugins") or []) if outcome.attachment else []
    return "ADDed: " + "+".join(str(p.get("type")) for p in plugins)


def unchanged(outcome: Outcome) -> None:
    """The node as it was but for the pod's own delta, its owners answering for their
    addresses, nothing left after the DEL; else the findings, with the config that made them."""
    if outcome.findings:
        raise AssertionError(outcome.report())


def run(
    node: Node, allocator: Allocator, cni_tools: CNITools, params: dict[str, Any],
    link: str, device_class: dict[str, Any] = DEFAULT_CLASS, namespace: str = "team-a",
) -> Outcome:  # fmt: skip
    return oracle.exercise(
        node, params, device_class, link, cni_path=[cni_tools.plugins], allocator=allocator,
        namespace=namespace, documented=ACCEPTED,
    )  # fmt: skip


def network(*plugins: dict[str, Any]) -> dict[str, Any]:
    return {
        "ifName": "net1",
        "config": {"cniVersion": "1.0.0", "name": "tnet", "plugins": list(plugins)},
    }


# ------------------------------------------------------------------ the fuzzer


@pytest.mark.slow  # the fuzzer: about 15 s
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    phases=PHASES,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(case=tenant_claims())
def test_what_prepare_allows_changes_nothing_on_the_node_but_the_pod(
    case: Case, node: Node, allocator: Allocator, cni_tools: CNITools
) -> None:
    outcome = run(node, allocator, cni_tools, case.params, case.link, case.device_class)
    event(kind_of(outcome))
    unchanged(outcome)


# ------------------------------------------------------------------ the reported attacks


def test_a_bridge_mtu_of_68_does_not_shrink_the_shared_bridge(
    node: Node, allocator: Allocator, cni_tools: CNITools
) -> None:
    outcome = run(node, allocator, cni_tools, network({"type": "bridge", "mtu": 68}), "br-data")
    unchanged(outcome)


def test_a_macvlan_with_the_nodes_address_does_not_take_it(
    node: Node, allocator: Allocator, cni_tools: CNITools
) -> None:
    params = network(
        {"type": "macvlan", "mode": "bridge",
         "ipam": {"type": "static", "addresses": [{"address": f"{DATA_IP}/24"}]}}
    )  # fmt: skip
    outcome = run(node, allocator, cni_tools, params, "data0")
    unchanged(outcome)


@pytest.mark.parametrize(
    ("link", "plugin", "address"),
    [("br-data", "bridge", PODA_IP), ("data0", "macvlan", PODB_IP)],
    ids=["podA-on-br-data", "podB-on-data0"],
)
def test_a_static_address_another_tenants_pod_holds_is_not_taken(
    node: Node, allocator: Allocator, cni_tools: CNITools, link: str, plugin: str, address: str
) -> None:
    params = network(
        {"type": plugin, "ipam": {"type": "static", "addresses": [{"address": f"{address}/24"}]}}
    )
    outcome = run(node, allocator, cni_tools, params, link)
    unchanged(outcome)


def test_two_tenants_never_hold_one_static_address(
    node: Node, allocator: Allocator, cni_tools: CNITools
) -> None:
    """team-a's pod holds 198.18.2.40 (leased from data-pool); team-b's claim writes the same
    address: prepare refuses it, or, if both come up, the address is still answered by one
    pod only."""
    address = "198.18.2.40"
    params = network(
        {"type": "macvlan", "mode": "bridge",
         "ipam": {"type": "static", "addresses": [{"address": f"{address}/24"}]}}
    )  # fmt: skip
    notes: list[str] = []
    first = oracle.prepare(
        node, params, DEFAULT_CLASS, "data0", ObjectRef("team-a", "c1", "uid-1"), allocator, notes
    )
    assert isinstance(first, Attachment), first  # a free address of a pool serving team-a
    second = oracle.prepare(
        node, params, DEFAULT_CLASS, "data0", ObjectRef("team-b", "c2", "uid-2"), allocator, notes
    )
    if isinstance(second, str):
        assert "198.18.2.40" in second, second
        return
    cni = [cni_tools.plugins]
    with oracle.plugged(node, first, cni) as a, oracle.plugged(node, second, cni) as b:
        answers = oracle.in_namespace(
            node.segment, lambda: oracle.arp_answers([("seg-br", SEGMENT_IP, [address])], 0.5)
        )[("seg-br", address)]
        owners = {mac: f"{who}'s net1" for who, p in (("team-a", a), ("team-b", b))
                  for mac in p.view.macs}  # fmt: skip
    assert len(answers) <= 1, (
        f"{address} is answered on the data0 segment by {[owners.get(m, m) for m in answers]}: "
        f"two tenants hold it ({'; '.join(notes)})"
    )


# ------------------------------------------------------------------ the effects the docs accept


def accepted(outcome: Outcome, name: str) -> bool:
    return any(a.startswith(name) for a in outcome.accepted)


def test_a_plain_bridge_claim_writes_only_the_documented_accept_ra(
    node: Node, allocator: Allocator, cni_tools: CNITools
) -> None:
    """The smallest bridge claim: besides the pod's delta, the bridge plugin's ADD writes the
    bridge's `net.ipv6.conf.<bridge>.accept_ra` (1 -> 0), and DEL leaves it so: the effect
    docs/security.md accepts, and nothing else."""
    outcome = run(node, allocator, cni_tools, network({"type": "bridge"}), "br-data")
    unchanged(outcome)
    assert accepted(outcome, oracle.DOCUMENTED[0].name), outcome.report()


def test_a_pod_port_changes_a_bridges_mac_only_as_documented(
    node: Node, allocator: Allocator, cni_tools: CNITools
) -> None:
    """A bridge whose MAC nobody set takes its lowest port's MAC; with its ports' MACs high
    (a bridge of veths has them so half the time), the pod's host veth lends it its MAC while
    the pod lives (the node's neighbours' ARP caches then point at the old one), and DEL gives
    it back: the effect docs/security.md accepts."""
    oracle.batch(
        node.node,
        "link set vbr-a address fe:ff:ff:ff:ff:fe",
        "link set vbr-probe address fe:ff:ff:ff:ff:fd",
    )
    assert not oracle.probe(node)
    node.baseline = oracle.snapshot(node)  # the node as its admin now has it
    outcome = run(node, allocator, cni_tools, network({"type": "bridge"}), "br-data")
    unchanged(outcome)
    assert accepted(outcome, oracle.DOCUMENTED[1].name), outcome.report()


def test_a_macvlan_on_a_bridge_makes_it_promiscuous_only_as_documented(
    node: Node, allocator: Allocator, cni_tools: CNITools
) -> None:
    """A macvlan child's MAC enters its parent's unicast filter; a bridge has none, so the
    kernel keeps the shared bridge promiscuous while the pod lives, and DEL ends it: the
    effect docs/security.md accepts."""
    outcome = run(node, allocator, cni_tools, network({"type": "macvlan"}), "br-data")
    unchanged(outcome)
    assert accepted(outcome, oracle.DOCUMENTED[2].name), outcome.report()


def test_the_oracle_is_strict_about_what_the_docs_do_not_accept(
    node: Node, allocator: Allocator, cni_tools: CNITools
) -> None:
    """Without the docs' acceptance the same bridge claim is a finding: `exercise` accepts
    nothing beyond the pod's own delta unless told."""
    outcome = oracle.exercise(
        node, network({"type": "bridge"}), DEFAULT_CLASS, "br-data",
        cni_path=[cni_tools.plugins], allocator=allocator,
    )  # fmt: skip
    assert any("accept_ra" in f for f in outcome.findings), outcome.report()


# ------------------------------------------------------------------ with a fix switched off


def test_the_oracle_finds_the_bridge_mtu_drag_with_the_fix_disabled(
    node: Node, allocator: Allocator, cni_tools: CNITools, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the host-side judgement switched off (the network passed on unchanged), the bridge
    MTU 68 claim is allowed and the oracle names br-data's MTU: it fails when a fix is
    missing."""

    def identity(network: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return dict(network)

    monkeypatch.setattr(cnidra.dra.resolve, "judge_host_side", identity)
    outcome = run(node, allocator, cni_tools, network({"type": "bridge", "mtu": 68}), "br-data")
    assert outcome.refused is None and outcome.add_failed is None, outcome.report()
    drag = [c for c in outcome.changes if (c.area, c.link, c.what) == ("link", "br-data", "mtu")]
    assert drag and (drag[0].before, drag[0].after) == ("1500", "68"), outcome.report()


def test_the_probes_find_a_taken_address_with_the_fixes_disabled(
    node: Node, allocator: Allocator, cni_tools: CNITools, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With neither the host-side judgement nor the static leases, a macvlan claim with the
    node's own address comes up, and the probes find the node's address answered by the pod."""

    def identity(network: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return dict(network)

    async def unleased(prepared: PreparedClaim, pods: Any = ()) -> PreparedClaim:
        return prepared

    monkeypatch.setattr(cnidra.dra.resolve, "judge_host_side", identity)
    monkeypatch.setattr(allocator, "assign", unleased)
    params = network(
        {"type": "macvlan", "mode": "bridge",
         "ipam": {"type": "static", "addresses": [{"address": f"{DATA_IP}/24"}]}}
    )  # fmt: skip
    outcome = run(node, allocator, cni_tools, params, "data0")
    assert outcome.attachment is not None and outcome.add_failed is None, outcome.report()
    taken = [p for p in outcome.probes if p.startswith(f"ARP on the data0 segment for {DATA_IP}")]
    assert taken and "the pod's net1" in taken[0], outcome.report()
