"""The node's network links, read from rtnetlink (cnidra.inventory.netlink) and sysfs."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cnidra.api.hostside import LinkFacts, NodeFacts
from cnidra.inventory import DEFAULT_EXCLUDE
from cnidra.inventory.netlink import AF_INET, AF_INET6, dump

SYS_NET = Path("/sys/class/net")


@dataclass(frozen=True)
class Link:
    name: str
    index: int
    mac: str
    mtu: int
    kind: str  # physical, virtual, bridge, bond, vlan
    link_kind: str | None  # the kernel's IFLA_INFO_KIND, None for physical NICs
    state: str  # up, down, unknown, ...
    speed_mbps: int | None = None
    pci_address: str | None = None
    pci_vendor: str | None = None
    pci_device: str | None = None
    numa_node: int | None = None
    sriov_vfs: int | None = None
    ipv4: tuple[str, ...] = ()
    ipv6: tuple[str, ...] = ()
    loopback: bool = False
    master: int | None = None  # the bridge or bond it is a port of
    lower: int | None = None  # the link a vlan/macvlan sits on
    default_route: bool = False  # a default route (IPv4 or IPv6) leaves through it
    gateway_route: bool = False  # a route of the node's via a gateway leaves through it
    # a veth whose peer lives in another network namespace (a pod's, or a container's)
    peer_elsewhere: bool = False
    admin_up: bool = True  # IFF_UP: set up by the node's admin
    carrier: bool | None = None  # IFLA_CARRIER: a cable, a peer, a switch port
    absent: bool = False  # gone from the node, kept as a device while claims use it
    vlan_filtering: bool | None = None  # bridges: whether the bridge filters VLANs


def link_failure(link: Link) -> str | None:
    """Why the link cannot carry a pod's traffic now (the value of its device's taint), or
    None. A bridge with no port reports `unknown` with carrier: that is a working link."""
    if link.absent:
        return "absent"
    if not link.admin_up:
        return "admin-down"
    if link.carrier is False:
        return "no-carrier"
    if link.state in ("down", "lowerlayerdown", "notpresent", "dormant"):
        return link.state
    return None


def absent_link(name: str) -> Link:
    """A link claims use that the node no longer has."""
    return Link(name, 0, "", 0, "absent", None, "absent", absent=True)


def classify(link_kind: str | None, has_device: bool) -> str:
    if link_kind in ("bridge", "bond", "vlan"):
        return link_kind
    if link_kind is None and has_device:
        return "physical"
    return "virtual"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _sysfs(name: str) -> dict[str, object]:
    base = SYS_NET / name
    info: dict[str, object] = {}
    device = base / "device"
    speed = _read(base / "speed")
    if speed and speed.lstrip("-").isdigit() and int(speed) > 0:
        info["speed_mbps"] = int(speed)
    if device.exists():
        info["has_device"] = True
        target = os.path.realpath(device)
        pci = os.path.basename(target)
        if re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", pci):
            info["pci_address"] = pci
            info["pci_vendor"] = _read(device / "vendor")
            info["pci_device"] = _read(device / "device")
            numa = _read(device / "numa_node")
            if numa is not None and numa.lstrip("-").isdigit() and int(numa) >= 0:
                info["numa_node"] = int(numa)
            vfs = _read(device / "sriov_totalvfs")
            if vfs and vfs.isdigit():
                info["sriov_vfs"] = int(vfs)
    return info


def read_links() -> list[Link]:
    """Every link of the current network namespace, with its addresses."""
    found = dump()
    defaults = {r.oif for r in found.routes if r.dst_len == 0}
    # the node reaches other networks through a gateway on these (a storage or management
    # route): traffic of the node's own, as much as a default route's
    routed = {r.oif for r in found.routes if r.gateway} | {
        hop for r in found.routes for hop in r.hops
    }
    v4: dict[int, list[str]] = {}
    v6: dict[int, list[str]] = {}
    for addr in found.addresses:
        if addr.family == AF_INET6 and addr.ip.startswith("fe80:"):
            continue
        target = v4 if addr.family == AF_INET else v6
        target.setdefault(addr.index, []).append(f"{addr.ip}/{addr.prefixlen}")
    links = []
    for msg in found.links:
        if msg.name is None:
            continue  # every link has a name; a message without one is not a link to show
        sysfs = _sysfs(msg.name)
        links.append(
            Link(
                name=msg.name,
                index=msg.index,
                mac=msg.mac or "",
                mtu=msg.mtu or 0,
                kind=classify(msg.link_kind, bool(sysfs.get("has_device"))),
                link_kind=msg.link_kind,
                state=msg.state or "unknown",
                speed_mbps=sysfs.get("speed_mbps"),  # type: ignore[arg-type]
                pci_address=sysfs.get("pci_address"),  # type: ignore[arg-type]
                pci_vendor=sysfs.get("pci_vendor"),  # type: ignore[arg-type]
                pci_device=sysfs.get("pci_device"),  # type: ignore[arg-type]
                numa_node=sysfs.get("numa_node"),  # type: ignore[arg-type]
                sriov_vfs=sysfs.get("sriov_vfs"),  # type: ignore[arg-type]
                ipv4=tuple(v4.get(msg.index, ())),
                ipv6=tuple(v6.get(msg.index, ())),
                loopback=msg.loopback,
                master=msg.master,
                # IFLA_LINK of a veth names its peer in another namespace when
                # IFLA_LINK_NETNSID is set: an index there, not here (then None)
                lower=msg.lower,
                default_route=msg.index in defaults,
                gateway_route=msg.index in routed,
                peer_elsewhere=msg.link_kind == "veth" and msg.peer_elsewhere,
                admin_up=msg.admin_up,
                carrier=msg.carrier,
                vlan_filtering=msg.vlan_filtering,
            )
        )
    return links


def node_facts(links: Iterable[Link]) -> NodeFacts:
    """The node's links as prepare judges a network's host-side effects against them
    (cnidra.api.hostside): each link's kind, MTU, the node's addresses on it, and whether a
    bridge filters VLANs."""
    return NodeFacts(
        {
            link.name: LinkFacts(
                link.name,
                link.kind,
                link.mtu,
                (*link.ipv4, *link.ipv6),
                link.vlan_filtering,
                link.speed_mbps,
            )
            for link in links
            if not link.absent
        }
    )


def primary_bridges(links: Iterable[Link]) -> frozenset[int]:
    """Bridges of another network of pods: a bridge holding a host address (the pods' gateway)
    with a port whose veth peer lives in another network namespace. That is kubenet's cbr0,
    the bridge CNI's cni0, docker0, podman's: a pod plugged into one would sit on the primary
    network with whatever address it asked for. cnidra's own bridge networks hold no host
    address (isGateway is never a tenant's), so they stay publishable."""
    links = list(links)
    with_pods = {link.master for link in links if link.peer_elsewhere and link.master}
    return frozenset(
        link.index
        for link in links
        if link.kind == "bridge" and link.index in with_pods and (link.ipv4 or link.ipv6)
    )


def carrying_node(links: Iterable[Link], node_ips: Iterable[str] = ()) -> frozenset[str]:
    """Links no pod may get: those that carry the node itself (loopback, links with a default
    route, a route via a gateway, or one of the node's addresses, its InternalIP), the bridges
    of another network of pods (`primary_bridges`), and every link bound to one of those (the
    bridge or bond it is a port of, its ports, the link a vlan sits on)."""
    links = list(links)
    by_index = {link.index: link for link in links}
    ips = {ip.split("/")[0] for ip in node_ips}
    carrying = {
        link.index
        for link in links
        if link.loopback
        or link.default_route
        or link.gateway_route
        or ips & {a.split("/")[0] for a in (*link.ipv4, *link.ipv6)}
    } | primary_bridges(links)
    grew = True
    while grew:
        before = len(carrying)
        for link in links:
            if link.master in carrying or link.lower in carrying:
                carrying.add(link.index)  # a port of, or a vlan on, a node link
            if link.index in carrying:
                carrying.update(i for i in (link.master, link.lower) if i in by_index)
        grew = len(carrying) > before
    return frozenset(by_index[i].name for i in carrying)


@dataclass(frozen=True)
class LinkFilter:
    """Which links become devices. Loopback and the kinds pods and runtimes create are out."""

    include: str = ".*"
    exclude: str = DEFAULT_EXCLUDE
    exclude_kinds: frozenset[str] = frozenset({"veth", "tun", "ifb", "macvtap", "ipvtap", "nlmon"})

    def eligible(self, link: Link) -> bool:
        if link.loopback or (link.link_kind or "") in self.exclude_kinds:
            return False
        return bool(re.search(self.include, link.name)) and not re.search(self.exclude, link.name)


def cni_plugins(cni_path: Iterable[str]) -> list[str]:
    """Executables found on the CNI path, first directory winning, sorted."""
    found: set[str] = set()
    for directory in cni_path:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.is_file() and os.access(entry.path, os.X_OK):
                found.add(entry.name)
    return sorted(found)
