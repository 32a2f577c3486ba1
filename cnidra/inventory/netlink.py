"""rtnetlink, read by hand: the dumps of the links, addresses and main-table routes of the current
network namespace (`dump`), and the parsing of link and address messages that both the dumps and
the slice publisher's event watch (cnidra.inventory.events) read.

Written here rather than taken from pyroute2 because of what pyroute2 cost on the driver's path
(docs/performance.md, "The node's links"): it decodes every attribute of every message (the
statistics, each address family's configuration arrays) through its own event loop, about 200 ms
of CPU to read 113 links, a tenth of the soak driver's CPU, and its decoding left a heap
high-water of about 10 MiB. cnidra needs a dozen attributes; these are read with `struct` from
the layouts of linux/netlink.h, linux/rtnetlink.h, linux/if_link.h and linux/if_addr.h, and
every other attribute is skipped unread. tests/test_netlink.py reads the same namespaces with
pyroute2 and compares.

A message that is not what the layouts say raises `Unreadable`; the kernel's error answer to a
dump raises OSError with its errno; a dump the kernel reports as interrupted (a link changed
while it was being dumped) is read again, up to three times."""

from __future__ import annotations

import errno
import itertools
import os
import socket
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

NETLINK_ROUTE = 0
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_DUMP_INTR, NLM_F_DUMP = 0x1, 0x2, 0x10, 0x300
NLMSG_NOOP, NLMSG_ERROR, NLMSG_DONE, NLMSG_OVERRUN = 1, 2, 3, 4
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE, RTM_GETROUTE = 24, 26
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINK, IFLA_MASTER = 1, 3, 4, 5, 10
IFLA_OPERSTATE, IFLA_LINKINFO, IFLA_CARRIER, IFLA_LINK_NETNSID = 16, 18, 33, 37
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
IFLA_BR_VLAN_FILTERING = 7  # a u8 in a bridge's IFLA_INFO_DATA
IFA_ADDRESS = 1
RTA_OIF, RTA_GATEWAY, RTA_MULTIPATH, RTA_TABLE = 4, 5, 9, 15
RT_TABLE_MAIN = 254
IFF_UP, IFF_LOOPBACK = 0x1, 0x8
AF_UNSPEC, AF_INET, AF_INET6 = 0, 2, 10
# IF_OPER_* (RFC 2863), lowered
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")
_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg: family, dst_len, src_len, tos, table, ... flags
_RTNH = struct.Struct("=HBBi")  # rtnexthop: len, flags, hops, ifindex
_ATTR = struct.Struct("=HH")  # rtattr: len, type
_U32 = struct.Struct("=I")
_ERROR = struct.Struct("=i")  # nlmsgerr's error (then the request's header)
_LINK_ATTRIBUTES = frozenset(
    (IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINK, IFLA_MASTER, IFLA_OPERSTATE, IFLA_LINKINFO,
     IFLA_CARRIER, IFLA_LINK_NETNSID)
)  # fmt: skip
RECEIVE_BYTES = 1 << 18  # the kernel fills a dump's datagrams up to 32 KiB
TIMEOUT = 5.0  # seconds the kernel has for each datagram of a dump
RETRIES = 3  # dumps read again when interrupted


class Unreadable(ValueError):
    """A message that is not what the layouts say."""


@dataclass(frozen=True)
class LinkMessage:
    """One link or (`address`) address message. For a link, the fields `read_links` makes a
    Link of (None: not in the message)."""

    index: int
    address: bool = False
    removed: bool = False
    name: str | None = None
    link_kind: str | None = None
    loopback: bool = False
    admin_up: bool = True
    master: int | None = None
    lower: int | None = None  # IFLA_LINK, unless it is an index in another namespace
    peer_elsewhere: bool = False  # IFLA_LINK_NETNSID: the lower link (a veth's peer) is elsewhere
    mac: str | None = None
    mtu: int | None = None
    state: str | None = None
    carrier: bool | None = None
    vlan_filtering: bool | None = None  # a bridge's IFLA_BR_VLAN_FILTERING


@dataclass(frozen=True)
class Address:
    index: int
    family: int
    ip: str
    prefixlen: int


@dataclass(frozen=True)
class Route:
    """A main-table route: its destination's prefix length, the link it leaves through, whether
    it goes via a gateway, and the links of its multipath hops."""

    family: int
    dst_len: int
    oif: int | None
    gateway: bool
    hops: tuple[int, ...] = ()


def _align(n: int) -> int:
    return (n + 3) & ~3


def _spans(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(type, value's start, value's end) of each attribute in data[start:end]: the values are
    sliced only by the callers that want them (a link carries about fifty attributes)."""
    unpack = _ATTR.unpack_from
    while start + 4 <= end:
        length, kind = unpack(data, start)
        if length < 4 or start + length > end:
            raise Unreadable(f"attribute of length {length} at {start}")
        yield kind & _TYPE_MASK, start + 4, start + length
        start += (length + 3) & ~3


def _attributes(data: bytes, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    for kind, begin, stop in _spans(data, start, end):
        yield kind, data[begin:stop]


def _text(value: bytes) -> str:
    return value.split(b"\0", 1)[0].decode("utf-8", "replace")


def _u32(value: bytes) -> int:
    if len(value) < 4:
        raise Unreadable(f"a 4-byte attribute of {len(value)} bytes")
    number: int = _U32.unpack_from(value)[0]
    return number


def _ip(family: int, value: bytes) -> str:
    try:
        return socket.inet_ntop(family, value)
    except (ValueError, OSError) as e:
        raise Unreadable(f"an address of family {family} in {len(value)} bytes") from e


def _link(kind: int, data: bytes, body: int, end: int) -> LinkMessage:
    if body + _IFINFO.size > end:
        raise Unreadable("short link message")
    _family, _type, index, flags, _change = _IFINFO.unpack_from(data, body)
    found: dict[str, object] = {}
    lower: int | None = None
    elsewhere = False
    for attr, begin, stop in _spans(data, body + _align(_IFINFO.size), end):
        if attr not in _LINK_ATTRIBUTES:
            continue
        value = data[begin:stop]
        if attr == IFLA_IFNAME:
            found["name"] = _text(value)
        elif attr == IFLA_ADDRESS:
            found["mac"] = value.hex(":")  # as ":".join of "%02x", in C
        elif attr == IFLA_MTU:
            found["mtu"] = _u32(value)
        elif attr == IFLA_MASTER:
            found["master"] = _u32(value) or None
        elif attr == IFLA_LINK:
            lower = _u32(value) or None
        elif attr == IFLA_LINK_NETNSID:
            elsewhere = True  # IFLA_LINK is then an index in another namespace
        elif attr == IFLA_OPERSTATE and value:
            found["state"] = OPERSTATES[value[0]] if value[0] < len(OPERSTATES) else str(value[0])
        elif attr == IFLA_CARRIER and value:
            found["carrier"] = bool(value[0])
        elif attr == IFLA_LINKINFO:
            for nested, info in _attributes(value, 0, len(value)):
                if nested == IFLA_INFO_KIND:
                    found["link_kind"] = _text(info)
                elif nested == IFLA_INFO_DATA:
                    data_attrs = _attributes(info, 0, len(info))
                    for key, item in data_attrs:
                        if key == IFLA_BR_VLAN_FILTERING and item:
                            found["vlan_filtering"] = bool(item[0])
            if found.get("link_kind") != "bridge":
                found.pop("vlan_filtering", None)
            elif "vlan_filtering" not in found:
                found["vlan_filtering"] = False
    return LinkMessage(
        index,
        removed=kind == RTM_DELLINK,
        loopback=bool(flags & IFF_LOOPBACK),
        admin_up=bool(flags & IFF_UP),
        lower=None if elsewhere else lower,
        peer_elsewhere=elsewhere,
        **found,  # type: ignore[arg-type]
    )


def _address(data: bytes, body: int, end: int) -> Address | None:
    if body + _IFADDR.size > end:
        raise Unreadable("short address message")
    family, prefixlen, _flags, _scope, index = _IFADDR.unpack_from(data, body)
    for attr, value in _attributes(data, body + _align(_IFADDR.size), end):
        if attr == IFA_ADDRESS:
            return Address(index, family, _ip(family, value), prefixlen)
    return None


def _route(data: bytes, body: int, end: int) -> Route | None:
    """The route, or None when it is not in the main table."""
    if body + _RTMSG.size > end:
        raise Unreadable("short route message")
    family, dst_len, _src, _tos, table, _proto, _scope, _type, _flags = _RTMSG.unpack_from(
        data, body
    )
    oif: int | None = None
    gateway = False
    hops: list[int] = []
    for attr, value in _attributes(data, body + _align(_RTMSG.size), end):
        if attr == RTA_TABLE:
            table = _u32(value)
        elif attr == RTA_OIF:
            oif = _u32(value)
        elif attr == RTA_GATEWAY:
            gateway = True
        elif attr == RTA_MULTIPATH:
            at = 0
            while at + _RTNH.size <= len(value):
                length, _f, _hops, ifindex = _RTNH.unpack_from(value, at)
                if length < _RTNH.size or at + length > len(value):
                    raise Unreadable(f"next hop of length {length} at {at}")
                hops.append(ifindex)
                at += _align(length)
    if table != RT_TABLE_MAIN:
        return None
    return Route(family, dst_len, oif, gateway, tuple(hops))


def messages(datagram: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """(type, flags, seq, body offset, end) of each message of one datagram; Unreadable when a
    message is cut."""
    offset = 0
    while offset + _HEADER.size <= len(datagram):
        length, kind, flags, seq, _pid = _HEADER.unpack_from(datagram, offset)
        if length < _HEADER.size or offset + length > len(datagram):
            raise Unreadable(f"message of length {length} at {offset}")
        yield kind, flags, seq, offset + _HEADER.size, offset + length
        offset += _align(length)


def parse(datagram: bytes) -> list[LinkMessage]:
    """The link and address messages of one datagram (other messages are skipped); Unreadable
    when a message is cut or malformed, or the datagram reports an error or an overrun."""
    found: list[LinkMessage] = []
    for kind, _flags, _seq, body, end in messages(datagram):
        if kind in (NLMSG_OVERRUN, NLMSG_ERROR):
            raise Unreadable(f"message type {kind}")
        if kind in (RTM_NEWLINK, RTM_DELLINK):
            found.append(_link(kind, datagram, body, end))
        elif kind in (RTM_NEWADDR, RTM_DELADDR):
            if body + _IFADDR.size > end:
                raise Unreadable("short address message")
            index = _IFADDR.unpack_from(datagram, body)[4]
            found.append(LinkMessage(index, address=True, removed=kind == RTM_DELADDR))
    return found


def _request(kind: int, seq: int, family: int) -> bytes:
    if kind == RTM_GETLINK:
        body = _IFINFO.pack(family, 0, 0, 0, 0)
    elif kind == RTM_GETADDR:
        body = _IFADDR.pack(family, 0, 0, 0, 0)
    else:
        body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
    return _HEADER.pack(_HEADER.size + len(body), kind, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def _dump_once(sock: socket.socket, kind: int, seq: int, family: int) -> tuple[list[bytes], bool]:
    """The datagrams answering one dump request, and whether the kernel said it was interrupted."""
    sock.send(_request(kind, seq, family))
    buffer = bytearray(RECEIVE_BYTES)
    datagrams: list[bytes] = []
    interrupted = False
    while True:
        size = sock.recv_into(buffer)
        datagram = bytes(buffer[:size])
        keep = False
        for msg_kind, flags, msg_seq, body, end in messages(datagram):
            if msg_seq != seq:
                continue  # an answer to an earlier request of this socket: not ours
            interrupted = interrupted or bool(flags & NLM_F_DUMP_INTR)
            if msg_kind == NLMSG_DONE:
                # a dump the kernel could not finish says why in its DONE (an errno, negated)
                code = -_ERROR.unpack_from(datagram, body)[0] if body + _ERROR.size <= end else 0
                if code > 0:
                    raise OSError(code, f"rtnetlink dump {kind}: {os.strerror(code)}")
                if keep:
                    datagrams.append(datagram)
                return datagrams, interrupted
            if msg_kind == NLMSG_ERROR:
                if body + _ERROR.size > end:
                    raise Unreadable("short error message")
                code = -_ERROR.unpack_from(datagram, body)[0]
                if code:
                    raise OSError(code, f"rtnetlink dump {kind}: {os.strerror(code)}")
                continue
            if msg_kind == NLMSG_OVERRUN:
                raise Unreadable("the kernel's answer overran the socket")
            keep = True
        if keep:
            datagrams.append(datagram)


def _dump(sock: socket.socket, kind: int, family: int, seqs: Iterator[int]) -> list[bytes]:
    for _ in range(RETRIES + 1):
        datagrams, interrupted = _dump_once(sock, kind, next(seqs), family)
        if not interrupted:
            break
    return datagrams  # the last, even if interrupted: a link changed; its event follows


@dataclass(frozen=True)
class Dump:
    """What `dump` read: every link, every address (link-local IPv6 ones too), the main table's
    IPv4 and IPv6 routes."""

    links: list[LinkMessage]
    addresses: list[Address]
    routes: list[Route]


def _of(datagrams: Iterable[bytes], kinds: tuple[int, ...]) -> Iterator[tuple[bytes, int, int]]:
    for datagram in datagrams:
        for kind, _flags, _seq, body, end in messages(datagram):
            if kind in kinds:
                yield datagram, body, end


def dump() -> Dump:
    """The links, addresses and main-table routes of the calling thread's network namespace."""
    with socket.socket(
        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE
    ) as sock:
        sock.settimeout(TIMEOUT)
        sock.bind((0, 0))
        return read_dump(sock)


def read_dump(sock: socket.socket) -> Dump:
    """`dump` on a socket bound to NETLINK_ROUTE."""
    seqs = itertools.count(1)
    try:
        links = _dump(sock, RTM_GETLINK, AF_UNSPEC, seqs)
        addresses = _dump(sock, RTM_GETADDR, AF_UNSPEC, seqs)
        routes = [d for f in (AF_INET, AF_INET6) for d in _dump(sock, RTM_GETROUTE, f, seqs)]
    except TimeoutError as e:
        raise OSError(errno.ETIMEDOUT, f"rtnetlink: no answer in {TIMEOUT:g}s") from e
    return Dump(
        links=[_link(RTM_NEWLINK, d, b, e) for d, b, e in _of(links, (RTM_NEWLINK,))],
        addresses=[
            a for d, b, e in _of(addresses, (RTM_NEWADDR,)) if (a := _address(d, b, e)) is not None
        ],
        routes=[
            r for d, b, e in _of(routes, (RTM_NEWROUTE,)) if (r := _route(d, b, e)) is not None
        ],
    )
