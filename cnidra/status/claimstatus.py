"""A claim's `status.devices` entries of ours (server-side apply, field manager `cnidra`) and
the finalizer on claims whose interfaces could not be removed yet (a second apply, field
manager `cnidra-detach`), each claim a key of the status writer's queue, due once, retried on
its own backoff.

What each claim costs the apiserver is kept to what these guarantees need (docs/performance.md):
a claim's status is written only when it differs from what was written last, and its finalizer
only when it changes (they are two requests: the status subresource keeps the object's
metadata, finalizers included, and the object keeps its status); the removal of a sandbox's
entries waits DROP_GRACE, and is not sent at all for a claim made from a template once it is
unprepared (`released`): its one pod is gone, so the claim controller deallocates it next, and
the apiserver drops the status.devices entries of deallocated devices itself. A finalizer
removal stays on disk until written, so a restart never strands a held claim."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cnidra.api.constants import DRIVER_NAME
from cnidra.api.refs import ObjectRef
from cnidra.kube.api import Api, NotFound, RefusedForGood, ResourceClaim, ResourceClaimStatus
from cnidra.observe import metrics
from cnidra.status.devices import (
    Condition,
    DeviceKey,
    DeviceStatus,
    same_condition,
    with_conditions,
)
from cnidra.util.files import write_atomically
from cnidra.util.workqueue import Lane

log = logging.getLogger(__name__)

STATUS_MANAGER = "cnidra"
FINALIZER_MANAGER = "cnidra-detach"
FINALIZER = f"{DRIVER_NAME}/interfaces"
# how long the removal of a sandbox's status.devices entries waits for the claim to be
# released (unprepared: no write needed) or set up again by the pod's next sandbox
DROP_GRACE = 30.0


class ClaimStatusWriter:
    """`releases`: a directory where a finalizer removal waits on disk until the apiserver
    took it, so a restart (rolling upgrade, crash) never leaves a claim held whose interfaces
    are all gone."""

    def __init__(
        self,
        api: Api | None,
        lane: Lane[ObjectRef],
        wake: Callable[[], None],
        releases: Path | None = None,
    ) -> None:
        self.api = api
        self.lane = lane
        self.wake = wake
        self.releases = releases
        self.devices: dict[ObjectRef, dict[DeviceKey, DeviceStatus]] = {}
        # conditions of other producers (network policy's), merged into the entries they name
        self.conditions: dict[ObjectRef, dict[DeviceKey, dict[str, Condition]]] = {}
        self.status_changed: set[ObjectRef] = set()  # claims whose status is to be written
        # what the apiserver has of a claim's entries, as written last (absent: not known)
        self.written: dict[ObjectRef, list[DeviceStatus]] = {}
        self.finalizers: dict[ObjectRef, bool] = {}
        self.finalizers_written: dict[ObjectRef, bool] = {}
        self.queued_at: dict[ObjectRef, float] = {}  # the oldest change not yet written

    # -- producers: cheap, synchronous, never touch the network

    def put(self, claim: ObjectRef, status: DeviceStatus) -> None:
        self.devices.setdefault(claim, {})[status.key] = status
        self.status_changed.add(claim)
        self._mark(claim)

    def device_condition(
        self, claim: ObjectRef, key: DeviceKey, type_: str, condition: Condition | None
    ) -> None:
        """A condition of `type_` on the entry `key` (None: none), kept apart from `put`'s and
        merged into the entry when it is written, whichever of the two comes first; a
        condition that says what the last one said keeps its transition time."""
        held = self.conditions.setdefault(claim, {}).setdefault(key, {})
        if condition is None:
            if held.pop(type_, None) is None:
                return
        elif same_condition(held.get(type_), condition):
            return
        else:
            held[type_] = condition
        if key in self.devices.get(claim, {}):
            self.status_changed.add(claim)
            self._mark(claim)

    def drop(self, claim: ObjectRef, keys: list[DeviceKey], *, later: bool = False) -> None:
        """The entries' interfaces are gone. `later`: their sandbox is gone, so the claim is
        likely to be unprepared soon (`released`: nothing to write) or set up again by the
        pod's next sandbox: written after DROP_GRACE, unless something due sooner writes it."""
        devices = self.devices.get(claim, {})
        conditions = self.conditions.get(claim, {})
        for key in keys:
            devices.pop(key, None)
            conditions.pop(key, None)
        if not conditions:
            self.conditions.pop(claim, None)
        self.status_changed.add(claim)
        self._mark(claim, DROP_GRACE if later else 0.0)

    def finalizer(self, claim: ObjectRef, present: bool) -> None:
        if self.finalizers.get(claim) != present:
            self.finalizers[claim] = present
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
            self.status_changed.discard(claim)
            self.devices.pop(claim, None)
            self.conditions.pop(claim, None)
            self.written.pop(claim, None)
            if self.finalizers.get(claim) == self.finalizers_written.get(claim, None):
                self.lane.done(claim)
                self.queued_at.pop(claim, None)
        elif claim in self.lane:
            self.lane.add(claim)
            self.wake()

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

    def _mark(self, claim: ObjectRef, delay: float = 0.0) -> None:
        # a new change is due now even while an earlier write waits out its backoff: a
        # finalizer release must not sit behind a 30 s retry of a status it supersedes; a
        # change that may wait (`delay`) never puts off one due sooner
        self.lane.add(claim, delay)
        if not delay:
            self.queued_at.setdefault(claim, time.monotonic())
        self.wake()

    def pending(self) -> int:
        return len(self.lane)

    # -- the worker's part

    async def write_due(self) -> None:
        for claim in self.lane.due():
            try:
                wrote = await self._apply(claim)
                self.lane.done(claim)
                if wrote:
                    metrics.STATUS_WRITES.labels("ok").inc()
                queued = self.queued_at.pop(claim, None)
                if queued is not None:
                    metrics.STATUS_LAG.observe(time.monotonic() - queued)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                metrics.STATUS_WRITES.labels("error").inc()
                delay = self.lane.retry(claim)
                log.warning(
                    "status of claim %s/%s not written (%s); retry in %.1fs",
                    claim.namespace,
                    claim.name,
                    exc,
                    delay,
                )

    async def _apply(self, claim: ObjectRef) -> bool:
        """The claim's status when it differs from what was written last, then its finalizer
        when it changed: two requests at most, each only when needed. Whether it wrote."""
        if self.api is None:
            return False
        wrote = False
        if claim in self.status_changed:
            extra = self.conditions.get(claim, {})
            devices = [
                with_conditions(d, list(extra.get(d.key, {}).values()))
                for d in self.devices.get(claim, {}).values()
            ]
            if self.written.get(claim) != devices:
                await self._apply_status(claim, [d.entry() for d in devices])
                wrote = True
            self.status_changed.discard(claim)
            if devices:
                self.written[claim] = devices
            else:
                self.devices.pop(claim, None)
                self.written.pop(claim, None)
        wanted = self.finalizers.get(claim)
        if wanted is not None and wanted != self.finalizers_written.get(claim):
            await self._apply_finalizer(claim, wanted)
            wrote = True
        if wanted is False:
            self.finalizers.pop(claim, None)
            self.finalizers_written.pop(claim, None)
            self._remember_release(claim, False)
        elif wanted:
            self.finalizers_written[claim] = True
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
