"""The node API's gRPC service on a root-only unix socket: reads from the driver's records in
memory (what is on disk, loaded at start), never the apiserver; the journal's stream."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from cnidra._proto.node.v1alpha1 import api_pb2 as api
from cnidra.datapath import shaping
from cnidra.nodeapi.client import SERVICE
from cnidra.nodeapi.views import (
    NodeRecords,
    add_enforced,
    event_of,
    find_pod,
    pod_networks,
    shaped_names,
)
from cnidra.state.journal import Entry, Journal
from cnidra.util.rpc import Context, Method, Methods, RPCServer, Status, service_methods

log = logging.getLogger(__name__)
# the socket is root's alone, but a stuck or runaway client must not take the driver with it:
# calls beyond the bound get RESOURCE_EXHAUSTED, requests are small (64 KiB), a peer that stops
# answering pings while a call is open is dropped (grpclib has no idle-connection timeout, which
# grpcio's server had at 5 minutes: a connection without calls stays until its client closes it)
MAX_CONCURRENT_RPCS = 64
MAX_RECEIVE = 64 * 1024
# a connection with a call open is pinged after 60 s without data (then, as grpc's core does,
# at most every 5 minutes), and closed when no answer comes within 20 s
KEEPALIVE = (60.0, 20.0)


# how long a query waits for the rate limits of a pod's interfaces (read in the pod's namespace)
LIMITS_TIMEOUT = 2.0
# (namespace path, interface names, timeout) -> what each holds (shaping.read_many)
LimitReader = Callable[[str, Sequence[str], float], Mapping[str, shaping.Shaping]]


class Plugger(Protocol):
    """Hot-plug on the pod lifecycle (the agent wires in the NRI side's); a refusal the
    caller can act on raises one of the service's `refusals`, with why."""

    async def plug(self, sandbox_id: str, claim: str, request: str) -> object: ...
    async def unplug(self, sandbox_id: str, claim: str, request: str) -> None: ...


class NodeNetworksService:
    def __init__(
        self,
        records: Callable[[], NodeRecords],
        journal: Journal,
        plugger: Plugger | None = None,
        refusals: tuple[type[Exception], ...] = (),
        limits: LimitReader | None = None,
        policy: Callable[[str, str], Mapping[str, Any]] | None = None,
        policy_counters: Callable[[str, str, float], Sequence[Any]] | None = None,
    ) -> None:
        """`limits`: reads the rate limits a pod's interfaces hold (shaping.read_many, run in
        a thread), shown with the pod's networks when one pod is queried; None: not read."""
        self.records = records
        self.limits = limits
        # network policy: what applies to a pod's interfaces (the enforcer's memory, read on
        # the loop), and a table's counters (read in a thread: nft in the pod's namespace)
        self.policy = policy
        self.policy_counters = policy_counters
        self.journal = journal
        self.plugger = plugger
        self.refusals = refusals  # a plug refused for a reason the caller can act on

    async def ListPodNetworks(
        self, request: api.ListPodNetworksRequest, context: Any
    ) -> api.ListPodNetworksResponse:
        return api.ListPodNetworksResponse(pods=pod_networks(self.records(), request.namespace))

    async def QueryPodNetwork(
        self, request: api.QueryPodNetworkRequest, context: Context
    ) -> api.PodNetwork:
        if not request.uid and not (request.namespace and request.name):
            await context.abort(
                Status.INVALID_ARGUMENT, "give the pod's namespace and name, or its uid"
            )
        found = find_pod(self.records(), request.namespace, request.name, request.uid)
        if found is None:
            who = request.uid or f"{request.namespace}/{request.name}"
            await context.abort(
                Status.NOT_FOUND,
                f"pod {who} has no cnidra claim prepared and no interfaces on this node",
            )
        assert found is not None
        await self._read_limits(found)
        await self._read_policy(found)
        return found

    async def _read_policy(self, view: api.PodNetwork) -> None:
        """The policies that apply to each interface and the table's rule counters, read off
        the loop and bounded (a read that fails is reported in the view)."""
        if self.policy is None:
            return
        described = self.policy(view.pod.namespace, view.pod.name)
        view.policy_undoable_by.extend(described.get("undoableBy") or [])
        for att in view.attachments:
            entry = described.get(att.if_name)
            if not isinstance(entry, Mapping):
                continue
            att.policy.network = str(entry.get("network", ""))
            att.policy.policies.extend(entry.get("policies") or [])
            att.policy.not_enforced = str(entry.get("notEnforced", ""))
            att.policy.host_interface = str(entry.get("hostInterface", ""))
            table = entry.get("table")
            netns = str(entry.get("netns") or view.netns)  # the host's, for a host-side table
            if not table or self.policy_counters is None or not netns:
                continue
            try:
                counted = await asyncio.wait_for(
                    asyncio.to_thread(self.policy_counters, netns, table, LIMITS_TIMEOUT),
                    LIMITS_TIMEOUT + 1.0,
                )
            except TimeoutError:
                att.policy.error = f"counters not read within {LIMITS_TIMEOUT:g}s"
                continue
            except Exception as exc:
                att.policy.error = f"counters could not be read: {exc}"
                continue
            for c in counted:
                att.policy.rules.add(
                    chain=c.chain,
                    comment=c.comment,
                    verdict=c.verdict,
                    packets=c.packets,
                    bytes=c.bytes,
                )

    async def _read_limits(self, view: api.PodNetwork) -> None:
        """What the pod's shaped interfaces hold now, read off the event loop and bounded:
        a read that fails or takes too long is reported in the view, never fails the query."""
        names = shaped_names(view)
        if self.limits is None or not names:
            return
        try:
            found = await asyncio.wait_for(
                asyncio.to_thread(self.limits, view.netns, names, LIMITS_TIMEOUT),
                LIMITS_TIMEOUT + 1.0,
            )
        except shaping.ShapingError as exc:
            add_enforced(view, None, f"could not be read: {exc}")
        except TimeoutError:
            add_enforced(view, None, f"could not be read within {LIMITS_TIMEOUT:g}s")
        else:
            add_enforced(view, found)

    async def AttachNetwork(
        self, request: api.AttachNetworkRequest, context: Context
    ) -> api.PodNetwork:
        return await self._hotplug(request, context, attach=True)

    async def DetachNetwork(
        self, request: api.DetachNetworkRequest, context: Context
    ) -> api.PodNetwork:
        return await self._hotplug(request, context, attach=False)

    async def _hotplug(
        self,
        request: api.AttachNetworkRequest | api.DetachNetworkRequest,
        context: Context,
        attach: bool,
    ) -> api.PodNetwork:
        if self.plugger is None:
            await context.abort(Status.UNIMPLEMENTED, "hot-plug is not served here")
        if not (request.namespace and request.name and request.claim and request.request):
            await context.abort(
                Status.INVALID_ARGUMENT,
                "give the pod's namespace and name, a claim, a request",
            )
        view = find_pod(self.records(), request.namespace, request.name, "")
        if view is None or view.state != "attached":
            await context.abort(
                Status.FAILED_PRECONDITION,
                f"pod {request.namespace}/{request.name} has no running sandbox cnidra attached",
            )
        assert view is not None and self.plugger is not None
        try:
            if attach:
                await self.plugger.plug(view.sandbox_id, request.claim, request.request)
            else:
                await self.plugger.unplug(view.sandbox_id, request.claim, request.request)
        except self.refusals as exc:
            await context.abort(Status.FAILED_PRECONDITION, str(exc))
        found = find_pod(self.records(), request.namespace, request.name, "")
        assert found is not None
        await self._read_limits(found)
        return found

    def methods(self) -> Methods:
        return service_methods(
            SERVICE,
            {
                "ListPodNetworks": Method(
                    self.ListPodNetworks, api.ListPodNetworksRequest, api.ListPodNetworksResponse
                ),
                "QueryPodNetwork": Method(
                    self.QueryPodNetwork, api.QueryPodNetworkRequest, api.PodNetwork
                ),
                "WatchEvents": Method(
                    self.WatchEvents, api.WatchEventsRequest, api.Event, stream=True
                ),
                "AttachNetwork": Method(
                    self.AttachNetwork, api.AttachNetworkRequest, api.PodNetwork
                ),
                "DetachNetwork": Method(
                    self.DetachNetwork, api.DetachNetworkRequest, api.PodNetwork
                ),
            },
        )

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


async def serve(
    service: NodeNetworksService, socket: Path, *, max_rpcs: int = MAX_CONCURRENT_RPCS
) -> RPCServer:
    """Listen on `socket`, readable and writable by root only, with bounded calls."""
    _clear(socket)
    server = RPCServer(
        service.methods(), max_rpcs=max_rpcs, max_receive=MAX_RECEIVE, keepalive=KEEPALIVE
    )
    old = os.umask(0o077)  # no moment at which others could connect
    try:
        await server.start(socket)
    finally:
        os.umask(old)
    os.chmod(socket, 0o600)
    log.info("node API on %s", socket)
    return server


def _clear(socket: Path) -> None:
    socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
