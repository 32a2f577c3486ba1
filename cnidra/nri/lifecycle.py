"""The pod network lifecycle behind the NRI hooks: attach on RunPodSandbox, detach on
StopPodSandbox/RemovePodSandbox, reconcile on Synchronize.

Nothing here talks to the apiserver: claims come from the checkpoint NodePrepareResources
wrote, and status, events and finalizers are handed to the StatusWriter, which writes them
later. Attachments of one pod are ADDed in a fixed order: claims by namespace/name, then each
claim's devices in allocation order; DEL runs in the reverse order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra.api.constants import DRIVER_NAME
from cnidra.api.ownership import is_owned
from cnidra.cni.attach import AttachFailed, Budget, Outcome, attach_all, detach_all
from cnidra.cni.errors import CNIRuntimeError
from cnidra.cni.invoke import Deadline
from cnidra.cni.result import Result
from cnidra.cni.runtime import CNIRuntime
from cnidra.cni.types import GCAttachment, NetworkConfigList
from cnidra.dra import metrics
from cnidra.dra.prepare import DEFAULT_MAX_ATTACHMENTS, ClaimRef
from cnidra.nri.plugin import netns_of
from cnidra.state.checkpoint import Checkpoint
from cnidra.state.sandboxes import AttachmentRecord, SandboxRecord, SandboxStore, State
from cnidra.status.devices import device_status
from cnidra.status.writer import ClaimKey, PodRef, StatusWriter

log = logging.getLogger(__name__)

REASON_ATTACH_FAILED = "NetworkAttachFailed"
REASON_DETACH_FAILED = "NetworkDetachFailed"


class AttachError(Exception):
    """Fails the RunPodSandbox hook, so the sandbox fails and kubelet retries."""


# containerd's default NRI plugin_request_timeout; the runtime tells the real one in Configure.
DEFAULT_REQUEST_TIMEOUT = 2.0
# Of the runtime's hook timeout: ADDs may use 60 %, rollback DELs must be done by 90 %, so the
# hook answers before containerd gives up on cnidra (it would start the sandbox without the
# interfaces and drop the connection).
ATTACH_SHARE = 0.6
ANSWER_SHARE = 0.9


@dataclass
class HookBudget:
    """How long one RunPodSandbox hook may take. `attach` 0 derives it from the runtime's
    request timeout; a configured value above what fits is cut down to fit."""

    attach: float = 0.0
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT

    @property
    def answer_seconds(self) -> float:
        return self.request_timeout * ANSWER_SHARE

    @property
    def attach_seconds(self) -> float:
        fits = self.request_timeout * ATTACH_SHARE
        return min(self.attach, self.answer_seconds) if self.attach > 0 else fits

    def deadlines(self) -> Budget:
        return Budget(
            add=Deadline.after(self.attach_seconds, "the pod's attach budget"),
            rollback=Deadline.after(self.answer_seconds, "the runtime's hook timeout"),
        )


def pod_args(pod: nri.PodSandbox) -> tuple[tuple[str, str], ...]:
    return (
        ("K8S_POD_NAMESPACE", pod.namespace),
        ("K8S_POD_NAME", pod.name),
        ("K8S_POD_INFRA_CONTAINER_ID", pod.id),
        ("K8S_POD_UID", pod.uid),
    )


class PodNetworks:
    def __init__(
        self,
        checkpoint: Checkpoint,
        runtime: CNIRuntime,
        store: SandboxStore,
        status: StatusWriter,
        retry_initial: float = 0.5,
        retry_max: float = 30.0,
        netns_exists: Callable[[str], bool] = os.path.exists,
        concurrent: bool = False,
        budget: HookBudget | None = None,
        max_attachments: int = DEFAULT_MAX_ATTACHMENTS,
    ) -> None:
        self.checkpoint = checkpoint
        self.runtime = runtime
        self.store = store
        self.status = status
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.netns_exists = netns_exists
        self.concurrent = concurrent
        self.budget = budget or HookBudget()
        self.max_attachments = max_attachments
        self._locks: dict[str, asyncio.Lock] = {}
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._removed: set[str] = set()

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    # ------------------------------------------------------------------ planning

    def plan(self, pod: nri.PodSandbox) -> list[AttachmentRecord]:
        records = []
        for claim in self.checkpoint.for_pod(pod.uid):
            for dev in claim.devices:
                records.append(
                    AttachmentRecord(
                        claim.uid,
                        claim.namespace,
                        claim.name,
                        dev.request,
                        dev.pool,
                        dev.device,
                        dev.if_name,
                        dev.network,
                        dev.capability_args,
                        (*pod_args(pod), *dev.cni_args),
                        dev.share_id,
                        network_label=dev.network_label,
                    )
                )
        return records

    def set_request_timeout(self, seconds: float) -> None:
        """The runtime's hook timeout, from NRI's Configure."""
        self.budget.request_timeout = seconds
        if self.budget.attach > self.budget.answer_seconds:
            log.warning(
                "--attach-budget %.2fs does not fit the runtime's %.2fs hook timeout; using %.2fs",
                self.budget.attach,
                seconds,
                self.budget.attach_seconds,
            )

    # ------------------------------------------------------------------ hooks

    async def run_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        start = time.perf_counter()
        try:
            count = await self._attach(pod)
        except AttachError:
            metrics.ATTACH_FAILURES.inc()
            raise
        finally:
            elapsed = time.perf_counter() - start
            metrics.HOOK_LATENCY.labels("RunPodSandbox").observe(elapsed)
        if count:
            log.info(
                "attached %d interface(s) to pod %s/%s in %.1f ms",
                count,
                pod.namespace,
                pod.name,
                elapsed * 1000,
            )

    async def _attach(self, pod: nri.PodSandbox) -> int:
        """ADD the pod's attachments; returns how many were added now."""
        planned = self.plan(pod)
        if not planned:
            return 0
        if len(planned) > self.max_attachments:  # prepare refuses this; a checkpoint may predate
            raise AttachError(
                f"pod {pod.namespace}/{pod.name} has {len(planned)} cnidra interfaces; "
                f"at most {self.max_attachments} per pod (--max-attachments-per-pod)"
            )
        netns = netns_of(pod)
        if not netns:
            raise AttachError(
                f"pod {pod.namespace}/{pod.name}: the runtime gave no network "
                "namespace for the sandbox"
            )
        async with self._lock(pod.id):
            existing = self.store.get(pod.id)
            if existing is not None and existing.state is State.ADDED:
                return 0  # the hook ran already (reconnect, or Synchronize's late attach)
            record = SandboxRecord(
                pod.id, pod.uid, pod.namespace, pod.name, netns, State.ADDING, tuple(planned)
            )
            self.store.put(record)  # write-ahead: a crash from here on is undone on restart
            attachments = [a.attachment() for a in planned]
            try:
                outcomes = await attach_all(
                    self.runtime,
                    attachments,
                    pod.id,
                    netns,
                    concurrent=self.concurrent,
                    budget=self.budget.deadlines(),
                )
            except asyncio.CancelledError:
                # the runtime gave up on the hook or the connection dropped: undo from the record
                log.warning("attach of %s/%s cancelled; rolling back", pod.namespace, pod.name)
                self.store.put(record.with_state(State.DELETING))
                self._retry_detach(pod.id, first_delay=0.0)
                raise
            except AttachFailed as failed:
                if failed.cleanup_errors:
                    self.store.put(record.with_state(State.DELETING))
                    self._retry_detach(pod.id)
                else:
                    self.store.remove(pod.id)
                self._report(planned, failed.outcomes)
                message = f"pod {pod.namespace}/{pod.name}: {failed}"
                self.status.event(
                    PodRef(pod.namespace, pod.name, pod.uid), REASON_ATTACH_FAILED, message
                )
                raise AttachError(message) from None
            done = tuple(
                AttachmentRecord(
                    **{**a.__dict__, "result": o.result.to_json() if o.result else None}
                )
                for a, o in zip(planned, outcomes, strict=True)
            )
            self.store.put(record.with_state(State.ADDED, attachments=done))
            self._report(planned, outcomes)
            # held until the last DEL succeeds: a claim must not vanish with interfaces set up
            for claim in {_claim_key(a) for a in planned}:
                self.status.finalizer(claim, True)
            return len(done)

    async def create_container(self, pod: nri.PodSandbox) -> None:
        """Attach now if the sandbox's own hook was missed (started while not registered)."""
        record = self.store.get(pod.id)
        if record is not None and record.state is State.ADDED:
            return
        if self.checkpoint.for_pod(pod.uid):
            log.info("late attach for pod %s/%s at container creation", pod.namespace, pod.name)
            await self.run_pod_sandbox(pod)

    def _report(self, planned: list[AttachmentRecord], outcomes: list[Outcome]) -> None:
        for record, outcome in zip(planned, outcomes, strict=False):
            self.status.put(_claim_key(record), device_status(outcome))

    async def stop_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        start = time.perf_counter()
        try:
            await self._detach(pod.id, PodRef(pod.namespace, pod.name, pod.uid), self._answer_by())
        finally:
            elapsed = time.perf_counter() - start
            metrics.HOOK_LATENCY.labels("StopPodSandbox").observe(elapsed)

    async def remove_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        self._removed.add(pod.id)
        await self._detach(pod.id, PodRef(pod.namespace, pod.name, pod.uid), self._answer_by())

    def _answer_by(self) -> Deadline:
        """DELs in a hook must end before the runtime's timeout; what does not fit is retried."""
        return Deadline.after(self.budget.answer_seconds, "the runtime's hook timeout")

    async def _detach(
        self, sandbox_id: str, pod: PodRef | None, deadline: Deadline | None = None
    ) -> bool:
        """DEL everything of the sandbox; True when nothing is left. Failures retry later."""
        async with self._lock(sandbox_id):
            record = self.store.get(sandbox_id)
            if record is None:
                return True
            if record.state is not State.DELETING:
                record = record.with_state(State.DELETING)
                self.store.put(record)
            errors = await detach_all(
                self.runtime,
                [a.attachment() for a in record.attachments],
                sandbox_id,
                record.netns,
                deadline,
            )
            if errors and self._can_retry(record):
                message = f"pod {record.pod_namespace}/{record.pod_name}: " + "; ".join(errors)
                log.warning("detach failed, will retry: %s", message)
                if pod is not None:
                    self.status.event(pod, REASON_DETACH_FAILED, message)
                for claim in {_claim_key(a) for a in record.attachments}:
                    self.status.finalizer(claim, True)
                self._retry_detach(sandbox_id)
                return False
            if errors:
                log.error(
                    "giving up on DEL for sandbox %s, whose namespace is gone: %s",
                    sandbox_id,
                    "; ".join(errors),
                )
            self._forget(record)
            return True

    def _can_retry(self, record: SandboxRecord) -> bool:
        """Retry while the sandbox lives or its namespace still exists."""
        return record.sandbox_id not in self._removed or self.netns_exists(record.netns)

    def _forget(self, record: SandboxRecord) -> None:
        self.store.remove(record.sandbox_id)
        in_use = {_claim_key(a) for other in self.store.all() for a in other.attachments}
        for claim in {_claim_key(a) for a in record.attachments}:
            keys = [
                (DRIVER_NAME, a.pool, a.device, a.share_id or "")
                for a in record.attachments
                if _claim_key(a) == claim
            ]
            self.status.drop(claim, keys)
            if claim not in in_use:  # another sandbox (a shared claim) may still use it
                self.status.finalizer(claim, False)
        self._locks.pop(record.sandbox_id, None)

    def _retry_detach(self, sandbox_id: str, first_delay: float | None = None) -> None:
        if sandbox_id in self._retries and not self._retries[sandbox_id].done():
            return
        self._retries[sandbox_id] = asyncio.create_task(
            self._retry_loop(sandbox_id, first_delay), name=f"detach-{sandbox_id[:12]}"
        )

    async def _retry_loop(self, sandbox_id: str, first_delay: float | None) -> None:
        delay = self.retry_initial if first_delay is None else first_delay
        while True:
            await asyncio.sleep(delay)
            if await self._detach(sandbox_id, None):
                log.info("detached sandbox %s after retrying", sandbox_id[:12])
                return
            delay = min(max(delay, self.retry_initial) * 2, self.retry_max)

    # ------------------------------------------------------------------ reconcile

    async def synchronize(self, pods: list[nri.PodSandbox]) -> None:
        """Make the records match the sandboxes the runtime has."""
        live = {p.id: p for p in pods}
        for record in self.store.all():
            pod = live.get(record.sandbox_id)
            if pod is None:
                self._removed.add(record.sandbox_id)
            if pod is None or record.state is not State.ADDED:
                # gone, or interrupted mid-ADD/DEL by a restart: undo it
                await self._detach(record.sandbox_id, None)
        for pod in pods:
            if self.store.get(pod.id) is None and self.plan(pod) and netns_of(pod):
                # the pod started while cnidra was not connected: attach now
                with contextlib.suppress(AttachError):
                    await self.run_pod_sandbox(pod)
        await self.sweep()
        await self.garbage_collect()

    async def sweep(self) -> int:
        """Undo attachments of sandboxes whose network namespace is gone: the runtime removed
        them without a hook reaching cnidra (a runtime restart mid-creation, a missed event)."""
        swept = 0
        for record in self.store.all():
            if record.sandbox_id in self._retries and not self._retries[record.sandbox_id].done():
                continue
            if not self.netns_exists(record.netns):
                self._removed.add(record.sandbox_id)
                log.info(
                    "sandbox %s of pod %s/%s is gone without a hook; cleaning up",
                    record.sandbox_id[:12],
                    record.pod_namespace,
                    record.pod_name,
                )
                await self._detach(record.sandbox_id, None)
                swept += 1
        return swept

    async def run_sweeper(self, interval: float = 10.0) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sweep()
            except Exception:
                log.exception("sweeping sandbox records failed")

    async def garbage_collect(self) -> None:
        """CNI GC (the plugins' own, e.g. host-local freeing leaked addresses) of the networks
        cnidra owns, with every attachment its records hold as valid. Never a DEL from the
        cache: what is stale was undone from the records by `synchronize` and `sweep`."""
        networks: dict[str, NetworkConfigList] = {}
        configs = [d.network for c in self.checkpoint.all() for d in c.devices]
        configs += [a.network for r in self.store.all() for a in r.attachments]
        for config in configs:
            with contextlib.suppress(CNIRuntimeError):
                net = NetworkConfigList.from_dict(config)
                if is_owned(net.name):  # records of cnidra 0.1 may name a shared network
                    networks.setdefault(net.name, net)
        valid = [
            GCAttachment(r.sandbox_id, a.if_name) for r in self.store.all() for a in r.attachments
        ]
        for net in networks.values():
            try:
                await self.runtime.gc(net, valid, stale_cached=False)
            except Exception as exc:
                log.warning("CNI GC of network %s: %s", net.name, exc)

    def restore_status(self) -> None:
        """After a restart: re-derive the status of every attachment that is set up."""
        for record in self.store.all():
            if record.state is not State.ADDED:
                continue
            for att in record.attachments:
                if att.result is None:
                    continue
                outcome = Outcome(att.attachment(), Result(att.result))
                self.status.put(_claim_key(att), device_status(outcome))

    async def unprepare_claim(self, ref: ClaimRef) -> None:
        """Called before a claim is forgotten: its interfaces must be gone first."""
        for record in self.store.all():
            uses_claim = any(a.claim_uid == ref.uid for a in record.attachments)
            if uses_claim and not await self._detach(record.sandbox_id, None):
                raise RuntimeError(
                    f"interfaces of claim {ref} in sandbox "
                    f"{record.sandbox_id[:12]} are still being removed"
                )


def _claim_key(record: AttachmentRecord) -> ClaimKey:
    return ClaimKey(record.claim_namespace, record.claim_name, record.claim_uid)
