"""The kubelet-facing services over their unix sockets, as the driver serves them
(cnidra/util/rpc.py on grpclib), called by a client on grpc's core as kubelet's grpc-go is:
both DRA versions and both health services, registration, grpc's health service, the codes
kubelet gets, deadlines, the bound on a request's size, the graceful stop."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from grpclib.health.check import ServiceStatus
from grpclib.health.service import OVERALL, Health
from grpclib.health.v1 import health_pb2

from bench import grpc_stubs
from cnidra._proto.dra.v1 import api_pb2 as dra
from cnidra._proto.drahealth.v1alpha1 import api_pb2 as health
from cnidra._proto.pluginregistration.v1 import api_pb2 as reg
from cnidra.api.refs import ObjectRef
from cnidra.dra.plugin import DRAService, RegistrationService
from cnidra.dra.prepare import PrepareError
from cnidra.inventory.publisher import HealthBoard
from cnidra.util.rpc import Method, RPCServer, service_methods


class Refusing:
    """A preparer that refuses every claim, saying which."""

    node = "node-a"
    checkpoint: tuple[object, ...] = ()

    async def prepare_batch(self, refs: list[ObjectRef]) -> list[PrepareError]:
        return [PrepareError(f"claim {r}: no such network") for r in refs]

    async def unprepare_batch(self, refs: list[ObjectRef]) -> None:
        return None


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[SimpleNamespace]:
    board = HealthBoard()
    board.update({"eth1": None})
    status = ServiceStatus()
    service = DRAService(Refusing(), health=board)  # type: ignore[arg-type]
    dra_server = RPCServer(service.methods(), extra=[Health({OVERALL: [status]})])
    registration = RegistrationService(str(tmp_path / "dra.sock"))
    reg_server = RPCServer(registration.methods())
    await dra_server.start(tmp_path / "dra.sock")
    await reg_server.start(tmp_path / "reg.sock")
    status.set(True)
    async with grpc.aio.insecure_channel(f"unix://{tmp_path / 'dra.sock'}") as channel:
        yield SimpleNamespace(
            channel=channel, status=status, registration=registration, tmp=tmp_path
        )
    await dra_server.stop(None)
    await reg_server.stop(None)


CLAIM = dra.Claim(namespace="ns", name="c", uid="u-1")


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_both_dra_versions_answer_with_each_claims_error(
    served: SimpleNamespace, version: str
) -> None:
    stub = grpc_stubs.DRAPluginStub(served.channel, version)
    reply = await stub.NodePrepareResources(
        dra.NodePrepareResourcesRequest(claims=[CLAIM]), timeout=10
    )
    assert reply.claims["u-1"].error == "claim ns/c: no such network"
    reply = await stub.NodeUnprepareResources(
        dra.NodeUnprepareResourcesRequest(claims=[CLAIM]), timeout=10
    )
    assert reply.claims["u-1"].error == ""


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
async def test_both_health_streams_send_the_devices(served: SimpleNamespace, version: str) -> None:
    stub = grpc_stubs.DRAResourceHealthStub(served.channel, version)
    call = stub.NodeWatchResources(health.NodeWatchResourcesRequest())
    first = await call.read()
    assert [(d.device.pool_name, d.device.device_name) for d in first.devices] == [
        ("node-a", "eth1")
    ]
    call.cancel()


async def test_registration_answers_on_its_socket(served: SimpleNamespace) -> None:
    async with grpc.aio.insecure_channel(f"unix://{served.tmp / 'reg.sock'}") as channel:
        stub = grpc_stubs.RegistrationStub(channel)
        info = await stub.GetInfo(reg.InfoRequest(), timeout=10)
        assert (info.type, info.endpoint) == ("DRAPlugin", str(served.tmp / "dra.sock"))
        await stub.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=True), timeout=10
        )
    assert served.registration.registered.is_set()


async def test_grpc_health_says_serving_then_not(served: SimpleNamespace) -> None:
    check = served.channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    reply = await check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    served.status.set(False)  # the driver's stop
    reply = await check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert unknown.value.code() is grpc.StatusCode.NOT_FOUND


async def test_an_unknown_method_is_unimplemented(served: SimpleNamespace) -> None:
    call = served.channel.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/Nope")
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await call(b"", timeout=10)
    assert missing.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_a_request_over_4_mib_is_refused(served: SimpleNamespace) -> None:
    stub = grpc_stubs.DRAPluginStub(served.channel)
    huge = dra.Claim(namespace="ns", name="x" * (5 * 1024 * 1024), uid="u-2")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[huge]), timeout=30)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    # and the connection serves on
    await stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[CLAIM]), timeout=10)


def slow_server(seconds: float, log: list[str], started: asyncio.Event | None = None) -> RPCServer:
    async def slow(request: Any, context: Any) -> dra.NodePrepareResourcesResponse:
        log.append("started")
        if started is not None:
            started.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            log.append("cancelled")
            raise
        log.append("done")
        return dra.NodePrepareResourcesResponse()

    async def crash(request: Any, context: Any) -> dra.NodePrepareResourcesResponse:
        raise RuntimeError("boom")

    return RPCServer(
        service_methods(
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
            {
                "NodePrepareResources": Method(
                    slow, dra.NodePrepareResourcesRequest, dra.NodePrepareResourcesResponse
                ),
                "NodeUnprepareResources": Method(
                    crash, dra.NodeUnprepareResourcesRequest, dra.NodeUnprepareResourcesResponse
                ),
            },
        )
    )


async def test_a_call_past_its_deadline_is_cancelled_and_a_crash_is_unknown(
    tmp_path: Path,
) -> None:
    log: list[str] = []
    server = slow_server(30, log)
    await server.start(tmp_path / "s.sock")
    try:
        async with grpc.aio.insecure_channel(f"unix://{tmp_path / 's.sock'}") as channel:
            stub = grpc_stubs.DRAPluginStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as late:
                await stub.NodePrepareResources(dra.NodePrepareResourcesRequest(), timeout=0.3)
            assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            for _ in range(100):
                if "cancelled" in log:
                    break
                await asyncio.sleep(0.05)
            assert log == ["started", "cancelled"]
            with pytest.raises(grpc.aio.AioRpcError) as crashed:
                await stub.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(), timeout=10)
            assert crashed.value.code() is grpc.StatusCode.UNKNOWN
    finally:
        await server.stop(None)


async def test_a_graceful_stop_ends_the_calls_in_flight_refuses_new_ones_and_removes_the_socket(
    tmp_path: Path,
) -> None:
    log: list[str] = []
    socket = tmp_path / "s.sock"
    started = asyncio.Event()
    server = slow_server(0.5, log, started)
    await server.start(socket)
    assert stat.S_ISSOCK(socket.stat().st_mode)
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = grpc_stubs.DRAPluginStub(channel)
        in_flight = asyncio.ensure_future(
            stub.NodePrepareResources(dra.NodePrepareResourcesRequest(), timeout=30)
        )
        await asyncio.wait_for(started.wait(), 30)
        stopping = asyncio.ensure_future(server.stop(grace=10))
        await asyncio.sleep(0.05)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.NodePrepareResources(dra.NodePrepareResourcesRequest(), timeout=10)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        await in_flight  # answered, not cancelled
        await stopping
    assert log == ["started", "done"]
    assert not socket.exists()


async def test_a_stop_leaves_a_socket_another_server_has_taken(tmp_path: Path) -> None:
    socket = tmp_path / "s.sock"
    first = slow_server(0, [])
    await first.start(socket)
    second = slow_server(0, [])
    await second.start(socket)  # asyncio removes the stale socket, as the driver's start does
    await first.stop(None)
    assert socket.exists()
    await second.stop(None)
    assert not socket.exists()
