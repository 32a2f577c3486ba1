"""Making cnidra's sandbox records agree with the runtime, from the records alone: on every
Synchronize (driver start, runtime restart, reconnect), periodically (the sweeper), and before
a claim is unprepared. Only what a record says cnidra added is ever DELed (docs/state.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from typing import Protocol

from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra.api.ownership import is_owned
from cnidra.api.refs import ObjectRef
from cnidra.cni.errors import CNIRuntimeError
from cnidra.cni.invoke import Deadline
from cnidra.cni.runtime import CNIRuntime
from cnidra.cni.types import GCAttachment, NetworkConfigList
from cnidra.nri.lifecycle import AttachError, netns_of
from cnidra.state import journal as events
from cnidra.state.checkpoint import Checkpoint
from cnidra.state.journal import Journal
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State

log = logging.getLogger(__name__)


class Sandboxes(Protocol):
    """What the Reconciler asks of the pod lifecycle (`PodLifecycle`): the records, the
    checkpoint, the runtime and the journal to read, and the state machine's transitions to
    run. The Reconciler changes none of the lifecycle's fields itself."""

    @property
    def store(self) -> SandboxStore: ...
    @property
    def checkpoint(self) -> Checkpoint: ...
    @property
    def runtime(self) -> CNIRuntime: ...
    @property
    def journal(self) -> Journal: ...

    def plan(self, pod: nri.PodSandbox) -> list[Attached]: ...

    async def attach(self, pod: nri.PodSandbox, *, behind_sandbox: bool = False) -> int: ...

    async def detach(
        self,
        sandbox_id: str,
        pod: ObjectRef | None,
        deadline: Deadline | None = None,
        *,
        unfinished_only: bool = False,
    ) -> bool: ...

    async def detach_claim(self, sandbox_id: str, claim: ObjectRef) -> bool: ...

    async def finish_unplugs(self, record: SandboxRecord) -> None: ...

    def runtime_lists(self, sandbox_ids: Collection[str]) -> None: ...

    def forget_sandbox(self, sandbox_id: str) -> None: ...

    def vanished(self, record: SandboxRecord) -> bool: ...

    def released(self, claim: ObjectRef, generated: bool) -> None: ...


class Reconciler:
    def __init__(
        self, lifecycle: Sandboxes, write_problem: Callable[[], str | None] = lambda: None
    ) -> None:
        self.lifecycle = lifecycle
        self.write_problem = write_problem  # why the state root cannot be written, or None
        self.state_problem: str | None = None
        self.synchronized = 0  # Synchronize passes finished, their sweep and GC included
        self._said = False

    async def synchronize(self, pods: list[nri.PodSandbox]) -> None:
        """Undo records of sandboxes the runtime no longer has, and records a crash left
        half-done; attach pods that started while cnidra was away; then GC."""
        life = self.lifecycle
        live = {p.id: p for p in pods}
        life.runtime_lists(live)  # the runtime forgot the others: their Remove may be lost
        for record in life.store.all():
            pod = live.get(record.sandbox_id)
            if pod is None:
                life.forget_sandbox(record.sandbox_id)
            if pod is None or record.state is not State.ADDED:
                # a live pod's record not `added`: a crash left it half-done, or its ADDs run
                # behind the sandbox in this process right now (NRI reconnected meanwhile);
                # the sandbox's lock tells them apart
                try:
                    await life.detach(record.sandbox_id, None, unfinished_only=pod is not None)
                except Exception:  # retried by the sweeper; the other records go on
                    log.exception("undoing sandbox %s failed", record.sandbox_id[:12])
            elif any(a.pending for a in record.attachments):
                await life.finish_unplugs(record)
        for pod in pods:
            if life.store.get(pod.id) is None and netns_of(pod) and life.plan(pod):
                try:
                    await life.attach(pod)
                except AttachError as exc:  # its Event is written; the pod runs without it
                    log.error("late attach of pod %s/%s failed: %s", pod.namespace, pod.name, exc)
                except Exception:  # one pod's failure must not stop the others' attach
                    log.exception("late attach of pod %s/%s failed", pod.namespace, pod.name)
        await self.sweep()
        await self.garbage_collect()
        self.synchronized += 1

    async def sweep(self) -> int:
        """Undo attachments of sandboxes whose network namespace is gone: the runtime removed
        them without a hook reaching cnidra (a runtime restart mid-creation, a missed event)."""
        life = self.lifecycle
        swept = 0
        for record in life.store.all():
            if not life.vanished(record):
                continue
            life.forget_sandbox(record.sandbox_id)
            log.info(
                "sandbox %s of pod %s is gone without a hook; cleaning up",
                record.sandbox_id[:12],
                record.pod,
            )
            life.journal.record(
                events.SWEPT,
                record.pod,
                record.sandbox_id,
                "the sandbox's network namespace is gone without a hook; undoing its interfaces",
            )
            await life.detach(record.sandbox_id, None)
            swept += 1
        return swept

    async def run_sweeper(self, interval: float = 10.0) -> None:
        """Sweep every `interval`; a state root that cannot be written (full, read-only) fails
        that sweep only: said once in the log and in `state_problem` (health, prepare), and
        the next sweep tries again."""
        while True:
            await asyncio.sleep(interval)
            self.state_problem = await asyncio.to_thread(self.write_problem)
            if self.state_problem is not None:
                if not self._said:
                    log.warning("%s; sweeps wait until it can", self.state_problem)
                    self._said = True
                continue
            if self._said:
                log.info("cnidra's state root can be written again")
                self._said = False
            try:
                await self.sweep()
            except OSError as exc:  # the disk filled between the probe and a write
                log.warning("sandbox sweep stopped: %s; the next one tries again", exc)

    async def garbage_collect(self) -> None:
        """CNI GC (the plugins' own, e.g. host-local freeing leaked addresses) of the networks
        cnidra owns, with every attachment its records hold as valid. Never a DEL from the
        cache: what is stale was undone from the records above."""
        life = self.lifecycle
        networks: dict[str, NetworkConfigList] = {}
        attachments = [d for c in life.checkpoint.all() for d in c.devices]
        attachments += [a.attachment for r in life.store.all() for a in r.attachments]
        for attachment in attachments:
            with contextlib.suppress(CNIRuntimeError):
                net = attachment.netconf
                if is_owned(net.name):  # records of cnidra 0.1 may name a shared network
                    networks.setdefault(net.name, net)
        valid = [
            GCAttachment(r.sandbox_id, a.attachment.if_name)
            for r in life.store.all()
            for a in r.attachments
        ]
        for net in networks.values():
            try:
                await life.runtime.gc(net, valid, stale_cached=False)
            except Exception as exc:
                log.warning("CNI GC of network %s: %s", net.name, exc)

    async def unprepare_claim(self, ref: ObjectRef) -> None:
        """Called before a claim is forgotten: its interfaces must be gone first (DELed from
        each sandbox that holds them, the sandbox's other attachments left alone). Then the
        status writer is told kubelet is done with it (what it need not write any more)."""
        for record in self.lifecycle.store.all():
            # only the claim's own attachments: the sandbox's other claims' stay
            if ref.uid in {
                c.uid for c in record.claims()
            } and not await self.lifecycle.detach_claim(record.sandbox_id, ref):
                raise RuntimeError(
                    f"interfaces of claim {ref} in sandbox "
                    f"{record.sandbox_id[:12]} are still being removed"
                )
        prepared = self.lifecycle.checkpoint.get(ref.uid)
        # made from a template for one pod: the claim controller names the pod's claim on it
        # and reserves it for that pod alone (a PodGroup's claim is reserved for the group)
        generated = (
            prepared is not None
            and prepared.pod_claim_name is not None
            and len(prepared.pod_uids) == 1
        )
        self.lifecycle.released(prepared.ref if prepared else ref, generated)
