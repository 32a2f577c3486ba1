"""The node API's gRPC service on a root-only unix socket: reads from the driver's records in
memory (what is on disk, loaded at start), never the apiserver; the journal's stream."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from cnidra._proto.node.v1alpha1 import api_pb2 as api
from cnidra._proto.node.v1alpha1 import api_pb2_grpc as api_grpc
from cnidra.nodeapi.views import NodeRecords, event_of, find_pod, pod_networks
from cnidra.state.journal import Entry, Journal

log = logging.getLogger(__name__)


class NodeNetworksService(api_grpc.NodeNetworksServicer):
    def __init__(self, records: Callable[[], NodeRecords], journal: Journal) -> None:
        self.records = records
        self.journal = journal

    async def ListPodNetworks(
        self, request: api.ListPodNetworksRequest, context: Any
    ) -> api.ListPodNetworksResponse:
        return api.ListPodNetworksResponse(pods=pod_networks(self.records(), request.namespace))

    async def QueryPodNetwork(
        self, request: api.QueryPodNetworkRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api.PodNetwork:
        if not request.uid and not (request.namespace and request.name):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "give the pod's namespace and name, or its uid"
            )
        found = find_pod(self.records(), request.namespace, request.name, request.uid)
        if found is None:
            who = request.uid or f"{request.namespace}/{request.name}"
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"pod {who} has no cnidra claim prepared and no interfaces on this node",
            )
        assert found is not None
        return found

    async def WatchEvents(
        self, request: api.WatchEventsRequest, context: Any
    ) -> AsyncIterator[api.Event]:
        def wanted(entry: Entry) -> bool:
            return (not request.namespace or entry.pod_namespace == request.namespace) and (
                not request.name or entry.pod_name == request.name
            )

        with self.journal.watch() as queue:  # subscribed before the backlog: nothing missed
            last = request.after_seq
            for entry in list(self.journal.since(last)):
                last = entry.seq
                if wanted(entry):
                    yield event_of(entry)
            while request.follow:
                entry = await queue.get()
                if entry.seq > last and wanted(entry):
                    last = entry.seq
                    yield event_of(entry)


async def serve(service: NodeNetworksService, socket: Path) -> grpc.aio.Server:
    """Listen on `socket`, readable and writable by root only."""
    _clear(socket)
    server = grpc.aio.server()
    api_grpc.add_NodeNetworksServicer_to_server(service, server)
    server.add_insecure_port(f"unix://{socket}")
    old = os.umask(0o077)  # no moment at which others could connect
    try:
        await server.start()
    finally:
        os.umask(old)
    os.chmod(socket, 0o600)
    log.info("node API on %s", socket)
    return server


def _clear(socket: Path) -> None:
    socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
