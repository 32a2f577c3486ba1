"""Events on pods, claims and the Node, written in the order they happened by one key of the
status writer's queue: one the apiserver refuses for good is dropped, one that fails otherwise
is tried again later (at most EVENT_ATTEMPTS times), and the rest wait for the key's backoff
rather than hammering an apiserver that is down. The queue of Events is bounded (the oldest
gives way); each Event carries the time it happened, not the time a retry got it through."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from cnidra.api.refs import ObjectRef
from cnidra.kube.api import Api, Conflict, RefusedForGood
from cnidra.kube.events import EventRecord, EventRecorder, Involved
from cnidra.observe import metrics
from cnidra.util.workqueue import Lane

log = logging.getLogger(__name__)

MAX_EVENTS = 1000  # queued Events; beyond, the oldest is dropped
EVENT_ATTEMPTS = 5
QUEUED = "queued"  # the one key of the Events' lane: the queue of Events in order


def involved(ref: ObjectRef, kind: str) -> Involved:
    return Involved(kind, ref.name, ref.namespace, ref.uid)


NORMAL_EVENTS = ("added", "all", "none")


class EventWriter:
    """`normal_events`: which Normal Events are written (each is one request): "added", those
    that say what a pod got (AddedInterface, as Multus writes), not the `detail` ones (a claim
    prepared, an interface removed); "all"; "none", only Warnings."""

    def __init__(
        self,
        api: Api | None,
        recorder: EventRecorder,
        lane: Lane[str],
        wake: Callable[[], None],
        *,
        normal_events: str = "added",
    ) -> None:
        if normal_events not in NORMAL_EVENTS:
            raise ValueError(f"normal_events: {normal_events!r}: one of {', '.join(NORMAL_EVENTS)}")
        self.api = api
        self.recorder = recorder
        self.lane = lane
        self.wake = wake
        self.normal_events = normal_events
        self.queue: deque[EventRecord] = deque(maxlen=MAX_EVENTS)

    def _written(self, type_: str, detail: bool) -> bool:
        if type_ != "Normal":
            return True
        return self.normal_events == "all" or (self.normal_events == "added" and not detail)

    def event(
        self,
        pod: ObjectRef,
        reason: str,
        message: str,
        type_: str = "Warning",
        *,
        detail: bool = False,
    ) -> None:
        if self._written(type_, detail):
            self._queue(EventRecord(involved(pod, "Pod"), reason, message, type_))

    def claim_event(self, claim: ObjectRef, reason: str, message: str) -> None:
        """A Normal Event on a ResourceClaim, a detail (same queue, bounds and retries as
        pods')."""
        if self._written("Normal", True):
            self._queue(EventRecord(involved(claim, "ResourceClaim"), reason, message, "Normal"))

    def object_event(
        self, about: Involved, reason: str, message: str, type_: str = "Warning", name: str = ""
    ) -> None:
        """An Event on any object (a network policy: cnidra.status.netpolicy). `name`: one every
        node reporting the same thing gives it, so the cluster has one Event however many
        nodes report (an Event of that name already there is taken as written)."""
        if self._written(type_, False):
            self._queue(EventRecord(about, reason, message, type_, name=name))

    def node_event(self, node: str, reason: str, message: str, type_: str = "Normal") -> None:
        """An Event on the Node object (what `kubectl describe node` shows)."""
        self._queue(EventRecord(Involved("Node", node), reason, message, type_))

    def _queue(self, event: EventRecord) -> None:
        if len(self.queue) == self.queue.maxlen:
            metrics.POD_WRITES.labels("event", "dropped").inc()  # the oldest gives way
        self.queue.append(event)
        if QUEUED not in self.lane:  # one waiting out its backoff is not hurried
            self.lane.add(QUEUED)
        self.wake()

    def pending(self) -> int:
        return len(self.queue)

    async def write_due(self) -> None:
        """The queued Events in order, when their key is due."""
        if QUEUED in self.lane.due():
            await self._send()

    async def _send(self) -> None:
        if self.api is None:
            self.queue.clear()
            self.lane.done(QUEUED)
            return
        while self.queue:
            item = self.queue[0]
            try:
                await self.recorder.send(self.api, item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if item.name and isinstance(exc, Conflict):  # written by another node
                    log.debug("event %s exists already: %s", item.name, exc)
                    metrics.POD_WRITES.labels("event", "exists").inc()
                    self.lane.forget(QUEUED)
                    self.queue.popleft()
                    continue
                item.attempts += 1
                if isinstance(exc, RefusedForGood) or item.attempts >= EVENT_ATTEMPTS:
                    log.warning(
                        "event %s for pod %s/%s dropped after %d attempt(s): %s",
                        item.reason, item.about.namespace, item.about.name, item.attempts, exc,
                    )  # fmt: skip
                    metrics.POD_WRITES.labels("event", "refused").inc()
                    self.queue.popleft()
                    continue
                metrics.POD_WRITES.labels("event", "error").inc()
                self.lane.retry(QUEUED)
                log.warning(
                    "event for pod %s/%s not written (%s); retried",
                    item.about.namespace, item.about.name, exc,
                )  # fmt: skip
                return
            metrics.POD_WRITES.labels("event", "ok").inc()
            self.lane.forget(QUEUED)
            self.queue.popleft()
        self.lane.done(QUEUED)
