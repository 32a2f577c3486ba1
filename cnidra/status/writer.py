"""Writes what the pods' attachments did into the apiserver, off the NRI hook's path.

Producers only record the desired state (never block, never fail); one worker applies it with
server-side apply and retries with backoff, so a down apiserver delays status, never a pod:
- ResourceClaim `status.devices` entries of ours (field manager `cnidra`),
- a finalizer on claims whose interfaces could not be removed yet,
- Events on pods for failed attaches and detaches,
- the pod's `k8s.v1.cni.cncf.io/network-status` annotation (Multus' format), for readers of
  it: cnidra's entries replace its earlier ones, every other writer's entry stays."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
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
from cnidra.api.refs import ObjectRef
from cnidra.observe import metrics
from cnidra.status.devices import NETWORK_STATUS_ANNOTATION
from cnidra.util.backoff import Backoff
from cnidra.util.files import write_atomically

log = logging.getLogger(__name__)

STATUS_MANAGER = "cnidra"
FINALIZER_MANAGER = "cnidra-detach"
FINALIZER = f"{DRIVER_NAME}/interfaces"


DeviceKey = tuple[str, str, str, str]  # driver, pool, device, shareID


class StatusSink(Protocol):
    """What the pod lifecycle reports, without waiting: implemented by StatusWriter."""

    def put(self, claim: ObjectRef, entry: dict[str, Any]) -> None: ...
    def drop(self, claim: ObjectRef, keys: list[DeviceKey]) -> None: ...
    def finalizer(self, claim: ObjectRef, present: bool) -> None: ...
    def event(self, pod: ObjectRef, reason: str, message: str) -> None: ...
    def pod_networks(self, pod: ObjectRef, statuses: list[dict[str, Any]]) -> None: ...


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
        self._events: list[tuple[ObjectRef, str, str]] = []
        # pod -> its cnidra interfaces as network-status entries, waiting to be written
        self._pod_networks: dict[ObjectRef, list[dict[str, Any]]] = {}
        self._written_interfaces: dict[ObjectRef, set[str]] = {}
        self._pods_backoff = Backoff(0.5, 30.0)
        self._pods_due = 0.0
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

    def event(self, pod: ObjectRef, reason: str, message: str) -> None:
        self._events.append((pod, reason, message))
        self._wake.set()

    def pod_networks(self, pod: ObjectRef, statuses: list[dict[str, Any]]) -> None:
        self._pod_networks[pod] = statuses
        self._wake.set()

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
            await self._send_events()
            if self._pod_networks and self._pods_due <= time.monotonic():
                await self._write_pod_networks()
            if not self.pending():
                self._drained.set()
            waits = [at - time.monotonic() for at in self._dirty.values()]
            if self._pod_networks:
                waits.append(self._pods_due - time.monotonic())
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
            gone = exc.status.code == 409 and "uid" in (exc.status.message or "").lower()
            if exc.status.code in (403, 422) or gone:  # gone: the claim was deleted
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
                await self.client.patch(
                    ResourceClaim,
                    claim.name,
                    {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta},
                    namespace=claim.namespace,
                    patch_type=PatchType.APPLY,
                    field_manager=FINALIZER_MANAGER,
                    force=True,
                )
            except ApiError as exc:
                if exc.status.code not in (404, 422):
                    raise
            if not wanted:
                self._finalizer.pop(claim, None)
                self._remember_release(claim, False)

    async def _write_pod_networks(self) -> None:
        for pod in list(self._pod_networks):
            statuses = self._pod_networks[pod]
            try:
                await self._annotate(pod, statuses)
            except Exception as exc:
                delay = self._pods_backoff.next()
                self._pods_due = time.monotonic() + delay
                log.warning(
                    "network-status of pod %s/%s not written (%s); retry in %.1fs",
                    pod.namespace,
                    pod.name,
                    exc,
                    delay,
                )
                return
            self._pods_backoff.reset()
            if self._pod_networks.get(pod) is statuses:
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
        try:
            kept = [e for e in json.loads(current or "[]") if e.get("interface") not in ours]
        except (ValueError, AttributeError, TypeError):
            kept = []  # not a list of objects: not the spec's format, replaced
        patch = {
            "metadata": {
                "resourceVersion": obj.metadata.resourceVersion,
                "annotations": {NETWORK_STATUS_ANNOTATION: json.dumps([*kept, *statuses])},
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
        if self.client is None:
            self._events.clear()
            return
        while self._events:
            pod, reason, message = self._events[0]
            event = Event(
                metadata=ObjectMeta(generateName=f"{pod.name}.", namespace=pod.namespace),
                involvedObject=ObjectReference(
                    kind="Pod", apiVersion="v1", name=pod.name, namespace=pod.namespace, uid=pod.uid
                ),
                reason=reason,
                message=message[:1024],
                type="Warning",
                source=EventSource(component=self.component),
                count=1,
            )
            try:
                await self.client.create(event)
            except Exception as exc:
                log.warning("event for pod %s/%s not written: %s", pod.namespace, pod.name, exc)
                return  # retried on the next round
            self._events.pop(0)
