"""The apiserver side of cnidra's IPAM (cnidra.ipam.allocator.IPAMCluster): CNIIPPools,
CNIIPBlocks (creation is the reservation; each is owned by its Node, so the garbage collector
takes a lost node's), IPAMClaims, the claims whose device status shows their addresses, and
Nodes, each call with a timeout. Called at prepare and by the reconciler, never on the NRI hook
path. The calls that may be repeated are asked again after a transient answer (throttled,
storage initializing, a timeout or a dropped connection: cnidra.kube.client.with_retries), so
the allocator never sees one."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, ParamSpec, Protocol, TypeVar

from cnidra.api.constants import API_GROUP, API_VERSION, DRIVER_NAME
from cnidra.api.ipam import (
    BLOCK_KIND,
    BLOCK_PLURAL,
    CONDITION_IPS_ALLOCATED,
    IPAMCLAIM_FINALIZER,
    IPAMCLAIM_GROUP,
    IPAMCLAIM_KIND,
    IPAMCLAIM_NODE_LABEL,
    IPAMCLAIM_PLURAL,
    IPAMCLAIM_VERSION,
    LABEL_NODE,
    LABEL_POOL,
    POOL_KIND,
    POOL_PLURAL,
    Block,
    BlockObject,
)
from cnidra.kube.api import (
    Api,
    AsyncClient,
    Conflict,
    Event,
    Lease,
    Node,
    NotFound,
    Pod,
    ResourceClaim,
    ResourceSlice,
    cluster_wide,
    namespaced,
)
from cnidra.kube.client import with_retries
from cnidra.kube.events import EventRecord, EventRecorder, Involved

log = logging.getLogger(__name__)
CNIIPPool = cluster_wide(API_GROUP, "v1alpha1", POOL_KIND, POOL_PLURAL)
CNIIPBlock = cluster_wide(API_GROUP, "v1alpha1", BLOCK_KIND, BLOCK_PLURAL)
IPAMClaim = namespaced(IPAMCLAIM_GROUP, IPAMCLAIM_VERSION, IPAMCLAIM_KIND, IPAMCLAIM_PLURAL)
ACCOUNTANT_MANAGER = "cnidra-pool-accountant"
P = ParamSpec("P")
T = TypeVar("T")


def _retried(method: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """A call safe to repeat, asked again after a transient answer (with_retries): the whole
    call each time, every attempt with its own timeout. Only what is not transient, or the
    last failure, reaches the caller."""

    @functools.wraps(method)
    async def retried(*args: P.args, **kwargs: P.kwargs) -> T:
        return await with_retries(lambda: method(*args, **kwargs))

    return retried


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def _block_object(data: Mapping[str, Any]) -> BlockObject:
    meta = data.get("metadata") or {}
    spec = data.get("spec") or {}
    owners = meta.get("ownerReferences") or []
    return BlockObject(
        str(meta.get("name")),
        str(spec.get("pool")),
        str(spec.get("node")),
        str(meta.get("uid")),
        str(meta.get("resourceVersion") or ""),
        owned=any(o.get("kind") == "Node" and o.get("name") == spec.get("node") for o in owners),
    )


class EventSink(Protocol):
    """Where an Event goes instead of being created at once (`StatusWriter.object_event`)."""

    def __call__(self, about: Involved, reason: str, message: str, type_: str = ...) -> None: ...


class KubeIPAM:
    """cnidra.ipam.allocator.IPAMCluster on the apiserver. The calls marked @_retried are asked
    again after a transient answer. The others are not: a PATCH with a precondition
    (bind_ipamclaim, own_block, unbind_ipamclaim) whose answer was lost meets its own write as
    a conflict when sent again, and its caller reads again anyway (the allocator's bind loop,
    the reconciler's next pass); an Event's create (record) would be written twice; the
    reconciler's reads (node_exists, addresses_in_use) are asked again by its next pass."""

    def __init__(
        self,
        client: AsyncClient,
        timeout: float = 5.0,
        node: str = "",
        events: EventSink | None = None,
    ) -> None:
        """`node`: where the Events come from (their source host and reporting instance).
        `events`: where they go: the status writer's queue in the driver (bounded, retried, the
        Normal ones as `--normal-events` says); without one (the benchmarks' stand-alone
        allocators) each is created at once."""
        self.client = client
        self.api = Api(client, timeout)
        self.recorder = EventRecorder("cnidra", node)
        self.events = events
        self.timeout = timeout
        self._node_uids: dict[str, str] = {}
        self.successors: frozenset[str] | None = None  # as the Lease named them (lead)
        # (namespace, name) -> the resourceVersion of the Lease as this process last wrote
        # it, holding it: its next renewal is that one PATCH, no GET before (lead)
        self._holding: dict[tuple[str, str], str] = {}

    async def _node_owner(self, node: str) -> dict[str, str]:
        """The Node as a block's owner: its deletion deletes the block (garbage collection)."""
        uid = self._node_uids.get(node)
        if uid is None:
            obj = await self.api.get(Node, node)
            uid = str(_meta(obj).get("uid") or "")
            if not uid:
                raise RuntimeError(f"Node {node} has no UID")
            self._node_uids[node] = uid
        return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}

    @_retried
    async def pool(self, name: str) -> Mapping[str, Any] | None:
        obj = await self.api.get_or_none(CNIIPPool, name)
        if obj is None:
            return None
        data: dict[str, Any] = obj
        return data

    @_retried
    async def pools(self) -> list[Mapping[str, Any]]:
        # the CRD not installed: no pools
        found = await self.api.list(CNIIPPool, within=self.timeout * 4, missing_is_empty=True)
        return list(found)

    @_retried
    async def blocks(self, pool: str | None = None, node: str | None = None) -> list[BlockObject]:
        labels: dict[str, Any] = {
            k: v for k, v in ((LABEL_POOL, pool), (LABEL_NODE, node)) if v is not None
        }
        found = await self.api.list(  # the CRD not installed: no blocks
            CNIIPBlock, labels=labels or None, within=self.timeout * 4, missing_is_empty=True
        )
        return [_block_object(o) for o in found]

    @_retried
    async def create_block(self, block: Block, node: str) -> str | None:
        owner = await self._node_owner(node)
        obj = {
            "apiVersion": CNIIPBlock.api_version,
            "kind": CNIIPBlock.kind,
            "metadata": {
                "name": block.name,
                "labels": {LABEL_POOL: block.pool, LABEL_NODE: node},
                "ownerReferences": [owner],
            },
            "spec": {
                "pool": block.pool,
                "range": block.range_index,
                "cidr": str(block.cidr),
                "node": node,
            },
        }
        try:
            created = await self.api.create(CNIIPBlock, obj, field_manager="cnidra")
        except Conflict:
            return await self._own_existing(block.name, node)
        return str(_meta(created).get("uid") or "")

    async def _own_existing(self, name: str, node: str) -> str | None:
        """A block that exists already: this node's when a create of ours went through but
        its answer was lost (a timeout, a dropped connection) and the create was retried;
        otherwise another node's (None)."""
        found = await self.api.get_or_none(CNIIPBlock, name)
        if found is None:
            return None  # deleted meanwhile: the caller tries the next block
        current = _block_object(found)
        return current.uid if current.node == node and current.owned else None

    @_retried
    async def delete_block(self, name: str, uid: str) -> None:
        current = await self.api.get_or_none(CNIIPBlock, name)
        if current is None or _meta(current).get("uid") != uid:
            return  # gone, or deleted and reserved again since: not ours to delete
        await self.api.delete(CNIIPBlock, name)

    async def own_block(self, block: BlockObject, node: str) -> None:
        """Give a block made before blocks had owners its Node as owner."""
        owner = await self._node_owner(node)
        patch = {
            "metadata": {
                "resourceVersion": block.resource_version,
                "ownerReferences": [owner],
            }
        }
        await self.api.merge_patch(CNIIPBlock, block.name, patch)

    @_retried
    async def ipamclaim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        obj = await self.api.get_or_none(IPAMClaim, name, namespace)
        if obj is None:
            return None
        data: dict[str, Any] = obj
        return data

    async def bind_ipamclaim(
        self, claim: Mapping[str, Any], ips: Sequence[str], pod: str, node: str
    ) -> bool:
        meta = claim.get("metadata") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace"))
        finalizers = list(meta.get("finalizers") or [])
        if IPAMCLAIM_FINALIZER not in finalizers:
            finalizers.append(IPAMCLAIM_FINALIZER)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            async with asyncio.timeout(self.timeout):  # both patches together, as one call
                held = await self.api.merge_patch(
                    IPAMClaim,
                    name,
                    {
                        "metadata": {
                            "resourceVersion": meta.get("resourceVersion"),
                            "finalizers": finalizers,
                            "labels": {IPAMCLAIM_NODE_LABEL: node},
                        }
                    },
                    namespace=namespace,
                )
                version = _meta(held).get("resourceVersion")
                status = {
                    "ips": list(ips),
                    "ownerPod": {"name": pod},
                    "conditions": [
                        {
                            "type": CONDITION_IPS_ALLOCATED,
                            "status": "True",
                            "reason": "SuccessfulAllocation",
                            "message": f"allocated by {API_VERSION} IPAM on node {node}",
                            "lastTransitionTime": now,
                            "observedGeneration": int(meta.get("generation") or 0),
                        }
                    ],
                }
                await self.api.merge_patch(
                    IPAMClaim.Status,
                    name,
                    {"metadata": {"resourceVersion": version}, "status": status},
                    namespace=namespace,
                )
        except Conflict:
            return False
        return True

    @_retried
    async def bound_ipamclaims(self) -> list[Mapping[str, Any]]:
        found = await self.api.list(  # the IPAMClaim CRD not installed: none
            IPAMClaim,
            namespace="*",
            labels={IPAMCLAIM_NODE_LABEL: None},  # the label exists
            within=self.timeout * 4,
            missing_is_empty=True,
        )
        return list(found)

    async def unbind_ipamclaim(self, claim: Mapping[str, Any]) -> None:
        """Drop the finalizer (JSON patch: test the list is as read, then replace it)."""
        meta = claim.get("metadata") or {}
        finalizers = list(meta.get("finalizers") or [])
        if IPAMCLAIM_FINALIZER not in finalizers:
            return
        left = [f for f in finalizers if f != IPAMCLAIM_FINALIZER]
        patch = [
            {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
            {"op": "replace", "path": "/metadata/finalizers", "value": left},
        ]
        with contextlib.suppress(NotFound):
            await self.api.json_patch(
                IPAMClaim, str(meta.get("name")), patch, namespace=str(meta.get("namespace"))
            )

    async def node_exists(self, name: str) -> bool:
        return await self.api.get_or_none(Node, name) is not None

    async def addresses_in_use(self, namespace: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for claim in await self.api.list(
            ResourceClaim, namespace=namespace, within=self.timeout * 4
        ):
            status = claim.get("status") or {}
            if status.get("allocation") is None or not status.get("devices"):
                continue
            name = f"{namespace}/{_meta(claim).get('name') or ''}"
            for device in status["devices"]:
                data = device.get("networkData")
                if device.get("driver") != DRIVER_NAME or data is None:
                    continue
                for ip in data.get("ips") or []:
                    found[str(ip).split("/", 1)[0]] = name
        return found

    async def record(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        """A Normal Event on the IPAMClaim `obj` (the one recorder's fields and times)."""
        about = Involved.of(IPAMCLAIM_KIND, f"{IPAMCLAIM_GROUP}/{IPAMCLAIM_VERSION}", obj)
        await self._event(EventRecord(about, reason, message, "Normal"))

    # ------------------------------------------------------------- pool accounting

    async def write_block_leased(self, name: str, leased: int) -> None:
        """The node's leased count in its block's status (server-side apply on the status
        subresource, the node's own field manager: no other writer, no conflict)."""
        body = {
            "apiVersion": f"{API_GROUP}/v1alpha1",
            "kind": BLOCK_KIND,
            "metadata": {"name": name},
            "status": {"leased": leased},
        }
        await self.api.apply(
            CNIIPBlock.Status, name, body, field_manager=f"cnidra-node-{self.recorder.node}"
        )

    async def write_pool_status(self, name: str, status: Mapping[str, int]) -> None:
        body = {
            "apiVersion": f"{API_GROUP}/v1alpha1",
            "kind": POOL_KIND,
            "metadata": {"name": name},
            "status": dict(status),
        }
        await self.api.apply(CNIIPPool.Status, name, body, field_manager=ACCOUNTANT_MANAGER)

    @_retried
    async def pool_objects(self) -> list[Mapping[str, Any]]:
        return list(await self.api.list(CNIIPPool, missing_is_empty=True))

    @_retried
    async def block_objects(self) -> list[Mapping[str, Any]]:
        return list(await self.api.list(CNIIPBlock, missing_is_empty=True))

    async def watch_pools(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        async for kind, obj in self.api.watch(CNIIPPool):
            yield kind, obj

    async def watch_blocks(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        async for kind, obj in self.api.watch(CNIIPBlock):
            yield kind, obj

    async def watch_failed_scheduling(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        """The scheduler's FailedScheduling Events of every namespace (the apiserver filters
        by reason)."""
        async for kind, obj in self.api.watch(
            Event, namespace="*", fields={"reason": "FailedScheduling"}
        ):
            yield kind, obj

    async def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        obj = await self.api.get_or_none(Pod, name, namespace)
        return None if obj is None else dict(obj)

    async def resource_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        obj = await self.api.get_or_none(ResourceClaim, name, namespace)
        return None if obj is None else dict(obj)

    async def network_pools(self) -> dict[str, str]:
        """network -> pool, from this driver's published devices (a LIST by driver)."""
        found: dict[str, str] = {}
        slices = await self.api.list(
            ResourceSlice, fields={"spec.driver": DRIVER_NAME}, within=self.timeout * 4
        )
        for item in slices:
            for device in (item.get("spec") or {}).get("devices") or []:
                attrs = device.get("attributes") or {}
                network = (attrs.get("network") or {}).get("string")
                pool = (attrs.get("ipPool") or {}).get("string")
                if network and pool:
                    found[str(network)] = str(pool)
        return found

    async def warn(self, kind: str, obj: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning Event on a Pod or ResourceClaim."""
        api_version = "v1" if kind == "Pod" else "resource.k8s.io/v1"
        about = Involved.of(kind, api_version, obj)
        await self._event(EventRecord(about, reason, message, "Warning"))

    async def _event(self, event: EventRecord) -> None:
        if self.events is not None:
            self.events(event.about, event.reason, event.message, event.type)
            return
        await self.recorder.send(self.api, event)

    async def lead(
        self,
        namespace: str,
        name: str,
        identity: str,
        duration: float,
        successors: Sequence[str] = (),
    ) -> bool:
        """Whether `identity` holds the Lease `namespace/name` now: taken when there is none,
        renewed when it is its own, taken over when its holder let it lapse `duration`
        seconds ago. Every write has the read's resourceVersion as precondition, so of two
        drivers that race for a lapsed Lease one wins (client-go's leader election, reduced
        to what the accountant needs). The holder names its `successors` in the Lease's
        SUCCESSORS annotation with each write; `self.successors` is what the last read
        found there (None: no Lease, or none named), for the candidates' pace.

        A holder renews with the PATCH alone, preconditioned on the resourceVersion its own
        last write returned: one request a renewal, not a GET and a PATCH. Anyone else's write
        in between (a takeover after it lapsed) makes that a conflict, and a deleted Lease
        not found: then it reads the Lease as a candidate does."""
        now = datetime.datetime.now(datetime.UTC)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {
            "holderIdentity": identity,
            "leaseDurationSeconds": max(int(duration), 1),
            "renewTime": stamp,
        }
        named = {SUCCESSORS: ",".join(successors) or None}
        key = (namespace, name)
        mine = self._holding.pop(key, None)
        if mine is not None:
            patch = {"metadata": {"resourceVersion": mine, "annotations": named}, "spec": spec}
            try:
                written = await self.api.merge_patch(Lease, name, patch, namespace=namespace)
            except (Conflict, NotFound):
                pass  # written by another since, or deleted: read it as a candidate does
            else:
                self._hold(key, written)
                self.successors = frozenset(successors) or None
                return True
        found = await self.api.get_or_none(Lease, name, namespace)
        self.successors = _successors(found)
        if found is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    **({"annotations": named} if successors else {}),
                },
                "spec": {**spec, "acquireTime": stamp},
            }
            try:
                self._hold(key, await self.api.create(Lease, body))
            except Conflict:
                return False
            return True
        data = found
        held = data.get("spec") or {}
        holder = held.get("holderIdentity") or ""
        renewed = held.get("renewTime")
        lapsed = True
        if renewed:
            when = datetime.datetime.fromisoformat(str(renewed).replace("Z", "+00:00"))
            lapsed = (now - when).total_seconds() > float(held.get("leaseDurationSeconds") or 0)
        if holder != identity and not lapsed:
            return False
        if holder != identity:
            spec["acquireTime"] = stamp
        meta = {"resourceVersion": data["metadata"]["resourceVersion"], "annotations": named}
        patch = {"metadata": meta, "spec": spec}
        try:
            self._hold(key, await self.api.merge_patch(Lease, name, patch, namespace=namespace))
        except Conflict:
            return False
        return True

    def _hold(self, key: tuple[str, str], written: Any) -> None:
        """The Lease as this process's write returned it: its next renewal's precondition."""
        meta = written.get("metadata") if isinstance(written, Mapping) else None
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        if isinstance(version, str) and version:
            self._holding[key] = version


# the pool accountant's Lease: the nodes its holder names to take over first (comma-separated)
SUCCESSORS = "cni.networking.x-k8s.io/successors"


def _successors(lease: Mapping[str, Any] | None) -> frozenset[str] | None:
    annotations = ((lease or {}).get("metadata") or {}).get("annotations") or {}
    named = annotations.get(SUCCESSORS)
    if not isinstance(named, str) or not named:
        return None
    return frozenset(n for n in named.split(",") if n)
