"""Writes what the pods' attachments did into the apiserver, off the NRI hook's path.

Producers only record the desired state (never block, never fail); one worker applies it with
server-side apply and retries with backoff, so a down apiserver delays status, never a pod:
- ResourceClaim `status.devices` entries of ours (field manager `cnidra`),
- a finalizer on claims whose interfaces could not be removed yet,
- Events on pods for failed attaches and detaches (and the Normal ones, unless turned off),
- the pod's `k8s.v1.cni.cncf.io/network-status` annotation (Multus' format), for readers of
  it: cnidra's entries replace its earlier ones, every other writer's entry stays.

One claim's or one pod's failure never holds up the others: each has its own backoff, a write
the apiserver refuses for good (403, 404, 422, a UID precondition) is dropped with a warning
and counted, every apiserver call has a timeout, the Event queue is bounded (the oldest goes
first) and an Event gets a few attempts. The pod's annotation is tenant input: read with a
size and depth bound, and anything but a list of objects is replaced.

What each pod costs the apiserver is kept to what these guarantees need (docs/performance.md):
a claim's status is written only when it differs from what was written last, and its finalizer
only when it changes (they are two requests: the status subresource keeps the object's
metadata, finalizers included, and the object keeps its status); the removal of a sandbox's
entries waits DROP_GRACE, and is not sent at all for a claim made from a template once it is
unprepared (`released`): its one pod is gone, so the claim controller deallocates it next, and
the apiserver drops the status.devices entries of deallocated devices itself. The annotation is
one JSON patch, tested against the annotations the runtime gave with the sandbox (kubelet
copies the pod's into it); when the test fails (another writer, such as Multus, wrote since)
the pod is read and merged as before."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cnidra.api.constants import DRIVER_NAME
from cnidra.api.loading import LoadError, load_json
from cnidra.api.refs import ObjectRef
from cnidra.kube.api import (
    Api,
    AsyncClient,
    Invalid,
    NotFound,
    Pod,
    RefusedForGood,
    ResourceClaim,
    ResourceClaimStatus,
)
from cnidra.kube.events import EventRecord, EventRecorder, Involved
from cnidra.observe import metrics
from cnidra.status.devices import (
    NETWORK_STATUS_ANNOTATION,
    DeviceKey,
    DeviceStatus,
    same_condition,
    with_conditions,
)
from cnidra.util.aio import wait_set
from cnidra.util.backoff import Backoff
from cnidra.util.files import write_atomically
from cnidra.util.workqueue import WorkQueue

log = logging.getLogger(__name__)

STATUS_MANAGER = "cnidra"
FINALIZER_MANAGER = "cnidra-detach"
FINALIZER = f"{DRIVER_NAME}/interfaces"
REQUEST_TIMEOUT = 10.0  # one apiserver call of the writer
MAX_EVENTS = 1000  # queued Events; beyond, the oldest is dropped
EVENT_ATTEMPTS = 5
ANNOTATION_MAX_BYTES = 256 * 1024  # a network-status annotation larger is not read
# how long the removal of a sandbox's status.devices entries waits for the claim to be
# released (unprepared: no write needed) or set up again by the pod's next sandbox
DROP_GRACE = 30.0
_ANNOTATION_PATH = "/metadata/annotations/" + NETWORK_STATUS_ANNOTATION.replace("~", "~0").replace(
    "/", "~1"
)


def refused_for_good(exc: BaseException) -> bool:
    """An apiserver answer that no retry changes (cnidra.kube.api.RefusedForGood)."""
    return isinstance(exc, RefusedForGood)


def _involved(ref: ObjectRef, kind: str) -> Involved:
    return Involved(kind, ref.name, ref.namespace, ref.uid)


@dataclass(frozen=True)
class SeenAnnotations:
    """The pod's annotations as the runtime gave them with its sandbox (NRI's PodSandbox;
    kubelet makes the sandbox's annotations the pod's: kuberuntime_sandbox.go:95, labels.go:92
    in Kubernetes 1.37): its network-status annotation then (None: it had none), and whether it
    had any annotation at all (none: the map may not exist in the object)."""

    network_status: str | None
    any: bool


class StatusSink(Protocol):
    """What the pod lifecycle reports, without waiting: implemented by StatusWriter."""

    def put(self, claim: ObjectRef, status: DeviceStatus) -> None: ...
    def drop(self, claim: ObjectRef, keys: list[DeviceKey], *, later: bool = False) -> None: ...
    def finalizer(self, claim: ObjectRef, present: bool) -> None: ...
    def released(self, claim: ObjectRef, generated: bool) -> None: ...
    def event(self, pod: ObjectRef, reason: str, message: str, type_: str = "Warning") -> None: ...
    def pod_networks(
        self,
        pod: ObjectRef,
        statuses: list[dict[str, Any]],
        seen: SeenAnnotations | None = None,
    ) -> None: ...
    def pod_gone(self, pod: ObjectRef) -> None: ...


class StatusWriter:
    def __init__(
        self,
        client: AsyncClient | None,
        component: str = "cnidra",
        releases: Path | None = None,
        *,
        normal_events: bool = True,
        node: str = "",
    ) -> None:
        """`releases`: a directory where a finalizer removal waits on disk until the apiserver
        took it, so a restart (rolling upgrade, crash) never leaves a claim held whose
        interfaces are all gone. `normal_events` False: only Warning Events are written (each
        Event is one request). `node`: the node the Events come from (their source host and
        reporting instance, as kubelet's)."""
        self.client = client
        self.api = Api(client, REQUEST_TIMEOUT) if client is not None else None
        self.component = component
        self.node = node
        self.recorder = EventRecorder(component, node)
        self.releases = releases
        self.normal_events = normal_events
        self._devices: dict[ObjectRef, dict[DeviceKey, DeviceStatus]] = {}
        # conditions of other producers (network policy's), merged into the entries they name
        self._conditions: dict[ObjectRef, dict[DeviceKey, dict[str, Mapping[str, Any]]]] = {}
        self._status_changed: set[ObjectRef] = set()  # claims whose status is to be written
        # what the apiserver has of a claim's entries, as written last (absent: not known)
        self._written: dict[ObjectRef, list[DeviceStatus]] = {}
        self._finalizer: dict[ObjectRef, bool] = {}
        self._finalizer_written: dict[ObjectRef, bool] = {}
        self._events: deque[EventRecord] = deque(maxlen=MAX_EVENTS)
        self._events_backoff = Backoff(0.5, 30.0)
        self._events_due = 0.0
        # pod -> its cnidra interfaces as network-status entries, waiting to be written
        self._pod_networks: dict[ObjectRef, list[dict[str, Any]]] = {}
        self._seen: dict[ObjectRef, SeenAnnotations] = {}
        # whether the annotations the runtime gives are fresh enough to patch against: off
        # after a test failed (another writer of the annotation on this node's pods: a GET
        # first saves the failed patch), on again when a read shows the runtime's view held
        self._patch_seen = True
        self._written_interfaces: dict[ObjectRef, set[str]] = {}
        # the pods whose network-status is to be written, and the claims whose status or
        # finalizer is: each key due once, retried on its own backoff
        self._pods: WorkQueue[ObjectRef] = WorkQueue(lambda: Backoff(0.5, 30.0))
        self._claims: WorkQueue[ObjectRef] = WorkQueue(lambda: Backoff(0.5, 30.0))
        self._queued_at: dict[ObjectRef, float] = {}  # the oldest change not yet written
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()

    # -- producers: cheap, synchronous, never touch the network

    def put(self, claim: ObjectRef, status: DeviceStatus) -> None:
        self._devices.setdefault(claim, {})[status.key] = status
        self._status_changed.add(claim)
        self._mark(claim)

    def device_condition(
        self, claim: ObjectRef, key: DeviceKey, type_: str, condition: Mapping[str, Any] | None
    ) -> None:
        """A condition of `type_` on the entry `key` (None: none), kept apart from `put`'s and
        merged into the entry when it is written, whichever of the two comes first; a
        condition that says what the last one said keeps its transition time."""
        held = self._conditions.setdefault(claim, {}).setdefault(key, {})
        if condition is None:
            if held.pop(type_, None) is None:
                return
        elif same_condition(held.get(type_), condition):
            return
        else:
            held[type_] = condition
        if claim in self._devices and key in self._devices[claim]:
            self._status_changed.add(claim)
            self._mark(claim)

    def drop(self, claim: ObjectRef, keys: list[DeviceKey], *, later: bool = False) -> None:
        """The entries' interfaces are gone. `later`: their sandbox is gone, so the claim is
        likely to be unprepared soon (`released`: nothing to write) or set up again by the
        pod's next sandbox: written after DROP_GRACE, unless something due sooner writes it."""
        devices = self._devices.get(claim, {})
        conditions = self._conditions.get(claim, {})
        for key in keys:
            devices.pop(key, None)
            conditions.pop(key, None)
        if not conditions:
            self._conditions.pop(claim, None)
        self._status_changed.add(claim)
        self._mark(claim, DROP_GRACE if later else 0.0)

    def finalizer(self, claim: ObjectRef, present: bool) -> None:
        if self._finalizer.get(claim) != present:
            self._finalizer[claim] = present
            self._remember_release(claim, not present)
            self._mark(claim)

    def released(self, claim: ObjectRef, generated: bool) -> None:
        """The claim is unprepared on this node: kubelet is done with it. One made from a
        template (`generated`) is deallocated next, its one pod being gone: the claim controller
        clears status.allocation (pkg/controller/resourceclaim/controller.go:1607 in Kubernetes
        1.37) and the status strategy drops the status.devices entries of deallocated devices
        (pkg/registry/resource/resourceclaim/strategy.go:200, 331-381): what is queued of its
        status is not sent, and nothing about it is kept. Another claim may stay allocated to
        other pods: its queued status is written now. A finalizer change stays queued."""
        if generated:
            self._status_changed.discard(claim)
            self._devices.pop(claim, None)
            self._conditions.pop(claim, None)
            self._written.pop(claim, None)
            if self._finalizer.get(claim) == self._finalizer_written.get(claim, None):
                self._claims.done(claim)
                self._queued_at.pop(claim, None)
        elif claim in self._claims:
            self._claims.add(claim)
            self._wake.set()

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
        """Return once everything queued is written, removals waiting out DROP_GRACE included
        (the worker must be running); the caller bounds the wait."""
        self._claims.hurry()
        self._wake.set()
        while self.pending():
            self._drained.clear()
            await self._drained.wait()

    def event(self, pod: ObjectRef, reason: str, message: str, type_: str = "Warning") -> None:
        if type_ == "Normal" and not self.normal_events:
            return
        self._queue(EventRecord(_involved(pod, "Pod"), reason, message, type_))

    def object_event(
        self, about: Involved, reason: str, message: str, type_: str = "Warning"
    ) -> None:
        """An Event on any object (a network policy: cnidra.status.netpolicy)."""
        if type_ == "Normal" and not self.normal_events:
            return
        self._queue(EventRecord(about, reason, message, type_))

    def claim_event(self, claim: ObjectRef, reason: str, message: str) -> None:
        """A Normal Event on a ResourceClaim (same queue, bounds and retries as pods')."""
        if self.normal_events:
            self._queue(EventRecord(_involved(claim, "ResourceClaim"), reason, message, "Normal"))

    def node_event(self, node: str, reason: str, message: str, type_: str = "Normal") -> None:
        """An Event on the Node object (what `kubectl describe node` shows)."""
        self._queue(EventRecord(Involved("Node", node), reason, message, type_))

    def _queue(self, event: EventRecord) -> None:
        if len(self._events) == self._events.maxlen:
            metrics.POD_WRITES.labels("event", "dropped").inc()  # the oldest gives way
        self._events.append(event)
        self._wake.set()

    def pod_networks(
        self,
        pod: ObjectRef,
        statuses: list[dict[str, Any]],
        seen: SeenAnnotations | None = None,
    ) -> None:
        """`seen`: the pod's annotations as its sandbox came with them; without them (a
        restart, the node API's plugs) the pod is read first."""
        self._pod_networks[pod] = statuses
        if seen is None:
            self._seen.pop(pod, None)
        else:
            self._seen[pod] = seen
        self._pods.add(pod)  # a new change is due now, whatever the last one's backoff
        self._wake.set()

    def pod_gone(self, pod: ObjectRef) -> None:
        """The pod has no sandbox on this node any more: which of its interfaces were written
        into its annotation need not be remembered (kept for every pod that ever ran, it grew
        with each pod of a node's life)."""
        self._written_interfaces.pop(pod, None)

    def pending(self) -> int:
        return len(self._claims) + len(self._events) + len(self._pod_networks)

    def _mark(self, claim: ObjectRef, delay: float = 0.0) -> None:
        # a new change is due now even while an earlier write waits out its backoff: a
        # finalizer release must not sit behind a 30 s retry of a status it supersedes; a
        # change that may wait (`delay`) never puts off one due sooner
        self._claims.add(claim, delay)
        if not delay:
            self._queued_at.setdefault(claim, time.monotonic())
        self._wake.set()

    # -- the worker

    async def run(self) -> None:
        while True:
            for claim in self._claims.due():
                try:
                    wrote = await self._apply(claim)
                    self._claims.done(claim)
                    if wrote:
                        metrics.STATUS_WRITES.labels("ok").inc()
                    queued = self._queued_at.pop(claim, None)
                    if queued is not None:
                        metrics.STATUS_LAG.observe(time.monotonic() - queued)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    metrics.STATUS_WRITES.labels("error").inc()
                    delay = self._claims.retry(claim)
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
            waits = [w for w in (self._claims.wait(), self._pods.wait()) if w is not None]
            if self._events:
                waits.append(self._events_due - time.monotonic())
            timeout = max(0.05, min(waits)) if waits else None
            self._wake.clear()
            await wait_set(self._wake, timeout)

    async def _apply(self, claim: ObjectRef) -> bool:
        """The claim's status when it differs from what was written last, then its finalizer
        when it changed: two requests at most, each only when needed. Whether it wrote."""
        if self.client is None:
            return False
        wrote = False
        if claim in self._status_changed:
            extra = self._conditions.get(claim, {})
            devices = [
                with_conditions(d, list(extra.get(d.key, {}).values()))
                for d in self._devices.get(claim, {}).values()
            ]
            if self._written.get(claim) != devices:
                await self._apply_status(claim, [d.entry() for d in devices])
                wrote = True
            self._status_changed.discard(claim)
            if devices:
                self._written[claim] = devices
            else:
                self._devices.pop(claim, None)
                self._written.pop(claim, None)
        wanted = self._finalizer.get(claim)
        if wanted is not None and wanted != self._finalizer_written.get(claim):
            await self._apply_finalizer(claim, wanted)
            wrote = True
        if wanted is False:
            self._finalizer.pop(claim, None)
            self._finalizer_written.pop(claim, None)
            self._remember_release(claim, False)
        elif wanted:
            self._finalizer_written[claim] = True
        return wrote

    async def _apply_status(self, claim: ObjectRef, devices: list[dict[str, Any]]) -> None:
        assert self.api is not None
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
            "status": {"devices": devices},
        }
        try:
            await self.api.apply(
                ResourceClaimStatus,
                claim.name,
                body,
                namespace=claim.namespace,
                field_manager=STATUS_MANAGER,
            )
        except NotFound:
            pass  # the claim is gone, nothing left to report
        except RefusedForGood as exc:  # 409 UID: the claim was deleted
            # refused for good (the claim no longer allocated to this node, a status the
            # API will never take): retrying every 30 s for the life of the driver fixes
            # nothing and keeps the queue from draining
            log.warning(
                "status of claim %s/%s refused (%s %s); not retried",
                claim.namespace, claim.name, exc.code, exc.message,
            )  # fmt: skip
            metrics.STATUS_WRITES.labels("refused").inc()

    async def _apply_finalizer(self, claim: ObjectRef, wanted: bool) -> None:
        assert self.api is not None
        meta: dict[str, Any] = {
            "name": claim.name,
            "namespace": claim.namespace,
            "uid": claim.uid,
            "finalizers": [FINALIZER] if wanted else [],
        }
        try:
            await self.api.apply(
                ResourceClaim,
                claim.name,
                {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta},
                namespace=claim.namespace,
                field_manager=FINALIZER_MANAGER,
            )
        except NotFound:
            pass  # gone: nothing to hold or release
        except RefusedForGood as exc:
            log.warning(
                "finalizer of claim %s/%s refused (%s %s); not retried",
                claim.namespace, claim.name, exc.code, exc.message,
            )  # fmt: skip
            metrics.STATUS_WRITES.labels("refused").inc()

    async def _write_pod_networks(self) -> None:
        """Each pod due on its own backoff: one pod's failure never holds up another's."""
        for pod in self._pods.due():
            statuses = self._pod_networks[pod]
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT):
                    await self._annotate(pod, statuses, self._seen.get(pod))
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
                delay = self._pods.retry(pod)
                log.warning(
                    "network-status of pod %s/%s not written (%s); retry in %.1fs",
                    pod.namespace, pod.name, exc, delay,
                )  # fmt: skip
                continue
            metrics.POD_WRITES.labels("network-status", "ok").inc()
            self._forget_pod(pod, statuses)

    def _forget_pod(self, pod: ObjectRef, statuses: list[dict[str, Any]]) -> None:
        self._pods.done(pod)
        if self._pod_networks.get(pod) is statuses:  # not replaced meanwhile
            del self._pod_networks[pod]
            self._seen.pop(pod, None)
        elif pod in self._pod_networks:  # replaced meanwhile: the new change is due now
            self._pods.add(pod)

    async def _annotate(
        self, pod: ObjectRef, statuses: list[dict[str, Any]], seen: SeenAnnotations | None
    ) -> None:
        if self.api is None:
            return
        if seen is not None and self._patch_seen and await self._patch_against(pod, statuses, seen):
            return
        obj = await self.api.get_or_none(Pod, pod.name, pod.namespace)
        if obj is None:
            self._written_interfaces.pop(pod, None)
            return
        if obj.metadata is None or obj.metadata.uid != pod.uid:
            self._written_interfaces.pop(pod, None)
            return  # another pod of the same name now
        if obj.metadata.deletionTimestamp is not None:
            self._written_interfaces.pop(pod, None)
            return  # going away: nobody reads its networks any more
        ours = {s["interface"] for s in statuses} | self._written_interfaces.get(pod, set())
        current = (obj.metadata.annotations or {}).get(NETWORK_STATUS_ANNOTATION)
        if seen is not None and current == seen.network_status:
            self._patch_seen = True  # the runtime's view held: patch against it again
        kept = other_entries(current, ours, pod)
        patch = {
            "metadata": {
                "resourceVersion": obj.metadata.resourceVersion,
                "annotations": {NETWORK_STATUS_ANNOTATION: _dumps([*kept, *statuses])},
            }
        }
        await self.api.merge_patch(Pod, pod.name, patch, namespace=pod.namespace)
        self._wrote(pod, statuses)

    def _wrote(self, pod: ObjectRef, statuses: list[dict[str, Any]]) -> None:
        if statuses:
            self._written_interfaces[pod] = {s["interface"] for s in statuses}
        else:
            self._written_interfaces.pop(pod, None)

    async def _patch_against(
        self, pod: ObjectRef, statuses: list[dict[str, Any]], seen: SeenAnnotations
    ) -> bool:
        """One JSON patch instead of a GET and a merge patch: it tests that the pod is this
        one, not being deleted, and that its annotation is still what the runtime gave (a test
        for null passes on a member that is missing: evanphx/json-patch v4.13.0 patch.go:689,
        what the apiserver applies), then sets it. False when a test failed (422: apiserver
        pkg/endpoints/handlers/patch.go:425): the caller reads the pod and merges."""
        assert self.api is not None
        ours = {s["interface"] for s in statuses} | self._written_interfaces.get(pod, set())
        value = _dumps([*other_entries(seen.network_status, ours, pod), *statuses])
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/uid", "value": pod.uid},
            {"op": "test", "path": "/metadata/deletionTimestamp", "value": None},
        ]
        if seen.any:
            ops.append({"op": "test", "path": _ANNOTATION_PATH, "value": seen.network_status})
            ops.append({"op": "add", "path": _ANNOTATION_PATH, "value": value})
        else:  # the pod had no annotation: the map itself may be missing
            ops.append({"op": "test", "path": "/metadata/annotations", "value": None})
            ops.append(
                {
                    "op": "add",
                    "path": "/metadata/annotations",
                    "value": {NETWORK_STATUS_ANNOTATION: value},
                }
            )
        try:
            await self.api.json_patch(Pod, pod.name, ops, namespace=pod.namespace)
        except NotFound:
            self._written_interfaces.pop(pod, None)
            return True  # gone: nobody reads its networks any more
        except Invalid:
            self._patch_seen = False
            return False
        self._wrote(pod, statuses)
        return True

    async def _send_events(self) -> None:
        """The queued Events in order; one the apiserver refuses for good is dropped, one that
        fails otherwise is tried again later (at most EVENT_ATTEMPTS times), and the rest wait
        for the backoff rather than hammering an apiserver that is down."""
        if self.api is None:
            self._events.clear()
            return
        while self._events:
            item = self._events[0]
            try:
                await self.recorder.send(self.api, item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                item.attempts += 1
                if refused_for_good(exc) or item.attempts >= EVENT_ATTEMPTS:
                    log.warning(
                        "event %s for pod %s/%s dropped after %d attempt(s): %s",
                        item.reason, item.about.namespace, item.about.name, item.attempts, exc,
                    )  # fmt: skip
                    metrics.POD_WRITES.labels("event", "refused").inc()
                    self._events.popleft()
                    continue
                metrics.POD_WRITES.labels("event", "error").inc()
                self._events_due = time.monotonic() + self._events_backoff.next()
                log.warning(
                    "event for pod %s/%s not written (%s); retried",
                    item.about.namespace, item.about.name, exc,
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
