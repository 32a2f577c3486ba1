"""Writes what the pods' attachments did into the apiserver, off the NRI hook's path.

Producers only record the desired state (never block, never fail); one worker applies it with
server-side apply and retries with backoff, so a down apiserver delays status, never a pod:
- ResourceClaim `status.devices` entries of ours (field manager `cnidra`),
- a finalizer on claims whose interfaces could not be removed yet,
- Events on pods for failed attaches and detaches,
- the pod's `k8s.v1.cni.cncf.io/network-status` annotation (Multus' format), for readers of
  it: cnidra's entries replace its earlier ones, every other writer's entry stays.

One claim's or one pod's failure never holds up the others: each has its own backoff, a write
the apiserver refuses for good (403, 404, 422, a UID precondition) is dropped with a warning
and counted, every apiserver call has a timeout, the Event queue is bounded (the oldest goes
first) and an Event gets a few attempts. The pod's annotation is tenant input: read with a
size and depth bound, and anything but a list of objects is replaced."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus
from lightkube.types import PatchType

from cnidra.api.constants import DRIVER_NAME
from cnidra.api.loading import LoadError, load_json
from cnidra.api.refs import ObjectRef
from cnidra.observe import metrics
from cnidra.status.devices import NETWORK_STATUS_ANNOTATION
from cnidra.util.backoff import Backoff
from cnidra.util.files import write_atomically

log = logging.getLogger(__name__)

STATUS_MANAGER = "cnidra"
FINALIZER_MANAGER = "cnidra-detach"
FINALIZER = f"{DRIVER_NAME}/interfaces"
REQUEST_TIMEOUT = 10.0  # one apiserver call of the writer
MAX_EVENTS = 1000  # queued Events; beyond, the oldest is dropped
EVENT_ATTEMPTS = 5
ANNOTATION_MAX_BYTES = 256 * 1024  # a network-status annotation larger is not read


def refused_for_good(exc: BaseException) -> bool:
    """An apiserver answer that no retry changes: forbidden (a policy, a terminating namespace),
    not found, invalid, or a UID precondition of an object deleted and made again."""
    if not isinstance(exc, ApiError):
        return False
    code = exc.status.code or 0
    if code == 409:
        return "uid" in (exc.status.message or "").lower()
    return code in (400, 403, 404, 405, 410, 413, 415, 422)


@dataclass
class _Event:
    pod: ObjectRef  # the object the Event is about: a Pod, or a claim (kind)
    reason: str
    message: str
    type: str
    attempts: int = 0
    kind: str = "Pod"


DeviceKey = tuple[str, str, str, str]  # driver, pool, device, shareID


class StatusSink(Protocol):
    """What the pod lifecycle reports, without waiting: implemented by StatusWriter."""

    def put(self, claim: ObjectRef, entry: dict[str, Any]) -> None: ...
    def drop(self, claim: ObjectRef, keys: list[DeviceKey]) -> None: ...
    def finalizer(self, claim: ObjectRef, present: bool) -> None: ...
    def event(self, pod: ObjectRef, reason: str, message: str, type_: str = "Warning") -> None: ...
    def pod_networks(self, pod: ObjectRef, statuses: list[dict[str, Any]]) -> None: ...
    def pod_gone(self, pod: ObjectRef) -> None: ...


def entry_key(entry: Mapping[str, Any]) -> DeviceKey:
    return (entry["driver"], entry["pool"], entry["device"], entry.get("shareID") or "")


class StatusWriter:
    def __init__(
        self,
        client: AsyncClient | None,
        component: str = "cnidra",
        releases: Path | None = None,
    ) -> None:
        """`releases`: a directory where a finalizer removal waits on disk until the apiserver
        took it, so a restart (rolling upgrade, crash) never leaves a claim held whose
        interfaces are all gone."""
        self.client = client
        self.component = component
        self.releases = releases
        self._devices: dict[ObjectRef, dict[DeviceKey, dict[str, Any]]] = {}
        self._finalizer: dict[ObjectRef, bool] = {}
        self._events: deque[_Event] = deque(maxlen=MAX_EVENTS)
        self._events_backoff = Backoff(0.5, 30.0)
        self._events_due = 0.0
        # pod -> its cnidra interfaces as network-status entries, waiting to be written
        self._pod_networks: dict[ObjectRef, list[dict[str, Any]]] = {}
        self._written_interfaces: dict[ObjectRef, set[str]] = {}
        self._pods_backoff: dict[ObjectRef, Backoff] = {}
        self._pods_due: dict[ObjectRef, float] = {}
        self._dirty: dict[ObjectRef, float] = {}
        self._queued_at: dict[ObjectRef, float] = {}  # the oldest change not yet written
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()

    # -- producers: cheap, synchronous, never touch the network

    def put(self, claim: ObjectRef, entry: dict[str, Any]) -> None:
        self._devices.setdefault(claim, {})[entry_key(entry)] = entry
        self._mark(claim)

    def drop(self, claim: ObjectRef, keys: list[DeviceKey]) -> None:
        devices = self._devices.get(claim, {})
        for key in keys:
            devices.pop(key, None)
        self._mark(claim)

    def finalizer(self, claim: ObjectRef, present: bool) -> None:
        if self._finalizer.get(claim) != present:
            self._finalizer[claim] = present
            self._remember_release(claim, not present)
            self._mark(claim)

    def restore_releases(self, held: set[ObjectRef]) -> int:
        """After a restart: queue again the finalizer removals the last process did not get
        to write, except for claims whose interfaces are set up again (`held`)."""
        if self.releases is None or not self.releases.is_dir():
            return 0
        count = 0
        for path in self.releases.glob("*.json"):
            try:
                data = json.loads(path.read_text())
                claim = ObjectRef(data["namespace"], data["name"], data["uid"])
            except (OSError, ValueError, KeyError):
                path.unlink(missing_ok=True)
                continue
            if claim in held:
                path.unlink(missing_ok=True)
                continue
            self.finalizer(claim, False)
            count += 1
        return count

    def _remember_release(self, claim: ObjectRef, waiting: bool) -> None:
        if self.releases is None:
            return
        path = self.releases / f"{claim.uid}.json"
        try:
            if waiting:
                body = {"namespace": claim.namespace, "name": claim.name, "uid": claim.uid}
                write_atomically(path, json.dumps(body).encode(), durable=False)
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("finalizer release of claim %s not kept on disk: %s", claim, exc)

    async def flushed(self) -> None:
        """Return once everything queued is written (the worker must be running); the caller
        bounds the wait."""
        while self.pending():
            self._drained.clear()
            await self._drained.wait()

    def event(self, pod: ObjectRef, reason: str, message: str, type_: str = "Warning") -> None:
        self._queue(_Event(pod, reason, message, type_))

    def claim_event(self, claim: ObjectRef, reason: str, message: str) -> None:
        """A Normal Event on a ResourceClaim (same queue, bounds and retries as pods')."""
        self._queue(_Event(claim, reason, message, "Normal", kind="ResourceClaim"))

    def node_event(self, node: str, reason: str, message: str, type_: str = "Normal") -> None:
        """An Event on the Node object (what `kubectl describe node` shows)."""
        self._queue(_Event(ObjectRef("", node, ""), reason, message, type_, kind="Node"))

    def _queue(self, event: _Event) -> None:
        if len(self._events) == self._events.maxlen:
            metrics.POD_WRITES.labels("event", "dropped").inc()  # the oldest gives way
        self._events.append(event)
        self._wake.set()

    def pod_networks(self, pod: ObjectRef, statuses: list[dict[str, Any]]) -> None:
        self._pod_networks[pod] = statuses
        self._pods_due.pop(pod, None)  # a new change is due now, whatever the last one's backoff
        self._wake.set()

    def pod_gone(self, pod: ObjectRef) -> None:
        """The pod has no sandbox on this node any more: which of its interfaces were written
        into its annotation need not be remembered (kept for every pod that ever ran, it grew
        with each pod of a node's life)."""
        self._written_interfaces.pop(pod, None)

    def pending(self) -> int:
        return len(self._dirty) + len(self._events) + len(self._pod_networks)

    def _mark(self, claim: ObjectRef) -> None:
        # a new change is due now even while an earlier write waits out its backoff: a
        # finalizer release must not sit behind a 30 s retry of a status it supersedes
        self._dirty[claim] = 0.0
        self._queued_at.setdefault(claim, time.monotonic())
        self._wake.set()

    # -- the worker

    async def run(self) -> None:
        backoff: dict[ObjectRef, Backoff] = {}
        while True:
            now = time.monotonic()
            due = [c for c, at in self._dirty.items() if at <= now]
            for claim in due:
                try:
                    await self._apply(claim)
                    self._dirty.pop(claim, None)
                    backoff.pop(claim, None)
                    metrics.STATUS_WRITES.labels("ok").inc()
                    queued = self._queued_at.pop(claim, None)
                    if queued is not None:
                        metrics.STATUS_LAG.observe(time.monotonic() - queued)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    metrics.STATUS_WRITES.labels("error").inc()
                    delay = backoff.setdefault(claim, Backoff(0.5, 30.0)).next()
                    self._dirty[claim] = time.monotonic() + delay
                    log.warning(
                        "status of claim %s/%s not written (%s); retry in %.1fs",
                        claim.namespace,
                        claim.name,
                        exc,
                        delay,
                    )
            if self._events and self._events_due <= time.monotonic():
                await self._send_events()
            if self._pod_networks:
                await self._write_pod_networks()
            if not self.pending():
                self._drained.set()
            waits = [at - time.monotonic() for at in self._dirty.values()]
            waits += [self._pods_due.get(p, 0.0) - time.monotonic() for p in self._pod_networks]
            if self._events:
                waits.append(self._events_due - time.monotonic())
            timeout = max(0.05, min(waits)) if waits else None
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _apply(self, claim: ObjectRef) -> None:
        if self.client is None:
            return
        devices = list(self._devices.get(claim, {}).values())
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
            "status": {"devices": devices},
        }
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                await self.client.patch(
                    ResourceClaimStatus,
                    claim.name,
                    body,
                    namespace=claim.namespace,
                    patch_type=PatchType.APPLY,
                    field_manager=STATUS_MANAGER,
                    force=True,
                )
        except ApiError as exc:
            if exc.status.code != 404 and refused_for_good(exc):  # 409 UID: the claim was deleted
                # refused for good (the claim no longer allocated to this node, a status the
                # API will never take): retrying every 30 s for the life of the driver fixes
                # nothing and keeps the queue from draining
                log.warning(
                    "status of claim %s/%s refused (%s %s); not retried",
                    claim.namespace, claim.name, exc.status.code, exc.status.message,
                )  # fmt: skip
                metrics.STATUS_WRITES.labels("refused").inc()
            elif exc.status.code != 404:  # 404: the claim is gone, nothing left to report
                raise
        if not devices:
            self._devices.pop(claim, None)
        wanted = self._finalizer.get(claim)
        if wanted is not None:
            meta: dict[str, Any] = {
                "name": claim.name,
                "namespace": claim.namespace,
                "uid": claim.uid,
                "finalizers": [FINALIZER] if wanted else [],
            }
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT):
                    await self.client.patch(
                        ResourceClaim,
                        claim.name,
                        {
                            "apiVersion": "resource.k8s.io/v1",
                            "kind": "ResourceClaim",
                            "metadata": meta,
                        },
                        namespace=claim.namespace,
                        patch_type=PatchType.APPLY,
                        field_manager=FINALIZER_MANAGER,
                        force=True,
                    )
            except ApiError as exc:
                if not refused_for_good(exc):
                    raise
                if exc.status.code != 404:  # gone: nothing to hold or release
                    log.warning(
                        "finalizer of claim %s/%s refused (%s %s); not retried",
                        claim.namespace, claim.name, exc.status.code, exc.status.message,
                    )  # fmt: skip
                    metrics.STATUS_WRITES.labels("refused").inc()
            if not wanted:
                self._finalizer.pop(claim, None)
                self._remember_release(claim, False)

    async def _write_pod_networks(self) -> None:
        """Each pod due on its own backoff: one pod's failure never holds up another's."""
        for pod in list(self._pod_networks):
            if self._pods_due.get(pod, 0.0) > time.monotonic():
                continue
            statuses = self._pod_networks[pod]
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT):
                    await self._annotate(pod, statuses)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if refused_for_good(exc):
                    log.warning(
                        "network-status of pod %s/%s refused (%s); not retried",
                        pod.namespace, pod.name, exc,
                    )  # fmt: skip
                    metrics.POD_WRITES.labels("network-status", "refused").inc()
                    self._forget_pod(pod, statuses)
                    continue
                metrics.POD_WRITES.labels("network-status", "error").inc()
                delay = self._pods_backoff.setdefault(pod, Backoff(0.5, 30.0)).next()
                self._pods_due[pod] = time.monotonic() + delay
                log.warning(
                    "network-status of pod %s/%s not written (%s); retry in %.1fs",
                    pod.namespace, pod.name, exc, delay,
                )  # fmt: skip
                continue
            metrics.POD_WRITES.labels("network-status", "ok").inc()
            self._forget_pod(pod, statuses)

    def _forget_pod(self, pod: ObjectRef, statuses: list[dict[str, Any]]) -> None:
        self._pods_backoff.pop(pod, None)
        self._pods_due.pop(pod, None)
        if self._pod_networks.get(pod) is statuses:  # not replaced meanwhile
            del self._pod_networks[pod]

    async def _annotate(self, pod: ObjectRef, statuses: list[dict[str, Any]]) -> None:
        if self.client is None:
            return
        try:
            obj = await self.client.get(Pod, pod.name, namespace=pod.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                self._written_interfaces.pop(pod, None)
                return
            raise
        if obj.metadata is None or obj.metadata.uid != pod.uid:
            self._written_interfaces.pop(pod, None)
            return  # another pod of the same name now
        if obj.metadata.deletionTimestamp is not None:
            self._written_interfaces.pop(pod, None)
            return  # going away: nobody reads its networks any more
        ours = {s["interface"] for s in statuses} | self._written_interfaces.get(pod, set())
        current = (obj.metadata.annotations or {}).get(NETWORK_STATUS_ANNOTATION)
        kept = other_entries(current, ours, pod)
        patch = {
            "metadata": {
                "resourceVersion": obj.metadata.resourceVersion,
                "annotations": {NETWORK_STATUS_ANNOTATION: _dumps([*kept, *statuses])},
            }
        }
        await self.client.patch(
            Pod, pod.name, patch, namespace=pod.namespace, patch_type=PatchType.MERGE
        )
        if statuses:
            self._written_interfaces[pod] = {s["interface"] for s in statuses}
        else:
            self._written_interfaces.pop(pod, None)

    async def _send_events(self) -> None:
        """The queued Events in order; one the apiserver refuses for good is dropped, one that
        fails otherwise is tried again later (at most EVENT_ATTEMPTS times), and the rest wait
        for the backoff rather than hammering an apiserver that is down."""
        if self.client is None:
            self._events.clear()
            return
        while self._events:
            item = self._events[0]
            event = Event(
                # a cluster-scoped object's Events live in the default namespace
                metadata=ObjectMeta(
                    generateName=f"{item.pod.name}.", namespace=item.pod.namespace or "default"
                ),
                involvedObject=ObjectReference(
                    kind=item.kind,
                    apiVersion="resource.k8s.io/v1" if item.kind == "ResourceClaim" else "v1",
                    name=item.pod.name,
                    namespace=item.pod.namespace or None,
                    uid=item.pod.uid or None,
                ),
                reason=item.reason,
                message=item.message[:1024],
                type=item.type,
                source=EventSource(component=self.component),
                count=1,
            )
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT):
                    await self.client.create(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                item.attempts += 1
                if refused_for_good(exc) or item.attempts >= EVENT_ATTEMPTS:
                    log.warning(
                        "event %s for pod %s/%s dropped after %d attempt(s): %s",
                        item.reason, item.pod.namespace, item.pod.name, item.attempts, exc,
                    )  # fmt: skip
                    metrics.POD_WRITES.labels("event", "refused").inc()
                    self._events.popleft()
                    continue
                metrics.POD_WRITES.labels("event", "error").inc()
                self._events_due = time.monotonic() + self._events_backoff.next()
                log.warning(
                    "event for pod %s/%s not written (%s); retried",
                    item.pod.namespace, item.pod.name, exc,
                )  # fmt: skip
                return
            metrics.POD_WRITES.labels("event", "ok").inc()
            self._events_backoff.reset()
            self._events.popleft()


def _dumps(value: Any) -> str:
    return json.dumps(value)


def other_entries(current: str | None, ours: set[str], pod: ObjectRef) -> list[dict[str, Any]]:
    """The entries of a pod's network-status annotation that are not cnidra's interfaces. The
    annotation is tenant input: larger than ANNOTATION_MAX_BYTES, nested beyond the readers'
    bound, or not a list, it is not the spec's format and is replaced (so are items that are
    not objects)."""
    if not current:
        return []
    if len(current) > ANNOTATION_MAX_BYTES:
        log.warning(
            "network-status of pod %s/%s is %d bytes, over %d: replaced",
            pod.namespace, pod.name, len(current), ANNOTATION_MAX_BYTES,
        )  # fmt: skip
        return []
    try:
        loaded = load_json(current, "network-status annotation")
    except LoadError as exc:
        log.warning("network-status of pod %s/%s replaced: %s", pod.namespace, pod.name, exc)
        return []
    if not isinstance(loaded, list):
        return []
    return [e for e in loaded if isinstance(e, dict) and e.get("interface") not in ours]
