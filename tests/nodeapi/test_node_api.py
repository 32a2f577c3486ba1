"""The node API from the node's records alone: a pod attached, one whose attach failed, one
prepared but not started, a failing DEL; the same answers over the root-only socket, after a
restart (a new process over the same state root), and the journal streamed as it grows."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from bench import grpc_stubs as api_grpc
from cnidra._proto.node.v1alpha1 import api_pb2 as api
from cnidra.nodeapi.service import NodeNetworksService, serve
from cnidra.nodeapi.views import NodeRecords, find_pod, pod_networks
from cnidra.nri.lifecycle import AttachError, PlugError
from cnidra.state.journal import Journal
from tests.nri.fakes import FakePlugins, Node, network, pod, prepare


def records(node: Node) -> NodeRecords:
    return NodeRecords(
        tuple(node.checkpoint.all()),
        tuple(node.store.all()),
        tuple(node.lifecycle.journal.entries),
    )


async def three_pods(node: Node) -> None:
    prepare(node.checkpoint, "ok", "a-uid", ("net1", network("data", "macvlan", "tuning")))
    prepare(node.checkpoint, "bad", "b-uid", ("net1", network("broken", "bridge")))
    prepare(node.checkpoint, "later", "c-uid", ("net1", network("data", "macvlan")))
    await node.hooks.run_pod_sandbox(pod("a"))
    node.plugins.failing["bridge"] = "ADD"
    with pytest.raises(AttachError):
        await node.hooks.run_pod_sandbox(pod("b"))


async def test_every_pod_and_why_an_interface_is_missing(tmp_path: Path) -> None:
    node = Node.start(tmp_path, journal=Journal(tmp_path / "journal.jsonl"))
    await three_pods(node)
    views = {v.pod.uid: v for v in pod_networks(records(node))}
    a, b, c = views["a-uid"], views["b-uid"], views["c-uid"]

    assert (a.pod.namespace, a.pod.name, a.state, a.problem) == ("ns", "a", "attached", "")
    [att] = a.attachments
    assert (att.if_name, att.network, att.plugins, att.ips) == (
        "net1", "data", ["macvlan", "tuning"], ["198.18.0.2/24"]
    )  # fmt: skip
    assert att.cni_network == "cnidra-ns.ns.data" and att.state == "attached"
    assert [e.kind for e in a.events] == ["Attached"] and a.events[0].duration_ms > 0

    assert b.state == "prepared" and b.pod.name == "b"  # named by its journal
    assert b.problem.startswith("attach failed:") and "bridge" in b.problem

    assert c.state == "prepared" and (c.pod.namespace, c.pod.name) == ("ns", "") and not c.events
    assert "no sandbox of this pod has been attached yet" in c.problem
    assert [x.if_name for x in c.attachments] == ["net1"]

    assert find_pod(records(node), "ns", "a", "") == a
    assert find_pod(records(node), "", "", "c-uid") == c
    assert find_pod(records(node), "ns", "nobody", "") is None

    again = Node.start(tmp_path, journal=Journal(tmp_path / "journal.jsonl"))  # a restart
    assert pod_networks(records(again)) == pod_networks(records(node))


async def test_a_failing_del_is_told_while_it_is_retried(tmp_path: Path) -> None:
    node = Node.start(tmp_path, FakePlugins(failing={"macvlan": "DEL"}))
    prepare(node.checkpoint, "ok", "a-uid", ("net1", network("data", "macvlan")))
    await node.hooks.run_pod_sandbox(pod("a"))
    await node.hooks.stop_pod_sandbox(pod("a"))
    [view] = pod_networks(records(node))
    assert view.state == "deleting" and "it broke" in view.problem
    node.plugins.failing.clear()
    await node.settle()
    [view] = pod_networks(records(node))
    assert view.state == "prepared" and [e.kind for e in view.events][-1] == "Detached"


async def test_the_socket_is_root_only_and_serves_lists_queries_and_a_stream(
    tmp_path: Path,
) -> None:
    node = Node.start(tmp_path)
    await three_pods(node)
    socket = tmp_path / "node.sock"
    server = await serve(NodeNetworksService(lambda: records(node), node.lifecycle.journal), socket)
    try:
        assert stat.S_IMODE(socket.stat().st_mode) == 0o600
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            client = api_grpc.NodeNetworksStub(channel)
            listed = await client.ListPodNetworks(api.ListPodNetworksRequest(namespace="ns"))
            assert [p.pod.uid for p in listed.pods] == ["c-uid", "a-uid", "b-uid"]  # by name
            one = await client.QueryPodNetwork(api.QueryPodNetworkRequest(namespace="ns", name="a"))
            assert one.attachments[0].mac == "" and one.attachments[0].ips == ["198.18.0.2/24"]
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await client.QueryPodNetwork(api.QueryPodNetworkRequest(namespace="ns", name="z"))
            assert missing.value.code() is grpc.StatusCode.NOT_FOUND
            assert "ns/z has no cnidra claim" in str(missing.value.details())

            stream = client.WatchEvents(api.WatchEventsRequest(follow=True))
            seen = [(await stream.read()).kind, (await stream.read()).kind]  # the backlog
            assert seen == ["Attached", "AttachFailed"]
            await node.hooks.stop_pod_sandbox(pod("a"))  # a new entry, streamed as it happens
            latest = await asyncio.wait_for(stream.read(), 5)
            assert (latest.kind, latest.pod.name) == ("Detached", "a")
            stream.cancel()
    finally:
        await server.stop(grace=None)


async def test_hot_plug_over_the_socket_answers_the_pods_new_view(tmp_path: Path) -> None:
    node = Node.start(tmp_path)
    prepare(node.checkpoint, "base", "a-uid", ("net1", network("base", "macvlan")))
    prepare(node.checkpoint, "extra", "a-uid", ("net2", network("extra", "bridge")), on_demand=True)
    await node.hooks.run_pod_sandbox(pod("a"))
    service = NodeNetworksService(
        lambda: records(node), node.lifecycle.journal, node.lifecycle, refusals=(PlugError,)
    )
    socket = tmp_path / "node.sock"
    server = await serve(service, socket)
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            client = api_grpc.NodeNetworksStub(channel)
            plug = api.AttachNetworkRequest(namespace="ns", name="a", claim="extra", request="req0")
            view = await client.AttachNetwork(plug)
            assert [(a.if_name, a.state) for a in view.attachments] == [
                ("net1", "attached"),
                ("net2", "attached"),
            ]
            with pytest.raises(grpc.aio.AioRpcError) as again:
                await client.AttachNetwork(plug)
            assert again.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "already has net2" in str(again.value.details())
            unplug = api.DetachNetworkRequest(
                namespace="ns", name="a", claim="extra", request="req0"
            )
            view = await client.DetachNetwork(unplug)
            assert [a.if_name for a in view.attachments] == ["net1"]
            with pytest.raises(grpc.aio.AioRpcError) as nobody:
                await client.AttachNetwork(
                    api.AttachNetworkRequest(namespace="ns", name="z", claim="x", request="r")
                )
            assert nobody.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    finally:
        await server.stop(grace=None)


def test_the_cli_says_when_no_driver_answers(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "cnidra", "node", "pods", "--socket", str(tmp_path / "x.sock")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1
    assert f"no cnidra driver answers on {tmp_path / 'x.sock'}" in out.stderr


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(3000):  # 30 s: a hang's bound
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not {what} within 30 s")


async def served(client: Any) -> None:
    for _ in range(300):
        try:
            await client.ListPodNetworks(api.ListPodNetworksRequest(), timeout=30)
            return
        except grpc.aio.AioRpcError as exc:
            assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, exc
        await asyncio.sleep(0.1)
    raise AssertionError("never served again once the streams were cancelled")


async def test_calls_beyond_the_bound_and_oversized_requests_are_refused(tmp_path: Path) -> None:
    """A runaway client (held follow streams, a flood of calls, a huge request) gets errors,
    never an unbounded share of the driver."""
    node = Node.start(tmp_path)
    socket = tmp_path / "node.sock"
    service = NodeNetworksService(lambda: records(node), node.lifecycle.journal)
    server = await serve(service, socket, max_rpcs=4)
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            client = api_grpc.NodeNetworksStub(channel)
            streams = [client.WatchEvents(api.WatchEventsRequest(follow=True)) for _ in range(4)]
            # once the server holds all four (its journal's watchers, up to 30 s: not a fixed
            # 0.3 s a loaded machine may not open them in, nor a call polled meanwhile, which
            # takes a slot from a stream not yet open), a call is refused
            await until(lambda: len(node.lifecycle.journal.watchers) == 4, "four streams held")
            with pytest.raises(grpc.aio.AioRpcError) as busy:
                await client.ListPodNetworks(api.ListPodNetworksRequest(), timeout=30)
            assert busy.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            for stream in streams:
                stream.cancel()
            await until(lambda: not node.lifecycle.journal.watchers, "the streams gone")
            await served(client)  # served again once they are gone
            with pytest.raises(grpc.aio.AioRpcError) as huge:
                await client.ListPodNetworks(
                    api.ListPodNetworksRequest(namespace="x" * 100_000), timeout=30
                )
            assert huge.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await server.stop(grace=None)
