"""Which rtnetlink events matter to the slice publisher. An event is read as
cnidra.inventory.netlink parses it (the link of a link event: index, name, kind, the bridge or
bond it is a port of, the link it sits on, its MAC, MTU, state, carrier; the link of an address
event), the same reading `read_links` makes of a dump. The publisher re-reads every link only
for events that can change what it publishes (`LinkWatch`): a burst of pods makes hundreds about
the pods' own veths, and others about the parent links that only restate them (a macvlan made
on a link notifies the link, unchanged)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cnidra.inventory.links import Link
from cnidra.inventory.netlink import LinkMessage, Unreadable, parse


def restates(event: LinkMessage, link: Link) -> bool:
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

    def _matters(self, event: LinkMessage) -> bool:
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
