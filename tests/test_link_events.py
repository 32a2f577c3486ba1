"""The slice publisher re-reads the links only for netlink events that can change what it
publishes (issue 28): a link event names its link, kind, bridge and lower link; the pods' veths
and the runtime's bridges do not wake it, a data link, a port joining one, an unreadable message
and a link never seen do."""

from __future__ import annotations

import select
import struct
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from cnidra.cni import netns
from cnidra.inventory.events import LinkWatch, restates
from cnidra.inventory.links import Link, LinkFilter, carrying_node, read_links
from cnidra.inventory.netlink import (
    IFLA_IFNAME,
    IFLA_INFO_KIND,
    IFLA_LINKINFO,
    IFLA_MASTER,
    RTM_DELLINK,
    RTM_NEWADDR,
    RTM_NEWLINK,
    LinkMessage,
    Unreadable,
    parse,
)
from cnidra.inventory.publisher import RTMGRP_IPV4_IFADDR, RTMGRP_LINK, netlink_events, receive
from tests.conftest import ip


def attr(kind: int, value: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(value), kind) + value
    return data + b"\0" * (-len(data) % 4)


def link_message(
    kind: int, index: int, name: str, link_kind: str | None = None, master: int | None = None
) -> bytes:
    body = struct.pack("=BxHiII", 0, 1, index, 0x1003, 0) + attr(IFLA_IFNAME, name.encode() + b"\0")
    if link_kind:
        body += attr(IFLA_LINKINFO | 0x8000, attr(IFLA_INFO_KIND, link_kind.encode() + b"\0"))
    if master:
        body += attr(IFLA_MASTER, struct.pack("=I", master))
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


def address_message(index: int) -> bytes:
    body = struct.pack("=BBBBI", 2, 24, 0, 0, index)
    return struct.pack("=IHHII", 16 + len(body), RTM_NEWADDR, 0, 0, 0) + body


def node_links() -> list[Link]:
    return [
        Link("lo", 1, "", 65536, "virtual", None, "unknown", loopback=True),
        Link("eth0", 2, "m0", 1500, "physical", None, "up", ipv4=("10.0.0.2/24",),
             default_route=True),
        Link("eth1", 3, "m1", 1500, "physical", None, "up"),
        Link("cni0", 4, "m2", 1500, "bridge", "bridge", "up", ipv4=("10.244.0.1/24",)),
    ]  # fmt: skip


def watch() -> LinkWatch:
    w = LinkWatch(LinkFilter().eligible)
    links = node_links()
    w.read(links, carrying_node(links))
    return w


def test_a_link_message_names_its_link_kind_and_bridge() -> None:
    one = link_message(RTM_NEWLINK, 7, "veth1a2b", "veth", master=4)
    two = address_message(7)
    [link, address] = parse(one + two)
    assert (link.index, link.name, link.link_kind, link.master, link.removed) == (
        7, "veth1a2b", "veth", 4, False,
    )  # fmt: skip
    assert (address.index, address.address) == (7, True)
    with pytest.raises(Unreadable):
        parse(struct.pack("=IHHII", 999, RTM_NEWLINK, 0, 0, 0) + one[16:])  # beyond the datagram
    with pytest.raises(Unreadable):
        parse(one[:32] + struct.pack("=HH", 200, IFLA_IFNAME) + one[36:])  # an attribute too


def test_the_pods_veths_do_not_wake_the_publisher_data_links_do() -> None:
    w = watch()
    assert not w.matters([link_message(RTM_NEWLINK, 7, "veth1a2b", "veth", master=4)])
    assert not w.matters([address_message(7)])  # learned from its link event
    assert not w.matters([link_message(RTM_DELLINK, 7, "veth1a2b", "veth")])
    assert not w.matters([link_message(RTM_NEWLINK, 8, "tap0", "tun")])
    assert not w.matters([address_message(4)])  # cni0: never published
    # a data link, a link that carries the node, a port of a data link, a link never seen
    assert w.matters([link_message(RTM_NEWLINK, 3, "eth1")])
    assert w.matters([link_message(RTM_NEWLINK, 9, "eth2")])
    assert w.matters([address_message(2)])
    assert w.matters([link_message(RTM_NEWLINK, 10, "veth9", "veth", master=3)])
    assert w.matters([address_message(42)])
    assert w.matters([b"\x00\x01"]) is False  # shorter than a header: no message in it
    assert w.matters([struct.pack("=IHHII", 64, RTM_NEWLINK, 0, 0, 0)])  # cut: unreadable
    assert LinkWatch(LinkFilter().eligible).matters([address_message(7)])  # nothing read yet


def test_an_event_that_restates_a_data_link_does_not_wake_the_publisher() -> None:
    """A macvlan made on a parent notifies the parent (its upper changed), which the slices do
    not show: nothing to publish. A change of what they show is."""
    eth1 = Link("eth1", 3, "52:54:00:00:00:01", 1500, "physical", None, "up", carrier=True)
    w = LinkWatch(LinkFilter().eligible)
    w.read([eth1], ())
    same = LinkMessage(3, name="eth1", mac=eth1.mac, mtu=1500, state="up", carrier=True)
    assert restates(same, eth1)
    for changed in (
        replace(same, mtu=9000),
        replace(same, state="down"),
        replace(same, carrier=False),
        replace(same, admin_up=False),
        replace(same, master=7),
        replace(same, name="eth9"),
        replace(same, mac=None),
    ):
        assert not restates(changed, eth1), changed


def test_a_pods_veth_joining_the_primary_networks_bridge_does_not_wake_the_publisher() -> None:
    """The test bed's (and flannel's) shape: the node's address on a bridge, every pod's veth a
    port of it. The bridge already carries the node; a veth never becomes a device. A link that
    may become one, on that bridge or on a data link, still matters."""
    links = [
        Link("lo", 1, "", 65536, "virtual", None, "unknown", loopback=True),
        Link("br0", 2, "m0", 1500, "bridge", "bridge", "up", ipv4=("10.0.0.2/24",),
             default_route=True),
        Link("eth1", 3, "m1", 1500, "physical", None, "up"),
        Link("data0", 4, "m2", 1500, "bridge", "bridge", "up"),
    ]  # fmt: skip
    w = LinkWatch(LinkFilter().eligible)
    w.read(links, carrying_node(links))
    assert not w.matters([link_message(RTM_NEWLINK, 7, "veth1a2b", "veth")])
    assert not w.matters([link_message(RTM_NEWLINK, 7, "veth1a2b", "veth", master=2)])
    assert not w.matters([address_message(7)])  # its IPv6 link-local address
    assert not w.matters([link_message(RTM_DELLINK, 7, "veth1a2b", "veth", master=2)])
    assert w.matters([link_message(RTM_NEWLINK, 8, "veth3c4d", "veth", master=4)])  # data
    assert w.matters([link_message(RTM_NEWLINK, 9, "br0.100", "vlan", master=2)])
    assert w.matters([link_message(RTM_NEWLINK, 10, "eth2", None, master=2)])
    # the bridge's MAC follows its ports; it is not published, so that shows nowhere
    w.read(links, carrying_node(links), shown=["eth1", "data0"])
    br0 = LinkMessage(2, name="br0", link_kind="bridge", mac="m9", mtu=1500, state="up")
    assert not w.matters([link_message(RTM_NEWLINK, 2, "br0", "bridge")])
    assert not w._matters(br0)
    assert w._matters(replace(br0, master=4))  # its place changes what it protects
    assert w._matters(replace(br0, name="br1"))
    w.read(links, carrying_node(links), shown=["eth1", "data0", "br0"])  # --publish-node-links
    assert w._matters(br0)


@pytest.mark.netns
def test_real_events_of_a_namespace(in_node: Path) -> None:
    """The kernel's own messages, in a namespace of the test's: a veth with its address and a
    runtime bridge stay quiet; a data link, and a veth joining a data bridge, do not."""
    ip(in_node, "link", "add", "data0", "type", "bridge")
    links = read_links()
    w = LinkWatch(LinkFilter().eligible)
    w.read(links, carrying_node(links))
    with netlink_events(RTMGRP_LINK | RTMGRP_IPV4_IFADDR) as sock:

        def events() -> bool:
            assert select.select([sock], [], [], 30)[0], "no event within 30 s"
            datagrams, overrun = receive(sock)
            assert not overrun
            return w.matters(datagrams)

        ip(in_node, "link", "add", "veth5f3a", "type", "veth", "peer", "name", "veth5f3b")
        assert not events()
        ip(in_node, "addr", "add", "198.18.7.1/32", "dev", "veth5f3a")
        assert not events()
        ip(in_node, "link", "add", "cni0", "type", "bridge")
        assert not events()
        ip(in_node, "link", "set", "veth5f3a", "master", "data0")
        assert events()
        ip(in_node, "link", "add", "data1", "type", "bridge")
        assert events()
        links = read_links()
        w.read(links, carrying_node(links))
        ip(in_node, "link", "set", "data1", "mtu", "1400")
        assert events()
        links = read_links()
        w.read(links, carrying_node(links))
        # what the macvlan plugin does: a macvlan on the parent, made in the pod's namespace
        with netns.temporary("cnidra-events-pod") as pod:
            ip(in_node, "link", "add", "mv0", "link", "data1", "netns", pod.name,
               "type", "macvlan", "mode", "bridge")  # fmt: skip
            if select.select([sock], [], [], 1)[0]:  # the parent is notified, unchanged
                datagrams, _ = receive(sock)
                assert not w.matters(datagrams)
            ip(in_node, "link", "set", "data1", "up")
            assert events()


@pytest.mark.netns
def test_real_veths_joining_the_node_bridge_stay_quiet(in_node: Path) -> None:
    """The kernel's messages as the primary network plugs a pod: a veth made, its peer moved
    into the pod's namespace, the veth joined to the bridge holding the node's address, set up
    (its link-local address), and the bridge's own MAC and carrier following its ports. None
    wakes the publisher; a link that may become a device made on that bridge does."""
    ip(in_node, "link", "add", "nodebr", "type", "bridge")
    ip(in_node, "addr", "add", "198.18.8.1/24", "dev", "nodebr")
    ip(in_node, "link", "set", "nodebr", "up")
    pod = Path(f"/run/netns/{in_node.name}-pod")
    subprocess.run(["ip", "netns", "add", pod.name], check=True, timeout=30)
    try:
        links = read_links()
        w = LinkWatch(LinkFilter().eligible)
        node = carrying_node(links, ["198.18.8.1"])
        w.read(links, node, [link.name for link in links if link.name not in node])
        with netlink_events(RTMGRP_LINK | RTMGRP_IPV4_IFADDR) as sock:

            def events() -> bool:
                found = False
                while select.select([sock], [], [], 0.5)[0]:
                    datagrams, overrun = receive(sock)
                    assert not overrun
                    found |= w.matters(datagrams)
                return found

            ip(in_node, "link", "add", "veth7e1a", "type", "veth", "peer", "name", "eth0",
               "netns", pod.name)  # fmt: skip
            ip(in_node, "link", "set", "veth7e1a", "master", "nodebr")
            ip(in_node, "link", "set", "veth7e1a", "up")
            assert not events()
            ip(in_node, "link", "add", "link", "nodebr", "name", "mv0", "type", "macvlan")
            assert events()  # on the node's bridge: it carries the node
    finally:
        subprocess.run(["ip", "netns", "del", pod.name], check=False, timeout=30)
