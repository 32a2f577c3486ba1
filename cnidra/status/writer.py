"""Writes what the pods' attachments did into the apiserver, off the NRI hook's path.

Producers only record the desired state (never block, never fail); one worker applies it and
retries with backoff, so a down apiserver delays status, never a pod. The writing is done by
small writers, each its own state, on one keyed work queue (cnidra.util.workqueue: each key due
once, retried on its own backoff, one wait for all):
- ResourceClaim `status.devices` entries of ours and the detach finalizer, a key per claim
  (`claimstatus.py`),
- Events on pods, claims and the Node, one key for the queue of Events in order (`events.py`),
- the pod's `k8s.v1.cni.cncf.io/network-status` annotation (Multus' format), a key per pod
  (`podnetworks.py`).

One claim's or one pod's failure never holds up the others: each has its own backoff, a write
the apiserver refuses for good (403, 404, 422, a UID precondition) is dropped with a warning
and counted, every apiserver call has a timeout, the Event queue is bounded (the oldest goes
first) and an Event gets a few attempts. What each pod costs the apiserver: docs/performance.md
and the small writers' own notes."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, Protocol

from cnidra.api.refs import ObjectRef
from cnidra.kube.api import Api, AsyncClient
from cnidra.kube.events import EventRecorder, Involved
from cnidra.status.claimstatus import ClaimStatusWriter
from cnidra.status.devices import (
    NETWORK_STATUS_ANNOTATION,
    Condition,
    DeviceKey,
    DeviceStatus,
    NetworkStatus,
)
from cnidra.status.events import EventWriter
from cnidra.status.podnetworks import PodNetworksWriter, SeenAnnotations
from cnidra.util.aio import wait_set
from cnidra.util.backoff import Backoff
from cnidra.util.workqueue import Lane, WorkQueue

# the names callers take from here
__all__ = [
    "NETWORK_STATUS_ANNOTATION",
    "REQUEST_TIMEOUT",
    "SeenAnnotations",
    "StatusSink",
    "StatusWriter",
]

REQUEST_TIMEOUT = 10.0  # one apiserver call of the writer


class StatusSink(Protocol):
    """What the pod lifecycle reports, without waiting: implemented by StatusWriter."""

    def put(self, claim: ObjectRef, status: DeviceStatus) -> None: ...
    def drop(self, claim: ObjectRef, keys: list[DeviceKey], *, later: bool = False) -> None: ...
    def finalizer(self, claim: ObjectRef, present: bool) -> None: ...
    def released(self, claim: ObjectRef, generated: bool) -> None: ...
    def event(
        self,
        pod: ObjectRef,
        reason: str,
        message: str,
        type_: str = "Warning",
        *,
        detail: bool = False,
    ) -> None: ...
    def pod_networks(
        self,
        pod: ObjectRef,
        statuses: Sequence[NetworkStatus],
        seen: SeenAnnotations | None = None,
    ) -> None: ...
    def pod_gone(self, pod: ObjectRef) -> None: ...


class SmallWriter(Protocol):
    """A writer of another room on the one queue (cnidra.status.netpolicy.PolicyStatusWriter)."""

    def pending(self) -> int: ...
    async def write_due(self) -> None: ...


class StatusWriter:
    def __init__(
        self,
        client: AsyncClient | None,
        component: str = "cnidra",
        releases: Path | None = None,
        *,
        normal_events: str = "added",
        node: str = "",
    ) -> None:
        """`releases`: a directory where a finalizer removal waits on disk until the apiserver
        took it, so a restart (rolling upgrade, crash) never leaves a claim held whose
        interfaces are all gone. `normal_events`: which Normal Events are written
        (cnidra.status.events; each Event is one request). `node`: the node the Events come
        from (their source host and reporting instance, as kubelet's)."""
        self.client = client
        self.api = Api(client, REQUEST_TIMEOUT) if client is not None else None
        self.component = component
        self.node = node
        self.recorder = EventRecorder(component, node)
        self.releases = releases
        self.normal_events = normal_events
        # the one queue: each claim, each pod and the Events a key of it
        self.queue: WorkQueue[tuple[str, Hashable]] = WorkQueue(lambda: Backoff(0.5, 30.0))
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self.claims = ClaimStatusWriter(
            self.api, Lane(self.queue, "claim"), self._wake.set, releases
        )
        self.events = EventWriter(
            self.api,
            self.recorder,
            Lane(self.queue, "events"),
            self._wake.set,
            normal_events=normal_events,
        )
        self.pods = PodNetworksWriter(
            self.api, Lane(self.queue, "pod"), self._wake.set, REQUEST_TIMEOUT
        )
        self.joined: list[SmallWriter] = []  # writers of other rooms on this queue (`join`)

    def lane(self, name: str) -> Lane[Any]:
        """A share of the one queue for a writer of another room (network policy's reports),
        which `join` then hands to the worker."""
        return Lane(self.queue, name)

    def wake(self) -> None:
        self._wake.set()

    def join(self, writer: SmallWriter) -> None:
        """`writer`'s due work done by this worker, on its lane of the one queue."""
        self.joined.append(writer)

    # -- producers: cheap, synchronous, never touch the network

    def put(self, claim: ObjectRef, status: DeviceStatus) -> None:
        self.claims.put(claim, status)

    def device_condition(
        self, claim: ObjectRef, key: DeviceKey, type_: str, condition: Condition | None
    ) -> None:
        self.claims.device_condition(claim, key, type_, condition)

    def drop(self, claim: ObjectRef, keys: list[DeviceKey], *, later: bool = False) -> None:
        self.claims.drop(claim, keys, later=later)

    def finalizer(self, claim: ObjectRef, present: bool) -> None:
        self.claims.finalizer(claim, present)

    def released(self, claim: ObjectRef, generated: bool) -> None:
        self.claims.released(claim, generated)

    def restore_releases(self, held: set[ObjectRef]) -> int:
        return self.claims.restore_releases(held)

    def event(
        self,
        pod: ObjectRef,
        reason: str,
        message: str,
        type_: str = "Warning",
        *,
        detail: bool = False,
    ) -> None:
        self.events.event(pod, reason, message, type_, detail=detail)

    def claim_event(self, claim: ObjectRef, reason: str, message: str) -> None:
        self.events.claim_event(claim, reason, message)

    def object_event(
        self, about: Involved, reason: str, message: str, type_: str = "Warning", name: str = ""
    ) -> None:
        self.events.object_event(about, reason, message, type_, name)

    def node_event(self, node: str, reason: str, message: str, type_: str = "Normal") -> None:
        self.events.node_event(node, reason, message, type_)

    def pod_networks(
        self,
        pod: ObjectRef,
        statuses: Sequence[NetworkStatus],
        seen: SeenAnnotations | None = None,
    ) -> None:
        self.pods.pod_networks(pod, statuses, seen)

    def pod_gone(self, pod: ObjectRef) -> None:
        self.pods.pod_gone(pod)

    def pending(self) -> int:
        mine = self.claims.pending() + self.events.pending() + self.pods.pending()
        return mine + sum(w.pending() for w in self.joined)

    async def flushed(self) -> None:
        """Return once everything queued is written, removals waiting out DROP_GRACE included
        (the worker must be running); the caller bounds the wait."""
        self.claims.lane.hurry()
        self._wake.set()
        while self.pending():
            self._drained.clear()
            await self._drained.wait()

    # -- the worker

    async def run(self) -> None:
        while True:
            await self.claims.write_due()
            await self.events.write_due()
            await self.pods.write_due()
            for writer in self.joined:
                await writer.write_due()
            if not self.pending():
                self._drained.set()
            wait = self.queue.wait()
            timeout = None if wait is None else max(0.05, wait)
            self._wake.clear()
            await wait_set(self._wake, timeout)
