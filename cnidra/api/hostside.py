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
from functools import cached_property
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
    # the link's speed in Mbit/s as the kernel reports it (None: not known, e.g. a virtual
    # link); published as the device's `bandwidth` capacity, and a burst's default ceiling
    speed_mbps: int | None = None


@dataclass(frozen=True)
class NodeFacts:
    """The node's links by name, and every address it holds on any of them."""

    links: Mapping[str, LinkFacts] = field(default_factory=dict)

    def addresses(self) -> frozenset[Address]:
        """Parsed once for these facts (a node with a thousand links judges each claim)."""
        return self._addresses

    @cached_property
    def _addresses(self) -> frozenset[Address]:
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
    a tenant wrote the value at a path of the conflist (`("plugins", 0, "mtu")`); what the
    admin wrote passes as written. `where`: the network's place in the claim, for the errors
    (a single-plugin config is named as its conflist form, `plugins[0]`)."""
    link = node.links.get(parent)
    held = node.addresses()
    plugins = network.get("plugins")
    out = []
    for i, original in enumerate(plugins if isinstance(plugins, list) else []):
        if not isinstance(original, Mapping):
            out.append(original)
            continue
        plugin = dict(original)
        at = where / "plugins" / i
        wrote = _writer(tenant, ("plugins", i))
        if plugin.get("type") == "bridge" and link is not None and link.kind == "bridge":
            _bridge(plugin, link, wrote, issues, at)
        ipam = plugin.get("ipam")
        if isinstance(ipam, Mapping) and held:
            _node_addresses(
                ipam, held, _writer(tenant, ("plugins", i, "ipam")), issues, at / "ipam"
            )
        out.append(plugin)
    return {**network, "plugins": out}


def _writer(
    tenant: Callable[[tuple[Any, ...]], bool], prefix: tuple[Any, ...]
) -> Callable[[str], bool]:
    def wrote(key: str) -> bool:
        return tenant((*prefix, key))

    return wrote


def _bridge(
    plugin: dict[str, Any],
    bridge: LinkFacts,
    tenant: Callable[[str], bool],
    issues: Issues,
    at: FieldPath,
) -> None:
    """The host end of the pod's veth gets the plugin's `mtu` (the kernel's 1500 without one),
    and the kernel sizes a bridge to its smallest port (and, with no smaller port, grows it):
    only the bridge's own MTU changes nothing. A VLAN on a bridge that does not filter VLANs
    isolates nothing, and the plugin turns filtering on only for a bridge it creates."""
    mtu = plugin.get("mtu")
    # an admin may spell it `MTU` (Go matches keys case-insensitively): theirs stands as written
    spelled = any(k.lower() == "mtu" and k != "mtu" for k in plugin)
    if mtu in (None, 0) and not spelled:
        plugin["mtu"] = bridge.mtu  # pinned: the value that changes nothing
    elif mtu != bridge.mtu and tenant("mtu"):
        issues.error(
            at / "mtu",
            f"{mtu} differs from bridge {bridge.name}'s MTU {bridge.mtu}: the host end of the "
            "pod's veth is a port of the shared bridge, and the kernel sizes a bridge to its "
            f"smallest port, so every other port would get it too; leave it out (cnidra sets "
            f"{bridge.mtu}) or set the pod's own end with tuning's mtu",
        )
    if bridge.vlan_filtering:
        return
    for key in ("vlan", "vlanTrunk"):
        if plugin.get(key) in (None, 0, [], False) or not tenant(key):
            continue
        issues.error(
            at / key,
            f"bridge {bridge.name} does not filter VLANs (vlan_filtering is off), so a VLAN on "
            "its port isolates nothing; the admin must enable VLAN filtering on the bridge "
            "(ip link set BRIDGE type bridge vlan_filtering 1) for claims to use VLANs on it",
        )


def _node_addresses(
    ipam: Mapping[str, Any],
    held: frozenset[Address],
    tenant: Callable[[str], bool],
    issues: Issues,
    at: FieldPath,
) -> None:
    """A static address the node holds would be taken from the node by the plugin's
    gratuitous ARP (or unsolicited neighbour advertisement): never a tenant's."""
    if ipam.get("type") != "static" or not tenant("addresses"):
        return
    addresses = ipam.get("addresses")
    for j, entry in enumerate(addresses if isinstance(addresses, list) else []):
        text = entry.get("address") if isinstance(entry, Mapping) else None
        try:
            ip = ipaddress.ip_interface(str(text)).ip
        except ValueError:
            continue
        mapped = getattr(ip, "ipv4_mapped", None)
        if ip in held or (mapped is not None and mapped in held):
            issues.error(
                at / "addresses" / j / "address",
                f"{ip} is an address of this node: the plugin would announce it from the pod "
                "and take the node's traffic",
            )
