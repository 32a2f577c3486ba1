"""Issue 44 made visible on the node: `cnidra node describe` shows the rate an interface
reserved and what it holds now in each direction with what the limit dropped (read through
the reader the agent passes, off the event loop), and the metrics collector exports the
same per interface and direction."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

from bench import grpc_stubs as api_grpc
from cnidra._proto.node.v1alpha1 import api_pb2 as api
from cnidra.api.bandwidth import DEFAULT_RULES, Rate, Terms
from cnidra.datapath.shaping import Direction, NamespaceGone, Shaping
from cnidra.nodeapi.service import NodeNetworksService, serve
from cnidra.observe.interfaces import PodInterface
from cnidra.observe.ratelimits import RateLimitCollector
from tests.nodeapi.test_node_api import records
from tests.nri.fakes import Node, network, pod, prepare
from tests.test_cli_outputs import cli

LIMIT = Rate(100 * 10**6, 100 * 10**6)


def direction(drops: int, limit: Rate = LIMIT) -> Direction:
    return Direction(limit.rate, limit.ceil, 125_000, 90, drops, 7, 0, 0)


class Reader:
    """What shaping.read_many would answer, and from which thread it was asked."""

    def __init__(self, answer: Mapping[str, Shaping] | Exception) -> None:
        self.answer = answer
        self.asked: list[tuple[str, list[str], float, bool]] = []

    def __call__(self, netns: str, names: Sequence[str], timeout: float) -> Mapping[str, Shaping]:
        on_main = threading.current_thread() is threading.main_thread()
        self.asked.append((netns, list(names), timeout, on_main))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def shaped_pod(tmp_path: Path) -> Node:
    node = Node.start(tmp_path)
    prepare(node.checkpoint, "fast", "a-uid", ("net1", network("fast", "macvlan")), rate=LIMIT)
    prepare(node.checkpoint, "open", "a-uid", ("net2", network("open", "bridge")))
    await node.hooks.run_pod_sandbox(pod("a"))
    return node


async def query(
    node: Node, reader: Reader, tmp_path: Path, pod_name: str = "a"
) -> tuple[api.PodNetwork, str]:
    socket = tmp_path / "node.sock"
    service = NodeNetworksService(lambda: records(node), node.lifecycle.journal, limits=reader)
    server = await serve(service, socket)
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            client = api_grpc.NodeNetworksStub(channel)
            view = await client.QueryPodNetwork(
                api.QueryPodNetworkRequest(namespace="ns", name=pod_name)
            )
        described = await asyncio.to_thread(
            cli, "node", "describe", pod_name, "-n", "ns", "--socket", str(socket)
        )
        assert described.exit_code == 0, described.output
        return view, str(described.output)
    finally:
        await server.stop(grace=None)


async def test_describe_shows_reserved_and_enforced_rates_and_drops(tmp_path: Path) -> None:
    node = await shaped_pod(tmp_path)
    reader = Reader({"net1": Shaping("net1", direction(3), direction(0), "cnifb-x")})
    view, described = await query(node, reader, tmp_path)
    # only the shaped interface is read, in the pod's namespace, not on the event loop's thread
    [(netns, names, timeout, on_main)] = reader.asked[:1]
    assert (netns, names, on_main) == ("/run/netns/a-sandbox", ["net1"], False) and timeout > 0
    net1, net2 = view.attachments
    assert (net1.reserved.rate_bps, net1.reserved.ceil_bps) == (LIMIT.rate, LIMIT.ceil)
    assert net1.enforced.egress.drops == 3 and net1.enforced.ingress.limit.rate_bps == LIMIT.rate
    assert not net2.HasField("reserved") and not net2.HasField("enforced")
    assert "bandwidth reserved 100Mbit/s each way" in described
    assert "egress  enforced 100Mbit/s: 90 packets sent, 3 dropped, 7 overlimits" in described
    assert "ingress enforced 100Mbit/s: 90 packets sent, 0 dropped, 7 overlimits" in described
    assert described.count("bandwidth reserved") == 1


async def test_describe_says_a_claim_that_reserved_nothing_holds_a_share(tmp_path: Path) -> None:
    """Under whenUnreserved Leftover the interface's limit is no reservation: describe says
    what it is (and the API: `held_as`)."""
    node = Node.start(tmp_path, bandwidth=True)
    link = 10**9
    for claim, granted in (("open", None), ("fast", 400 * 10**6)):
        prepare(
            node.checkpoint,
            claim,
            f"{claim}-uid",
            ("net1", network(claim, "macvlan")),
            bandwidth=Terms(granted, link, DEFAULT_RULES, "gold"),
            parent="eth1",
        )
    await node.hooks.run_pod_sandbox(pod("fast"))
    await node.hooks.run_pod_sandbox(pod("open"))
    share = Rate(600 * 10**6, 600 * 10**6)
    reader = Reader({"net1": Shaping("net1", direction(0, share), direction(0, share), "x")})
    view, described = await query(node, reader, tmp_path, pod_name="open")
    [net1] = view.attachments
    assert net1.held_as == "leftover" and net1.reserved.rate_bps == share.rate
    assert (
        "bandwidth reserved none; held to 600Mbit/s each way, its share of what the link's "
        "reservations leave" in described
    )


async def test_a_limit_missing_or_unreadable_is_told_not_failed(tmp_path: Path) -> None:
    node = await shaped_pod(tmp_path)
    _, missing = await query(node, Reader({}), tmp_path)
    assert "egress  not enforced" in missing
    assert "problem: no limit found on the interface" in missing
    gone = Reader(NamespaceGone("the network namespace /run/netns/a-sandbox is gone"))
    view, unread = await query(node, gone, tmp_path)
    assert "could not be read: the network namespace" in view.attachments[0].enforced.error
    assert "problem: could not be read" in unread


async def test_json_output_carries_the_rates(tmp_path: Path) -> None:
    node = await shaped_pod(tmp_path)
    socket = tmp_path / "node.sock"
    reader = Reader({"net1": Shaping("net1", direction(1), None, None)})
    server = await serve(
        NodeNetworksService(lambda: records(node), node.lifecycle.journal, limits=reader), socket
    )
    try:
        out = await asyncio.to_thread(
            cli, "node", "describe", "a", "-n", "ns", "-o", "json", "--socket", str(socket)
        )
    finally:
        await server.stop(grace=None)
    net1 = json.loads(out.output)["attachments"][0]
    assert net1["reserved"] == {"rate_bps": str(LIMIT.rate), "ceil_bps": str(LIMIT.ceil)}
    assert net1["enforced"]["egress"]["drops"] == "1"
    assert net1["enforced"]["error"] == "the limit is there in one direction only"


async def test_the_collector_exports_each_shaped_interface_per_direction(tmp_path: Path) -> None:
    node = await shaped_pod(tmp_path)
    assert [i.interface for i in node.lifecycle.reporting.shaped_interfaces()] == ["net1"]
    collector = RateLimitCollector()
    collector.source = node.lifecycle.reporting.shaped_interfaces
    reader = Reader({"net1": Shaping("net1", direction(4), direction(2), "cnifb-x")})
    collector.read = reader
    families = {f.name: f for f in collector.collect()}
    labels = ("ns", "a", "fast", "req0", "net1")
    drops = {
        (*tuple(s.labels.values())[:5], s.labels["direction"]): s.value
        for s in families["cnidra_pod_interface_shaped_drops"].samples
        if s.name.endswith("_total")
    }
    assert drops == {(*labels, "egress"): 4, (*labels, "ingress"): 2}
    rates = families["cnidra_pod_interface_rate_limit_bits_per_second"].samples
    assert {s.value for s in rates} == {LIMIT.rate}
    assert reader.asked[0][1] == ["net1"]


def test_a_namespace_that_cannot_be_read_is_left_out_of_the_scrape() -> None:
    collector = RateLimitCollector()
    collector.source = lambda: [
        PodInterface("/gone", "ns", "a", "c", "r", "net1"),
        PodInterface("/here", "ns", "b", "c", "r", "net1"),
    ]

    def read(netns: str, names: Sequence[str], timeout: float) -> Mapping[str, Shaping]:
        if netns == "/gone":
            raise NamespaceGone("gone")
        return {"net1": Shaping("net1", direction(0), None, None)}

    collector.read = read
    families = {f.name: f for f in collector.collect()}
    pods = {s.labels["pod"] for s in families["cnidra_pod_interface_shaped_drops"].samples}
    assert pods == {"b"}
