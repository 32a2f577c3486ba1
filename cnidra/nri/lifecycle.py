"""A pod sandbox's secondary interfaces: attach on RunPodSandbox (or, as a safety net, at its
first CreateContainer), detach on StopPodSandbox/RemovePodSandbox, retry a failed detach.

Nothing here talks to the apiserver: claims come from the checkpoint NodePrepareResources
wrote, and status, events and finalizers go to a StatusSink that writes them later. The
write-ahead sandbox record is the state machine:

    none --adding--> ADDING --ADDs ok--> ADDED --deleting--> DELETING --DELs ok--> none
                       |                                        ^
                       +--ADD failed, rolled back--> none       |
                       +--rollback failed, or cancelled --------+ (retried with backoff)

Attachments of one pod are ADDed in a fixed order: claims by namespace/name, then each claim's
devices in allocation order; DEL runs in the reverse order. Reconciling the records with the
runtime (Synchronize, the sweeper, GC) is in `reconcile.py`."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra.api.bandwidth import Rate
from cnidra.api.constants import DEFAULT_MAX_ATTACHMENTS, DRIVER_NAME
from cnidra.api.naming import NamingError, check_unique
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import (
    AfterAdd,
    AttachFailed,
    Attachment,
    Budget,
    Outcome,
    SetupFailed,
    attach_all,
    detach_all,
)
from cnidra.cni.invoke import Deadline
from cnidra.cni.result import Result
from cnidra.cni.runtime import CNIRuntime
from cnidra.datapath import shaping
from cnidra.observe import metrics
from cnidra.observe.interfaces import PodInterface
from cnidra.state import journal as events
from cnidra.state.checkpoint import Checkpoint
from cnidra.state.journal import Journal
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State
from cnidra.status.devices import (
    NETWORK_STATUS_ANNOTATION,
    DeviceKey,
    device_status_of,
    network_status,
)
from cnidra.status.metadata import DeviceMetadata
from cnidra.status.writer import SeenAnnotations, StatusSink
from cnidra.util.backoff import Backoff
from cnidra.util.locks import Busy, KeyedLocks

log = logging.getLogger(__name__)

REASON_ATTACH_FAILED = "NetworkAttachFailed"
# Normal events, as Multus writes them: what `kubectl describe pod` shows first
REASON_ADDED = "AddedInterface"
REASON_REMOVED = "RemovedInterface"
REASON_DETACH_FAILED = "NetworkDetachFailed"
# containerd's default NRI plugin_request_timeout; the runtime tells the real one in Configure.
DEFAULT_REQUEST_TIMEOUT = 2.0
# Of the runtime's hook timeout: ADDs may use 60 %, rollback DELs must be done by 90 %, so the
# hook answers before containerd gives up on cnidra (it would start the sandbox without the
# interfaces and drop the connection).
ATTACH_SHARE = 0.6
ANSWER_SHARE = 0.9
# the most one rate limit's apply or removal may take (within a hook: what is left of its ADD
# budget, if less)
SHAPING_TIMEOUT = shaping.DEFAULT_TIMEOUT_SECONDS
REASON_SHAPING = "shaping"  # the ATTACH_FAILURES reason of a rate limit that failed
# all of a pod's ADDs behind its sandbox, unless --attach-budget says otherwise: the driver
# passes its plugin timeout (--cni-timeout)
DEFAULT_BEHIND_SANDBOX = 10.0


class Shaper(Protocol):
    """Rate limits on pod interfaces (cnidra.datapath.shaping; tests pass a fake). Both raise
    shaping.ShapingError (Gone: the namespace or interface is not there)."""

    def apply(self, netns: str, interface: str, limit: Rate, *, timeout: float) -> object: ...

    def remove(self, netns: str, interface: str, *, timeout: float) -> bool: ...


class PolicyHook(Protocol):
    """Network policy at attach and detach (cnidra.nri.netpolicy.PolicyEnforcer): the
    interface's table applied right after its ADD from what is in memory (SetupFailed fails
    the attachment), the addresses told once the sandbox is set up, tables dropped."""

    async def at_add(
        self,
        record: SandboxRecord,
        labels: Mapping[str, str] | None,
        att: Attachment,
        deadline: Deadline | None,
    ) -> None: ...

    def attached(self, record: SandboxRecord) -> None: ...

    async def detached(self, record: SandboxRecord, attachments: Sequence[Attachment]) -> None: ...

    def forget(self, record: SandboxRecord) -> None: ...


class BandwidthHook(Protocol):
    """The limits that depend on more than the attachment (cnidra.nri.bandwidth.
    BandwidthKeeper): the limit an interface gets at its ADD, decided from what is in memory
    (the class's rules as last watched, the other interfaces on its link), and word that
    interfaces came or went, so the others' limits follow off the hook path."""

    def limit_of(self, att: Attachment) -> Rate | None: ...

    def changed(self) -> None: ...


class AttachError(Exception):
    """Fails the RunPodSandbox hook, so the sandbox fails and kubelet retries."""


class PlugError(Exception):
    """A node API plug or unplug that cannot be done, with why."""


@dataclass
class HookBudget:
    """How long one hook may take. Inside a hook, `attach` 0 derives the ADD budget from the
    runtime's request timeout, and a configured value above what fits is cut down to fit.
    Behind the sandbox (the RunPodSandbox hook has answered; the pod's CreateContainer waits
    for the ADDs, and fails and is tried again while they run) no hook's answer waits on the
    ADDs: they get `attach` when set, else `behind` (the plugin timeout), so a node slowed
    down by a burst or a restart does not kill ADDs that would have finished, only to do them
    again at the next try."""

    attach: float = 0.0
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    behind: float = DEFAULT_BEHIND_SANDBOX

    @property
    def answer_seconds(self) -> float:
        return self.request_timeout * ANSWER_SHARE

    @property
    def attach_seconds(self) -> float:
        fits = self.request_timeout * ATTACH_SHARE
        return min(self.attach, self.answer_seconds) if self.attach > 0 else fits

    @property
    def behind_seconds(self) -> float:
        return self.attach if self.attach > 0 else self.behind

    def deadlines(self, *, behind_sandbox: bool = False) -> Budget:
        if behind_sandbox:
            return Budget(
                add=Deadline.after(self.behind_seconds, "the pod's attach budget"),
                rollback=Deadline.after(self.behind_seconds, "the pod's rollback budget"),
            )
        return Budget(
            add=Deadline.after(self.attach_seconds, "the pod's attach budget"),
            rollback=self.answer_by(),
        )

    def answer_by(self) -> Deadline:
        return Deadline.after(self.answer_seconds, "the runtime's hook timeout")


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
    ) -> None:
        """`hold_from_attach`: a claim carries the detach finalizer from its first interface
        on (two more requests per claim), not only once a DEL of its interfaces failed.
        `shaper`: what holds an interface whose attachment has a `rate` to it, right after
        its ADD (a failure fails the attachment), and removes it after an unplug's DEL."""
        self.checkpoint = checkpoint
        self.runtime = runtime
        self.store = store
        self.status = status
        self.retry = retry
        self.netns_exists = netns_exists
        self.concurrent = concurrent
        self.budget = budget or HookBudget()
        self.max_attachments = max_attachments
        self.protected_links = protected_links
        self.node_netns = node_netns
        self.metadata = metadata
        self.journal = journal or Journal(None)
        self.network_status = network_status
        self.hold_from_attach = hold_from_attach
        self.shaper = shaper
        self.policy = policy
        self.bandwidth = bandwidth
        # claims whose finalizer may be set: asked for by this process, or left by an earlier
        # one (any claim of a record on disk at start; its process may have held it)
        self.held: set[ObjectRef] = {c for r in store.all() for c in r.claims()}
        self.locks = KeyedLocks()
        # detach retries in flight, by sandbox; each removes itself when it ends
        self.retries: dict[str, asyncio.Task[None]] = {}
        # sandboxes the runtime removed (or that vanished) while cnidra still holds a record;
        # dropped with the record
        self.removed: set[str] = set()
        # sandboxes of cnidra's the runtime stopped (a stopped sandbox never runs again): no
        # attach may start for them, and their records are undone even when `added`; each is
        # dropped at its RemovePodSandbox, or at a Synchronize that no longer lists it
        self.stopped: set[str] = set()

    # ------------------------------------------------------------------ planning

    def plan(self, pod: nri.PodSandbox) -> list[Attached]:
        """The pod's attachments from the checkpoint, with the pod's CNI_ARGS."""
        ref = pod_ref(pod)
        return [
            Attached(device.for_pod(ref, pod.id))
            for claim in self.checkpoint.for_pod(pod.uid)
            for device in claim.devices
        ]

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
                _count_failure(attached.attachment, "refused")
            self.status.event(pod_ref(pod), REASON_ATTACH_FAILED, refusal)
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

    def _limited(self, att: Attachment) -> Attachment:
        """`att` with the limit it gets now (the sandbox's record is in the store already:
        an interface that shares its link's leftover counts itself)."""
        if self.bandwidth is None:
            return att
        return replace(att, rate=self.bandwidth.limit_of(att))

    def _bandwidth_changed(self) -> None:
        if self.bandwidth is not None:
            self.bandwidth.changed()

    async def _add(self, pod: nri.PodSandbox, record: SandboxRecord, behind_sandbox: bool) -> int:
        attachments = [self._limited(a.attachment) for a in record.attachments]
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
                after_add=self._shape_after_add(record.netns, budget.add, record, dict(pod.labels)),
            )
        except asyncio.CancelledError:
            # the runtime gave up on the hook, or the connection dropped: a background detach
            # undoes whatever the record lists (a crash before it runs leaves `adding`, which
            # the next Synchronize undoes)
            log.warning("attach of %s/%s cancelled; rolling back", pod.namespace, pod.name)
            for attachment in attachments:
                _count_failure(attachment, "cancelled")
            self.retry_detach(pod.id, first_delay=0.0)
            raise
        except AttachFailed as failed:
            _count_failure(failed.failed.attachment, failed.failed.reason or "runtime")
            if failed.cleanup_errors:
                await self.store.put(record.with_state(State.DELETING))
                self.retry_detach(pod.id)
            else:
                await self.store.remove(pod.id)
            self._bandwidth_changed()
            self._report(failed.outcomes)
            message = f"pod {pod.namespace}/{pod.name}: {failed}"
            self.status.event(pod_ref(pod), REASON_ATTACH_FAILED, message)
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
        self._bandwidth_changed()
        if self.policy is not None:
            self.policy.attached(added)
        self._report(outcomes, pod_ref(pod))
        self._annotate(record.pod, done, pod)
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
        if self.hold_from_attach:  # else held once a DEL fails (see `_hold`)
            for claim in record.claims():
                self._hold(claim)
        return len(done)

    def _hold(self, claim: ObjectRef) -> None:
        """Keep the claim until its interfaces are gone. While its pod exists Kubernetes keeps
        it anyway: it stays allocated and reserved, kubelet reports the pod terminal (and so
        lets it be deleted) only once NodeUnprepareResources succeeded, which refuses while
        interfaces remain (kubelet_pods.go:1130, status_manager.go:1274, 1340, 1504 in 1.37),
        and the claim controller deallocates and deletes a claim only after that. The
        finalizer holds it beyond: a pod deleted by force, or a node lost."""
        self.held.add(claim)
        self.status.finalizer(claim, True)

    def _release(self, claim: ObjectRef) -> None:
        if claim in self.held:
            self.held.discard(claim)
            self.status.finalizer(claim, False)

    def _report(self, outcomes: list[Outcome], pod: ObjectRef | None = None) -> None:
        for outcome in outcomes:
            if outcome.ready:
                name = metrics.network_label(_network_of(outcome.attachment))
                metrics.ATTACH_DURATION.labels(name).observe(outcome.seconds)
            device = device_status_of(outcome)
            self.status.put(outcome.attachment.claim, device)
            if pod is not None and outcome.ready:
                att = outcome.attachment
                ips = ", ".join((device.network_data or {}).get("ips") or [])
                self.status.event(
                    pod,
                    REASON_ADDED,
                    f"Add {att.if_name} [{ips}] from {att.status_name or att.network_label} "
                    f"(claim {att.claim.name}, request {att.request})",
                    "Normal",
                )
            if self.metadata is not None and outcome.ready and device.network_data is not None:
                att = outcome.attachment
                try:  # local files, before the pod's containers start
                    self.metadata.attached(
                        att.claim, att.request, att.pool, att.device, device.network_data
                    )
                except OSError as exc:
                    log.warning("device metadata of claim %s: %s", att.claim, exc)

    def _annotate(
        self, pod: ObjectRef, attached: Sequence[Attached], sandbox: nri.PodSandbox | None = None
    ) -> None:
        """The pod's network-status annotation (off the hook: the status writer sends it),
        with the pod's annotations as the runtime gave them with the `sandbox`."""
        if not self.network_status:
            return
        up = [(a.attachment, Result(a.result)) for a in attached if a.result and not a.pending]
        seen = None
        if sandbox is not None:
            annotations = sandbox.annotations
            seen = SeenAnnotations(
                annotations.get(NETWORK_STATUS_ANNOTATION), bool(len(annotations))
            )
        self.status.pod_networks(pod, network_status(up), seen)

    def interfaces(self) -> list[PodInterface]:
        """Every interface attached now, for the per-interface telemetry."""
        return [
            PodInterface(
                record.netns,
                record.pod.namespace,
                record.pod.name,
                a.attachment.claim.name,
                a.attachment.request,
                a.attachment.if_name,
            )
            for record in self.store.all()
            if record.state is State.ADDED
            for a in record.attachments
            if not a.pending and a.result is not None
        ]

    def shaped_interfaces(self) -> list[PodInterface]:
        """The attached interfaces that have a rate limit, for its telemetry."""
        shaped = {
            (r.netns, a.attachment.if_name)
            for r in self.store.all()
            for a in r.attachments
            if a.attachment.rate is not None
        }
        return [i for i in self.interfaces() if (i.netns, i.interface) in shaped]

    def restore_status(self) -> None:
        """After a restart: re-derive the status of every attachment that is set up."""
        for record in self.store.all():
            if record.state is not State.ADDED:
                continue
            self._annotate(record.pod, record.attachments)
            for attached in record.attachments:
                if attached.result is not None:
                    outcome = Outcome(attached.attachment, Result(attached.result))
                    self.status.put(attached.attachment.claim, device_status_of(outcome))

    # ------------------------------------------------------------------ hot-plug

    def on_demand(self, record: SandboxRecord, claim: str, request: str) -> Attachment:
        """The pod's on-demand attachment of `claim` (its name, or the pod's name for it) and
        `request`, from the checkpoint; PlugError when there is none."""
        for prepared in self.checkpoint.for_pod(record.pod.uid):
            if claim not in (prepared.ref.name, prepared.pod_claim_name):
                continue
            for device in prepared.devices:
                if device.request == request and device.on_demand:
                    return device.for_pod(record.pod, record.sandbox_id)
        raise PlugError(
            f"pod {record.pod} has no on-demand attachment for claim {claim!r} request "
            f"{request!r} (a CNIConfig with attach: OnDemand, prepared for this pod)"
        )

    def _live_record(self, sandbox_id: str) -> SandboxRecord:
        record = self.store.get(sandbox_id)
        if record is None or record.state is not State.ADDED:
            raise PlugError(f"sandbox {sandbox_id[:12]} has no attached record to plug into")
        if self.node_netns(record.netns):
            raise PlugError(f"sandbox {sandbox_id[:12]}'s network namespace is gone")
        return record

    def _netns_for_del(self, record: SandboxRecord) -> str:
        """Where to DEL: never in the node's own namespace. A record reaching a sandbox through
        its pause pid (`/proc/<pid>/ns/net`) would point there if the pause died and the pid
        went to a host process; DEL then runs without a namespace (the plugins only release
        what they hold, as for a sandbox whose namespace is gone)."""
        return "" if self.node_netns(record.netns) else record.netns

    async def plug(self, sandbox_id: str, claim: str, request: str) -> Attached:
        """ADD an on-demand attachment to a running sandbox: the same checkpointed config,
        write-ahead record, rollback, status, finalizer and metadata as at sandbox start."""
        async with self.locks.hold(sandbox_id):
            record = self._live_record(sandbox_id)
            att = self.on_demand(record, claim, request)
            if any(a.attachment.if_name == att.if_name for a in record.attachments):
                raise PlugError(f"pod {record.pod} already has {att.if_name}")
            if att.parent in self.protected_links() and not att.node_link_allowed:
                raise PlugError(f"link {att.parent!r} now carries the node itself; refused")
            pending = Attached(att, None, pending=True)
            await self.store.put(replace(record, attachments=(*record.attachments, pending)))
            att = self._limited(att)
            started = time.perf_counter()
            budget = self.budget.deadlines()
            try:
                [outcome] = await attach_all(
                    self.runtime,
                    [att],
                    sandbox_id,
                    record.netns,
                    budget=budget,
                    after_add=self._shape_after_add(record.netns, budget.add, record),
                )
            except AttachFailed as failed:
                _count_failure(att, failed.failed.reason or "runtime")
                if not failed.cleanup_errors:
                    await self.store.put(record)
                self._report(failed.outcomes)
                self.journal.record(events.ATTACH_FAILED, record.pod, sandbox_id, str(failed))
                raise PlugError(f"pod {record.pod}: {failed}") from None
            done = Attached(att, outcome.result.to_json() if outcome.result else None)
            plugged = replace(record, attachments=(*record.attachments, done))
            await self.store.put(plugged)
            self._bandwidth_changed()
            if self.policy is not None:
                self.policy.attached(plugged)
            self._report([outcome], record.pod)
            self._annotate(record.pod, (*record.attachments, done))
            if self.hold_from_attach:
                self._hold(att.claim)
            self.journal.record(
                events.ATTACHED,
                record.pod,
                sandbox_id,
                f"plugged {att.if_name} ({att.network_label})",
                (time.perf_counter() - started) * 1000,
            )
            return done

    async def _detach_part(
        self, sandbox_id: str, record: SandboxRecord, going: list[Attached]
    ) -> list[str]:
        """DEL some of a live sandbox's attachments (one claim's, or one unplugged network),
        the others kept: marked pending on disk first (a crash is finished by the next
        Synchronize), then DELed; once all went, their rate limits removed, the record kept
        with the rest, the annotation and statuses updated and each claim no sandbox holds any
        more released. The DELs' errors (the record keeps them pending)."""
        marked = tuple(replace(a, pending=True) if a in going else a for a in record.attachments)
        await self.store.put(replace(record, attachments=marked))
        errors = await detach_all(
            self.runtime,
            [a.attachment for a in going],
            sandbox_id,
            self._netns_for_del(record),
            on_done=_observe_del,
        )
        if errors:
            return errors
        await self._unshape(record, [a.attachment for a in going])
        rest = tuple(a for a in record.attachments if a not in going)
        await self.store.put(replace(record, attachments=rest))
        self._bandwidth_changed()
        self._annotate(record.pod, rest)
        for ref in dict.fromkeys(a.attachment.claim for a in going):
            self.status.drop(
                ref, [status_key(a.attachment) for a in going if a.attachment.claim == ref]
            )
            if ref not in {c for r in self.store.all() for c in r.claims()}:
                self._release(ref)
        return []

    async def unplug(self, sandbox_id: str, claim: str, request: str) -> None:
        """DEL an on-demand attachment from a running sandbox; the others stay."""
        async with self.locks.hold(sandbox_id):
            record = self._live_record(sandbox_id)
            att = self.on_demand(record, claim, request)
            rest = tuple(a for a in record.attachments if a.attachment.if_name != att.if_name)
            if len(rest) == len(record.attachments):
                raise PlugError(f"pod {record.pod} has no {att.if_name} plugged")
            going = [a for a in record.attachments if a.attachment.if_name == att.if_name]
            errors = await self._detach_part(sandbox_id, record, going)
            if errors:
                self.journal.record(events.DETACH_FAILED, record.pod, sandbox_id, "; ".join(errors))
                raise PlugError(f"pod {record.pod}: " + "; ".join(errors))
            self.journal.record(events.DETACHED, record.pod, sandbox_id, f"unplugged {att.if_name}")
            self.status.event(
                record.pod, REASON_REMOVED, f"Removed {att.if_name} ({att.network_label})", "Normal"
            )

    async def finish_unplugs(self, record: SandboxRecord) -> None:
        """A crash while plugging or unplugging left `pending` attachments in an attached
        record: DEL them and keep the rest (called by Synchronize)."""
        async with self.locks.hold(record.sandbox_id):
            pending = [a for a in record.attachments if a.pending]
            if not pending:
                return
            errors = await detach_all(
                self.runtime,
                [a.attachment for a in pending],
                record.sandbox_id,
                self._netns_for_del(record),
                on_done=_observe_del,
            )
            if errors:
                log.warning("undoing a half-done plug of %s: %s", record.pod, "; ".join(errors))
                return
            await self._unshape(record, [a.attachment for a in pending])
            rest = tuple(a for a in record.attachments if not a.pending)
            await self.store.put(replace(record, attachments=rest))

    # ------------------------------------------------------------------ rate limits

    def _shape_after_add(
        self,
        netns: str,
        deadline: Deadline | None,
        record: SandboxRecord | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> AfterAdd:
        """Hold each attachment that has a `rate` to it right after its ADD, within what is
        left of the ADD budget (at most SHAPING_TIMEOUT), in a thread: the event loop never
        waits on netlink. A limit that cannot be applied fails the attachment (SetupFailed),
        so it is rolled back and no interface runs without the limit its claim reserved."""

        async def shape(att: Attachment) -> None:
            await limit(att)
            if self.policy is not None and record is not None:
                await self.policy.at_add(record, labels, att, deadline)

        async def limit(att: Attachment) -> None:
            if att.rate is None:
                return
            timeout = SHAPING_TIMEOUT
            if deadline is not None:
                timeout = min(timeout, deadline.remaining())
            what = f"rate limit {att.rate} on {att.if_name}"
            if timeout <= 0:
                why = deadline.describe() if deadline is not None else "no time"
                raise SetupFailed(f"{what} could not be applied: {why} ran out", REASON_SHAPING)
            try:
                await asyncio.to_thread(
                    self.shaper.apply, netns, att.if_name, att.rate, timeout=timeout
                )
            except shaping.ShapingError as exc:
                raise SetupFailed(f"{what} could not be applied: {exc}", REASON_SHAPING) from exc

        return shape

    async def _unshape(self, record: SandboxRecord, attachments: Sequence[Attachment]) -> None:
        if self.policy is not None:
            await self.policy.detached(record, attachments)
        await self._unlimit(record, attachments)

    async def _unlimit(self, record: SandboxRecord, attachments: Sequence[Attachment]) -> None:
        """Remove the rate limits of interfaces DELed from a live sandbox (its IFB stays in the
        namespace otherwise); Gone is done. A failure is logged and journalled, not raised:
        the interface is gone, what is left (an idle IFB) is replaced by the next apply."""
        netns = self._netns_for_del(record)
        for att in attachments:
            if att.rate is None or not netns:
                continue
            try:
                await asyncio.to_thread(
                    self.shaper.remove, netns, att.if_name, timeout=SHAPING_TIMEOUT
                )
            except shaping.Gone:
                continue
            except shaping.ShapingError as exc:
                message = f"removing the rate limit of {att.if_name}: {exc}"
                log.warning("pod %s: %s", record.pod, message)
                self.journal.record(events.DETACH_FAILED, record.pod, record.sandbox_id, message)

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

    def _going(self, sandbox_id: str) -> bool:
        """The runtime stopped or removed the sandbox: it never runs again."""
        return sandbox_id in self.stopped or sandbox_id in self.removed

    def _undone_anyway(self, record: SandboxRecord) -> bool:
        """An `added` record is left alone unless its sandbox is going."""
        return record.state is not State.ADDED or self._going(record.sandbox_id)

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
            errors = await self._detach_part(sandbox_id, record, going)
            if errors:
                message = "; ".join(errors)
                log.warning("detach of claim %s from pod %s failed: %s", claim, record.pod, message)
                self.journal.record(events.DETACH_FAILED, record.pod, sandbox_id, message)
                self._hold(going[0].attachment.claim)
                return False
            names = ", ".join(
                f"{a.attachment.if_name} ({a.attachment.network_label})" for a in going
            )
            self.journal.record(events.DETACHED, record.pod, sandbox_id, f"detached {names}")
            self.status.event(record.pod, REASON_REMOVED, f"Removed {names}", "Normal")
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
            self._netns_for_del(record),
            deadline,
            on_done=_observe_del,
        )
        if errors and self._can_retry(record):
            message = f"pod {record.pod}: " + "; ".join(errors)
            log.warning("detach failed, will retry: %s", message)
            self.journal.record(events.DETACH_FAILED, record.pod, sandbox_id, "; ".join(errors))
            if pod is not None:
                self.status.event(pod, REASON_DETACH_FAILED, message)
            for claim in record.claims():
                self._hold(claim)
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
            names = ", ".join(
                f"{a.attachment.if_name} ({a.attachment.network_label})" for a in record.attachments
            )
            self.status.event(record.pod, REASON_REMOVED, f"Removed {names}", "Normal")
        return True

    def _can_retry(self, record: SandboxRecord) -> bool:
        """Retry while the sandbox lives or its namespace still exists."""
        return record.sandbox_id not in self.removed or self.netns_exists(record.netns)

    async def _forget(self, record: SandboxRecord) -> None:
        await self.store.remove(record.sandbox_id)
        self._bandwidth_changed()
        if self.policy is not None:
            self.policy.forget(record)
        self.removed.discard(record.sandbox_id)
        if all(other.pod != record.pod for other in self.store.all()):  # no sandbox re-created
            self.status.pod_gone(record.pod)
        in_use = {claim for other in self.store.all() for claim in other.claims()}
        for claim in record.claims():
            keys = [
                status_key(a.attachment) for a in record.attachments if a.attachment.claim == claim
            ]
            self.status.drop(claim, keys, later=True)  # the pod is likely going: see drop
            if claim not in in_use:  # another sandbox (a shared claim) may still use it
                self._release(claim)

    def retry_detach(self, sandbox_id: str, first_delay: float | None = None) -> None:
        if sandbox_id in self.retries:
            return
        task = asyncio.create_task(
            self._retry_loop(sandbox_id, first_delay), name=f"detach-{sandbox_id[:12]}"
        )
        self.retries[sandbox_id] = task
        task.add_done_callback(lambda _: self.retries.pop(sandbox_id, None))

    def retrying(self, sandbox_id: str) -> bool:
        return sandbox_id in self.retries

    async def _retry_loop(self, sandbox_id: str, first_delay: float | None) -> None:
        backoff = self.retry()
        delay = backoff.next() if first_delay is None else first_delay
        while True:
            await asyncio.sleep(delay)
            record = self.store.get(sandbox_id)
            if record is None or not self._undone_anyway(record):
                return  # undone meanwhile, or attached again since (a late attach): not ours
            try:
                if await self.detach(sandbox_id, None, unfinished_only=True):
                    log.info("detached sandbox %s after retrying", sandbox_id[:12])
                    return
            except Exception:
                log.exception("retrying the detach of sandbox %s", sandbox_id[:12])
            delay = backoff.next()


def status_key(att: Attachment) -> DeviceKey:
    """The claim's status.devices entry of the attachment: driver, pool, device, shareID."""
    return (DRIVER_NAME, att.pool, att.device, att.share_id or "")


def _network_of(att: Attachment) -> str:
    return att.status_name or att.network_name


def _count_failure(att: Attachment, reason: str) -> None:
    metrics.ATTACH_FAILURES.labels(metrics.network_label(_network_of(att)), reason).inc()


def _observe_del(att: Attachment, seconds: float, reason: str) -> None:
    network = metrics.network_label(_network_of(att))
    if reason:
        metrics.DETACH_FAILURES.labels(network, reason).inc()
    else:
        metrics.DETACH_DURATION.labels(network).observe(seconds)
