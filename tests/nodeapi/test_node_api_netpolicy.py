"""Issue 43 made visible on the node: `cnidra node describe` shows, per interface, the network as
policies name it, the policies that select the pod there and the table's rule counters (read off
the event loop), what cannot be enforced, and the containers that could undo it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc

from bench import grpc_stubs as api_grpc
from cnidra._proto.node.v1alpha1 import api_pb2 as api
from cnidra.datapath.netpolicy import NftError, RuleCounter
from cnidra.nodeapi.service import NodeNetworksService, serve
from tests.nodeapi.test_node_api import records
from tests.nri.fakes import Node, network, pod, prepare
from tests.test_cli_outputs import cli


async def query(
    node: Node,
    described: dict[str, object],
    counters: object,
    tmp_path: Path,
    where: tuple[str, str] = ("/run/netns/a-sandbox", "cnidra_x"),
) -> tuple[api.PodNetwork, str, list[bool]]:
    on_main: list[bool] = []

    def read(netns: str, table: str, timeout: float) -> list[RuleCounter]:
        on_main.append(threading.current_thread() is threading.main_thread())
        if isinstance(counters, Exception):
            raise counters
        assert (netns, table) == where
        return counters  # type: ignore[return-value]

    socket = tmp_path / "node.sock"
    service = NodeNetworksService(
        lambda: records(node),
        node.lifecycle.journal,
        policy=lambda namespace, name: described if (namespace, name) == ("ns", "a") else {},
        policy_counters=read,
    )
    server = await serve(service, socket)
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            view = await api_grpc.NodeNetworksStub(channel).QueryPodNetwork(
                api.QueryPodNetworkRequest(namespace="ns", name="a")
            )
        out = await asyncio.to_thread(
            cli, "node", "describe", "a", "-n", "ns", "--socket", str(socket)
        )
        assert out.exit_code == 0, out.output
        return view, str(out.output), on_main
    finally:
        await server.stop(grace=None)


async def test_describe_shows_policies_counters_and_flags(tmp_path: Path) -> None:
    node = Node.start(tmp_path)
    prepare(node.checkpoint, "c", "a-uid", ("net1", network("blue", "macvlan")))
    prepare(node.checkpoint, "d", "a-uid", ("net2", network("fast", "vhostuser")))
    await node.hooks.run_pod_sandbox(pod("a"))
    described = {
        "net1": {"network": "ns/blue", "table": "cnidra_x", "policies": ["ns/web"]},
        "net2": {
            "network": "ns/fast",
            "policies": ["ns/deny"],
            "notEnforced": "a vhost-user socket",
        },
        "undoableBy": ["debug"],
    }
    counted = [
        RuleCounter("if0_in_tenant", "ns/web ingress[0]", "accept", 12, 1200),
        RuleCounter("if0_in", "default-deny ingress (ns/web)", "drop", 5, 500),
    ]
    view, out, on_main = await query(node, described, counted, tmp_path)
    net1, net2 = view.attachments
    assert net1.policy.network == "ns/blue" and list(net1.policy.policies) == ["ns/web"]
    assert [(r.verdict, r.packets) for r in net1.policy.rules] == [("accept", 12), ("drop", 5)]
    assert net2.policy.not_enforced == "a vhost-user socket"
    assert list(view.policy_undoable_by) == ["debug"]
    assert on_main and not any(on_main)  # nft's counters are read in a thread
    assert "policy network ns/blue: ns/web" in out
    assert "drop            5 packets" in out and "default-deny ingress (ns/web)" in out
    assert "NOT ENFORCED: a vhost-user socket" in out
    # the interface enforced in the pod's namespace is flagged, the one not enforced is not
    assert (
        out.count("UNDOABLE: enforced in the pod's network namespace, where containers debug") == 1
    )
    assert "containers debug are privileged or have CAP_NET_ADMIN" in out
    view, out, _ = await query(node, described, NftError("nft: no such table"), tmp_path)
    assert "counters could not be read: nft: no such table" in view.attachments[0].policy.error


async def test_describe_shows_a_host_side_table_and_reads_its_counters_there(
    tmp_path: Path,
) -> None:
    node = Node.start(tmp_path)
    prepare(node.checkpoint, "c", "a-uid", ("net1", network("blue", "ptp")))
    await node.hooks.run_pod_sandbox(pod("a"))
    described = {
        "net1": {
            "network": "ns/blue",
            "table": "cnidra_h0123456789ab",
            "netns": "/proc/self/ns/net",
            "hostInterface": "veth1234",
            "policies": ["ns/web"],
        },
    }
    counted = [RuleCounter("if0_in", "default-deny ingress (ns/web)", "drop", 5, 500)]
    where = ("/proc/self/ns/net", "cnidra_h0123456789ab")
    view, out, _ = await query(node, described, counted, tmp_path, where)
    assert view.attachments[0].policy.host_interface == "veth1234"
    assert [r.packets for r in view.attachments[0].policy.rules] == [5]
    assert "enforced on the host's end of the pod's veth (veth1234)" in out
    assert "UNDOABLE" not in out
