"""What the node tells about a pod's interfaces, projected from the state machine's outcomes
and records: each claim's status.devices entries, the pod's network-status annotation, the
pod's Events, the claim's detach finalizer, the device metadata files containers read, the
attach and detach metrics, and the interfaces listed for the telemetry. All of it goes to a
StatusSink that writes later: nothing here waits on the apiserver."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra.api.constants import DRIVER_NAME
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment, Outcome
from cnidra.cni.result import Result
from cnidra.observe import metrics
from cnidra.observe.interfaces import PodInterface
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State
from cnidra.status.devices import (
    NETWORK_STATUS_ANNOTATION,
    DeviceKey,
    device_status_of,
    network_status,
)
from cnidra.status.metadata import DeviceMetadata
from cnidra.status.writer import SeenAnnotations, StatusSink

log = logging.getLogger(__name__)

REASON_ATTACH_FAILED = "NetworkAttachFailed"
# Normal events, as Multus writes them: what `kubectl describe pod` shows first
REASON_ADDED = "AddedInterface"
REASON_REMOVED = "RemovedInterface"
REASON_DETACH_FAILED = "NetworkDetachFailed"


class Reporting:
    """The state machine's outcomes told to the StatusSink, and the detach finalizer's hold.
    `hold_from_attach`: a claim carries the finalizer from its first interface on (two more
    requests per claim), not only once a DEL of its interfaces failed."""

    def __init__(
        self,
        store: SandboxStore,
        status: StatusSink,
        *,
        metadata: DeviceMetadata | None = None,
        network_status: bool = True,
        hold_from_attach: bool = False,
    ) -> None:
        self.store = store
        self.status = status
        self.metadata = metadata
        self.network_status = network_status
        self.hold_from_attach = hold_from_attach
        # claims whose finalizer may be set: asked for by this process, or left by an earlier
        # one (any claim of a record on disk at start; its process may have held it)
        self.held: set[ObjectRef] = {c for r in store.all() for c in r.claims()}

    # ------------------------------------------------------------------ the finalizer

    def hold(self, claim: ObjectRef) -> None:
        """Keep the claim until its interfaces are gone. While its pod exists Kubernetes keeps
        it anyway: it stays allocated and reserved, kubelet reports the pod terminal (and so
        lets it be deleted) only once NodeUnprepareResources succeeded, which refuses while
        interfaces remain (kubelet_pods.go:1130, status_manager.go:1274, 1340, 1504 in 1.37),
        and the claim controller deallocates and deletes a claim only after that. The
        finalizer holds it beyond: a pod deleted by force, or a node lost."""
        self.held.add(claim)
        self.status.finalizer(claim, True)

    def release(self, claim: ObjectRef) -> None:
        if claim in self.held:
            self.held.discard(claim)
            self.status.finalizer(claim, False)

    def attached_claims(self, claims: Iterable[ObjectRef]) -> None:
        """Claims whose interfaces were just set up: held now with `hold_from_attach`, else
        only once a DEL of theirs fails."""
        if self.hold_from_attach:
            for claim in claims:
                self.hold(claim)

    # ------------------------------------------------------------------ events

    def attach_failed(self, pod: ObjectRef, message: str) -> None:
        self.status.event(pod, REASON_ATTACH_FAILED, message)

    def detach_failed(self, pod: ObjectRef, message: str) -> None:
        self.status.event(pod, REASON_DETACH_FAILED, message)

    def removed(self, pod: ObjectRef, attachments: Sequence[Attachment]) -> None:
        names = ", ".join(f"{a.if_name} ({a.network_label})" for a in attachments)
        self.status.event(pod, REASON_REMOVED, f"Removed {names}", "Normal", detail=True)

    def released(self, claim: ObjectRef, generated: bool) -> None:
        """kubelet is done with the claim (NodeUnprepareResources)."""
        self.status.released(claim, generated)

    # ------------------------------------------------------------------ status

    def outcomes(self, outcomes: list[Outcome], pod: ObjectRef | None = None) -> None:
        """Each ADD's outcome: its status.devices entry, its metrics, and once ready an
        AddedInterface Event (with `pod`) and its device metadata."""
        for outcome in outcomes:
            if outcome.ready:
                name = metrics.network_label(network_of(outcome.attachment))
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

    def annotate(
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

    def unplugged(self, rest: SandboxRecord, going: Sequence[Attached]) -> None:
        """Some of a live sandbox's attachments were DELed, `rest` is what it keeps: the
        annotation and the claims' entries updated, each claim no sandbox holds released."""
        self.annotate(rest.pod, rest.attachments)
        for ref in dict.fromkeys(a.attachment.claim for a in going):
            self.status.drop(
                ref, [status_key(a.attachment) for a in going if a.attachment.claim == ref]
            )
            if ref not in {c for r in self.store.all() for c in r.claims()}:
                self.release(ref)

    def forgotten(self, record: SandboxRecord) -> None:
        """The sandbox's record is gone (after its DELs): the pod said gone once no sandbox of
        it is left, its claims' entries dropped, each claim no other sandbox uses released."""
        if all(other.pod != record.pod for other in self.store.all()):  # no sandbox re-created
            self.status.pod_gone(record.pod)
        in_use = {claim for other in self.store.all() for claim in other.claims()}
        for claim in record.claims():
            keys = [
                status_key(a.attachment) for a in record.attachments if a.attachment.claim == claim
            ]
            self.status.drop(claim, keys, later=True)  # the pod is likely going: see drop
            if claim not in in_use:  # another sandbox (a shared claim) may still use it
                self.release(claim)

    def restore(self) -> None:
        """After a restart: re-derive the status of every attachment that is set up."""
        for record in self.store.all():
            if record.state is not State.ADDED:
                continue
            self.annotate(record.pod, record.attachments)
            for attached in record.attachments:
                if attached.result is not None:
                    outcome = Outcome(attached.attachment, Result(attached.result))
                    self.status.put(attached.attachment.claim, device_status_of(outcome))

    # ------------------------------------------------------------------ telemetry

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


def status_key(att: Attachment) -> DeviceKey:
    """The claim's status.devices entry of the attachment: driver, pool, device, shareID."""
    return (DRIVER_NAME, att.pool, att.device, att.share_id or "")


def network_of(att: Attachment) -> str:
    return att.status_name or att.network_name


def count_failure(att: Attachment, reason: str) -> None:
    metrics.ATTACH_FAILURES.labels(metrics.network_label(network_of(att)), reason).inc()


def observe_del(att: Attachment, seconds: float, reason: str) -> None:
    network = metrics.network_label(network_of(att))
    if reason:
        metrics.DETACH_FAILURES.labels(network, reason).inc()
    else:
        metrics.DETACH_DURATION.labels(network).observe(seconds)
