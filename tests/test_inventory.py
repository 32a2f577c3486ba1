"""Links that carry the node are found, with everything bound to them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cnidra.api.issues import FieldPath
from cnidra.api.networks import NamedNetwork
from cnidra.inventory.links import Link, carrying_node
from cnidra.inventory.slices import SliceSettings, network_device


def link(name: str, index: int, **kw: object) -> Link:
    fields: dict[str, object] = {"kind": "physical", "state": "up", **kw}
    return Link(name, index, "", 1500, link_kind=None, **fields)  # type: ignore[arg-type]


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


def test_a_bridge_of_another_network_of_pods_is_never_a_pods() -> None:
    """kubenet's cbr0: the pods' gateway address, pod veths as ports. A pod plugged into it
    would sit on the primary network; cnidra's own bridges (no host address) stay free."""
    links = [
        link("eth1", 3),
        Link("cbr0", 5, "", 1500, "bridge", "bridge", "up", ipv4=("198.18.240.1/24",)),
        Link("vethab", 6, "", 1500, "virtual", "veth", "up", master=5, peer_elsewhere=True),
        Link("br-storage", 7, "", 1500, "bridge", "bridge", "up"),
        Link("vethcd", 8, "", 1500, "virtual", "veth", "up", master=7, peer_elsewhere=True),
        Link("br-empty", 9, "", 1500, "bridge", "bridge", "up", ipv4=("198.18.241.1/24",)),
    ]
    assert carrying_node(links) == {"cbr0", "vethab"}


def test_other_cnis_devices_are_never_published() -> None:
    from cnidra.inventory.links import LinkFilter

    others = ["antrea-gw0", "antrea-tun0", "vxlan.calico", "weave", "nodelocaldns", "virbr0",
              "cbr0", "cni0", "docker0", "flannel.1", "cilium_host", "lxc12ab", "tunl0",
              "kube-ipvs0", "ovn-k8s-mp0", "br-int", "genev_sys_6081", "cni-podman0"]  # fmt: skip
    assert [n for n in others if LinkFilter().eligible(link(n, 1))] == []
    assert all(LinkFilter().eligible(link(n, 1)) for n in ("eth1", "ens2f0np0", "br-data"))


def test_a_veths_peer_index_in_another_namespace_is_not_a_link_here() -> None:
    from unittest import mock

    from cnidra.inventory import links as module
    from cnidra.inventory.netlink import Address, Dump, LinkMessage

    found = Dump(
        links=[
            LinkMessage(3, name="tbdata"),
            # IFLA_LINK 3 with IFLA_LINK_NETNSID: an index in the pod's namespace
            LinkMessage(9, name="veth1", link_kind="veth", master=7, peer_elsewhere=True),
            LinkMessage(7, name="cni0"),
        ],
        addresses=[Address(7, 2, "198.51.100.1", 24)],
        routes=[],
    )
    with (
        mock.patch.object(module, "dump", return_value=found),
        mock.patch.object(module, "_sysfs", return_value={}),
    ):
        links = module.read_links()
    veth = next(link for link in links if link.name == "veth1")
    assert veth.lower is None and veth.master == 7 and veth.peer_elsewhere
    # the node bridge and its port carry the node; the data link whose index the peer shares
    # in the pod's namespace does not
    assert carrying_node(links, ["198.51.100.1"]) == {"cni0", "veth1"}


def test_a_link_the_node_routes_through_carries_the_node() -> None:
    """A storage or management route via a gateway: the node's own traffic leaves there, as
    much as through the default route, so the link (and a plain route's link is not)."""
    from unittest import mock

    from cnidra.inventory import links as module
    from cnidra.inventory.netlink import Dump, LinkMessage, Route

    found = Dump(
        links=[
            LinkMessage(i, name=name)
            for i, name in ((3, "storage0"), (4, "data0"), (5, "mgmt0"), (6, "mgmt1"))
        ],
        addresses=[],
        routes=[
            Route(2, 24, 3, gateway=True),  # 198.18.60.0/24 via 198.18.50.1 on storage0
            Route(2, 24, 4, gateway=False),  # data0's own subnet, no gateway
            Route(2, 16, None, gateway=False, hops=(5, 6)),  # multipath
        ],
    )
    with (
        mock.patch.object(module, "dump", return_value=found),
        mock.patch.object(module, "_sysfs", return_value={}),
    ):
        links = module.read_links()
    assert carrying_node(links) == {"storage0", "mgmt0", "mgmt1"}


@pytest.mark.netns
def test_a_link_change_in_the_nodes_namespace_wakes_the_publisher(in_node: Path) -> None:
    """The publisher's netlink wakeup: raw rtnetlink events, counted and never decoded."""
    import select

    from cnidra.inventory.publisher import RTMGRP_LINK, drain, netlink_events
    from tests.conftest import ip

    with netlink_events(RTMGRP_LINK) as sock:
        assert drain(sock) == 0
        ip(in_node, "link", "add", "nlwake0", "type", "bridge")
        assert select.select([sock], [], [], 30)[0], "no event within 30 s"
        assert drain(sock) >= 1
        assert drain(sock) == 0


def test_a_network_with_cnidra_ipam_publishes_its_pool_and_addresses() -> None:
    network = NamedNetwork(
        reference="CNINetwork data",
        config={"name": "data", "plugins": [{"type": "macvlan", "ipam": {"type": "cnidra"}}]},
        path=FieldPath(),
        trusted=True,
    )
    dev = network_device("net-data", "data", network, None, SliceSettings("n1"), ("data-v4", 12))
    assert dev["attributes"]["ipPool"] == {"string": "data-v4"}
    assert dev["capacity"]["addresses"] == {
        "value": "12",
        "requestPolicy": {"default": "1", "validValues": ["1"]},
    }
    assert dev["allowMultipleAllocations"] is True


def test_a_network_whose_pool_has_nothing_left_here_is_not_offered() -> None:
    from cnidra.inventory.slices import build_slices

    network = NamedNetwork(
        reference="CNINetwork data",
        config={"name": "data", "plugins": [{"type": "macvlan", "ipam": {"type": "cnidra"}}]},
        path=FieldPath(),
        trusted=True,
    )
    served = {"net-data": ("data", network, None), "net-other": ("other", network, None)}
    slices = build_slices(
        [], [], SliceSettings("n1"), 1, networks=served, addresses={"net-data": ("p", 0)}
    )
    assert [d["name"] for d in slices[0]["spec"]["devices"]] == ["net-other"]


def test_nothing_is_published_while_the_node_cannot_be_read() -> None:
    """Fail closed on a missing fact: without the Node's addresses the link holding its
    InternalIP is not known, so until the Node is read nothing is published, and the view that
    prepare and the hook read protects every link that holds an address."""
    import asyncio
    import contextlib

    from cnidra.inventory.publisher import SlicePublisher

    links = [
        link("eth0", 2, ipv4=("192.0.2.7/24",)),  # the InternalIP, but no default route
        link("eth1", 3),
    ]

    class Client:
        def __init__(self) -> None:
            self.reads = 0
            self.applied: list[object] = []
            self.up = False  # unreachable until the test says (not until a 4th read, which a
            # loaded machine's late look at the reads could come after)

        async def get(self, kind: object, name: str) -> object:
            self.reads += 1
            if not self.up:
                raise OSError("apiserver unreachable")
            addresses = [{"type": "InternalIP", "address": "192.0.2.7"}]
            return {
                "metadata": {"labels": {}, "uid": "node-uid"},
                "status": {"addresses": addresses},
            }

        async def patch(self, kind: object, name: str, obj: object, **_: object) -> None:
            self.applied.append(obj)

        async def delete(self, *args: object) -> None: ...

        def list(self, *args: object, **kw: object) -> object:
            raise OSError("no list here")

    async def scenario() -> None:
        client = Client()
        publisher = SlicePublisher(
            client,  # type: ignore[arg-type]
            SliceSettings("n1"), [], min_interval=0.01, links=lambda: links,
        )  # fmt: skip
        view = await publisher.refresh_view()
        assert view.protected == {"eth0"} and "eth1" in view.links
        task = asyncio.create_task(publisher.run())
        for _ in range(1500):  # two failed reads of the Node (0.2 s, 0.4 s, ... of backoff)
            if client.reads >= 2:
                break
            await asyncio.sleep(0.02)
        assert client.applied == [] and client.reads >= 2
        client.up = True
        for _ in range(600):  # 30 s: the next read is a backoff (0.4 s, 0.8 s, ...) away
            await asyncio.sleep(0.05)
            if client.applied:
                break
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert client.applied, "published once the Node was read"
        assert publisher.node_known and publisher.view().protected == {"eth0"}
        devices = [d["name"] for d in client.applied[0]["spec"]["devices"]]  # type: ignore[index]
        assert devices == ["eth1"]

    asyncio.run(scenario())


def test_a_failed_link_is_published_with_a_taint_that_says_why() -> None:
    """KEP-5055: the scheduler keeps new claims off it (NoSchedule), or also evicts the pods
    using it (NoExecute); a working bridge without ports (state unknown, carrier) is healthy."""
    from cnidra.inventory.slices import TAINT_KEY, build_slices

    links = [
        link("up0", 2, carrier=True),
        link("br0", 3, state="unknown", carrier=True, kind="bridge"),
        link("down0", 4, state="down"),
        link("off0", 5, admin_up=False, state="down"),
        link("cable0", 6, carrier=False, state="down"),
    ]

    def taints(settings: SliceSettings) -> dict[str, list[dict[str, str]]]:
        [slice_] = build_slices(links, [], settings, 1)
        return {d["name"]: d.get("taints", []) for d in slice_["spec"]["devices"]}

    found = taints(SliceSettings("n1"))
    assert found["up0"] == found["br0"] == []
    assert found["down0"] == [{"key": TAINT_KEY, "value": "down", "effect": "NoSchedule"}]
    assert found["off0"][0]["value"] == "admin-down"
    assert found["cable0"][0]["value"] == "no-carrier"
    assert taints(SliceSettings("n1", taint_effect="NoExecute"))["down0"][0]["effect"] == (
        "NoExecute"
    )
    assert all(t == [] for t in taints(SliceSettings("n1", taint_effect="None")).values())


def test_a_link_in_use_that_is_gone_stays_published_tainted_absent() -> None:
    from cnidra.inventory.publisher import with_absent
    from cnidra.inventory.slices import build_slices

    present = [link("eth1", 2)]
    links = with_absent(present, {"eth1", "eth9"})
    [slice_] = build_slices(links, [], SliceSettings("n1"), 1)
    devices = {d["name"]: d for d in slice_["spec"]["devices"]}
    assert devices["eth9"]["taints"][0]["value"] == "absent"
    assert devices["eth9"]["attributes"]["state"] == {"string": "absent"}
    assert "taints" not in devices["eth1"]
    assert with_absent(present, set()) == present  # not in use: gone is gone


def test_a_named_network_whose_parent_is_down_is_served_tainted() -> None:
    network = NamedNetwork(
        reference="CNINetwork data",
        config={"name": "data", "plugins": [{"type": "macvlan", "master": "eth1"}]},
        path=FieldPath(),
        trusted=True,
    )
    parent = link("eth1", 2, state="down")
    dev = network_device("net-data", "data", network, parent, SliceSettings("n1"))
    assert dev["taints"][0]["value"] == "down"


def test_slices_deleted_after_kubelet_registers_the_plugin_are_written_again() -> None:
    """kubelet deletes a driver's slices at its start and 30 s after it lost the plugin; a
    deletion under way when the plugin registers is not called off and can land after the
    first publish (a test bed run: one publish, then no device for 60 s). The rounds after a
    registration check the slices are there, and write them again when they are not."""
    import asyncio
    import contextlib

    from cnidra.inventory.publisher import SlicePublisher

    class Apiserver:
        def __init__(self) -> None:
            self.slices: dict[str, object] = {}
            self.applied = self.lists = 0

        async def get(self, kind: object, name: str) -> object:
            return {"metadata": {"labels": {}, "uid": "node-uid"}, "status": {"addresses": []}}

        async def patch(self, kind: object, name: str, obj: object, **_: object) -> None:
            self.slices[name] = obj
            self.applied += 1

        async def delete(self, kind: object, name: str) -> None:
            self.slices.pop(name, None)

        async def list(self, *args: object, **kw: object) -> object:
            self.lists += 1
            for obj in list(self.slices.values()):
                yield obj

    async def until(check: object, seconds: float = 30.0) -> bool:
        for _ in range(int(seconds / 0.02)):
            if check():  # type: ignore[operator]
                return True
            await asyncio.sleep(0.02)
        return False

    rounds = 0

    def links() -> list[Link]:  # read once a round: the rounds that elapsed, counted
        nonlocal rounds
        rounds += 1
        return [link("tt0", 3)]

    async def scenario() -> None:
        apiserver = Apiserver()
        publisher = SlicePublisher(
            apiserver,  # type: ignore[arg-type]
            SliceSettings("n1"), [], resync=0.3, min_interval=0.01, links=links,
        )  # fmt: skip
        task = asyncio.create_task(publisher.run())
        try:
            assert await until(lambda: apiserver.applied == 1)
            apiserver.slices.clear()  # kubelet's deletion, before it registers the plugin
            publisher.check_slices()  # kubelet registered the plugin
            assert await until(lambda: "n1-cni-dra-0" in apiserver.slices), "not written again"
            assert publisher.generation == 2
            apiserver.slices.clear()  # a deletion retried, after the registration
            assert await until(lambda: "n1-cni-dra-0" in apiserver.slices), "not at a resync"
            # the three checked rounds, then two resyncs at rest: nothing written, nothing
            # listed (counted in rounds, not seconds: a loaded machine runs fewer a second)
            assert await until(lambda: apiserver.lists >= 1 + 3, 60), apiserver.lists
            at_rest = rounds
            assert await until(lambda: rounds >= at_rest + 2, 60), rounds
            assert apiserver.applied == 3
            assert apiserver.lists == 1 + 3  # the adoption at the start, three checked rounds
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(scenario())


def test_the_view_stays_the_same_object_while_the_node_does_not_change() -> None:
    """Prepare uses a judgement the read-ahead made only on the very view it would judge on
    (cnidra.dra.ahead): a round that finds the node as it was keeps its view, one that finds
    a change makes a new one."""
    import asyncio

    from cnidra.inventory.publisher import SlicePublisher

    class Apiserver:
        async def get(self, kind: object, name: str) -> object:
            return {"metadata": {"labels": {}, "uid": "node-uid"}, "status": {"addresses": []}}

        async def patch(self, kind: object, name: str, obj: object, **_: object) -> None: ...

        async def delete(self, kind: object, name: str) -> None: ...

    found = [link("eth1", 3)]

    async def scenario() -> None:
        publisher = SlicePublisher(
            Apiserver(),  # type: ignore[arg-type]
            SliceSettings("n1"), [], min_interval=0.01, links=lambda: list(found),
        )  # fmt: skip
        first = await publisher.refresh_view()
        assert await publisher.refresh_view() is first
        owner = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "node-uid"}
        await publisher.publish_if_changed(owner)
        published = publisher.view()
        assert published.attributes  # the slices' attributes, a change
        await publisher.publish_if_changed(owner)
        assert publisher.view() is published
        found.append(link("eth2", 4))
        await publisher.publish_if_changed(owner)
        changed = publisher.view()
        assert changed is not published and "eth2" in changed.links.values()

    asyncio.run(scenario())
