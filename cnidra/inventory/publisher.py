"""Keeps this node's ResourceSlices current: netlink events (rate-limited) and a periodic
resync recompute the inventory; it is written with server-side apply only when it changed."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from cnidra.api.constants import DRIVER_NAME
from cnidra.api.ipam import pool_of
from cnidra.api.networks import NamedNetwork
from cnidra.api.nodes import NodeView
from cnidra.inventory.events import LinkWatch
from cnidra.inventory.links import (
    Link,
    LinkFilter,
    absent_link,
    carrying_node,
    cni_plugins,
    link_failure,
    node_facts,
    read_links,
)
from cnidra.inventory.slices import (
    SliceSettings,
    build_slices,
    content,
    device_names,
    network_device_names,
    parents,
)
from cnidra.kube.api import Api, ApiFailure, AsyncClient, Node, NotFound, ResourceSlice
from cnidra.observe import metrics
from cnidra.util.aio import wait_set
from cnidra.util.backoff import Backoff

log = logging.getLogger(__name__)


class NetworkSource(Protocol):
    """The named networks defined for the cluster, each with its node conf read on this node
    (cnidra.kube.networks.ServedNetworks)."""

    async def served(self) -> list[tuple[str, NamedNetwork]]: ...

    async def watch(self, changed: Callable[[], None]) -> None: ...


class HealthBoard:
    """Each published device's health as the last round found it: None when it works, else why
    not (its link's failure). kubelet's health stream (KEP-4680) waits on `changed`."""

    def __init__(self) -> None:
        self.devices: dict[str, str | None] = {}
        self._changed = asyncio.Event()

    def update(self, devices: dict[str, str | None]) -> None:
        if devices != self.devices:
            for name, failure in sorted(devices.items()):
                was = self.devices.get(name)
                if failure != was and (failure is not None or name in self.devices):
                    if failure is None:
                        log.info("device %s healthy again (was: %s)", name, was)
                    else:
                        log.info("device %s unhealthy: %s", name, failure)
            self.devices = devices
            self._changed.set()

    async def wait(self, seconds: float) -> None:
        """Until the next change, or `seconds`."""
        await wait_set(self._changed, seconds)
        self._changed.clear()


def device_failures(
    links: Mapping[str, Link], served: Mapping[str, tuple[str, NamedNetwork, Link | None]]
) -> dict[str, str | None]:
    """Device name -> why its link cannot carry traffic (None: it can)."""
    out: dict[str, str | None] = {}
    for dev, link in links.items():
        failure = link_failure(link)
        out[dev] = f"link {link.name}: {failure}" if failure else None
    for dev, (_, _, parent) in served.items():
        failure = link_failure(parent) if parent is not None else None
        out[dev] = f"link {parent.name}: {failure}" if parent is not None and failure else None
    return out


def with_absent(links: list[Link], in_use: set[str]) -> list[Link]:
    """The node's links, and a stand-in for each link in use that is gone."""
    present = {link.name for link in links}
    return links + [absent_link(name) for name in sorted(in_use - present)]


class SlicePublisher:
    def __init__(
        self,
        client: AsyncClient,
        settings: SliceSettings,
        cni_path: Sequence[str],
        link_filter: LinkFilter | None = None,
        resync: float = 60.0,
        min_interval: float = 1.0,
        links: Callable[[], list[Link]] = read_links,
        publish_node_links: Sequence[str] = (),
        networks: NetworkSource | None = None,
        pool_capacity: Callable[[str], Awaitable[int | None]] | None = None,
        in_use: Callable[[], set[str]] = set,
    ) -> None:
        """`in_use`: the host links prepared claims use; one that disappears stays published,
        tainted (`absent`), so the scheduler and the pods' owners see it, until the claims go."""
        self.client = client
        self.api = Api(client, API_TIMEOUT)
        self.settings = settings
        self.cni_path = list(cni_path)
        self.filter = link_filter or LinkFilter()
        self.resync = resync
        self.min_interval = min_interval
        self.read_links = lambda: with_absent(links(), in_use())
        self.generation = 0
        self._published: list[Any] | None = None
        self._published_names: set[str] = set()
        self._trigger = asyncio.Event()
        self.last_publish: float | None = None
        self.publish_node_links = frozenset(publish_node_links)
        self.node_ips: tuple[str, ...] = ()
        # False until the Node object is read: until then its addresses are unknown, so every
        # link holding an address is taken to carry the node (a missing fact means no)
        self.node_known = False
        self._view: NodeView | None = None
        self.node_labels: dict[str, str] | None = None
        self.networks = networks
        self._served: dict[str, tuple[str, NamedNetwork, Link | None]] = {}
        self.pool_capacity = pool_capacity
        self.health = HealthBoard()
        self.watch = LinkWatch(self.filter.eligible)
        self._check_rounds = 0  # rounds still to check that the slices written are there

    def view(self) -> NodeView:
        """The node as prepare and the hook see it: each published device's link, the links
        that carry the node. Kept current by every round (`refresh_view` before the first);
        no I/O here, it is called on the event loop."""
        return self._view or NodeView()

    async def refresh_view(self) -> NodeView:
        links = await asyncio.to_thread(self.read_links)
        await self._serve(links)
        self._view = self._same(self._make_view(links))
        self.watch.read(links, self._view.protected, self._view.links.values())
        return self._view

    def _same(self, view: NodeView) -> NodeView:
        """The view kept when the node has not changed: a judgement made ahead on it is used
        by prepare only while it is the same object (cnidra.dra.ahead)."""
        return self._view if self._view is not None and self._view == view else view

    def _protected(self, links: list[Link]) -> frozenset[str]:
        protected = carrying_node(links, self.node_ips)
        if self.node_known:
            return protected
        return protected | {link.name for link in links if link.ipv4 or link.ipv6}

    def _make_view(self, links: list[Link]) -> NodeView:
        protected = self._protected(links)
        published = [link for link in links if self._publishable(link, protected)]
        names = {name: link.name for name, link in device_names(published).items()}
        for dev, (_, _, parent) in self._served.items():
            names[dev] = parent.name if parent else ""
        networks = {dev: network for dev, (_, network, _) in self._served.items()}
        return NodeView(
            names, protected, self.node_labels, networks=networks, facts=node_facts(links)
        )

    async def _serve(self, links: list[Link]) -> None:
        """The named networks this node can serve: each CNINetwork whose node conf (if it
        names one) is here and readable, and whose parent links are up and publishable."""
        if self.networks is None:
            return
        try:
            found = await self.networks.served()
        except Exception as exc:
            log.warning("named networks not read (%s); keeping the last known", exc)
            return
        protected = self._protected(links)
        by_name = {link.name: link for link in links if self._publishable(link, protected)}
        taken = set(device_names(by_name.values()))
        usable: list[tuple[str, NamedNetwork]] = []
        parent_of: dict[str, Link | None] = {}
        for name, network in found:
            wanted = parents(network)
            links_up = [by_name.get(p) for p in wanted]
            # a parent that is down: served, tainted like the link (unless taints are off)
            untainted = self.settings.taint_effect == "None"
            if any(
                link is None or (untainted and link_failure(link) is not None) for link in links_up
            ):
                log.debug("network %s not served here: parent %s not up", name, wanted)
                continue
            usable.append((name, network))
            parent_of[name] = links_up[0] if links_up else None
        self._served = {
            dev: (name, network, parent_of[name])
            for dev, (name, network) in network_device_names(usable, taken).items()
        }

    async def _addresses(self) -> dict[str, tuple[str, int]]:
        """Per served network with cnidra IPAM: its pool and the addresses this node can
        still give (a pool that cannot be read now is published without a count)."""
        if self.pool_capacity is None:
            return {}
        found: dict[str, tuple[str, int]] = {}
        for dev, (_, network, _) in self._served.items():
            pool = pool_of(network.config)
            if pool is None:
                continue
            try:
                count = await self.pool_capacity(pool)
            except Exception as exc:
                log.warning("addresses of CNIIPPool %s not counted: %s", pool, exc)
                continue
            if count is not None:
                found[dev] = (pool, count)
        return found

    def _publishable(self, link: Link, protected: frozenset[str]) -> bool:
        if not self.filter.eligible(link):
            return False
        return link.name not in protected or link.name in self.publish_node_links

    def poke(self) -> None:
        self._trigger.set()

    def check_slices(self) -> None:
        """kubelet registered the plugin (at the driver's start, or at kubelet's own): the next
        `CHECK_ROUNDS` rounds, this one at once, make sure the slices last written are still
        there. kubelet deletes a driver's slices at its start and 30 s after it lost the
        plugin's connection; a deletion already under way when the plugin comes back is not
        called off, and can land after this driver's publish, which then compared only with
        what it wrote itself and never wrote them again (a test bed run: one publish, then no
        device for 60 s)."""
        self._check_rounds = CHECK_ROUNDS
        self.poke()

    async def run(self) -> None:
        owner = await self._node_owner()
        await self._adopt_existing()
        watcher = asyncio.create_task(self._watch_netlink(), name="netlink-watch")
        networks = (
            asyncio.create_task(self.networks.watch(self.poke), name="network-watch")
            if self.networks
            else None
        )
        failed = Backoff(initial=PUBLISH_RETRY, maximum=self.resync)
        try:
            while True:
                wait = self.resync
                try:
                    if self._check_rounds:
                        self._check_rounds -= 1
                        await self._check_published()
                    await self.publish_if_changed(owner)
                    failed.reset()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    metrics.PUBLISHES.labels("error").inc()
                    self._published = None  # published again, whole, on the next round
                    wait = min(failed.next(), self.resync)
                    log.warning("publishing ResourceSlices failed (next in %.1f s): %s", wait, exc)
                await wait_set(self._trigger, wait)
                await self._quiet()
        finally:
            watcher.cancel()
            if networks is not None:
                networks.cancel()

    async def _quiet(self) -> None:
        """After a change: publish once events pause for `min_interval`, or at the latest
        `BURST_LIMIT` intervals after the first. A burst of pods makes link events for seconds
        (veths, macvlans made and moved away); re-reading every link each second of it cost
        more CPU than the burst's hooks."""
        first = time.monotonic()
        while time.monotonic() - first < self.min_interval * BURST_LIMIT:
            self._trigger.clear()
            if not await wait_set(self._trigger, self.min_interval):
                return

    async def publish_if_changed(self, owner: dict[str, Any]) -> bool:
        every = await asyncio.to_thread(self.read_links)
        await self._serve(every)
        view = self._make_view(every)
        if self._view is None or replace(view, attributes=self._view.attributes) != self._view:
            self._view = view  # until the slices give it its attributes
        self.watch.read(every, view.protected, view.links.values())
        published = {n for d, n in view.links.items() if d not in view.networks}
        links = [link for link in every if link.name in published]
        plugins = cni_plugins(self.cni_path)
        slices = build_slices(
            links,
            plugins,
            self.settings,
            self.generation + 1,
            owner,
            view.protected,
            self._served,
            await self._addresses(),
        )
        self._view = self._same(
            replace(
                view,
                attributes={
                    d["name"]: d["attributes"] for s in slices for d in s["spec"]["devices"]
                },
            )
        )
        failures = device_failures(device_names(links), self._served)
        if content(slices) == self._published:
            self.health.update(failures)
            return False
        self.generation += 1
        for obj in slices:
            await self.api.apply_object(ResourceSlice, obj)
        names = {s["metadata"]["name"] for s in slices}
        for stale in self._published_names - names:
            with contextlib.suppress(ApiFailure):
                await self.api.delete(ResourceSlice, stale)
        self._published, self._published_names = content(slices), names
        devices = sum(len(s["spec"]["devices"]) for s in slices)
        self.last_publish = time.time()
        metrics.PUBLISHED_DEVICES.set(devices)
        metrics.LAST_PUBLISH.set(self.last_publish)
        metrics.PUBLISHES.labels("ok").inc()
        log.info(
            "published %d device(s) in %d slice(s), pool generation %d",
            devices,
            len(slices),
            self.generation,
        )
        # after the slices (a taint, where the cluster takes them, is written first): a log
        # reader who sees a device's health change knows what the slice says of it
        self.health.update(failures)
        return True

    async def _node_owner(self) -> dict[str, Any]:
        """The Node object, as the slices' owner; its addresses and labels. Nothing is published
        until it is read: without its addresses the links that carry the node are not known
        (the view meanwhile protects every link that holds an address)."""
        backoff = Backoff(initial=0.2, maximum=10.0)
        while True:
            try:
                node = await self.api.get(Node, self.settings.node)
                meta = node.get("metadata") or {}
                self.node_labels = dict(meta.get("labels") or {})
                addresses = (node.get("status") or {}).get("addresses") or []
                self.node_ips = tuple(
                    str(a.get("address"))
                    for a in addresses
                    if a.get("type") in ("InternalIP", "ExternalIP")
                )
                self.node_known = True
                return {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": self.settings.node,
                    "uid": meta.get("uid"),
                    "controller": True,
                }
            except NotFound:
                log.warning("node %s not registered yet; nothing published", self.settings.node)
            except Exception as exc:
                log.warning("cannot read node %s: %s; nothing published", self.settings.node, exc)
            await asyncio.sleep(backoff.next())

    async def _adopt_existing(self) -> None:
        """Continue the pool generation across restarts, and know which slices are ours."""
        with contextlib.suppress(Exception):
            for name, generation in (await self._listed()).items():
                self._published_names.add(name)
                self.generation = max(self.generation, generation)

    async def _listed(self) -> dict[str, int]:
        """This driver's slices of this node on the apiserver now: name -> pool generation."""
        found: dict[str, int] = {}
        for obj in await self.api.list(
            ResourceSlice, fields={"spec.nodeName": self.settings.node}, within=API_TIMEOUT * 3
        ):
            data = obj
            if data["spec"].get("driver") == DRIVER_NAME:
                found[data["metadata"]["name"]] = int(data["spec"]["pool"]["generation"])
        return found

    async def _check_published(self) -> None:
        """Written again next when a slice last written is gone from the apiserver (one LIST,
        as `_adopt_existing`'s; only after a registration, so a resync at rest asks nothing)."""
        if self._published is None:
            return  # nothing written yet, or the last write failed: written again anyway
        try:
            there = set(await self._listed())
        except Exception as exc:
            log.warning("ResourceSlices not listed to check them: %s", exc)
            return
        if missing := self._published_names - there:
            log.warning(
                "ResourceSlice(s) %s deleted by another (kubelet's cleanup of the plugin's "
                "last run?); writing them again",
                ", ".join(sorted(missing)),
            )
            self._published = None

    async def _watch_netlink(self) -> None:
        """A link or address change in the node's namespace that can change what is published
        triggers a publish (coalesced: `_quiet`). The messages are read for the link they name
        only (cnidra.inventory.events, a few struct reads, not pyroute2's decoding): a burst of
        pods makes hundreds of them about the pods' veths, which never re-read the links."""
        backoff = Backoff(initial=NETLINK_RETRY, maximum=NETLINK_RETRY_MAX)
        while True:
            started = time.monotonic()
            try:
                with netlink_events(RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR) as sock:
                    readable = asyncio.Event()
                    loop = asyncio.get_running_loop()
                    loop.add_reader(sock.fileno(), readable.set)
                    try:
                        while True:
                            await readable.wait()
                            readable.clear()
                            datagrams, overrun = receive(sock)
                            if overrun or self.watch.matters(datagrams):
                                self._trigger.set()
                    finally:
                        loop.remove_reader(sock.fileno())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("netlink monitor failed (%s); relying on resync", exc)
                await asyncio.sleep(backoff.after_run(time.monotonic() - started))


PUBLISH_RETRY = 1.0  # seconds before a failed publish is tried again, at first (then doubling)
NETLINK_RETRY = 5.0  # seconds before a failed netlink monitor is opened again, at first
NETLINK_RETRY_MAX = 60.0  # ... and at most (the publisher's resync covers the gap)
API_TIMEOUT = 10.0  # one apiserver call of the publisher (a LIST of its slices: three)
BURST_LIMIT = 10  # a publish waits at most this many min_intervals for events to pause
# rounds after a registration that check the slices are there: at once, then the next two (at
# rest, two resyncs: kubelet's deletion retries 1 s, 2 s, 4 s, ... apart while it fails)
CHECK_ROUNDS = 3

# rtnetlink multicast groups (linux/rtnetlink.h)
RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV6_IFADDR = 0x100


@contextlib.contextmanager
def netlink_events(groups: int) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, 0)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.bind((0, groups))
        yield sock
    finally:
        sock.close()


def receive(sock: socket.socket) -> tuple[list[bytes], bool]:
    """What is queued, and whether events were lost (ENOBUFS: an overrun)."""
    datagrams: list[bytes] = []
    overrun = False
    while True:
        try:
            datagrams.append(sock.recv(1 << 16))
        except BlockingIOError:
            return datagrams, overrun
        except OSError as exc:
            if exc.errno != errno.ENOBUFS:
                raise
            overrun = True


def drain(sock: socket.socket) -> int:
    """Reads what is queued: how many datagrams; an overrun counts as one too."""
    datagrams, overrun = receive(sock)
    return len(datagrams) + overrun
