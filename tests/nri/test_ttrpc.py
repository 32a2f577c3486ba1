"""The hand-written NRI transport: multiplexer framing, ttrpc framing, concurrency, closing.

The containerd side is played by a peer built from the same classes (the roles swapped); the
real containerd is exercised by the end-to-end tests on the test bed."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra._proto.ttrpc import ttrpc_pb2
from cnidra.nri.mux import HEADER, MAX_FRAME_PAYLOAD, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux
from cnidra.nri.plugin import PLUGIN_SERVICE, RUNTIME_SERVICE, NRIPlugin, event_mask
from cnidra.nri.ttrpc import (
    DEADLINE_EXCEEDED,
    TYPE_REQUEST,
    TYPE_RESPONSE,
    UNIMPLEMENTED,
    Client,
    ConnectionClosed,
    Server,
    TTRPCError,
    encode,
    read_message,
)


async def stream_pair() -> tuple[
    tuple[asyncio.StreamReader, asyncio.StreamWriter],
    tuple[asyncio.StreamReader, asyncio.StreamWriter],
]:
    a, b = socket.socketpair()
    return await asyncio.open_connection(sock=a), await asyncio.open_connection(sock=b)


def test_ttrpc_header_is_big_endian_length_stream_type_flags() -> None:
    raw = encode(7, TYPE_RESPONSE, b"abc", flags=4)
    assert raw[:10] == struct.pack(">IIBB", 3, 7, 2, 4) and raw[10:] == b"abc"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.integers(1, 2**31), st.lists(st.integers(1, 50), min_size=1))
def test_messages_survive_any_split_into_frames_and_reads(
    payload: bytes, stream: int, cuts: list[int]
) -> None:
    async def scenario() -> None:
        data = encode(stream, TYPE_REQUEST, payload)
        mux_stream = asyncio.StreamReader()
        i, k = 0, 0
        while i < len(data):  # the message cut into frames of the drawn sizes
            chunk = data[i : i + cuts[k % len(cuts)]]
            frame = HEADER.pack(PLUGIN_SERVICE_CONN, len(chunk)) + chunk
            for j in range(0, len(frame), 3):  # and the frames arrive a few bytes at a time
                mux_stream.feed_data(frame[j : j + 3])
            i, k = i + len(chunk), k + 1
        mux_stream.feed_eof()
        mux = Mux(mux_stream, None)  # type: ignore[arg-type]
        reader = mux.open(PLUGIN_SERVICE_CONN)
        mux.start()
        msg = await read_message(reader)
        assert (msg.stream_id, msg.type, msg.payload) == (stream, TYPE_REQUEST, payload)
        await mux.closed.wait()

    asyncio.run(scenario())


async def test_mux_splits_writes_bigger_than_a_frame() -> None:
    (_, w1), (r2, _) = await stream_pair()
    mux = Mux(asyncio.StreamReader(), w1)
    data = b"x" * (MAX_FRAME_PAYLOAD + 100)
    writing = asyncio.create_task(mux.write(RUNTIME_SERVICE_CONN, data))
    first = HEADER.unpack(await r2.readexactly(8))
    await r2.readexactly(first[1])
    second = HEADER.unpack(await r2.readexactly(8))
    await r2.readexactly(100)
    await writing
    assert first == (RUNTIME_SERVICE_CONN, MAX_FRAME_PAYLOAD) and second == (
        RUNTIME_SERVICE_CONN,
        100,
    )
    w1.close()


@contextlib.asynccontextmanager
async def connected() -> AsyncIterator[tuple[Client, Mux, Mux]]:
    """A client on one end and a server on the other, over a real socket pair and two muxes."""
    (r1, w1), (r2, w2) = await stream_pair()
    client_mux, server_mux = Mux(r1, w1), Mux(r2, w2)
    client_conn = client_mux.open(RUNTIME_SERVICE_CONN)
    server_conn = server_mux.open(RUNTIME_SERVICE_CONN)
    client_mux.start()
    server_mux.start()

    async def slow_echo(payload: bytes) -> bytes:
        await asyncio.sleep(float(payload.decode() or 0))
        return payload

    async def boom(payload: bytes) -> bytes:
        raise ValueError("handler exploded")

    server = Server(
        server_conn,
        lambda d: server_mux.write(RUNTIME_SERVICE_CONN, d),
        {"svc": {"Echo": slow_echo, "Boom": boom}},
    )
    serving = asyncio.create_task(server.serve())
    client = Client(client_conn, lambda d: client_mux.write(RUNTIME_SERVICE_CONN, d))
    client.start()
    try:
        yield client, client_mux, server_mux
    finally:
        serving.cancel()
        await client.close()
        await client_mux.close()
        await server_mux.close()


async def test_several_requests_in_flight_are_answered_by_stream_id() -> None:
    async with connected() as (client, _, _):
        replies = await asyncio.gather(
            client.call("svc", "Echo", b"0.3"),
            client.call("svc", "Echo", b"0.1"),
            client.call("svc", "Echo", b"0.2"),
            client.call("svc", "Echo", b"0"),
        )
        assert replies == [b"0.3", b"0.1", b"0.2", b"0"]


async def test_errors_unknown_methods_and_deadlines() -> None:
    async with connected() as (client, _, _):
        with pytest.raises(TTRPCError, match="handler exploded"):
            await client.call("svc", "Boom", b"")
        with pytest.raises(TTRPCError) as info:
            await client.call("svc", "Nope", b"")
        assert info.value.code == UNIMPLEMENTED
        with pytest.raises(TimeoutError):  # the caller's deadline
            await client.call("svc", "Echo", b"2", deadline=0.2)
        # the server enforces the timeout_nano it receives, too: a raw request whose caller
        # waits longer than the deadline it sent gets DEADLINE_EXCEEDED at 0.1 s, not the echo
        # (of 60 s: a server that ignored the deadline fails wait_for's 30 s, a slow machine
        # does not)
        request = ttrpc_pb2.Request(
            service="svc", method="Echo", payload=b"60", timeout_nano=100_000_000
        )
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[ttrpc_pb2.Response] = loop.create_future()
        client._pending[101] = answer  # the client's own table: the reply is matched by stream
        start = loop.time()
        await client.write(encode(101, TYPE_REQUEST, request.SerializeToString()))
        response = await asyncio.wait_for(answer, 30)
        assert loop.time() - start < 30
        assert response.status.code == DEADLINE_EXCEEDED
        assert response.status.message == "Echo did not finish within 0.1s"
        assert response.payload == b""


async def test_the_peer_closing_fails_pending_calls() -> None:
    async with connected() as (client, _, server_mux):
        pending = asyncio.create_task(client.call("svc", "Echo", b"5"))
        await asyncio.sleep(0.1)
        await server_mux.close()
        with pytest.raises(ConnectionClosed):
            await pending
        with pytest.raises(ConnectionClosed):
            await client.call("svc", "Echo", b"0")


# -------------------------------------------------------------- the NRI plugin against a peer


class Hooks:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.synced = asyncio.Event()

    async def run_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        self.calls.append(("run", pod.name))
        if pod.name == "bad":
            raise RuntimeError("plugin 'macvlan' ADD failed: no such parent")

    async def stop_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        self.calls.append(("stop", pod.name))

    async def remove_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        self.calls.append(("remove", pod.name))

    async def synchronize(self, pods: list[nri.PodSandbox]) -> None:
        self.calls.append(("sync", ",".join(p.name for p in pods)))
        self.synced.set()

    async def create_container(self, pod: nri.PodSandbox) -> None:
        self.calls.append(("create", pod.name))

    def set_request_timeout(self, seconds: float) -> None:
        self.calls.append(("timeout", f"{seconds:g}"))


class RuntimePeer:
    """Plays containerd: accepts the plugin, serves RegisterPlugin, calls the plugin."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.registered: list[nri.RegisterPluginRequest] = []
        self.sessions: asyncio.Queue[tuple[Client, Mux]] = asyncio.Queue()
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._accept, path=str(self.path))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mux = Mux(reader, writer)
        runtime_conn = mux.open(RUNTIME_SERVICE_CONN)
        plugin_conn = mux.open(PLUGIN_SERVICE_CONN)
        mux.start()

        async def register(payload: bytes) -> bytes:
            self.registered.append(nri.RegisterPluginRequest.FromString(payload))
            return nri.Empty().SerializeToString()

        server = Server(
            runtime_conn,
            lambda d: mux.write(RUNTIME_SERVICE_CONN, d),
            {RUNTIME_SERVICE: {"RegisterPlugin": register}},
        )
        task = asyncio.create_task(server.serve())
        client = Client(plugin_conn, lambda d: mux.write(PLUGIN_SERVICE_CONN, d))
        client.start()
        await self.sessions.put((client, mux))
        await mux.closed.wait()
        task.cancel()

    async def close(self) -> None:
        if self.server:
            self.server.close()


def pod(name: str) -> nri.PodSandbox:
    p = nri.PodSandbox(id=f"id-{name}", name=name, uid=f"uid-{name}", namespace="ns")
    p.linux.namespaces.add(type="network", path=f"/run/netns/{name}")
    return p


async def test_plugin_registers_configures_syncs_and_serves_hooks(tmp_path: Path) -> None:
    peer = RuntimePeer(tmp_path / "nri.sock")
    await peer.start()
    hooks = Hooks()
    plugin = NRIPlugin(hooks, str(peer.path), name="cnidra", index="42")
    task = asyncio.create_task(plugin.run())
    try:
        client, mux = await asyncio.wait_for(peer.sessions.get(), 5)
        await asyncio.wait_for(plugin.connected.wait(), 5)
        assert [(r.plugin_name, r.plugin_idx) for r in peer.registered] == [("cnidra", "42")]
        configured = nri.ConfigureResponse.FromString(
            await client.call(
                PLUGIN_SERVICE,
                "Configure",
                nri.ConfigureRequest(
                    runtime_name="containerd", runtime_version="v2", request_timeout=2000
                ).SerializeToString(),
            )
        )
        assert configured.events == event_mask((1, 2, 3, 4)) == 0b1111
        first = nri.SynchronizeResponse.FromString(
            await client.call(
                PLUGIN_SERVICE,
                "Synchronize",
                nri.SynchronizeRequest(pods=[pod("a")], more=True).SerializeToString(),
            )
        )
        assert first.more is True
        await client.call(
            PLUGIN_SERVICE,
            "Synchronize",
            nri.SynchronizeRequest(pods=[pod("b")], more=False).SerializeToString(),
        )
        await asyncio.wait_for(hooks.synced.wait(), 5)
        await client.call(
            PLUGIN_SERVICE,
            "RunPodSandbox",
            nri.RunPodSandboxRequest(pod=pod("good")).SerializeToString(),
        )
        with pytest.raises(TTRPCError, match="no such parent"):
            await client.call(
                PLUGIN_SERVICE,
                "RunPodSandbox",
                nri.RunPodSandboxRequest(pod=pod("bad")).SerializeToString(),
            )
        await client.call(
            PLUGIN_SERVICE,
            "StopPodSandbox",
            nri.StopPodSandboxRequest(pod=pod("good")).SerializeToString(),
        )
        await client.call(
            PLUGIN_SERVICE,
            "RemovePodSandbox",
            nri.RemovePodSandboxRequest(pod=pod("good")).SerializeToString(),
        )
        assert hooks.calls == [
            ("timeout", "2"),
            ("sync", "a,b"),
            ("run", "good"),
            ("run", "bad"),
            ("stop", "good"),
            ("remove", "good"),
        ]

        await mux.close()  # containerd restarts: the plugin must come back
        await asyncio.wait_for(peer.sessions.get(), 10)
        await asyncio.wait_for(plugin.connected.wait(), 5)
        assert plugin.sessions == 2 and len(peer.registered) == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await peer.close()


async def test_plugin_waits_for_a_runtime_that_is_not_there(tmp_path: Path) -> None:
    plugin = NRIPlugin(Hooks(), str(tmp_path / "absent.sock"))
    task = asyncio.create_task(plugin.run())
    for _ in range(1500):  # its first attempt made and failed (30 s: a hang's bound)
        if plugin.last_error is not None:
            break
        await asyncio.sleep(0.02)
    assert not plugin.connected.is_set()
    assert plugin.last_error is not None and "no NRI socket" in plugin.last_error
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_ttrpc_request_envelope_field_numbers() -> None:
    req = ttrpc_pb2.Request(service="s", method="m", payload=b"p", timeout_nano=5)
    assert req.SerializeToString() == b"\n\x01s\x12\x01m\x1a\x01p \x05"
