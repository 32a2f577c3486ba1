"""ResourceSlices for the node's links: pure functions from an inventory to slice objects.

Device attributes live in the driver's own domain (cni.dra.networking.x-k8s.io), so a CEL
selector reads `device.attributes["cni.dra.networking.x-k8s.io"].ifName`. The full list is in
docs/inventory.md, and only there and here."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cnidra.api.constants import DRIVER_NAME
from cnidra.api.networks import NamedNetwork
from cnidra.api.policy import parent_links
from cnidra.inventory.links import Link, link_failure

MAX_DEVICES_PER_SLICE = 128
MAX_ATTRIBUTES = 32  # attributes + capacities per device (resource.k8s.io/v1 validation)
STRING_MAX = 64
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"

# CNI plugins published as boolean attributes, most useful first, while the budget lasts.
PLUGIN_ATTRIBUTES = (
    "macvlan",
    "ipvlan",
    "vlan",
    "host-device",
    "bridge",
    "sriov",
    "ib-sriov",
    "tap",
    "ptp",
    "tuning",
    "bandwidth",
    "sbr",
    "host-local",
    "static",
    "dhcp",
    "whereabouts",
    "portmap",
    "firewall",
    "vrf",
)


TAINT_KEY = f"{DRIVER_NAME}/link-failure"
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")


@dataclass(frozen=True)
class SliceSettings:
    node: str
    sub_interfaces: int = 64  # how many pod interfaces may share one parent
    shared_capacity: bool = True  # KEP-5075 consumable capacity (allowMultipleAllocations)
    # KEP-5055 device taints on a failed link (the key TAINT_KEY, the failure as its value):
    # NoSchedule keeps new claims off it, NoExecute also evicts the pods using it; "None": no
    # taint (the cluster without device taints, or the admin's choice)
    taint_effect: str = "NoSchedule"


def taints(failure: str | None, settings: SliceSettings) -> list[dict[str, str]]:
    if failure is None or settings.taint_effect == "None":
        return []
    return [{"key": TAINT_KEY, "value": failure, "effect": settings.taint_effect}]


def plugin_attribute(plugin: str) -> str:
    return "cni" + "".join(part.capitalize() for part in re.split(r"[-_.]", plugin))


def device_name(link: Link, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", link.name.lower()).strip("-")[:55] or f"link{link.index}"
    name = base
    if name in taken:
        name = f"{base}-{link.index}"
    taken.add(name)
    return name


def device(
    link: Link,
    name: str,
    plugins: Sequence[str],
    settings: SliceSettings,
    node_link: bool = False,
) -> dict[str, Any]:
    attrs: dict[str, dict[str, Any]] = {
        "ifName": {"string": link.name},
        "nodeLink": {"bool": node_link},
        "type": {"string": link.kind},
        "state": {"string": link.state},
        "mtu": {"int": link.mtu},
    }
    if link.mac:
        attrs["mac"] = {"string": link.mac}
    if link.speed_mbps:
        attrs["speed"] = {"int": link.speed_mbps}
    if link.ipv4:
        attrs["ipv4"] = {"string": link.ipv4[0][:STRING_MAX]}
    if link.ipv6:
        attrs["ipv6"] = {"string": link.ipv6[0][:STRING_MAX]}
    if link.pci_address:
        attrs["pciAddress"] = {"string": link.pci_address}
        attrs[PCIE_ROOT] = {"string": _pcie_root(link.pci_address)}
    if link.pci_vendor:
        attrs["pciVendor"] = {"string": link.pci_vendor}
    if link.pci_device:
        attrs["pciDevice"] = {"string": link.pci_device}
    if link.numa_node is not None:
        attrs["numaNode"] = {"int": link.numa_node}
    if link.sriov_vfs is not None:
        attrs["sriovVfs"] = {"int": link.sriov_vfs}
    capacity: dict[str, dict[str, Any]] = {}
    if settings.shared_capacity:
        capacity["subInterfaces"] = {
            "value": str(settings.sub_interfaces),
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}},
        }
        if link.speed_mbps:
            capacity["bandwidth"] = {
                "value": f"{link.speed_mbps}M",
                "requestPolicy": {"default": "0", "validRange": {"min": "0"}},
            }
    budget = MAX_ATTRIBUTES - len(attrs) - len(capacity)
    installed = set(plugins)
    for plugin in PLUGIN_ATTRIBUTES:
        if budget <= 0:
            break
        if plugin in installed:
            attrs[plugin_attribute(plugin)] = {"bool": True}
            budget -= 1
    out: dict[str, Any] = {"name": name, "attributes": attrs}
    if capacity:
        out["capacity"] = capacity
        out["allowMultipleAllocations"] = True
    failed = taints(link_failure(link), settings)
    if failed:
        out["taints"] = failed
    return out


def _pcie_root(pci_address: str) -> str:
    """The PCIe root complex the NIC hangs off: its domain and bus, as `pci<domain>:<bus>`."""
    domain, bus = pci_address.split(":")[:2]
    return f"pci{domain}:{bus}"


def device_names(links: Iterable[Link]) -> dict[str, Link]:
    """The device name each link is published under (stable: by link name)."""
    taken: set[str] = set()
    return {device_name(link, taken): link for link in sorted(links, key=lambda link: link.name)}


NETWORK_TYPE = "network"


def parents(network: NamedNetwork) -> list[str]:
    return parent_links(network.config)


def network_device_names(
    networks: Iterable[tuple[str, NamedNetwork]], taken: set[str]
) -> dict[str, tuple[str, NamedNetwork]]:
    """The device each served network is published as: `net-<name>` (a DNS label)."""
    out: dict[str, tuple[str, NamedNetwork]] = {}
    for name, network in sorted(networks, key=lambda item: item[0]):
        base = "net-" + (re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:55] or "x")
        candidate, n = base, 1
        while candidate in taken:
            n += 1
            candidate = f"{base[:58]}-{n}"
        taken.add(candidate)
        out[candidate] = (name, network)
    return out


def network_device(
    name: str,
    network_name: str,
    network: NamedNetwork,
    parent: Link | None,
    settings: SliceSettings,
    addresses: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """A named network this node serves: the scheduler sends a claim that selects it by
    `network` only to nodes that can serve it. `addresses`: the CNIIPPool its cnidra IPAM
    names and how many addresses this node can still give its claims; every claim of the
    device consumes one, so the scheduler leaves a pod Pending when the pool has none."""
    attrs: dict[str, dict[str, Any]] = {
        "type": {"string": NETWORK_TYPE},
        "network": {"string": network_name[:STRING_MAX]},
        "nodeLink": {"bool": False},
    }
    if network.network_id:
        attrs["networkID"] = {"string": network.network_id[:STRING_MAX]}
    plugin: Any = next(iter(network.config.get("plugins") or []), {})
    if isinstance(plugin, Mapping) and isinstance(plugin.get("type"), str):
        attrs["plugin"] = {"string": plugin["type"][:STRING_MAX]}
    if parent is not None:
        attrs["ifName"] = {"string": parent.name}
        attrs["state"] = {"string": parent.state}
        attrs["mtu"] = {"int": parent.mtu}
    out: dict[str, Any] = {"name": name, "attributes": attrs}
    failed = taints(link_failure(parent) if parent is not None else None, settings)
    if failed:
        out["taints"] = failed
    if addresses is not None:
        attrs["ipPool"] = {"string": addresses[0][:STRING_MAX]}
    if settings.shared_capacity:
        one_each = {"default": "1", "validRange": {"min": "1", "step": "1"}}
        out["capacity"] = {
            "subInterfaces": {"value": str(settings.sub_interfaces), "requestPolicy": one_each}
        }
        if addresses is not None:
            out["capacity"]["addresses"] = {
                "value": str(addresses[1]),
                "requestPolicy": {"default": "1", "validValues": ["1"]},
            }
        out["allowMultipleAllocations"] = True
    return out


def build_slices(
    links: Iterable[Link],
    plugins: Sequence[str],
    settings: SliceSettings,
    generation: int,
    owner: Mapping[str, Any] | None = None,
    node_links: frozenset[str] = frozenset(),
    networks: Mapping[str, tuple[str, NamedNetwork, Link | None]] | None = None,
    addresses: Mapping[str, tuple[str, int]] | None = None,
) -> list[dict[str, Any]]:
    """`node_links`: links among `links` that carry the node (published only because the admin
    opted in), marked with the `nodeLink` attribute for classes to select or avoid.
    `networks`: the named networks the node serves, by device name (network_device_names)."""
    devices = [
        device(link, name, plugins, settings, link.name in node_links)
        for name, link in device_names(links).items()
    ]
    counts = addresses or {}
    devices += [
        network_device(dev, name, network, parent, settings, counts.get(dev))
        for dev, (name, network, parent) in (networks or {}).items()
        # none left: not offered (the API refuses a capacity smaller than one claim's share)
        if dev not in counts or counts[dev][1] > 0
    ]
    chunks = [
        devices[i : i + MAX_DEVICES_PER_SLICE]
        for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)
    ] or [[]]
    slices = []
    for i, chunk in enumerate(chunks):
        meta: dict[str, Any] = {"name": slice_name(settings.node, i)}
        if owner:
            meta["ownerReferences"] = [dict(owner)]
        slices.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": meta,
                "spec": {
                    "driver": DRIVER_NAME,
                    "nodeName": settings.node,
                    "pool": {
                        "name": settings.node,
                        "generation": generation,
                        "resourceSliceCount": len(chunks),
                    },
                    "devices": chunk,
                },
            }
        )
    return slices


def slice_name(node: str, index: int) -> str:
    return f"{node}-cni-dra-{index}"[:253]


def content(slices: Sequence[Mapping[str, Any]]) -> list[Any]:
    """What a slice says, minus the generation: equal content means no publish."""
    return [(s["metadata"]["name"], s["spec"]["devices"]) for s in slices]
