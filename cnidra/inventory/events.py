"""What an rtnetlink event says, read from the raw message without pyroute2: the link of a link
event (index, name, kind, the bridge or bond it is a port of, the link it sits on, its MAC, MTU,
state, carrier), the link of an address event. The slice publisher re-reads every link only for
events that can change what it publishes (`LinkWatch`): a burst of pods makes hundreds about
the pods' own veths, and others about the parent links that only restate them (a macvlan made
on a link notifies the link, unchanged). Layouts from linux/netlink.h, linux/rtnetlink.h and
linux/if_link.h; what each attribute becomes as `read_links` has it."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cnidra.inventory.links import Link

RTM_NEWLINK, RTM_DELLINK = 16, 17
RTM_NEWADDR, RTM_DELADDR = 20, 21
NLMSG_ERROR, NLMSG_OVERRUN = 2, 4
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINK, IFLA_MASTER = 1, 3, 4, 5, 10
IFLA_OPERSTATE, IFLA_LINKINFO, IFLA_CARRIER, IFLA_LINK_NETNSID = 16, 18, 33, 37
IFLA_INFO_KIND = 1
IFF_UP, IFF_LOOPBACK = 0x1, 0x8
# IF_OPER_* (RFC 2863), as pyroute2 names them and read_links lowers them
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")
_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
_ATTR = struct.Struct("=HH")  # rtattr: len, type
_U32 = struct.Struct("=I")


@dataclass(frozen=True)
class LinkEvent:
    """One rtnetlink message: a link's, or (`address`) one of its addresses'. For a link, the
    fields `read_links` reads from the same attributes (None: not in the message)."""

    index: int
    address: bool = False
    removed: bool = False
    name: str | None = None
    link_kind: str | None = None
    loopback: bool = False
    admin_up: bool = True
    master: int | None = None
    lower: int | None = None
    mac: str | None = None
    mtu: int | None = None
    state: str | None = None
    carrier: bool | None = None


class Unreadable(ValueError):
    """A message that is not what the layouts say: every link is read again."""


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attributes(data: bytes, start: int, end: int) -> Iterable[tuple[int, bytes]]:
    while start + _ATTR.size <= end:
        length, kind = _ATTR.unpack_from(data, start)
        if length < _ATTR.size or start + length > end:
            raise Unreadable(f"attribute of length {length} at {start}")
        yield kind & _TYPE_MASK, data[start + _ATTR.size : start + length]
        start += _align(length)


def _text(value: bytes) -> str:
    return value.split(b"\0", 1)[0].decode("utf-8", "replace")


def _u32(value: bytes) -> int:
    if len(value) < 4:
        raise Unreadable(f"a 4-byte attribute of {len(value)} bytes")
    number: int = _U32.unpack_from(value)[0]
    return number


def _link(kind: int, data: bytes, body: int, end: int) -> LinkEvent:
    if body + _IFINFO.size > end:
        raise Unreadable("short link message")
    _family, _type, index, flags, _change = _IFINFO.unpack_from(data, body)
    found: dict[str, object] = {}
    lower: int | None = None
    elsewhere = False
    for attr, value in _attributes(data, body + _align(_IFINFO.size), end):
        if attr == IFLA_IFNAME:
            found["name"] = _text(value)
        elif attr == IFLA_ADDRESS:
            found["mac"] = ":".join(f"{b:02x}" for b in value)
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
    return LinkEvent(
        index,
        removed=kind == RTM_DELLINK,
        loopback=bool(flags & IFF_LOOPBACK),
        admin_up=bool(flags & IFF_UP),
        lower=None if elsewhere else lower,
        **found,  # type: ignore[arg-type]
    )


def parse(datagram: bytes) -> list[LinkEvent]:
    """The link and address events of one datagram (other messages are skipped); Unreadable
    when a message is cut or malformed."""
    events: list[LinkEvent] = []
    offset = 0
    while offset + _HEADER.size <= len(datagram):
        length, kind, _flags, _seq, _pid = _HEADER.unpack_from(datagram, offset)
        if length < _HEADER.size or offset + length > len(datagram):
            raise Unreadable(f"message of length {length} at {offset}")
        if kind in (NLMSG_OVERRUN, NLMSG_ERROR):
            raise Unreadable(f"message type {kind}")
        body, end = offset + _HEADER.size, offset + length
        if kind in (RTM_NEWLINK, RTM_DELLINK):
            events.append(_link(kind, datagram, body, end))
        elif kind in (RTM_NEWADDR, RTM_DELADDR):
            if body + _IFADDR.size > end:
                raise Unreadable("short address message")
            index = _IFADDR.unpack_from(datagram, body)[4]
            events.append(LinkEvent(index, address=True, removed=kind == RTM_DELADDR))
        offset += _align(length)
    return events


def restates(event: LinkEvent, link: Link) -> bool:
    """Whether a link event says of the link only what the last read found (the fields the
    slices and the node's view are made of that a link message carries)."""
    return (
        event.name == link.name
        and event.link_kind == link.link_kind
        and event.mac == link.mac
        and event.mtu == link.mtu
        and event.state == link.state
        and event.admin_up == link.admin_up
        and event.carrier == link.carrier
        and event.master == link.master
        and event.lower == link.lower
        and event.loopback == link.loopback
    )


class LinkWatch:
    """Which events can change what the publisher publishes, from the links it read last.

    An event matters when it changes a link that may become a device (`eligible`: the admin's
    filter, by name and kind) or one that carries the node (`protected`), or is about a link
    that may become a device, or a link that is a port of, or sits on, a link that may (a veth
    joining a data bridge can make it another network of pods'; a vlan on a node link carries
    the node), or an address of such a link; and when it cannot be read or names a link never
    seen. Events about other links (the pods' veths, also as they join the primary network's
    bridge, the runtime's bridges, tunnels), and link events that restate what was read, do
    not: the next resync reads every link anyway."""

    MAX_IGNORED = 4096  # links learned from events to be irrelevant; beyond, forgotten

    def __init__(self, eligible: Callable[[Link], bool]) -> None:
        self.eligible = eligible
        self._read = False
        self._relevant: dict[int, Link] = {}
        self._protected: set[int] = set()
        self._hidden: set[int] = set()  # carry the node and are not published
        self._ignored: set[int] = set()

    def read(
        self, links: Iterable[Link], protected: Iterable[str], shown: Iterable[str] | None = None
    ) -> None:
        """What a full read of the links found: those that carry the node (`protected`), and
        those behind a published device (`shown`; None: every link)."""
        links = [link for link in links if not link.absent]
        protected = set(protected)
        self._relevant = {
            link.index: link for link in links if self.eligible(link) or link.name in protected
        }
        self._protected = {link.index for link in links if link.name in protected}
        shown = None if shown is None else set(shown)
        self._hidden = {
            link.index
            for link in links
            if shown is not None and link.name not in shown and link.index in self._protected
        }
        self._ignored = {link.index for link in links} - self._relevant.keys()
        self._read = True

    def matters(self, datagrams: Iterable[bytes]) -> bool:
        if not self._read:
            return True
        try:
            events = [e for d in datagrams for e in parse(d)]
        except Unreadable:
            return True
        return any(self._matters(event) for event in events)

    def _matters(self, event: LinkEvent) -> bool:
        known = self._relevant.get(event.index)
        if known is not None:
            if event.address or event.removed:
                return True
            if event.index in self._hidden:  # its MAC, MTU, state show nowhere; its place does
                return (event.name, event.master, event.lower, event.loopback) != (
                    known.name, known.master, known.lower, known.loopback
                )  # fmt: skip
            return not restates(event, known)
        bound = {event.master, event.lower} & self._relevant.keys()
        if event.address:
            return event.index not in self._ignored
        if event.name is None:
            return True
        link = Link(
            event.name, event.index, "", 0, "virtual", event.link_kind, "unknown",
            loopback=event.loopback,
        )  # fmt: skip
        if self.eligible(link):
            return True
        if bound - self._protected:
            return True  # a port can make a data bridge another network of pods' (protected)
        # bound only to links that already carry the node (a pod's veth joining the primary
        # network's bridge, at every pod): it never becomes a device, and changes none
        if event.removed:
            self._ignored.discard(event.index)
        elif len(self._ignored) < self.MAX_IGNORED:
            self._ignored.add(event.index)
        return False
