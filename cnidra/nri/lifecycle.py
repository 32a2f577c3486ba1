"""A pod sandbox's secondary interfaces: attach on RunPodSandbox (or, as a safety net, at its
first CreateContainer), detach on StopPodSandbox/RemovePodSandbox, retry a failed detach.

Nothing here talks to the apiserver: claims come from the checkpoint NodePrepareResources
wrote, and what the node tells about them goes to a StatusSink that writes it later. The
write-ahead sandbox record is the state machine:

    none --adding--> ADDING --ADDs ok--> ADDED --deleting--> DELETING --DELs ok--> none
                       |                                        ^
                       +--ADD failed, rolled back--> none       |
                       +--rollback failed, or cancelled --------+ (retried with backoff)

Attachments of one pod are ADDed in a fixed order: claims by namespace/name, then each claim's
devices in allocation order; DEL runs in the reverse order. The rest has rooms of its own:
the hook budget (`budget.py`), what is set up on an interface besides its plugins (`setup.py`:
rate limits, network policy), an attached sandbox changed one part at a time (`hotplug.py`),
and the status, Events, annotation and finalizer projected from the outcomes and records
(`reporting.py`). Reconciling the records with the runtime (Synchronize, the sweeper, GC) is
in `reconcile.py`, through the methods below."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Collection

from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra.api.constants import DEFAULT_MAX_ATTACHMENTS
from cnidra.api.naming import NamingError, check_unique
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import AttachFailed, attach_all, detach_all
from cnidra.cni.invoke import Deadline
from cnidra.cni.runtime import CNIRuntime
from cnidra.datapath import shaping
from cnidra.nri.budget import HookBudget
from cnidra.nri.hotplug import HotPlug, PlugError
from cnidra.nri.reporting import Reporting, count_failure, observe_del
from cnidra.nri.setup import (
    SHAPING_TIMEOUT,
    BandwidthHook,
    InterfaceSetup,
    PolicyHook,
    Shaper,
)
from cnidra.observe.interfaces import PodInterface
from cnidra.state import journal as events
from cnidra.state.checkpoint import Checkpoint
from cnidra.state.journal import Journal
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State
from cnidra.status.metadata import DeviceMetadata
from cnidra.status.writer import StatusSink
from cnidra.util.backoff import Backoff
from cnidra.util.locks import Busy, KeyedLocks
from cnidra.util.workqueue import WorkQueue

log = logging.getLogger(__name__)

# the names callers take from here, the rooms' included
__all__ = [
    "SHAPING_TIMEOUT",
    "AttachError",
    "HookBudget",
    "PlugError",
    "PodLifecycle",
    "PolicyHook",
    "is_node_netns",
    "netns_of",
    "pod_ref",
]


class AttachError(Exception):
    """Fails the RunPodSandbox hook, so the sandbox fails and kubelet retries."""


def netns_of(pod: nri.PodSandbox) -> str:
    """The sandbox's network namespace. A sandbox containerd recovered after dying mid-creation
    comes without its spec (containerd 2.x stores it late), so only with its pause process's
    pid: the namespace is then reached through /proc (the DaemonSet runs with hostPID)."""
    for ns in pod.linux.namespaces:
        if ns.type == "network" and ns.path:
            return ns.path
    return f"/proc/{pod.pid}/ns/net" if pod.pid else ""


def is_node_netns(path: str) -> bool:
    """Whether `path` is the namespace the driver itself runs in: the node's (hostNetwork)."""
    try:
        there, here = os.stat(path), os.stat("/proc/self/ns/net")
    except OSError:
        return False
    return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)


def pod_ref(pod: nri.PodSandbox) -> ObjectRef:
    return ObjectRef(pod.namespace, pod.name, pod.uid)


class PodLifecycle:
    def __init__(
        self,
        checkpoint: Checkpoint,
        runtime: CNIRuntime,
        store: SandboxStore,
        status: StatusSink,
        *,
        retry: Callable[[], Backoff] = lambda: Backoff(0.5, 30.0),
        netns_exists: Callable[[str], bool] = os.path.exists,
        concurrent: bool = False,
        budget: HookBudget | None = None,
        max_attachments: int = DEFAULT_MAX_ATTACHMENTS,
        protected_links: Callable[[], frozenset[str]] = frozenset,
        node_netns: Callable[[str], bool] = is_node_netns,
        metadata: DeviceMetadata | None = None,
        journal: Journal | None = None,
        network_status: bool = True,
        hold_from_attach: bool = False,
        shaper: Shaper = shaping,
        policy: PolicyHook | None = None,
        bandwidth: BandwidthHook | None = None,
        locks: KeyedLocks | None = None,
    ) -> None:
        """`hold_from_attach`: a claim carries the detach finalizer from its first interface
        on (two more requests per claim), not only once a DEL of its interfaces failed.
        `shaper`: what holds an interface whose attachment has a `rate` to it, right after
        its ADD (a failure fails the attachment), and removes it after an unplug's DEL.
        `bandwidth`: the limits that depend on more than the attachment (cnidra.nri.bandwidth).
        `locks`: the sandboxes' locks, when others take them too (the bandwidth keeper)."""
        self.checkpoint = checkpoint
        self.runtime = runtime
        self.store = store
        self.retry = retry
        self.netns_exists = netns_exists
        self.concurrent = concurrent
        self.budget = budget or HookBudget()
        self.max_attachments = max_attachments
        self.protected_links = protected_links
        self.node_netns = node_netns
        self.journal = journal or Journal(None)
        # the rooms: what the node tells, what an interface holds besides its plugins, and
        # an attached sandbox changed one part at a time
        self.reporting = Reporting(
            store,
            status,
            metadata=metadata,
            network_status=network_status,
            hold_from_attach=hold_from_attach,
        )
        self.setup = InterfaceSetup(shaper, policy, self.journal, bandwidth)
        self.hotplug = HotPlug(self)
        self.locks = KeyedLocks() if locks is None else locks
        # detaches to try again, keyed by sandbox, each due after its own backoff (the keyed
        # work queue's shape, cnidra.util.workqueue), worked by one task while any is queued
        self.detaches: WorkQueue[str] = WorkQueue(retry)
        self._detach_worker: asyncio.Task[None] | None = None
        self._detach_queued = asyncio.Event()
        # sandboxes the runtime removed (or that vanished) while cnidra still holds a record;
        # dropped with the record
        self.removed: set[str] = set()
        # sandboxes of cnidra's the runtime stopped (a stopped sandbox never runs again): no
        # attach may start for them, and their records are undone even when `added`; each is
        # dropped at its RemovePodSandbox, or at a Synchronize that no longer lists it
        self.stopped: set[str] = set()

    @property
    def held(self) -> set[ObjectRef]:
        """Claims whose detach finalizer may be set (Reporting.held)."""
        return self.reporting.held

    # ------------------------------------------------------------------ planning

    def plan(self, pod: nri.PodSandbox) -> list[Attached]:
        """The pod's attachments from the checkpoint, with the pod's CNI_ARGS."""
        ref = pod_ref(pod)
        return [
            Attached(device.for_pod(ref, pod.id))
            for claim in self.checkpoint.for_pod(pod.uid)
            for device in claim.devices
        ]

    # ------------------------------------------------------------------ attach

    async def attach(self, pod: nri.PodSandbox, *, behind_sandbox: bool = False) -> int:
        """ADD the pod's attachments; returns how many were added now (0: nothing to do).
        `behind_sandbox`: no hook waits to answer on them (HookBudget)."""
        planned = self.plan(pod)
        if not planned:
            return 0
        refusal = self._refusal(pod, planned)
        if refusal:
            for attached in planned:
                count_failure(attached.attachment, "refused")
            self.reporting.attach_failed(pod_ref(pod), refusal)
            self.journal.record(events.ATTACH_FAILED, pod_ref(pod), pod.id, refusal)
            raise AttachError(refusal)
        netns = netns_of(pod)
        async with self.locks.hold(pod.id):
            if self._going(pod.id):
                return 0  # stopped while this waited (a Synchronize's list of pods is old)
            existing = self.store.get(pod.id)
            if existing is not None and existing.state is State.ADDED:
                return 0  # the hook ran already (reconnect, or a late attach)
            at_start = tuple(a for a in planned if not a.attachment.on_demand)
            record = SandboxRecord(pod.id, pod_ref(pod), netns, State.ADDING, at_start)
            await self.store.put(record)  # write-ahead: a crash from here on is undone
            return await self._add(pod, record, behind_sandbox)

    def _refusal(self, pod: nri.PodSandbox, planned: list[Attached]) -> str | None:
        """Why the pod's interfaces must not be set up, checked at every attach."""
        who = f"pod {pod.namespace}/{pod.name}"
        if len(planned) > self.max_attachments:  # prepare refuses this; a checkpoint may predate
            return (
                f"{who} has {len(planned)} cnidra interfaces; at most {self.max_attachments} "
                "per pod (--max-attachments-per-pod)"
            )
        try:  # the naming rule, over all of the pod's claims (prepare named them)
            check_unique([(a.attachment.label_without_name, a.attachment.if_name) for a in planned])
        except NamingError as exc:
            return f"{who}: {exc}"
        protected = self.protected_links()  # routes change: checked again at every attach
        for attached in planned:
            att = attached.attachment
            if att.parent in protected and not att.node_link_allowed:
                return (
                    f"{who}: claim {att.claim} request {att.request} would use link "
                    f"{att.parent!r}, which now carries the node itself (its default route or "
                    "address); refused"
                )
        netns = netns_of(pod)
        if not netns:
            return f"{who}: the runtime gave no network namespace for the sandbox"
        if self.node_netns(netns):
            return (
                f"{who} shares the node's network namespace (hostNetwork); cnidra attaches "
                "interfaces only to a pod's own namespace"
            )
        return None

    async def _add(self, pod: nri.PodSandbox, record: SandboxRecord, behind_sandbox: bool) -> int:
        attachments = [self.setup.limited(a.attachment) for a in record.attachments]
        started = time.perf_counter()
        budget = self.budget.deadlines(behind_sandbox=behind_sandbox)
        try:
            outcomes = await attach_all(
                self.runtime,
                attachments,
                pod.id,
                record.netns,
                concurrent=self.concurrent,
                budget=budget,
                after_add=self.setup.after_add(record.netns, budget.add, record, dict(pod.labels)),
            )
        except asyncio.CancelledError:
            # the runtime gave up on the hook, or the connection dropped: a background detach
            # undoes whatever the record lists (a crash before it runs leaves `adding`, which
            # the next Synchronize undoes)
            log.warning("attach of %s/%s cancelled; rolling back", pod.namespace, pod.name)
            for attachment in attachments:
                count_failure(attachment, "cancelled")
            self.retry_detach(pod.id, first_delay=0.0)
            raise
        except AttachFailed as failed:
            count_failure(failed.failed.attachment, failed.failed.reason or "runtime")
            if failed.cleanup_errors:
                await self.store.put(record.with_state(State.DELETING))
                self.retry_detach(pod.id)
            else:
                await self.store.remove(pod.id)
            self.setup.interfaces_changed()
            self.reporting.outcomes(failed.outcomes)
            message = f"pod {pod.namespace}/{pod.name}: {failed}"
            self.reporting.attach_failed(pod_ref(pod), message)
            self.journal.record(
                events.ATTACH_FAILED,
                pod_ref(pod),
                pod.id,
                str(failed),
                (time.perf_counter() - started) * 1000,
            )
            raise AttachError(message) from None
        done = tuple(
            Attached(o.attachment, o.result.to_json() if o.result else None) for o in outcomes
        )
        added = record.with_state(State.ADDED, attachments=done)
        await self.store.put(added)
        self.setup.attached(added)
        self.reporting.outcomes(outcomes, pod_ref(pod))
        self.reporting.annotate(record.pod, done, pod)
        self.journal.record(
            events.ATTACHED,
            pod_ref(pod),
            pod.id,
            "attached " + ", ".join(f"{a.if_name} ({a.network_label})" for a in attachments)
            if attachments
            else "sandbox recorded; its on-demand networks wait for the node API",
            (time.perf_counter() - started) * 1000,
            interfaces=[a.if_name for a in attachments],
        )
        self.reporting.attached_claims(record.claims())  # else held once a DEL fails
        return len(done)

    # ------------------------------------------------------------------ detach

    def forget_sandbox(self, sandbox_id: str) -> None:
        """The runtime removed the sandbox: a failing DEL stops retrying once its netns is gone."""
        self.stopped.discard(sandbox_id)
        if self.store.get(sandbox_id) is not None:
            self.removed.add(sandbox_id)

    def sandbox_stopped(self, sandbox_id: str) -> None:
        """StopPodSandbox: nothing attaches to the sandbox from now on."""
        if self.store.get(sandbox_id) is not None or sandbox_id in self.locks.busy():
            self.stopped.add(sandbox_id)

    def runtime_lists(self, sandbox_ids: Collection[str]) -> None:
        """Synchronize: the runtime has these sandboxes and forgot every other; a stopped
        sandbox it no longer lists is forgotten too (its RemovePodSandbox may be lost)."""
        self.stopped &= set(sandbox_ids)

    def vanished(self, record: SandboxRecord) -> bool:
        """The sandbox's network namespace is gone without a hook, and no detach of it is
        retrying (the sweeper's question)."""
        return not self.retrying(record.sandbox_id) and not self.netns_exists(record.netns)

    def _going(self, sandbox_id: str) -> bool:
        """The runtime stopped or removed the sandbox: it never runs again."""
        return sandbox_id in self.stopped or sandbox_id in self.removed

    def _undone_anyway(self, record: SandboxRecord) -> bool:
        """An `added` record is left alone unless its sandbox is going."""
        return record.state is not State.ADDED or self._going(record.sandbox_id)

    def netns_for_del(self, record: SandboxRecord) -> str:
        """Where to DEL: never in the node's own namespace. A record reaching a sandbox through
        its pause pid (`/proc/<pid>/ns/net`) would point there if the pause died and the pid
        went to a host process; DEL then runs without a namespace (the plugins only release
        what they hold, as for a sandbox whose namespace is gone)."""
        return "" if self.node_netns(record.netns) else record.netns

    def in_node_netns(self, path: str) -> bool:
        return self.node_netns(path)

    async def detach(
        self,
        sandbox_id: str,
        pod: ObjectRef | None,
        deadline: Deadline | None = None,
        *,
        unfinished_only: bool = False,
    ) -> bool:
        """DEL everything of the sandbox; True when nothing is left. Failures retry later.
        `unfinished_only`: undo the record only if, under the sandbox's lock, it is still not
        `added` or its sandbox is going (a record read as `adding` may be an ADD in flight in
        this process, which the lock waits for; one that succeeded is left alone). With a
        `deadline` (a hook's), a lock still busy at the deadline hands the detach to a retry
        in the background, so the hook answers in time."""
        if self.store.get(sandbox_id) is None:
            return True  # not cnidra's: no lock, no state for other owners' pods
        try:
            async with self.locks.hold(sandbox_id, deadline.remaining() if deadline else None):
                return await self._detach_held(sandbox_id, pod, deadline, unfinished_only)
        except Busy:
            # the lock is busy past the hook's time (another detach's DELs, an ADD that is
            # unwinding): the hook answers, and a retry undoes the record once it is free
            log.info("sandbox %s is busy; its detach goes on in the background", sandbox_id[:12])
            self.retry_detach(sandbox_id)
            return False

    async def detach_claim(self, sandbox_id: str, claim: ObjectRef) -> bool:
        """DEL the attachments of `claim` in the sandbox, and only those (NodeUnprepare of one
        claim of a pod that has others); True when none of them is left. A sandbox whose
        record is not `added` (a crash left it half-done, an ADD runs behind it) or that is
        going, or whose every attachment is the claim's, is detached whole, as before. The
        DEL is written ahead (the attachments marked pending: a crash leaves them to the
        next Synchronize's `finish_unplugs`); a failure holds the claim and is kubelet's to
        retry (NodeUnprepareResources fails)."""
        if self.store.get(sandbox_id) is None:
            return True
        async with self.locks.hold(sandbox_id):
            record = self.store.get(sandbox_id)
            if record is None:
                return True
            going = [a for a in record.attachments if a.attachment.claim.uid == claim.uid]
            if not going:
                return True
            if self._undone_anyway(record) or len(going) == len(record.attachments):
                return await self._detach_held(sandbox_id, None, None, False)
            errors = await self.hotplug.detach_part(sandbox_id, record, going)
            if errors:
                message = "; ".join(errors)
                log.warning("detach of claim %s from pod %s failed: %s", claim, record.pod, message)
                self.journal.record(events.DETACH_FAILED, record.pod, sandbox_id, message)
                self.reporting.hold(going[0].attachment.claim)
                return False
            names = ", ".join(
                f"{a.attachment.if_name} ({a.attachment.network_label})" for a in going
            )
            self.journal.record(events.DETACHED, record.pod, sandbox_id, f"detached {names}")
            self.reporting.removed(record.pod, [a.attachment for a in going])
            return True

    async def _detach_held(
        self,
        sandbox_id: str,
        pod: ObjectRef | None,
        deadline: Deadline | None,
        unfinished_only: bool,
    ) -> bool:
        """detach's work, under the sandbox's lock."""
        record = self.store.get(sandbox_id)
        if record is None:
            return True
        if unfinished_only and not self._undone_anyway(record):
            return True
        if record.state is not State.DELETING:
            record = record.with_state(State.DELETING)
            await self.store.put(record)
        errors = await detach_all(
            self.runtime,
            [a.attachment for a in record.attachments],
            sandbox_id,
            self.netns_for_del(record),
            deadline,
            on_done=observe_del,
        )
        if errors and self._can_retry(record):
            message = f"pod {record.pod}: " + "; ".join(errors)
            log.warning("detach failed, will retry: %s", message)
            self.journal.record(events.DETACH_FAILED, record.pod, sandbox_id, "; ".join(errors))
            if pod is not None:
                self.reporting.detach_failed(pod, message)
            for claim in record.claims():
                self.reporting.hold(claim)
            self.retry_detach(sandbox_id)
            return False
        if errors:
            log.error(
                "giving up on DEL for sandbox %s, whose namespace is gone: %s",
                sandbox_id,
                "; ".join(errors),
            )
        await self._forget(record)
        self.journal.record(
            events.DETACHED,
            record.pod,
            sandbox_id,
            "detached " + ", ".join(a.attachment.if_name for a in record.attachments),
        )
        if record.attachments and not errors:
            self.reporting.removed(record.pod, [a.attachment for a in record.attachments])
        return True

    def _can_retry(self, record: SandboxRecord) -> bool:
        """Retry while the sandbox lives or its namespace still exists."""
        return record.sandbox_id not in self.removed or self.netns_exists(record.netns)

    async def _forget(self, record: SandboxRecord) -> None:
        await self.store.remove(record.sandbox_id)
        self.setup.forget(record)
        self.removed.discard(record.sandbox_id)
        self.reporting.forgotten(record)

    def retry_detach(self, sandbox_id: str, first_delay: float | None = None) -> None:
        """Queue the sandbox's detach to be tried again: after `first_delay` seconds, or its
        backoff's first step; a sandbox queued already keeps its place."""
        if sandbox_id in self.detaches:
            return
        if first_delay is None:
            self.detaches.retry(sandbox_id)
        else:
            self.detaches.add(sandbox_id, first_delay)
        self._detach_queued.set()
        if self._detach_worker is None or self._detach_worker.done():
            self._detach_worker = asyncio.create_task(self._work_detaches(), name="detach-retries")

    def retrying(self, sandbox_id: str) -> bool:
        return sandbox_id in self.detaches

    async def _work_detaches(self) -> None:
        """The queued detaches, each when due (those due together at once, each sandbox's DELs
        under its own lock); one that fails is queued again after its next backoff step, one
        done or no longer ours is dropped. Ends when none is queued."""
        while (wait := self.detaches.wait()) is not None:
            if wait > 0:
                self._detach_queued.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._detach_queued.wait()
                continue
            await asyncio.gather(*(self._detach_again(s) for s in self.detaches.due()))

    async def _detach_again(self, sandbox_id: str) -> None:
        record = self.store.get(sandbox_id)
        if record is None or not self._undone_anyway(record):
            self.detaches.done(sandbox_id)  # undone meanwhile, or attached again: not ours
            return
        try:
            if await self.detach(sandbox_id, None, unfinished_only=True):
                log.info("detached sandbox %s after retrying", sandbox_id[:12])
                self.detaches.done(sandbox_id)
                return
        except Exception:
            log.exception("retrying the detach of sandbox %s", sandbox_id[:12])
        self.detaches.retry(sandbox_id)

    # ------------------------------------------------------------------ the rooms' faces
    # (callers that hold the lifecycle as one face: the Reconciler, the tests)

    async def plug(self, sandbox_id: str, claim: str, request: str) -> Attached:
        return await self.hotplug.plug(sandbox_id, claim, request)

    async def unplug(self, sandbox_id: str, claim: str, request: str) -> None:
        await self.hotplug.unplug(sandbox_id, claim, request)

    async def finish_unplugs(self, record: SandboxRecord) -> None:
        await self.hotplug.finish_unplugs(record)

    def released(self, claim: ObjectRef, generated: bool) -> None:
        self.reporting.released(claim, generated)

    def interfaces(self) -> list[PodInterface]:
        return self.reporting.interfaces()

    def shaped_interfaces(self) -> list[PodInterface]:
        return self.reporting.shaped_interfaces()

    def restore_status(self) -> None:
        self.reporting.restore()
