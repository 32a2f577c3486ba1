"""cnidra.inventory.netlink reads the links, addresses and main-table routes of a namespace by
hand: the same namespaces read with pyroute2 (a test dependency only) must give the same Links;
the parser takes any bytes without failing otherwise than Unreadable; a dump's other answers
(another request's, an interrupted dump, the kernel's error) are handled."""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cnidra.cni import netns
from cnidra.inventory import links as links_module
from cnidra.inventory import netlink
from cnidra.inventory.links import Link, classify, read_links
from tests.conftest import ip


def pyroute2_links() -> list[Link]:
    """The links as pyroute2 decodes them (what read_links was before it read netlink itself)."""
    from pyroute2.iproute import IPRoute

    with IPRoute() as ipr:
        raw_links = ipr.get_links()
        raw_addrs = ipr.get_addr()
        routes = [r for f in (2, 10) for r in ipr.get_routes(family=f, table=254)]
    defaults = {r.get_attr("RTA_OIF") for r in routes if r["dst_len"] == 0}
    routed = {r.get_attr("RTA_OIF") for r in routes if r.get_attr("RTA_GATEWAY")} | {
        hop.get("oif") for r in routes for hop in (r.get_attr("RTA_MULTIPATH") or [])
    }
    addrs: dict[tuple[int, int], list[str]] = {}
    for a in raw_addrs:
        value = a.get("IFA_ADDRESS")
        if value and not (a["family"] == 10 and value.startswith("fe80:")):
            addrs.setdefault((a["family"], a["index"]), []).append(f"{value}/{a['prefixlen']}")
    found = []
    for m in raw_links:
        kind = m.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")
        elsewhere = m.get("IFLA_LINK_NETNSID") is not None
        sysfs = links_module._sysfs(m.get("IFLA_IFNAME"))
        found.append(
            Link(
                name=m.get("IFLA_IFNAME"),
                index=m["index"],
                mac=str(m.get("IFLA_ADDRESS") or ""),
                mtu=int(m.get("IFLA_MTU") or 0),
                kind=classify(kind, bool(sysfs.get("has_device"))),
                link_kind=kind,
                state=str(m.get("IFLA_OPERSTATE") or "UNKNOWN").lower(),
                speed_mbps=sysfs.get("speed_mbps"),  # type: ignore[arg-type]
                ipv4=tuple(addrs.get((2, m["index"]), ())),
                ipv6=tuple(addrs.get((10, m["index"]), ())),
                loopback=bool(m["flags"] & 0x8),
                master=m.get("IFLA_MASTER") or None,
                lower=None if elsewhere else (m.get("IFLA_LINK") or None),
                default_route=m["index"] in defaults,
                gateway_route=m["index"] in routed,
                peer_elsewhere=kind == "veth" and elsewhere,
                admin_up=bool(m["flags"] & 0x1),
                carrier=None if m.get("IFLA_CARRIER") is None else bool(m.get("IFLA_CARRIER")),
                vlan_filtering=(
                    bool(m.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA", "IFLA_BR_VLAN_FILTERING"))
                    if kind == "bridge"
                    else None
                ),
            )
        )
    return found


def stable_reads() -> tuple[list[Link], list[Link]]:
    """Both readings of a namespace at rest: links just set up change their operational state
    and carrier a moment later (the kernel's linkwatch), so read until ours is the same before
    and after pyroute2's."""
    for _ in range(40):
        before, theirs, after = read_links(), pyroute2_links(), read_links()
        if before == after:
            return before, theirs
        time.sleep(0.25)
    raise AssertionError("the namespace's links kept changing for 10 s")


@pytest.fixture
def other_netns() -> Iterator[Path]:
    with netns.temporary("cnidra-nl-other") as path:
        yield path


@pytest.mark.netns
def test_a_namespace_reads_as_pyroute2_reads_it(in_node: Path, other_netns: Path) -> None:
    """Bridges with ports, veths (one peer elsewhere), macvlans, a vxlan, links down and up,
    IPv4 and IPv6 addresses (link-local ones left out), a default route, a route via a gateway
    on another link, a multipath route, a route in another table, a bridge's VLAN filtering:
    field for field the same."""
    ip(in_node, "link", "set", "lo", "up")
    ip(in_node, "link", "add", "data0", "type", "bridge")
    ip(in_node, "link", "set", "data0", "up", "mtu", "1400")
    ip(in_node, "addr", "add", "198.18.9.1/24", "dev", "data0")
    ip(in_node, "addr", "add", "2001:db8:9::1/64", "dev", "data0")
    for i in range(6):
        ip(in_node, "link", "add", f"vp{i}", "type", "veth", "peer", "name", f"vq{i}")
        ip(in_node, "link", "set", f"vp{i}", "master", "data0", "up")
        ip(in_node, "link", "set", f"vq{i}", "up")
    ip(in_node, "addr", "add", "192.0.2.1/24", "dev", "vq1")
    ip(in_node, "addr", "add", "192.0.2.9/32", "dev", "vq1")
    ip(in_node, "addr", "add", "198.51.100.1/24", "dev", "vq2")
    ip(in_node, "link", "add", "vo0", "type", "veth", "peer", "name", "eth9",
       "netns", other_netns.name)  # fmt: skip
    ip(in_node, "link", "add", "link", "vq3", "name", "mv0", "type", "macvlan", "mode", "bridge")
    ip(in_node, "link", "add", "link", "vq3", "name", "mv1", "type", "macvlan", "mode", "private")
    ip(in_node, "link", "set", "mv0", "up")
    ip(in_node, "link", "add", "vx0", "type", "vxlan", "id", "42", "dstport", "4789",
       "local", "198.18.9.1")  # fmt: skip
    ip(in_node, "route", "add", "default", "via", "198.18.9.254")
    ip(in_node, "route", "add", "203.0.113.0/24", "via", "192.0.2.254")
    ip(in_node, "route", "add", "198.18.200.0/24", "nexthop", "via", "198.51.100.254",
       "nexthop", "via", "192.0.2.253")  # fmt: skip
    ip(in_node, "route", "add", "198.18.201.0/24", "via", "192.0.2.252", "table", "100")
    ip(in_node, "-6", "route", "add", "2001:db8:77::/48", "via", "2001:db8:9::fe")
    ours, theirs = stable_reads()
    # pci and SR-IOV fields come from sysfs in both; namespaces made here have none
    assert [replace(link, pci_address=None) for link in ours] == theirs
    by_name = {link.name: link for link in ours}
    assert by_name["data0"].default_route and by_name["data0"].ipv6 == ("2001:db8:9::1/64",)
    assert by_name["vq1"].gateway_route and by_name["vq2"].gateway_route  # the multipath hops
    assert by_name["vq1"].ipv4 == ("192.0.2.1/24", "192.0.2.9/32")
    assert by_name["vo0"].peer_elsewhere and by_name["vo0"].lower is None
    assert by_name["mv0"].lower == by_name["vq3"].index and by_name["mv1"].state == "down"
    assert by_name["vp0"].master == by_name["data0"].index
    assert by_name["lo"].loopback and by_name["vx0"].link_kind == "vxlan"
    # this machine's kernel has no VLAN filtering to turn on: a bridge reads as not filtering
    assert by_name["data0"].vlan_filtering is False and by_name["vq1"].vlan_filtering is None


@pytest.mark.netns
def test_many_links_take_several_datagrams(in_node: Path) -> None:
    """More links than one of the kernel's datagrams holds: every one is read, once."""
    for i in range(60):
        ip(in_node, "link", "add", f"mv{i}", "type", "veth", "peer", "name", f"mw{i}")
    names = [link.name for link in read_links()]
    assert len(names) == len(set(names)) == 121
    assert names == [link.name for link in pyroute2_links()]


def message(kind: int, body: bytes, seq: int = 1, flags: int = netlink.NLM_F_MULTI) -> bytes:
    data = struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body
    return data + b"\0" * (-len(data) % 4)


def attr(kind: int, value: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(value), kind) + value
    return data + b"\0" * (-len(data) % 4)


def link_body(index: int, name: str) -> bytes:
    return struct.pack("=BxHiII", 0, 1, index, 0x1, 0) + attr(netlink.IFLA_IFNAME, name.encode())


class FakeSocket:
    """Answers each dump request with the datagrams a script gives for its attempt."""

    def __init__(self, answers: list[list[bytes]]) -> None:
        self.answers = answers
        self.sent: list[int] = []
        self.pending: list[bytes] = []

    def send(self, data: bytes) -> int:
        seq = struct.unpack_from("=IHHII", data)[3]
        self.sent.append(seq)
        self.pending = [d.replace(b"SEQ!", struct.pack("=I", seq)) for d in self.answers.pop(0)]
        return len(data)

    def recv_into(self, buffer: Any) -> int:
        data = self.pending.pop(0)
        buffer[: len(data)] = data
        return len(data)


def scripted(kind: int, body: bytes, flags: int = netlink.NLM_F_MULTI) -> bytes:
    """A message whose seq is filled in with the request's."""
    data = message(kind, body, seq=0, flags=flags)
    return data[:8] + b"SEQ!" + data[12:]


def test_a_dump_skips_other_answers_and_reads_an_interrupted_dump_again() -> None:
    stale = message(netlink.RTM_NEWLINK, link_body(9, "old"), seq=999)
    interrupted = scripted(
        netlink.RTM_NEWLINK,
        link_body(2, "eth0"),
        flags=netlink.NLM_F_MULTI | netlink.NLM_F_DUMP_INTR,
    )
    done = scripted(netlink.NLMSG_DONE, struct.pack("=i", 0))
    good = scripted(netlink.RTM_NEWLINK, link_body(2, "eth0")) + scripted(
        netlink.RTM_NEWLINK, link_body(3, "eth1")
    )
    sock = FakeSocket([[stale + interrupted, done], [good, done]])
    seqs = iter(range(1, 10))
    datagrams = netlink._dump(sock, netlink.RTM_GETLINK, 0, seqs)  # type: ignore[arg-type]
    assert sock.sent == [1, 2]
    assert [m.name for d in datagrams for m in netlink.parse(d)] == ["eth0", "eth1"]


def test_the_kernels_error_is_an_oserror_with_its_errno() -> None:
    error = scripted(netlink.NLMSG_ERROR, struct.pack("=i", -1) + b"\0" * 16)
    sock = FakeSocket([[error]])
    with pytest.raises(OSError) as raised:
        netlink._dump(sock, netlink.RTM_GETLINK, 0, iter(range(1, 5)))  # type: ignore[arg-type]
    assert raised.value.errno == 1


def test_a_dump_the_kernel_could_not_finish_is_an_oserror() -> None:
    part = scripted(netlink.RTM_NEWLINK, link_body(2, "eth0"))
    done = scripted(netlink.NLMSG_DONE, struct.pack("=i", -90))  # EMSGSIZE
    with pytest.raises(OSError) as raised:
        netlink._dump(FakeSocket([[part, done]]), netlink.RTM_GETLINK, 0, iter(range(1, 5)))  # type: ignore[arg-type]
    assert raised.value.errno == 90


def test_the_kernels_silence_is_a_timeout() -> None:
    class Silent(FakeSocket):
        def recv_into(self, buffer: Any) -> int:
            raise TimeoutError

    with pytest.raises(OSError, match="no answer in 5s"):
        netlink.read_dump(Silent([[b""]]))  # type: ignore[arg-type]


@given(st.binary(max_size=512))
def test_any_bytes_parse_or_are_unreadable(data: bytes) -> None:
    with contextlib.suppress(netlink.Unreadable):
        netlink.parse(data)
    for body in (netlink._link, lambda k, d, b, e: netlink._route(d, b, e)):
        with contextlib.suppress(netlink.Unreadable):
            body(netlink.RTM_NEWLINK, data, 0, len(data))
    with contextlib.suppress(netlink.Unreadable):
        netlink._address(data, 0, len(data))


@given(st.lists(st.tuples(st.integers(0, 0x7FFF), st.binary(max_size=40)), max_size=12))
def test_well_formed_attributes_are_all_walked(attrs: list[tuple[int, bytes]]) -> None:
    data = b"".join(attr(kind, value) for kind, value in attrs)
    assert list(netlink._attributes(data, 0, len(data))) == [
        (kind & 0x3FFF, value) for kind, value in attrs
    ]
