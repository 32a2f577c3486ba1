"""Links that carry the node are found, with everything bound to them."""

from __future__ import annotations

from cnidra.inventory.links import Link, carrying_node


def link(name: str, index: int, **kw: object) -> Link:
    return Link(name, index, "", 1500, "physical", None, "up", **kw)  # type: ignore[arg-type]


def test_default_route_node_address_and_what_hangs_off_them() -> None:
    links = [
        link("lo", 1, loopback=True),
        link("eth0", 2, master=5),  # a port of br0
        link("eth1", 3),  # a data NIC: free
        link("eth1.100", 4, lower=3),  # a VLAN on the data NIC: free
        link("br0", 5, default_route=True),
        link("eth2", 6, ipv4=("198.51.100.7/24",)),  # holds the node's InternalIP
        link("eth2.5", 7, lower=6),
    ]
    assert carrying_node(links, ["198.51.100.7"]) == {"lo", "eth0", "br0", "eth2", "eth2.5"}
