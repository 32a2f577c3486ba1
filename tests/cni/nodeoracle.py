"""The node-effect oracle (issue 39): run what prepare allows with the real plugins on a
throwaway node shaped like a real one, and compare the node before and after.

The policy judges what a claim's network *says*; this judges what it *does* to the node. The
node is a network namespace holding what a node's admin set up (`Node`), with other tenants'
pods beside it; `snapshot` reads everything of the node a plugin could change; `diff` names
every change beyond the pod's own documented delta (`Delta`); `probe` asks the wire whether the
node's and the neighbours' addresses are still answered by their owners. `exercise` runs one
tenant config through prepare's own path (`cnidra.dra.resolve.resolve_attachment` with the
node's facts, cnidra IPAM's `Allocator.assign`), ADDs it into a fresh pod namespace with the
node's namespace as the host, and DELs it again.

Everything lives in namespaces named `cnidra-*` this module makes, on 198.18.0.0/15; the
machine's own namespace is never touched (tools run with `ip -n`/`ip netns exec`, probes and
plugins from threads that entered a namespace of ours)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import hashlib
import ipaddress
import json
import os
import select
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from cnidra.api.hostside import NodeFacts
from cnidra.api.ipam import cnidra_ipam
from cnidra.api.issues import Issues
from cnidra.api.refs import ObjectRef
from cnidra.cni import netns
from cnidra.cni.attach import AttachFailed, Attachment, attach_all, detach_all
from cnidra.cni.runtime import CNIRuntime
from cnidra.dra.claim import ALLOCATION_CONFIG, read_claim
from cnidra.dra.prepare import name_pod_interfaces
from cnidra.dra.resolve import Device, resolve_attachment
from cnidra.inventory.links import carrying_node, node_facts, read_links
from cnidra.ipam.allocator import AllocationError, Allocator
from cnidra.state.checkpoint import PreparedClaim
from cnidra.state.ipam import claim_owner
from cnidra.state.layout import StateLayout

T = TypeVar("T")

DRIVER = "cni.dra.networking.x-k8s.io"
NODE_NAME = "node-1"  # the ResourceSlice pool of the node's devices

# the node's shape: every address inside 198.18.0.0/15
NODE_IP = "198.18.0.2"  # the Node's InternalIP, on the uplink eth0
ROUTER_IP = "198.18.0.1"  # the default gateway, in the router namespace
DATA_IP = "198.18.2.2"  # the node's own address on the data NIC (a storage network)
SEGMENT_IP = "198.18.2.1"  # the data segment's peer (the switch's side)
PODB_IP = "198.18.2.20"  # another tenant's pod: a macvlan on data0
PODA_IP = "198.18.3.10"  # another tenant's pod: a port of br-data
PROBE_IP = "198.18.3.1"  # a leg of the segment namespace on br-data: the "other port"
PODA_MAC = "0a:58:c6:12:03:0a"
PODB_MAC = "0a:58:c6:12:02:14"
DATA_LINKS = ("data0", "br-data")  # what the node publishes for pods

TIMEOUT = 30.0


# ------------------------------------------------------------------ small helpers


def run(*cmd: str, stdin: str | None = None, timeout: float = TIMEOUT) -> str:
    done = subprocess.run(
        list(cmd), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise OSError(f"{' '.join(cmd)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def batch(ns: Path, *lines: str) -> None:
    """`ip` commands run in namespace `ns`, in one process."""
    run("ip", "-n", ns.name, "-b", "-", stdin="\n".join(lines) + "\n")


def in_namespace(ns: Path, fn: Callable[[], T], timeout: float = 120.0) -> T:
    """`fn()` in a thread that entered `ns` (and every process it spawns runs there): the
    caller's thread, and the machine's namespace, stay where they are."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            with netns.entered(ns):
                box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=body, name=f"in-{ns.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{getattr(fn, '__name__', fn)} in {ns.name}: over {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


# ------------------------------------------------------------------ the node


class Node:
    """A throwaway node: a `cnidra-node` namespace holding

    - `eth0`, the uplink with the Node's InternalIP 198.18.0.2/24 and the default route via
      198.18.0.1 (a veth to a `cnidra-router` namespace): it carries the node, so the inventory
      does not publish it;
    - `data0`, a data NIC holding a host address that is not the node's IP, 198.18.2.2/24 (a
      storage network): a veth whose peer is a port of a bridge in the `cnidra-segment`
      namespace, the L2 segment, whose own address is 198.18.2.1;
    - `br-data`, a bridge made without an MTU or MAC (the kernel sizes it to its smallest port
      and takes a port's address), holding no address, with two ports: another tenant's pod
      (`cnidra-poda`, 198.18.3.10/24) and the segment namespace's second leg (198.18.3.1/24),
      the "other port" probes send from;
    - a neighbour pod on data0: a macvlan (bridge mode) moved into `cnidra-podb`, 198.18.2.20/24.

    data0 and br-data are what the inventory publishes for pods (checked when built). State
    directories of the driver are under `state_root`."""

    def __init__(self, state_root: Path) -> None:
        self.state_root = state_root
        self.node = self.router = self.segment = self.pod_a = self.pod_b = Path()
        # the owners' MACs: data0's (the node's), eth0's, podA's, podB's, the segment's legs
        self.macs: dict[str, str] = {}
        self.builds = 0
        self.baseline: Snapshot | None = None  # as built, after its probes

    @property
    def namespaces(self) -> list[Path]:
        return [p for p in (self.node, self.router, self.segment, self.pod_a, self.pod_b) if p.name]

    @property
    def layout(self) -> StateLayout:
        return StateLayout(self.state_root)

    def __repr__(self) -> str:
        return f"Node({self.node.name or 'not built'}, builds={self.builds})"

    def build(self) -> Node:
        self.builds += 1
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise
        return self

    def _build(self) -> None:
        self.node = netns.create("cnidra-node")
        self.router = netns.create("cnidra-router")
        self.segment = netns.create("cnidra-segment")
        self.pod_a = netns.create("cnidra-poda")
        self.pod_b = netns.create("cnidra-podb")
        r, s, a, b = self.router.name, self.segment.name, self.pod_a, self.pod_b
        batch(
            self.node,
            f"link add eth0 type veth peer name up0 netns {r}",
            f"link add data0 type veth peer name data0-sw netns {s}",
            "link add br-data type bridge",
            f"link add vbr-a type veth peer name eth0 netns {a.name}",
            f"link add vbr-probe type veth peer name brp0 netns {s}",
            "link set vbr-a master br-data",
            "link set vbr-probe master br-data",
            "link add podb0 link data0 type macvlan mode bridge",
            f"link set podb0 address {PODB_MAC}",
            f"link set podb0 netns {b.name}",
            f"addr add {NODE_IP}/24 dev eth0",
            f"addr add {DATA_IP}/24 dev data0",
            "link set eth0 up",
            "link set data0 up",
            "link set br-data up",
            "link set vbr-a up",
            "link set vbr-probe up",
            f"route add default via {ROUTER_IP}",
        )
        batch(self.router, f"addr add {ROUTER_IP}/24 dev up0", "link set up0 up")
        batch(
            self.segment,
            "link add seg-br type bridge",
            "link set data0-sw master seg-br",
            f"addr add {SEGMENT_IP}/24 dev seg-br",
            f"addr add {PROBE_IP}/24 dev brp0",
            "link set seg-br up",
            "link set data0-sw up",
            "link set brp0 up",
        )
        # the segment's ARP cache follows a new answer at once (no 1 s lock), so that an
        # address taken over shows there; per-link values of our own namespace only
        run(
            "ip", "netns", "exec", s, "sh", "-c",
            "echo 0 > /proc/sys/net/ipv4/neigh/seg-br/locktime; "
            "echo 0 > /proc/sys/net/ipv4/neigh/brp0/locktime",
        )  # fmt: skip
        batch(a, f"link set eth0 address {PODA_MAC}", f"addr add {PODA_IP}/24 dev eth0",
              "link set eth0 up")  # fmt: skip
        batch(b, "link set podb0 name net1", f"addr add {PODB_IP}/24 dev net1", "link set net1 up")
        self.macs = {
            "data0": _mac(self.node, "data0"),
            "eth0": _mac(self.node, "eth0"),
            "podA": _mac(a, "eth0"),
            "podB": _mac(b, "net1"),
            "segment": _mac(self.segment, "seg-br"),
            "probe": _mac(self.segment, "brp0"),
        }
        self.state_root.mkdir(parents=True, exist_ok=True)
        for d in (self.layout.ipam, self.layout.tuning, self.layout.cni_cache):
            d.mkdir(parents=True, exist_ok=True)
        links = in_namespace(self.node, read_links)
        carrying = carrying_node(links, [NODE_IP])
        assert "eth0" in carrying and not carrying & set(DATA_LINKS), carrying
        failures = probe(self)
        assert not failures, f"the node as built fails its own probes: {failures}"
        self.baseline = snapshot(self)

    def destroy(self) -> None:
        for ns in self.namespaces:
            with contextlib.suppress(OSError):
                netns.remove(ns)
        self.node = self.router = self.segment = self.pod_a = self.pod_b = Path()
        self.baseline = None

    def rebuild(self) -> None:
        self.destroy()
        for child in sorted(self.state_root.rglob("*"), reverse=True):
            if child.is_dir():
                child.rmdir()
            else:
                child.unlink()
        self.build()

    def facts(self) -> NodeFacts:
        """The node's facts as prepare reads them: the inventory's links, read from a thread in
        the node's namespace (sysfs is the machine's there: only a link's kind reads it)."""
        return in_namespace(self.node, lambda: node_facts(read_links()))

    def protected(self) -> frozenset[str]:
        return carrying_node(in_namespace(self.node, read_links), [NODE_IP])


@functools.cache
def kernel_link_kinds() -> frozenset[str]:
    """Which of the link kinds plugins make (vlan, ipvlan, vrf; macvlan and veth are the
    node's own) this kernel has, tried once in a namespace of our own."""
    found = set()
    with netns.temporary("cnidra-kinds") as ns:
        batch(ns, "link add kinds0 type veth peer name kinds1")
        for kind, args in (("vlan", "type vlan id 5"), ("ipvlan", "type ipvlan"),
                           ("vrf", "type vrf table 10")):  # fmt: skip
            lower = "" if kind == "vrf" else "link kinds0 "
            with contextlib.suppress(OSError):
                run("ip", "-n", ns.name, "link", "add", *f"{lower}name k-{kind} {args}".split())
                found.add(kind)
    return frozenset(found)


@contextlib.contextmanager
def node_shaped(state_root: Path) -> Iterator[Node]:
    node = Node(state_root).build()
    try:
        yield node
    finally:
        node.destroy()


def _mac(ns: Path, ifname: str) -> str:
    [link] = json.loads(run("ip", "-n", ns.name, "-j", "link", "show", "dev", ifname))
    return str(link["address"])


# ------------------------------------------------------------------ snapshot

Key = tuple[str, str, str]  # (area, the link it is about or "", what)

SNAPSHOT_SCRIPT = r"""
section() { echo "@@@ $1"; }
section links; ip -d -j link show
section addrs; ip -j addr show
section routes4; ip -4 -j route show table all
section routes6; ip -6 -j route show table all
section rules4; ip -4 -j rule show
section rules6; ip -6 -j rule show
section neigh; ip -j neigh show
section fdb; bridge -j fdb show
section vlan; bridge -j vlan show
section mdb; bridge -j mdb show
if command -v tc >/dev/null; then section qdisc; tc -j qdisc show; fi
if command -v iptables-save >/dev/null; then section iptables; iptables-save; fi
if command -v ip6tables-save >/dev/null; then section ip6tables; ip6tables-save; fi
if command -v nft >/dev/null; then section nft; nft list ruleset; fi
section sysctl; grep -rs '' /proc/sys/net
for w in $WITNESSES; do
  section "witness-links $w"; ip -n "$w" -d -j link show
  section "witness-addrs $w"; ip -n "$w" -j addr show
done
exit 0
"""

# values that change with time or traffic, never with configuration
VOLATILE_LINK = {
    "ifindex", "link_index", "hello_timer", "tcn_timer", "topology_change_timer",
    "gc_timer", "bridge_id", "root_id", "hold_timer", "message_age_timer",
    "forward_delay_timer", "designated_root", "designated_bridge", "stats64", "stats",
}  # fmt: skip
VOLATILE_SYSCTLS = {"netfilter/nf_conntrack_count", "ipv6/route/gc_elasticity_dummy"}
VOLATILE_ADDRESS_FLAGS = {"tentative", "optimistic", "valid_life_time", "preferred_life_time"}


@dataclass(frozen=True)
class Snapshot:
    """The node at one moment, flattened to comparable items: `items[(area, link, what)]`.
    `index` and `kinds` say which ifindex and kind each link had (not compared: a new link's
    index is arbitrary); `learned` is where the bridges learned the known hosts' MACs."""

    items: Mapping[Key, str]
    index: Mapping[str, int]
    kinds: Mapping[str, str]
    masters: Mapping[str, str]
    learned: Mapping[str, str]

    def links(self) -> set[str]:
        return set(self.index)


def snapshot(node: Node, *, witnesses: bool = True) -> Snapshot:
    """Everything of the node a plugin could change: links (kind, MTU, MAC, flags, master,
    promiscuity, bridge and port attributes, VLAN filtering, addresses), routes of every
    table, rules, neighbours, the bridges' FDB, VLAN and multicast (MDB) tables, qdiscs,
    iptables/ip6tables/nft rules, every sysctl under /proc/sys/net the node's namespace shows,
    and the files under the driver's state root; with `witnesses`, also the links and
    addresses of the other tenants' pods. Volatile values are left out: timers and counters,
    link indexes, address lifetimes and DAD states, the ARP cache's states (an entry is its
    address and MAC), entries a bridge learned from traffic (but where it learned the known
    hosts' MACs is kept, in `learned`), iptables' counters and comments."""
    env = {**os.environ, "WITNESSES": " ".join(p.name for p in (node.pod_a, node.pod_b))}
    if not witnesses:
        env["WITNESSES"] = ""
    done = subprocess.run(
        ["ip", "netns", "exec", node.node.name, "sh", "-c", SNAPSHOT_SCRIPT],
        capture_output=True, text=True, timeout=TIMEOUT, env=env, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise OSError(f"snapshot of {node.node.name}: {done.stderr.strip()}")
    sections: dict[str, str] = {}
    current = None
    chunks: list[str] = []
    for line in done.stdout.splitlines():
        if line.startswith("@@@ "):
            if current is not None:
                sections[current] = "\n".join(chunks)
            current, chunks = line[4:], []
        else:
            chunks.append(line)
    if current is not None:
        sections[current] = "\n".join(chunks)
    return _parse(sections, node)


def _json(text: str) -> list[dict[str, Any]]:
    text = text.strip()
    return list(json.loads(text)) if text else []


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if k in VOLATILE_LINK:
                continue
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list):
        out[prefix] = json.dumps(sorted(map(str, value)) if prefix.endswith("flags") else value)
    else:
        out[prefix] = json.dumps(value)


def _parse(sections: Mapping[str, str], node: Node) -> Snapshot:
    items: dict[Key, str] = {}
    index: dict[str, int] = {}
    kinds: dict[str, str] = {}
    masters: dict[str, str] = {}
    for link in _json(sections.get("links", "")):
        name = str(link["ifname"])
        index[name] = int(link["ifindex"])
        kinds[name] = str(link.get("linkinfo", {}).get("info_kind", ""))
        masters[name] = str(link.get("master", ""))
        flat: dict[str, str] = {}
        _flatten("", link, flat)
        items.update({("link", name, k): v for k, v in flat.items() if k != "ifname"})
    for link in _json(sections.get("addrs", "")):
        for a in link.get("addr_info", []):
            skip = VOLATILE_ADDRESS_FLAGS | {"local", "prefixlen"}
            attrs = json.dumps({k: v for k, v in a.items() if k not in skip}, sort_keys=True)
            items[("address", str(link["ifname"]), f"{a['local']}/{a['prefixlen']}")] = attrs
    _routes(sections, items)
    _neighbours(sections, items)
    learned = _bridges(sections, items, set(node.macs.values()))
    for q in _json(sections.get("qdisc", "")):
        qdisc = json.dumps(
            {k: v for k, v in q.items() if k not in ("dev", "refcnt")}, sort_keys=True
        )
        items[("qdisc", str(q.get("dev", "")), qdisc)] = "present"
    for tool in ("iptables", "ip6tables", "nft"):
        lines = [_rule_line(line) for line in sections.get(tool, "").splitlines()]
        for line, count in Counter(line for line in lines if line).items():
            items[("firewall", "", f"{tool}: {line}")] = str(count)
    _sysctls(sections, items)
    _witnesses(sections, items, node)
    for path in sorted(node.state_root.rglob("*")):
        if path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            items[("file", "", str(path.relative_to(node.state_root)))] = digest
    return Snapshot(items, index, kinds, masters, learned)


def _routes(sections: Mapping[str, str], items: dict[Key, str]) -> None:
    for family in ("routes4", "routes6"):
        for found in _json(sections.get(family, "")):
            route = {k: v for k, v in found.items() if k != "expires"}
            if route.get("type") == "local" and str(route.get("dst")).startswith("fe80:"):
                continue  # a link-local address's own route, made once its DAD is done
            text = json.dumps(route, sort_keys=True)
            items[("route", str(route.get("dev", "")), text)] = "present"
    for family in ("rules4", "rules6"):
        for rule in _json(sections.get(family, "")):
            items[("rule", "", f"{family[-1]} {json.dumps(rule, sort_keys=True)}")] = "present"


def _neighbours(sections: Mapping[str, str], items: dict[Key, str]) -> None:
    for entry in _json(sections.get("neigh", "")):
        states = set(entry.get("state", []))
        if not entry.get("lladdr") or states & {"FAILED", "INCOMPLETE", "NONE"}:
            continue  # a resolution in flight or failed: traffic, not configuration
        kind = "permanent" if states & {"PERMANENT", "NOARP"} else "learned"
        flags = " router" if "router" in entry else ""
        what = f"{entry['lladdr']} {kind}{flags}"
        items[("neighbour", str(entry.get("dev", "")), str(entry["dst"]))] = what


def _bridges(sections: Mapping[str, str], items: dict[Key, str], known: set[str]) -> dict[str, str]:
    """FDB entries a link holds for itself or was configured with, and VLANs of bridge ports,
    into `items`; where the known hosts' MACs were learned, returned."""
    learned: dict[str, str] = {}
    for entry in _json(sections.get("fdb", "")):
        dev = str(entry.get("ifname", ""))
        state = str(entry.get("state", ""))
        flags = sorted(entry.get("flags", []))
        mac = str(entry.get("mac", ""))
        if not state and "self" not in flags:  # learned from traffic
            if mac in known:
                learned[f"{mac} vlan {entry.get('vlan', '-')}"] = dev
            continue
        what = f"{mac} vlan {entry.get('vlan', '-')} master {entry.get('master', '-')}"
        items[("fdb", dev, what)] = f"{state} {' '.join(flags)}".strip()
    for bridge in _json(sections.get("mdb", "")):
        for m in bridge.get("mdb", []):
            what = f"{m.get('dev')} group {m.get('grp')} vlan {m.get('vid', '-')}"
            items[("mdb", str(m.get("port", "")), what)] = str(m.get("state", ""))
    for port in _json(sections.get("vlan", "")):
        dev = str(port.get("ifname", ""))
        for v in port.get("vlans", []):
            vid = f"{v.get('vlan')}" + (f"-{v['vlanEnd']}" if "vlanEnd" in v else "")
            items[("vlan", dev, vid)] = json.dumps(sorted(v.get("flags", [])))
    return learned


def _sysctls(sections: Mapping[str, str], items: dict[Key, str]) -> None:
    values: dict[str, list[str]] = {}
    for line in sections.get("sysctl", "").splitlines():
        path, _, value = line.partition(":")
        values.setdefault(path.removeprefix("/proc/sys/net/"), []).append(value)
    for path, lines in values.items():
        if path in VOLATILE_SYSCTLS:
            continue
        parts = path.split("/")
        dev = parts[2] if len(parts) > 3 and parts[1] in ("conf", "neigh") else ""
        items[("sysctl", dev, path)] = "\n".join(lines)


def _witnesses(sections: Mapping[str, str], items: dict[Key, str], node: Node) -> None:
    """The other tenants' pods' links and addresses."""
    for name, text in sections.items():
        kind, _, ns = name.partition(" ")
        pod = _witness_label(node, ns)
        for link in _json(text) if kind in ("witness-links", "witness-addrs") else []:
            where = f"{pod}:{link['ifname']}"
            if kind == "witness-addrs":
                for a in link.get("addr_info", []):
                    what = f"address {a['local']}/{a['prefixlen']}"
                    items[("witness", where, what)] = str(a.get("scope"))
            elif link.get("ifname") != "lo":
                flat: dict[str, str] = {}
                _flatten("", link, flat)
                skip = ("ifname", "link_netnsid")
                items.update({("witness", where, k): v for k, v in flat.items() if k not in skip})


def _witness_label(node: Node, name: str) -> str:
    return {node.pod_a.name: "podA", node.pod_b.name: "podB"}.get(name, name)


def _rule_line(line: str) -> str:
    line = line.strip()
    if not line or line.startswith("#"):
        return ""
    if line.startswith(":"):  # a chain's policy and counters: `:INPUT ACCEPT [0:0]`
        return line.split("[", 1)[0].strip()
    return line


# ------------------------------------------------------------------ diff


@dataclass(frozen=True)
class Change:
    area: str
    link: str
    what: str
    before: str | None
    after: str | None

    def __str__(self) -> str:
        where = f"{self.area} {self.link}: " if self.link else f"{self.area}: "
        if self.before is None:
            return f"{where}{self.what} appeared ({self.after})"
        if self.after is None:
            return f"{where}{self.what} vanished (was {self.before})"
        return f"{where}{self.what} {self.before} -> {self.after}"


@dataclass(frozen=True)
class PodView:
    """The pod's interfaces as its namespace shows them after the ADD."""

    macs: frozenset[str] = frozenset()
    peers: frozenset[int] = frozenset()  # veth peers' ifindexes (in the node's namespace)
    groups: frozenset[str] = frozenset()  # link-layer multicast groups it joined
    interfaces: Mapping[str, str] = field(default_factory=dict)  # name -> MAC


def pod_view(pod: Path) -> PodView:
    links = _json(run("ip", "-n", pod.name, "-d", "-j", "link", "show"))
    maddrs = _json(run("ip", "-n", pod.name, "-j", "maddr", "show"))
    interfaces = {str(k["ifname"]): str(k.get("address", "")) for k in links if k["ifname"] != "lo"}
    peers = {
        int(k["link_index"])
        for k in links
        if k.get("linkinfo", {}).get("info_kind") == "veth" and "link_index" in k
    }
    groups = {
        str(m["link"])
        for entry in maddrs
        if entry.get("ifname") != "lo"
        for m in entry.get("maddr", [])
        if "link" in m
    }
    return PodView(frozenset(interfaces.values()), frozenset(peers), frozenset(groups), interfaces)


@dataclass(frozen=True)
class Delta:
    """The pod's own documented delta: what an ADD may change on the node, and a DEL leave.

    - **the pod's own host veth end** (bridge): a new veth in the node's namespace whose peer
      is the pod's interface and whose master is the allocated bridge; its attributes, port
      flags (hairpin, isolation, learning), VLANs of its port, its link-local IPv6 address and
      the routes the kernel makes for it (fe80::/64, its local address, ff00::/8), neighbours
      on it, FDB and snooped multicast (MDB) entries of it, its qdisc, the sysctls of it
      (`conf/<veth>/`, `neigh/<veth>/`): all of it is the pod's, and goes with the veth at DEL
      (any other new link, or one whose master is not the allocated bridge, is a change);
    - **the pod's addresses in its parent's filters** (macvlan, vlan, tuning's `mac`): the
      kernel adds a child's MAC and the link-layer multicast groups it joined to the parent's
      unicast and multicast lists (`bridge fdb` shows them as `self permanent` on the parent),
      so that the parent delivers the pod's traffic; nothing else of the parent may change
      (flags, promiscuity and allmulti counts, MTU, MAC, addresses);
    - **a neighbour entry the node had learned going away** (a cache flushed or expiring
      re-resolves: no configuration), and a multicast membership a bridge snooped expiring; a
      learned entry appearing or pointing elsewhere is not covered, nor any change of a
      permanent one;
    - **the pod's own multicast groups snooped by a bridge** (a macvlan child on a bridge
      reports them through the bridge's host port): soft state (`temp`) for the groups the
      pod's interfaces joined, which expires by itself (260 s), so also after the DEL;
    - **files under the driver's state root for this pod's network**: host-local's leases and
      bookkeeping in `ipam/<network>/`, tuning's saved settings in `tuning/` for this
      container, the result cache `cni/results/<network>-<container>-<ifname>`; after the DEL
      only host-local's `lock` and `last_reserved_ip.*` may stay (the plugin keeps them for the
      network's next ADD; they hold no lease).

    Nothing else: the bridge's MTU, MAC and attributes, other ports, the parent's flags and
    MTU, the node's addresses, routes, rules, neighbours of the node's own, iptables/nft,
    every sysctl, other tenants' pods."""

    parent: str = ""
    network: str = ""
    container: str = ""
    if_name: str = ""
    host_links: frozenset[str] = frozenset()
    host_macs: frozenset[str] = frozenset()  # the host links' MACs
    pod: PodView = field(default_factory=PodView)
    added: bool = True  # False: after the DEL (or a failed ADD): nothing of the pod is left
    plugins: tuple[str, ...] = ()  # the network's plugin types, in order

    def covers(self, change: Change) -> bool:
        if change.area == "file":
            return self._file(change)
        if change.area == "neighbour" and change.after is None and "learned" in str(change.before):
            return True  # a cache forgetting an entry it learned (it resolves it again)
        if change.area == "mdb" and change.after is None and change.before == "temp":
            return True  # a multicast membership a bridge snooped, expired
        if change.area == "mdb" and change.after == "temp":
            group = change.what.split(" group ", 1)[-1].split(" ", 1)[0]
            if _group_mac(group) in self.pod.groups:
                return True  # the pod's own report, snooped
            solicited = group.startswith("ff02::1:ff")
            if solicited and not self.pod.groups and change.link == self.parent:
                # an ADD that failed: its child of the bridge lived long enough to report its
                # link-local address's solicited-node group through the bridge's host port
                # before the plugin removed it, and the pod's groups were never read (a new
                # address of the bridge's own would show as an address change)
                return True
            # else: a group the pod left again before the snapshot (a tuning MTU below 1280
            # turns IPv6 off after the bridge plugin brought the veth up: whether its report
            # was snooped first is timing), covered below only on the pod's own host port
        if not self.added:
            return False
        if change.link in self.host_links:
            if change.area == "address":
                return change.what.startswith("fe80:")
            if change.area == "route":
                return _link_local_route(change.what)
            covered = ("link", "neighbour", "fdb", "mdb", "vlan", "sysctl", "qdisc")
            return change.area in covered
        if change.area == "fdb" and change.link == self.parent and change.before is None:
            mac = change.what.split(" ", 1)[0]
            return "self" in str(change.after) and (mac in self.pod.macs or mac in self.pod.groups)
        return False

    def _file(self, change: Change) -> bool:
        path = change.what
        if not self.network:
            return False
        if path.startswith(f"ipam/{self.network}/"):
            name = path.rsplit("/", 1)[-1]
            return self.added or name == "lock" or name.startswith("last_reserved_ip")
        if not self.added:
            return False
        if path.startswith("tuning/") and self.container in path:
            return True
        return path == f"cni/results/{self.network}-{self.container}-{self.if_name}"


@dataclass(frozen=True)
class Accepted:
    """A host-side effect beyond the pod's own delta that docs/security.md ("Host-side
    effects") accepts as inherent to a plugin, matched narrowly. `quote` is the doc's own words
    for it: a test suite accepts it only while docs/security.md still says so, so the oracle is
    strict about it again once the row changes."""

    name: str
    quote: str
    matches: Callable[[Change, Delta], bool]


def _bridge_accept_ra(c: Change, d: Delta) -> bool:
    """The bridge plugin writes `accept_ra=0` on its bridge at every ADD (and DEL does not
    restore it)."""
    return (
        "bridge" in d.plugins
        and (c.area, c.link, c.what) == ("sysctl", d.parent, f"ipv6/conf/{d.parent}/accept_ra")
        and c.after == "0"
    )


def _bridge_mac(c: Change, d: Delta) -> bool:
    """While the pod's port is the bridge's lowest, a bridge whose MAC was never set has that
    port's MAC."""
    return (
        d.added
        and (c.area, c.link, c.what) == ("link", d.parent, "address")
        and json.loads(str(c.after)) in d.host_macs
    )


def _promiscuous_parent(c: Change, d: Delta) -> bool:
    """While a macvlan child is up on a parent without unicast filtering (a bridge), the
    kernel keeps the parent promiscuous for the child's MAC."""
    return (
        d.added
        and d.plugins[:1] == ("macvlan",)
        and (c.area, c.link, c.what) == ("link", d.parent, "promiscuity")
        and (c.before, c.after) == ("0", "1")
    )


DOCUMENTED = (
    Accepted(
        "the bridge plugin writes accept_ra=0 on the bridge",
        "`net.ipv6.conf.<bridge>.accept_ra=0` written in the node's namespace on every ADD",
        _bridge_accept_ra,
    ),
    Accepted(
        "a bridge whose MAC was never set takes the pod's port's MAC",
        "a bridge whose MAC was never set takes its lowest port's, so the pod's port can change it",
        _bridge_mac,
    ),
    Accepted(
        "a parent without unicast filtering turns promiscuous for a macvlan child",
        "a parent without unicast filtering turns promiscuous",
        _promiscuous_parent,
    ),
)


def accepted_by(change: Change, delta: Delta, documented: Sequence[Accepted]) -> Accepted | None:
    return next((a for a in documented if a.matches(change, delta)), None)


def _group_mac(group: str) -> str:
    """The link-layer address of an IP multicast group (RFC 2464, RFC 1112)."""
    try:
        ip = ipaddress.ip_address(group)
    except ValueError:
        return ""
    if ip.version == 6:
        tail = ip.packed[-4:]
        return "33:33:" + ":".join(f"{b:02x}" for b in tail)
    low = int(ip) & 0x7FFFFF
    return "01:00:5e:" + ":".join(f"{b:02x}" for b in low.to_bytes(3, "big"))


def _link_local_route(text: str) -> bool:
    route = json.loads(text)
    dst = str(route.get("dst", ""))
    if dst == "default":
        return False
    try:
        net = ipaddress.ip_network(dst, strict=False)
    except ValueError:
        return False
    return net.version == 6 and (
        net.subnet_of(ipaddress.IPv6Network("fe80::/10"))
        or net.subnet_of(ipaddress.IPv6Network("ff00::/8"))
    ) and not route.get("gateway")  # fmt: skip


def host_links(before: Snapshot, after: Snapshot, pod: PodView, parent: str) -> frozenset[str]:
    """The links new on the node that are the pod's own host veth end: a veth whose peer is
    the pod's interface and whose master is the allocated bridge."""
    return frozenset(
        name
        for name in after.links() - before.links()
        if after.kinds.get(name) == "veth"
        and after.index[name] in pod.peers
        and after.masters.get(name) == parent
    )


def diff(before: Snapshot, after: Snapshot, allowed: Delta) -> list[Change]:
    """Every change from `before` to `after` that `allowed` does not cover, named."""
    changes: list[Change] = []
    for key in sorted(set(before.items) | set(after.items)):
        old, new = before.items.get(key), after.items.get(key)
        if old == new:
            continue
        change = Change(*key, old, new)
        if not allowed.covers(change):
            changes.append(change)
    # where a bridge learned a known host's MAC (podA's, the probe's): moved to another port,
    # the pod's own included, it is that host's traffic going elsewhere
    for mac in sorted(set(before.learned) & set(after.learned)):
        if before.learned[mac] != after.learned[mac]:
            changes.append(Change("fdb", "learned", mac, before.learned[mac], after.learned[mac]))
    return _merge_links(changes)


def _merge_links(changes: list[Change]) -> list[Change]:
    """A link that appeared or vanished as one change, not one per attribute."""
    whole: dict[tuple[str, str], list[Change]] = {}
    rest: list[Change] = []
    for c in changes:
        if c.area == "link" and (c.before is None or c.after is None):
            whole.setdefault((c.link, "gone" if c.after is None else "new"), []).append(c)
        else:
            rest.append(c)
    for (link, how), group in sorted(whole.items()):
        attrs = {c.what: (c.after if how == "new" else c.before) for c in group}
        summary = ", ".join(
            f"{k}={attrs[k]}"
            for k in ("linkinfo.info_kind", "mtu", "address", "master")
            if k in attrs
        )
        rest.append(
            Change("link", link, "the link", None if how == "new" else summary,
                   summary if how == "new" else None)
        )  # fmt: skip
    return rest


# ------------------------------------------------------------------ probes


ETH_P_ARP = 0x0806
IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def ping(dst: str, payload: int = 56, timeout: float = 1.0, tries: int = 2) -> str | None:
    """An ICMP echo with `payload` bytes and DF set, from this thread's namespace: None when
    answered, else why not."""
    why = "no answer"
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as s:
        s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        ident = uuid.uuid4().int & 0xFFFF
        for seq in range(1, tries + 1):
            body = bytes(payload)
            header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
            packet = struct.pack("!BBHHH", 8, 0, _checksum(header + body), ident, seq) + body
            try:
                s.sendto(packet, (dst, 0))
            except OSError as exc:
                return f"send failed: {exc.strerror}"
            deadline = time.monotonic() + timeout
            while True:  # past the deadline, once more without waiting: what is queued counts
                left = max(deadline - time.monotonic(), 0.0)
                ready, _, _ = select.select([s], [], [], left)
                if not ready:
                    break
                data, addr = s.recvfrom(65535)
                ihl = (data[0] & 0x0F) * 4
                kind, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl : ihl + 8])
                if kind == 0 and rid == ident and rseq == seq and addr[0] == dst:
                    got = len(data) - ihl - 8
                    return None if got == payload else f"answered with {got} bytes"
                if kind == 3 and addr[0] != dst:
                    why = f"ICMP unreachable from {addr[0]}"
    return why


def arp_answers(
    queries: Sequence[tuple[str, str, Sequence[str]]], wait: float
) -> dict[tuple[str, str], set[str]]:
    """Who answers ARP requests, from this thread's namespace: for each (link, source
    address, targets), every MAC that replied for each target within `wait` seconds (two
    replies: the address is taken twice)."""
    found: dict[tuple[str, str], set[str]] = {}
    with contextlib.ExitStack() as stack:
        sockets: dict[socket.socket, str] = {}
        for ifname, source, targets in queries:
            # protocol 0 until bound: a packet socket open for ARP before its bind would
            # queue frames of every link
            s = stack.enter_context(socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
            s.bind((ifname, ETH_P_ARP))
            sockets[s] = ifname
            mine = s.getsockname()[4]
            for target in targets:
                found[(ifname, target)] = set()
                arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mine + socket.inet_aton(source)
                arp += bytes(6) + socket.inet_aton(target)
                s.send(b"\xff" * 6 + mine + struct.pack("!H", ETH_P_ARP) + arp)
        deadline = time.monotonic() + wait
        while True:  # past the deadline, once more without waiting: what is queued counts
            left = max(deadline - time.monotonic(), 0.0)
            ready, _, _ = select.select(list(sockets), [], [], left)
            if not ready:
                break
            for s in ready:
                frame, where = s.recvfrom(2048)
                if where[0] != sockets[s]:
                    continue
                op = struct.unpack("!H", frame[20:22])[0]
                key = (sockets[s], socket.inet_ntoa(frame[28:32]))
                if op == 2 and key in found:
                    found[key].add(":".join(f"{b:02x}" for b in frame[22:28]))
    return found


@dataclass(frozen=True)
class Expectation:
    """On link `ifname` of the segment namespace (source address `source`), who owns each
    address: the set of owner names (`Node.macs`) that must answer, and only they."""

    ifname: str
    source: str
    owners: Mapping[str, frozenset[str]]
    full_size: tuple[str, ...] = ()  # answered with 1500-byte frames, DF set


EXPECTATIONS = (
    Expectation(
        "seg-br",
        SEGMENT_IP,
        {
            DATA_IP: frozenset({"data0"}),
            PODB_IP: frozenset({"podB"}),
            NODE_IP: frozenset({"data0"}),  # a Linux host answers for any of its addresses
            PODA_IP: frozenset(),
        },
        full_size=(DATA_IP, PODB_IP),
    ),
    Expectation(
        "brp0",
        PROBE_IP,
        {
            PODA_IP: frozenset({"podA"}),
            DATA_IP: frozenset({"br-data"}),
            PODB_IP: frozenset(),
            NODE_IP: frozenset({"br-data"}),
        },
        full_size=(PODA_IP,),
    ),
)


def probe(node: Node, pod: PodView | None = None) -> list[str]:
    """From the segment namespace (the data segment, and its port on br-data): each address
    is answered by its owner only (ARP), full-size packets with DF reach the owners (ping
    -M do -s 1472), and after that the segment's neighbour entry is the owner's MAC."""
    # the node answers for each of its addresses on every link (Linux's weak host model): on
    # br-data with br-data's MAC, whatever that is now (a change is the snapshot's to report)
    macs = {**node.macs, "br-data": _mac(node.node, "br-data")}
    names = {mac: who for who, mac in macs.items()}
    if pod is not None:
        names.update({mac: f"the pod's {ifname}" for ifname, mac in pod.interfaces.items()})

    def ask() -> list[str]:
        queries = [(e.ifname, e.source, list(e.owners)) for e in EXPECTATIONS]
        wants = {
            (e.ifname, address): {macs[o] for o in owners}
            for e in EXPECTATIONS
            for address, owners in e.owners.items()
        }
        answers = arp_answers(queries, wait=0.1)
        if any(answers[k] != want for k, want in wants.items()):  # a slow answer: once more
            answers = arp_answers(queries, wait=3.0)  # a loaded machine's slow answer
        failures: list[str] = []
        for e in EXPECTATIONS:
            for address, owners in e.owners.items():
                got = answers[(e.ifname, address)]
                if got != wants[(e.ifname, address)]:
                    who = ", ".join(f"{m} ({names.get(m, 'unknown')})" for m in sorted(got))
                    failures.append(
                        f"ARP on {_segment_name(e.ifname)} for {address}: answered by "
                        f"[{who}], its owner is {', '.join(sorted(owners)) or 'nobody there'}"
                    )
            for address in e.full_size:
                why = ping(address, payload=1472)
                if why:
                    failures.append(
                        f"ping -M do -s 1472 {address} on {_segment_name(e.ifname)}: {why}"
                    )
        return failures

    failures = in_namespace(node.segment, ask)
    for entry in _json(run("ip", "-n", node.segment.name, "-j", "neigh", "show")):
        for e in EXPECTATIONS:
            owners = e.owners.get(str(entry.get("dst")))
            if entry.get("dev") != e.ifname or not owners or "lladdr" not in entry:
                continue
            want = {macs[o] for o in owners}
            if entry["lladdr"] not in want:
                failures.append(
                    f"the segment's neighbour entry for {entry['dst']} on "
                    f"{_segment_name(e.ifname)} is {entry['lladdr']} "
                    f"({names.get(entry['lladdr'], 'unknown')})"
                )
    return failures


def _segment_name(ifname: str) -> str:
    return {"seg-br": "the data0 segment", "brp0": "br-data"}.get(ifname, ifname)


# ------------------------------------------------------------------ one config, end to end


@dataclass
class Outcome:
    """What one tenant config did: refused (with prepare's reason), failed in a plugin (with
    its reason; the node must be as before), or came up; `changes` beyond the documented delta
    after the ADD, `leftovers` after the DEL, `probes` that failed after the ADD."""

    config: str
    refused: str | None = None
    add_failed: str | None = None
    changes: list[Change] = field(default_factory=list)
    leftovers: list[Change] = field(default_factory=list)
    probes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)  # documented effects it had
    attachment: Attachment | None = field(default=None, repr=False)

    @property
    def findings(self) -> list[str]:
        return (
            [f"after the ADD: {c}" for c in self.changes]
            + [f"probe after the ADD: {p}" for p in self.probes]
            + [f"after the DEL: {c}" for c in self.leftovers]
        )

    def report(self) -> str:
        if self.refused:
            head = f"refused: {self.refused}"
        elif self.add_failed:
            head = f"ADD failed: {self.add_failed}"
        else:
            head = "allowed and ADDed"
        accepted = [f"accepted (docs/security.md): {a}" for a in self.accepted]
        lines = [f"config: {self.config}", head, *self.findings, *accepted, *self.notes]
        return "\n  ".join(lines)


def allocated_claim(
    params: Mapping[str, Any],
    device_class: Mapping[str, Any],
    link: str,
    ref: ObjectRef,
) -> dict[str, Any]:
    """A tenant's claim with `params` as its config, allocated `link` of this node from
    `device_class` (whose configs DRA copies in, FromClass), as prepare reads it."""
    config = {"apiVersion": "cni.networking.x-k8s.io/v1alpha1", "kind": "CNIConfig", **params}
    class_configs = [
        {**copy.deepcopy(c), "source": "FromClass", "requests": ["net"]}
        for c in device_class["spec"].get("config", [])
    ]
    claim_config = {
        "source": "FromClaim",
        "requests": ["net"],
        "opaque": {"driver": DRIVER, "parameters": config},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "net",
                     "exactly": {"deviceClassName": device_class["metadata"]["name"]}}
                ],
                "config": [{k: v for k, v in claim_config.items() if k != "source"}],
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "net", "driver": DRIVER, "pool": NODE_NAME, "device": link}
                    ],
                    "config": [*class_configs, claim_config],
                }
            }
        },
    }  # fmt: skip


def prepare(
    node: Node,
    params: Mapping[str, Any],
    device_class: Mapping[str, Any],
    link: str,
    ref: ObjectRef,
    allocator: Allocator | None,
    notes: list[str],
) -> Attachment | str:
    """Prepare's path for one tenant request: the claim's configs read as prepare reads them,
    `resolve_attachment` with the node's facts, the check that the link does not carry the
    node, cnidra IPAM's `Allocator.assign` (cnidra IPAM, tenant static addresses), interface
    names. The Attachment, or why prepare refuses."""
    typed = read_claim(allocated_claim(params, device_class, link, ref))
    issues = Issues()
    attachment = resolve_attachment(
        typed.configs,
        "net",
        ref,
        Device(NODE_NAME, link, None, link),
        node.layout.private_dirs(),
        issues,
        ALLOCATION_CONFIG,
        node=node.facts(),
    )
    if attachment is None:
        return "; ".join(f"{i.path}: {i.message}" for i in issues.errors) or "no attachment"
    if link in node.protected() and not attachment.node_link_allowed:
        return f"link {link} carries the node"
    if cnidra_ipam(attachment.network) or attachment.tenant_static:
        if allocator is None:
            return "cnidra IPAM without an allocator"
        claim = PreparedClaim(ref, (f"pod-{ref.uid}",), (attachment,))
        try:
            claim = asyncio.run(allocator.assign(claim, [f"pod-{ref.name}"]))
        except AllocationError as exc:
            return f"Allocator.assign: {exc}"
        [attachment] = claim.devices
        if attachment.tenant_static and not allocator.state.of_owner(claim_owner(ref.uid, "net")):
            notes.append(
                "tenant static addresses were not leased: Allocator.assign does not lease "
                "them (yet)"
            )
    [named] = name_pod_interfaces([PreparedClaim(ref, (), (attachment,))], [])
    return named.devices[0]


@dataclass
class Plugged:
    """A pod namespace with one attachment ADDed (the node's namespace as the host)."""

    pod: Path
    attachment: Attachment
    container: str
    view: PodView = field(default_factory=PodView)
    del_errors: list[str] = field(default_factory=list)


@contextlib.contextmanager
def plugged(node: Node, attachment: Attachment, cni_path: Sequence[str]) -> Iterator[Plugged]:
    """ADD `attachment` with the real plugins into a fresh `cnidra-pod` namespace, from a
    thread in the node's namespace with its own event loop (the plugins inherit the thread's
    namespace, as they inherit the driver's on a node), with the pod's CNI_ARGS as the NRI hook
    adds them; DEL it on the way out. AttachFailed (after attach_all's rollback) if the ADD
    fails."""
    container = f"oracle-{uuid.uuid4().hex[:12]}"
    pod_ref = ObjectRef(attachment.claim.namespace, "pod", f"pod-{container}")
    attachment = attachment.for_pod(pod_ref, container)
    runtime = CNIRuntime(list(cni_path), str(node.layout.cni_cache), timeout=TIMEOUT)
    with netns.temporary("cnidra-pod") as pod:
        target = str(pod)

        async def add() -> None:
            await attach_all(runtime, [attachment], container, target)

        async def delete() -> list[str]:
            return await detach_all(runtime, [attachment], container, target)

        in_namespace(node.node, lambda: asyncio.run(add()))
        done = Plugged(pod, attachment, container)
        try:
            done.view = pod_view(pod)
            yield done
        finally:
            done.del_errors = in_namespace(node.node, lambda: asyncio.run(delete()))


def exercise(
    node: Node,
    params: Mapping[str, Any],
    device_class: Mapping[str, Any],
    link: str,
    *,
    cni_path: Sequence[str],
    allocator: Allocator | None = None,
    namespace: str = "team-a",
    documented: Sequence[Accepted] = (),
) -> Outcome:
    """One tenant config through prepare's path, then (if allowed) ADDed with the real plugins
    into a fresh pod namespace, probed, compared with the node before, DELed and compared
    again. A node that differs from its state as built, or fails its probes, before the run
    (a failed run left something) is built again first. The claim's addresses are released
    from the allocator after the run (as unprepare does). `documented`: effects beyond the
    pod's delta to accept (reported in `Outcome.accepted`); none by default."""
    described = json.dumps(
        {"class": device_class["metadata"]["name"], "link": link, **params}, sort_keys=True
    )
    outcome = Outcome(described)
    uid = uuid.uuid4().hex[:12]
    ref = ObjectRef(namespace, f"claim-{uid}", uid)
    before = ready_node(node)
    try:
        prepared = prepare(node, params, device_class, link, ref, allocator, outcome.notes)
        if isinstance(prepared, str):
            outcome.refused = prepared
            outcome.leftovers = diff(before, snapshot(node), Delta(added=False))
            return outcome
        outcome.attachment = prepared
        compare(node, prepared, before, outcome, cni_path, documented)
    finally:
        if allocator is not None:
            asyncio.run(allocator.release_claim(uid))
    return outcome


def compare(
    node: Node,
    attachment: Attachment,
    before: Snapshot,
    outcome: Outcome,
    cni_path: Sequence[str],
    documented: Sequence[Accepted] = (),
) -> None:
    """ADD, snapshot, probe, DEL, snapshot: what changed beyond the pod's delta (and the
    `documented` effects) into `outcome`."""
    network = str(attachment.network.get("name", ""))
    plugins = attachment.network.get("plugins")
    types = (
        tuple(str(p.get("type")) for p in plugins if isinstance(p, Mapping))
        if isinstance(plugins, list)
        else ()
    )
    gone = Delta(attachment.parent, network, "", attachment.if_name, added=False, plugins=types)
    try:
        with plugged(node, attachment, cni_path) as up:
            gone = replace(gone, container=up.container, pod=up.view)
            after = snapshot(node)
            mine = host_links(before, after, up.view, attachment.parent)
            delta = replace(
                gone,
                added=True,
                host_links=mine,
                host_macs=frozenset(json.loads(after.items[("link", h, "address")]) for h in mine),
            )
            outcome.changes = _unless(diff(before, after, delta), delta, documented, outcome)
            outcome.probes = probe(node, up.view)
    except AttachFailed as failed:
        outcome.add_failed = failed.failed.error or str(failed)
    else:
        if up.del_errors:
            outcome.notes.append(f"DEL failed: {'; '.join(up.del_errors)}")
    left = diff(before, snapshot(node), gone)
    outcome.leftovers = _unless(left, gone, documented, outcome)


def _unless(
    changes: list[Change], delta: Delta, documented: Sequence[Accepted], outcome: Outcome
) -> list[Change]:
    """The changes no `documented` effect accepts; the accepted ones into `outcome.accepted`."""
    kept = []
    for change in changes:
        accepted = accepted_by(change, delta, documented)
        if accepted is None:
            kept.append(change)
        else:
            when = "after the ADD" if delta.added else "after the DEL"
            outcome.accepted.append(f"{accepted.name}, {when}: {change}")
    return kept


def ready_node(node: Node) -> Snapshot:
    """The node's snapshot before a run, after its probes passed (they also refresh what the
    segment and the bridges learned). Files a run left under the state root (reported by that
    run) are removed; a node that fails its probes or differs from its state as built is built
    again."""
    failures: list[str] = []
    for attempt in range(2):
        if node.baseline is None:  # a build that failed
            node.rebuild()
        assert node.baseline is not None
        for path in sorted(node.state_root.rglob("*"), reverse=True):
            name = str(path.relative_to(node.state_root))
            if path.is_file() and ("file", "", name) not in node.baseline.items:
                path.unlink()
        failures = probe(node)
        current = snapshot(node)
        drift = [str(c) for c in diff(node.baseline, current, Delta(added=False))]
        if not failures and not drift:
            return current
        failures += drift
        if attempt == 0:
            node.rebuild()
    raise AssertionError(f"the node cannot be made ready: {failures}")
