"""grpcio clients of the services cnidra serves through grpclib: kubelet's stand-in (a client on
grpc's core, as kubelet's grpc-go is) for the benchmarks and tests, built from the protobuf
message types (cnidra generates no gRPC code: cnidra/util/rpc.py)."""

from __future__ import annotations

from typing import Any

from cnidra._proto.dra.v1 import api_pb2 as dra
from cnidra._proto.drahealth.v1alpha1 import api_pb2 as health
from cnidra._proto.node.v1alpha1 import api_pb2 as node
from cnidra._proto.pluginregistration.v1 import api_pb2 as reg


class Stub:
    """One attribute per method: grpc's multi-callables, as generated stubs have."""

    def __init__(
        self, channel: Any, service: str, methods: dict[str, tuple[Any, Any, bool]]
    ) -> None:
        for name, (request, reply, stream) in methods.items():
            make = channel.unary_stream if stream else channel.unary_unary
            call = make(
                f"/{service}/{name}",
                request_serializer=request.SerializeToString,
                response_deserializer=reply.FromString,
            )
            setattr(self, name, call)

    def __getattr__(self, name: str) -> Any:  # for type checkers: the methods are set above
        raise AttributeError(name)


def DRAPluginStub(channel: Any, version: str = "v1") -> Any:
    return Stub(
        channel,
        f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin",
        {
            "NodePrepareResources": (
                dra.NodePrepareResourcesRequest,
                dra.NodePrepareResourcesResponse,
                False,
            ),
            "NodeUnprepareResources": (
                dra.NodeUnprepareResourcesRequest,
                dra.NodeUnprepareResourcesResponse,
                False,
            ),
        },
    )


def DRAResourceHealthStub(channel: Any, version: str = "v1alpha1") -> Any:
    return Stub(
        channel,
        f"{version}.DRAResourceHealth",
        {
            "NodeWatchResources": (
                health.NodeWatchResourcesRequest,
                health.NodeWatchResourcesResponse,
                True,
            )
        },
    )


def RegistrationStub(channel: Any) -> Any:
    return Stub(
        channel,
        "pluginregistration.Registration",
        {
            "GetInfo": (reg.InfoRequest, reg.PluginInfo, False),
            "NotifyRegistrationStatus": (
                reg.RegistrationStatus,
                reg.RegistrationStatusResponse,
                False,
            ),
        },
    )


def NodeNetworksStub(channel: Any) -> Any:
    return Stub(
        channel,
        "cnidra.node.v1alpha1.NodeNetworks",
        {
            "ListPodNetworks": (node.ListPodNetworksRequest, node.ListPodNetworksResponse, False),
            "QueryPodNetwork": (node.QueryPodNetworkRequest, node.PodNetwork, False),
            "WatchEvents": (node.WatchEventsRequest, node.Event, True),
            "AttachNetwork": (node.AttachNetworkRequest, node.PodNetwork, False),
            "DetachNetwork": (node.DetachNetworkRequest, node.PodNetwork, False),
        },
    )
