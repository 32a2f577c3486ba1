"""NodePrepareResources / NodeUnprepareResources: everything slow happens here.

`resolve_claim` is pure: an allocated ResourceClaim (as JSON) in, a PreparedClaim out, or a
PrepareError saying what a person should fix. DRA copied the DeviceClass configs into the
allocation (source FromClass), so no DeviceClass lookup is needed; each request becomes an
attachment through the one path `cnidra validate` and `cnidra try` use too
(`cnidra.dra.resolve.resolve_attachment`); the claim is read once into a typed view
(`cnidra.dra.claim`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from cnidra.api.bandwidth import BANDWIDTH_CAPACITY, QuantityError, granted_bps
from cnidra.api.constants import (
    DEFAULT_MAX_ATTACHMENTS,
    DRIVER_NAME,
)
from cnidra.api.errors import UnusableObject
from cnidra.api.ipam import cnidra_ipam
from cnidra.api.issues import Issues
from cnidra.api.merge import ConfigEntry, Source
from cnidra.api.naming import NamingError, assign_names
from cnidra.api.networks import (
    NamedNetwork,
    NetworkCatalog,
    NetworkRef,
    StaticCatalog,
    Unresolved,
)
from cnidra.api.nodes import NodeView, named_nodes, selects
from cnidra.api.ownership import PrivateDirs
from cnidra.api.refs import ObjectRef
from cnidra.api.verdict import judged_once
from cnidra.cni.attach import Attachment, changed
from cnidra.dra.ahead import ClaimsAhead
from cnidra.dra.claim import (
    ALLOCATION_CONFIG,
    RESULTS,
    AllocatedClaim,
    ClaimShapeError,
    read_claim,
)
from cnidra.dra.resolve import Device, resolve_attachment
from cnidra.dra.verdicts import NotCached, VerdictCache, cached_only
from cnidra.ipam.allocator import AllocationError, Allocator
from cnidra.observe import metrics
from cnidra.observe.logs import fields
from cnidra.state.checkpoint import Checkpoint, PreparedClaim
from cnidra.status.metadata import DeviceMetadata, base_request
from cnidra.util.aio import wait_set
from cnidra.util.locks import KeyedLocks

log = logging.getLogger(__name__)
APISERVER_SLOTS = 32
# A claim's judgement (the pure resolve_claim: policy, validation, binding) runs in a worker
# thread, at most JUDGE_SLOTS claims at once, so no claim stalls the event loop and with it the
# node's other pods; one that takes longer than JUDGE_BUDGET_S fails alone (its thread ends on
# its own: the judgement is linear in the claim's size, docs/security.md). A claim whose every
# verdict the VerdictCache holds is judged on the loop instead (its configs are each within the
# cache's key bound, so what is left is small; no thread hop).
JUDGE_SLOTS = 2
JUDGE_BUDGET_S = 2.0
# how long prepare waits for a claim's read ahead whose GET is under way (then GETs it itself)
READ_AHEAD_WAIT_S = 2.0


class PrepareError(Exception):
    """A per-claim failure kubelet shows in the pod's events: it must say what to fix."""


class ClaimSource(Protocol):
    """A claim by name; UnusableObject for one that exists but cannot be read."""

    async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


class NamespaceLabels(Protocol):
    async def labels(self, namespace: str) -> Mapping[str, str] | None: ...


def resolve_claim(
    claim: Mapping[str, Any] | AllocatedClaim,
    ref: ObjectRef,
    node: str,
    dirs: PrivateDirs,
    view: NodeView,
    namespace_labels: Mapping[str, str] | None = None,
    catalog: NetworkCatalog | None = None,
    device_networks: Mapping[str, NamedNetwork] | None = None,
    verdicts: VerdictCache | None = None,
) -> PreparedClaim:
    """The claim's attachments in connection order (its requests' order), not yet named where
    the names are computed (`name_pod_interfaces` does that for all of a pod's claims)."""
    typed = claim if isinstance(claim, AllocatedClaim) else read(claim, ref)
    if typed.uid != ref.uid:
        raise PrepareError(
            f"claim {ref} has UID {typed.uid or None}, kubelet asked for {ref.uid}: "
            "it was deleted and created again; the pod must be recreated"
        )
    if not typed.allocated:
        raise PrepareError(f"claim {ref} is not allocated")
    if not selects(typed.node_selector, node, view.labels):
        nodes = ", ".join(sorted(named_nodes(typed.node_selector))) or "other nodes"
        raise PrepareError(f"claim {ref} is allocated to {nodes}, not to this node {node}")
    order = typed.request_order
    results = sorted(typed.ours, key=lambda r: order.get(r.request.split("/", 1)[0], len(order)))
    if not results:
        raise PrepareError(f"claim {ref} has no devices of driver {DRIVER_NAME}")
    entries = list(typed.configs)
    networks = device_networks if device_networks is not None else view.networks
    per_request = Counter(r.request for r in results)
    problems: list[str] = []
    prepared: list[Attachment] = []
    for result in results:
        request = result.request
        if per_request[request] > 1:
            problems.append(
                f"request {request!r} was allocated {per_request[request]} devices, but "
                "one CNIConfig gives one interface name; use count 1 per request"
            )
            continue
        if result.pool != node:
            problems.append(
                f"request {request!r} was allocated device {result.device!r} of pool "
                f"{result.pool!r}, which is not this node's ({node!r}): only the ResourceSlices "
                "this node's driver publishes are its devices; the pod must be scheduled again"
            )
            continue
        issues = Issues()
        link = view.links.get(result.device)
        if link is None:
            problems.append(
                f"request {request!r} was allocated device {result.device!r}, which is not "
                "a link or network of this node (any more); the pod must be scheduled again"
            )
            continue
        granted_where = RESULTS / typed.results.index(result)
        try:  # the scheduler's grant, checked before the configs: its own message, not theirs
            granted_bps(result.consumed_capacity)
        except QuantityError as exc:
            field = granted_where / "consumedCapacity" / BANDWIDTH_CAPACITY
            problems.append(
                f"request {request!r}: {field} is no rate cnidra can enforce on the interface: "
                f"{exc}"
            )
            continue
        device = Device(result.pool, result.device, result.share_id, link or None)
        attachment = resolve_attachment(
            entries,
            request,
            ref,
            device,
            dirs,
            issues,
            ALLOCATION_CONFIG,
            namespace_labels=namespace_labels,
            catalog=catalog,
            device_network=networks.get(result.device),
            verdicts=verdicts,
            node=view.facts,
            granted=result.consumed_capacity,
            granted_where=granted_where,
            device_class=typed.request_classes.get(request)
            or typed.request_classes.get(request.split("/", 1)[0]),
        )
        if attachment is None:
            problems.append(_describe(request, entries, issues))
            continue
        if link in view.protected and not attachment.node_link_allowed:
            problems.append(
                f"request {request!r} was allocated link {link!r}, which carries the node itself "
                "(its default route or address); only a DeviceClass whose CNIPolicy lists it in "
                "nodeLinks may use it"
            )
            continue
        prepared.append(attachment)
    if problems:
        raise PrepareError(f"claim {ref}: " + "; ".join(dict.fromkeys(problems)))
    return PreparedClaim(
        ref, typed.pod_uids, tuple(prepared), typed.generation, typed.pod_claim_name
    )


def read(claim: Mapping[str, Any], ref: ObjectRef) -> AllocatedClaim:
    """The claim's typed view, or a PrepareError naming the field that is not as the API says."""
    try:
        return read_claim(claim)
    except ClaimShapeError as exc:
        raise PrepareError(f"claim {ref}: {exc}") from None


def name_pod_interfaces(
    batch: Sequence[PreparedClaim], others: Sequence[PreparedClaim]
) -> list[PreparedClaim]:
    """Names for the interfaces of a pod's claims, `batch` in connection order (as kubelet
    sends them); `others` are its claims prepared before, whose names stand. A name the
    checkpoint already gave stays when it is still free. NamingError on a collision."""
    taken = {a.if_name: a.label_without_name for c in others for a in c.devices}
    slots = [a.slot() for c in batch for a in c.devices]
    before = {(c.uid, a.request): a.if_name for c in batch for a in c.devices if a.if_name}
    slots = [
        replace(slot, preferred=before.get((c.uid, a.request)))
        for slot, (c, a) in zip(slots, [(c, a) for c in batch for a in c.devices], strict=True)
    ]
    names = iter(assign_names(slots, taken))
    return [
        replace(c, devices=tuple(changed(a, if_name=next(names)) for a in c.devices)) for c in batch
    ]


def network_references(claim: AllocatedClaim, namespace: str) -> list[tuple[NetworkRef, str]]:
    """The network references of the claim's allocation configs that parse (a bad one is
    reported by the resolution, where its path is known)."""
    refs: list[tuple[NetworkRef, str]] = []
    for entry in claim.configs:
        raw = entry.parameters.get("network")
        if raw is None:
            continue
        with contextlib.suppress(ValueError):
            refs.append((NetworkRef.model_validate(raw), namespace))
    return refs


def _known(catalog: StaticCatalog | None) -> list[NamedNetwork]:
    networks = catalog.networks.values() if catalog is not None else ()
    return [n for n in networks if isinstance(n, NamedNetwork)]


def _describe(request: str, entries: Sequence[ConfigEntry], issues: Issues) -> str:
    chosen = [e for e in entries if e.applies_to(request)]
    if not chosen:
        return "; ".join(i.message for i in issues.errors)
    origin = "DeviceClass" if all(e.source is Source.CLASS for e in chosen) else "claim"
    details = "; ".join(f"{i.path}: {i.message}" for i in issues.errors) or "incomplete config"
    return f"request {request!r} ({origin} config) is invalid: {details}"


class SharedNetworks:
    """One copy of each network the prepared claims hold: the pods of one template get equal
    networks (a tenant network is named for its namespace, not its claim), and the driver keeps
    every prepared claim's in memory. Equal is equal JSON text, keys in their order; the
    networks are never changed in place (a change makes a new one: cnidra.api.ownership,
    cnidra.ipam), so sharing one is safe. At most `size` networks are remembered, each at
    most `max_chars` long: what tenants write cannot grow it."""

    def __init__(self, size: int = 256, max_chars: int = 16 * 1024) -> None:
        self.size = size
        self.max_chars = max_chars
        self._by_text: OrderedDict[str, Mapping[str, Any]] = OrderedDict()

    def share(self, claim: PreparedClaim) -> PreparedClaim:
        devices = tuple(self._one(a) for a in claim.devices)
        if all(new is old for new, old in zip(devices, claim.devices, strict=True)):
            return claim
        return replace(claim, devices=devices)

    def _one(self, attachment: Attachment) -> Attachment:
        try:
            text = json.dumps(attachment.network, separators=(",", ":"))
        except (TypeError, ValueError):
            return attachment
        if len(text) > self.max_chars:
            return attachment
        known = self._by_text.get(text)
        if known is None:
            self._by_text[text] = attachment.network
            while len(self._by_text) > self.size:
                self._by_text.popitem(last=False)
            return attachment
        self._by_text.move_to_end(text)
        return attachment if known is attachment.network else changed(attachment, network=known)


class NetworkLookup(Protocol):
    """The objects and node files a claim's network references name (cnidra.kube.networks)."""

    async def catalog(self, refs: Sequence[tuple[NetworkRef, str]]) -> StaticCatalog: ...

    async def refresh(self, network: NamedNetwork) -> NamedNetwork | Unresolved: ...


class Preparer:
    def __init__(
        self,
        node: str,
        claims: ClaimSource,
        checkpoint: Checkpoint,
        dirs: PrivateDirs,
        max_attachments: int = DEFAULT_MAX_ATTACHMENTS,
        view: Callable[[], NodeView] = NodeView,
        namespaces: NamespaceLabels | None = None,
        metadata: DeviceMetadata | None = None,
        networks: NetworkLookup | None = None,
        ipam: Allocator | None = None,
        judge_budget: float = JUDGE_BUDGET_S,
    ) -> None:
        self.node = node
        self.claims = claims
        self.checkpoint = checkpoint
        self.dirs = dirs
        self.max_attachments = max_attachments
        self.view = view
        self.namespaces = namespaces
        self.metadata = metadata
        self.networks = networks
        self.ipam = ipam
        self._locks = KeyedLocks()
        self._apiserver_slots = asyncio.Semaphore(APISERVER_SLOTS)
        self._judge_slots = asyncio.Semaphore(JUDGE_SLOTS)
        self.judge_budget = judge_budget
        # the verdicts on configs judged before, and one copy of equal networks: a template's
        # pods share theirs
        self.verdicts = VerdictCache()
        # claims read when their pods were bound (None: every claim is a GET)
        self.ahead: ClaimsAhead | None = None
        self._warm_slot = asyncio.Semaphore(1)
        self.shared_networks = SharedNetworks()
        # told of each claim prepared anew (not of a kubelet's repeated call): the agent
        # makes it a Normal Event on the claim
        self.on_prepared: Callable[[PreparedClaim], None] = lambda claim: None
        self.on_unprepared: Callable[[ObjectRef], None] = lambda ref: None
        # why the node cannot set up interfaces now (None: it can): then prepare refuses, and
        # kubelet asks again later, before the pod's sandbox exists
        self.unready: Callable[[], str | None] = lambda: None

    def in_flight(self) -> set[str]:
        """UIDs of the claims being prepared or unprepared right now."""
        return self._locks.busy()

    async def prepare(self, ref: ObjectRef) -> PreparedClaim:
        answer = (await self.prepare_batch([ref]))[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def prepare_batch(self, refs: Sequence[ObjectRef]) -> list[PreparedClaim | PrepareError]:
        """One pod's claims, as kubelet sends them (the pod's order): each resolved, then the
        interfaces of all named together, then each checkpointed. A claim's failure is its
        own; a naming collision fails the claims it involves."""
        reason = self.unready()
        if reason is not None:
            return [PrepareError(f"claim {r}: not prepared now: {reason}") for r in refs]
        async with contextlib.AsyncExitStack() as stack:
            for uid in sorted({r.uid for r in refs}):  # one order: no deadlock between batches
                await stack.enter_async_context(self._locks.hold(uid))
            resolved = await asyncio.gather(
                *(self._resolve_in_slot(r) for r in refs), return_exceptions=True
            )
            answers: list[PreparedClaim | PrepareError] = []
            for ref, item in zip(refs, resolved, strict=True):
                if isinstance(item, PrepareError | PreparedClaim):
                    answers.append(item)
                elif isinstance(item, Exception):
                    log.error("prepare %s crashed", ref, exc_info=item, extra={"claim": str(ref)})
                    answers.append(PrepareError(f"claim {ref}: internal error: {item}"))
                else:
                    raise item
            checked = self._check_pod_limits(self._name(answers))
            if self.ipam is not None:  # addresses leased for a claim that is not prepared
                for ref, answer in zip(refs, checked, strict=True):
                    if isinstance(answer, PrepareError) and self.checkpoint.get(ref.uid) is None:
                        await self.ipam.release_claim(ref.uid)
            # the checkpoint's writes in one go (the directory fsynced once), then the device
            # metadata files, all in one hop to a worker thread
            changed = [
                a
                for a in checked
                if isinstance(a, PreparedClaim) and self.checkpoint.get(a.uid) != a
            ]
            await self.checkpoint.put_many(changed)
            for claim in changed:
                self.on_prepared(claim)
            prepared = [a for a in checked if isinstance(a, PreparedClaim)]
            if self.metadata is not None and prepared:
                attributes = self.view().attributes
                await asyncio.to_thread(self.metadata.prepare_all, prepared, attributes)
            return checked

    async def _resolve_in_slot(self, ref: ObjectRef) -> PreparedClaim:
        """At most APISERVER_SLOTS claims ask the apiserver at once, and they wait for one of
        the client's LIMIT connections (cnidra.kube.session): a 100-claim batch does not open
        100 TLS connections, nor crowd out the driver's other requests (an earlier HTTP/2
        client failed the 101st stream of its one connection instead of queueing it)."""
        async with self._apiserver_slots:
            with fields(claim=str(ref)):
                return await self._resolve(ref)

    async def _resolve(self, ref: ObjectRef) -> PreparedClaim:
        known = self.checkpoint.get(ref.uid)
        # read ahead when its pod was bound (cnidra.dra.ahead): kubelet's UID, the newest
        # resourceVersion this node read, not expired; else the GET
        ahead = None
        if self.ahead is not None:
            reading = self.ahead.reading(ref.namespace, ref.name)
            if reading is not None:  # its GET is under way: waited for, not made twice
                metrics.CLAIMS_AHEAD_WAITED.inc()
                await asyncio.wait({reading}, timeout=READ_AHEAD_WAIT_S)
            ahead = self.ahead.ready(ref)
        if ahead is not None:
            if ahead.judged is not None and ahead.typed is not None and ahead.view is self.view():
                # judged when the pod was bound, on the view prepare would judge it on now
                metrics.CLAIMS_AHEAD_JUDGED.labels("used").inc()
                return await self._addressed(ahead.judged, ahead.typed)
            metrics.CLAIMS_AHEAD_JUDGED.labels("again").inc()
            return await self._judged(ahead.typed or ahead.claim, ref)
        if self.ahead is not None:
            self.ahead.got(ref.namespace, ref.name)  # a read ahead of it still waiting is not made
        try:
            claim = await self.claims.get(ref.namespace, ref.name)
        except UnusableObject as exc:
            raise PrepareError(str(exc)) from None
        except Exception as exc:
            if known is not None:
                return known  # what was prepared stands while the apiserver cannot be asked
            raise PrepareError(
                f"claim {ref} was never prepared on this node and the apiserver "
                f"could not be asked: {exc}"
            ) from None
        if claim is None:
            if known is not None:
                return known
            raise PrepareError(f"claim {ref} not found")
        if self.ahead is not None:
            self.ahead.seen(claim)
        return await self._judged(claim, ref)

    async def warm(self, claim: Mapping[str, Any]) -> None:
        """Judge a claim read ahead (cnidra.dra.ahead) as prepare will: on the loop when every
        verdict it needs is kept, else off the loop, one at a time, never in prepare's judging
        slots. Its verdicts stay in `self.verdicts`; its typed
        reading, and its judgement when that needs nothing but the node's view (no namespace
        labels, no named network: `_view_only`), go to the read-ahead's entry with the view
        it was made on; the addresses it will ask for go to the allocator, which reserves the
        blocks they need before kubelet asks (`Allocator.expect`). What it finds wrong is
        prepare's to say."""
        meta = claim.get("metadata") or {}
        ref = ObjectRef(
            str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", ""))
        )
        view = self.view()

        try:
            typed = read(claim, ref)  # on the loop, as prepare reads a claim it GETs
        except PrepareError:
            return  # prepare reads it again, and says what is wrong

        def judge() -> tuple[PreparedClaim | None, PreparedClaim | None]:
            with judged_once(), contextlib.suppress(PrepareError):
                networks = self._view_only(typed, ref, view)
                if networks is None:  # prepare reads what it needs, then judges: verdicts only
                    near = resolve_claim(
                        typed, ref, self.node, self.dirs, view, verdicts=self.verdicts
                    )
                    return None, near
                judged = resolve_claim(
                    typed, ref, self.node, self.dirs, view, None, None, networks, self.verdicts
                )
                return judged, judged
            return None, None

        # as at prepare: a claim all of whose verdicts are kept (a template's pods after the
        # first) is judged at once, on the loop, where a thread hop would cost more than it
        try:
            with cached_only():
                made = judge()
        except NotCached:
            async with self._warm_slot:
                made = await asyncio.to_thread(judge)
        judged, near = made
        if self.ahead is not None:
            self.ahead.judged(claim, typed, judged, view if judged is not None else None)
        if self.ipam is not None and near is not None:
            # the blocks its addresses need, reserved before kubelet asks (judged on the view
            # alone, the pools may be a guess: prepare reserves what it still lacks)
            self.ipam.expect(near)

    def _view_only(
        self, claim: AllocatedClaim, ref: ObjectRef, view: NodeView
    ) -> dict[str, NamedNetwork] | None:
        """The device networks `_judged` would judge the claim with when it needs nothing read
        beyond `view` (no namespace labels, no network reference, no allocated named network
        whose node conf is read again); None when it needs more."""
        if claim.selects_namespaces() or network_references(claim, ref.namespace):
            return None
        if self.networks is not None:
            return None if any(r.device in view.networks for r in claim.ours) else {}
        networks = dict(view.networks)
        if any(n.namespace_selector is not None for n in networks.values()):
            return None
        return networks

    async def _judged(
        self, claim: Mapping[str, Any] | AllocatedClaim, ref: ObjectRef
    ) -> PreparedClaim:
        typed = claim if isinstance(claim, AllocatedClaim) else read(claim, ref)
        view = self.view()
        catalog, device_networks = await self._networks(typed, ref, view)
        labels = None
        selecting = typed.selects_namespaces() or any(
            n.namespace_selector is not None for n in [*device_networks.values(), *_known(catalog)]
        )
        if self.namespaces and selecting:  # a GET only when a policy or a network asks
            labels = await self.namespaces.labels(ref.namespace)

        def judge() -> PreparedClaim:
            with judged_once():  # its requests' shared configs judged once
                return resolve_claim(
                    typed,
                    ref,
                    self.node,
                    self.dirs,
                    view,
                    labels,
                    catalog,
                    device_networks,
                    self.verdicts,
                )

        # a claim all of whose verdicts are kept (a template's pods after the first) is judged
        # at once, on the loop: what is left is small (its configs are each at most the
        # cache's key bound) and a thread hop would cost more than it; the same judgement
        try:
            with cached_only():
                prepared = judge()
        except NotCached:
            pass
        else:
            return await self._addressed(prepared, typed)
        # off the loop, within the budget; a slot is held until the thread is done, even when
        # the claim failed on its budget, so such threads never pile up
        await self._judge_slots.acquire()
        judged = asyncio.Event()

        def done(finished: asyncio.Future[PreparedClaim]) -> None:
            self._judge_slots.release()
            judged.set()
            if not finished.cancelled():
                finished.exception()  # retrieved: one that ends past the budget is not "lost"

        judging = asyncio.ensure_future(asyncio.to_thread(judge))
        judging.add_done_callback(done)
        if not await wait_set(judged, self.judge_budget):
            raise PrepareError(
                f"claim {ref}: judging its configs took longer than the budget of "
                f"{self.judge_budget:g} s a claim may take, so it is refused; its configs are "
                "too large to judge in time: make them smaller"
            )
        prepared = judging.result()
        return await self._addressed(prepared, typed)

    async def _addressed(self, prepared: PreparedClaim, claim: AllocatedClaim) -> PreparedClaim:
        return self.shared_networks.share(await self._addresses(prepared, claim))

    async def _addresses(self, prepared: PreparedClaim, claim: AllocatedClaim) -> PreparedClaim:
        """cnidra-IPAM networks get their addresses now, while the apiserver can be asked, and
        the static addresses a tenant wrote are leased through the cluster IPAM (docs/ipam.md)."""
        if not any(cnidra_ipam(a.network) or a.tenant_static for a in prepared.devices):
            return prepared
        if self.ipam is None:
            static = next((a for a in prepared.devices if a.tenant_static), None)
            if static is not None:
                raise PrepareError(
                    f"claim {prepared.ref}: request {static.request!r}: a tenant's static IPAM "
                    "addresses are leased through cnidra's cluster IPAM, so that no two pods "
                    "hold one address, which this driver runs only with an apiserver "
                    "connection; no owner of the address can be asked"
                )
            raise PrepareError(
                f"claim {prepared.ref}: its network asks for cnidra IPAM, which this driver "
                "runs only with an apiserver connection"
            )
        try:
            return await self.ipam.assign(prepared, list(claim.pod_names))
        except AllocationError as exc:
            raise PrepareError(f"claim {prepared.ref}: {exc}") from None

    async def _networks(
        self, claim: AllocatedClaim, ref: ObjectRef, view: NodeView
    ) -> tuple[StaticCatalog | None, dict[str, NamedNetwork]]:
        """What the claim's references and its allocated network devices name, read now (a
        node conf as it is on disk at this moment)."""
        if self.networks is None:
            return None, dict(view.networks)
        allocated = [r.device for r in claim.ours if r.device in view.networks]
        device_networks: dict[str, NamedNetwork] = {}
        for name in allocated:
            fresh = await self.networks.refresh(view.networks[name])
            if isinstance(fresh, Unresolved):
                raise PrepareError(f"claim {ref}: {fresh.message}")
            device_networks[name] = fresh
        refs = network_references(claim, ref.namespace)
        catalog = await self.networks.catalog(refs) if refs else None
        return catalog, device_networks

    def _name(
        self, answers: list[PreparedClaim | PrepareError]
    ) -> list[PreparedClaim | PrepareError]:
        """Interface names across the batch, per pod (a claim may serve several pods)."""
        prepared = [a for a in answers if isinstance(a, PreparedClaim)]
        failed: dict[str, PrepareError] = {}
        renamed: dict[str, PreparedClaim] = {c.uid: c for c in prepared}
        pods = {p for c in prepared for p in c.pod_uids} or {""}
        for pod in sorted(pods):
            batch = [renamed[c.uid] for c in prepared if pod in c.pod_uids or not pod]
            uids = {c.uid for c in batch}
            others = [c for c in self.checkpoint.for_pod(pod) if c.uid not in uids] if pod else []
            try:
                for claim in name_pod_interfaces(batch, others):
                    renamed[claim.uid] = claim
            except NamingError as exc:
                for claim in batch:
                    failed[claim.uid] = PrepareError(f"claim {claim.ref}: {exc}")
        return [
            failed.get(a.uid, renamed[a.uid]) if isinstance(a, PreparedClaim) else a
            for a in answers
        ]

    def _check_pod_limits(
        self, answers: list[PreparedClaim | PrepareError]
    ) -> list[PreparedClaim | PrepareError]:
        """Each claim against the limit of its pods, counting the pods' other prepared claims
        and the claims of this batch accepted before it."""
        batch = {a.uid for a in answers if isinstance(a, PreparedClaim)}
        accepted: dict[str, int] = {}
        checked: list[PreparedClaim | PrepareError] = []
        for answer in answers:
            if isinstance(answer, PreparedClaim):
                try:
                    self._check_pod_limit(answer, batch, accepted)
                except PrepareError as exc:
                    checked.append(exc)
                    continue
                for pod in answer.pod_uids:
                    accepted[pod] = accepted.get(pod, 0) + len(answer.devices)
            checked.append(answer)
        return checked

    def restore_cdi(self) -> int:
        """At start: every checkpointed claim's CDI spec written again, before kubelet can ask
        for a container. /var/run/cdi is a tmpfs a reboot empties while the checkpoint and
        kubelet's own record of prepared claims survive; an upgrade changes the spec (the
        container gate came in one)."""
        if self.metadata is None:
            return 0
        claims = list(self.checkpoint.all())
        view = self.view()
        for claim in claims:
            self.metadata.restore(claim, view.attributes)
        return len(claims)

    def cdi_device_ids(self, claim: PreparedClaim, request: str) -> list[str]:
        if self.metadata is None:
            return []
        return [self.metadata.cdi_id(claim.uid, base_request(request))]

    def _check_pod_limit(
        self,
        prepared: PreparedClaim,
        batch: set[str],
        accepted: Mapping[str, int],
    ) -> None:
        """Every attachment of a pod is ADDed inside one NRI hook, whose time is bounded."""
        for pod in prepared.pod_uids:
            others = sum(
                len(c.devices)
                for c in self.checkpoint.for_pod(pod)
                if c.uid != prepared.uid and c.uid not in batch
            ) + accepted.get(pod, 0)
            total = others + len(prepared.devices)
            if total > self.max_attachments:
                raise PrepareError(
                    f"claim {prepared.ref}: pod {pod} would get {total} cnidra interfaces; "
                    f"at most {self.max_attachments} per pod are allowed "
                    "(the driver's --max-attachments-per-pod), because all of them are set up "
                    "within the runtime's hook timeout"
                )

    async def unprepare(self, ref: ObjectRef) -> None:
        await self.unprepare_batch([ref])

    async def unprepare_batch(self, refs: Sequence[ObjectRef]) -> None:
        """Claims forgotten together (a kubelet call's, after their interfaces are gone): each
        claim's lock held, the checkpoint's removals one change, the claims' addresses freed
        in another, their metadata files removed in one hop to a worker thread."""
        refs = list({r.uid: r for r in refs}.values())
        async with contextlib.AsyncExitStack() as stack:
            for uid in sorted(r.uid for r in refs):  # one order: no deadlock between batches
                await stack.enter_async_context(self._locks.hold(uid))
            known = {r.uid: self.checkpoint.get(r.uid) for r in refs}
            held = [r for r in refs if known[r.uid] is not None]
            await self.checkpoint.remove_many([r.uid for r in held])
            for ref in held:
                log.info("unprepared claim %s (%s)", ref, ref.uid)
                self.on_unprepared(ref)
            if self.ipam is not None:
                await self.ipam.release_claims([r.uid for r in refs])
            if self.metadata is not None:
                metadata = self.metadata

                def remove() -> None:
                    for ref in refs:
                        claim = known[ref.uid]
                        requests = [d.request for d in claim.devices] if claim else None
                        metadata.remove(ref, requests)

                await asyncio.to_thread(remove)
