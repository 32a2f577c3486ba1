"""What a network does outside the pod's namespace, judged against the node as it is: the
host-side effects of the plugins a tenant may run (docs/security.md, "Host-side effects").
Pure: the facts about the node's links come in as `NodeFacts` (the inventory reads them).

A field can be spelled right and still reach outside the pod: the bridge plugin gives the host
end of the pod's veth the network's `mtu` (the kernel's default, 1500, when it has none), and
the kernel sizes a bridge to its smallest port, so one pod's MTU drags the shared bridge and
every other port down (or, on a bridge with no smaller port, up); a VLAN on a bridge that does
not filter VLANs isolates nothing; a static address the node holds is taken from the node by
the plugin's gratuitous ARP. Prepare judges each bound network here, with the node's facts,
before anything runs."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cnidra.api.issues import FieldPath, Issues

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class LinkFacts:
    """One host link as prepare needs to know it."""

    name: str
    kind: str  # physical, virtual, bridge, bond, vlan (inventory.links.Link.kind)
    mtu: int
    addresses: tuple[str, ...] = ()  # the node's addresses on it, as CIDRs
    # bridges: whether the bridge filters VLANs (None: not known, taken as no)
    vlan_filtering: bool | None = None


@dataclass(frozen=True)
class NodeFacts:
    """The node's links by name, and every address it holds on any of them."""

    links: Mapping[str, LinkFacts] = field(default_factory=dict)

    def addresses(self) -> frozenset[Address]:
        out: set[Address] = set()
        for link in self.links.values():
            for cidr in link.addresses:
                try:
                    out.add(ipaddress.ip_interface(cidr).ip)
                except ValueError:
                    continue
        return frozenset(out)


def judge_host_side(
    network: Mapping[str, Any],
    parent: str,
    node: NodeFacts,
    tenant: Callable[[tuple[Any, ...]], bool],
    issues: Issues,
    where: FieldPath,
) -> dict[str, Any]:
    """The bound network (a conflist) with the values pinned that keep shared host objects as
    they are, and errors for what a tenant wrote that would change one. `tenant(path)`: whether
    a tenant wrote the value at a path of the conflist (`("plugins", 0, "mtu")`)."""
    return dict(network)
