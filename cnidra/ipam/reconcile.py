"""What frees addresses nobody holds, and only those (docs/ipam.md):

- an address of a claim this node has not prepared and is not preparing (its checkpoint entry
  is gone: the claim was unprepared, or a prepare died after the address was leased), once
  older than a grace period;
- an IPAMClaim's addresses once it is being deleted or is gone, and no allocated claim on any
  node holds them any more (an IPAMClaim deleted under a running pod keeps its addresses, and
  its finalizer, until the pod goes, with an Event saying so); its finalizer is dropped then.

A lost node's blocks are not this code's: they are owned by their Node object, so the garbage
collector deletes them with it, and a node that reserves such a block again leases the
IPAMClaim addresses in it first (cnidra.ipam.allocator). No node writes another's block.

Everything else is live: an address whose claim is in the checkpoint, or whose IPAMClaim
exists, is never freed."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from cnidra.api.ipam import IPAMCLAIM_NODE_LABEL, parse_claim_ips
from cnidra.ipam.allocator import Allocator, IPAMCluster
from cnidra.state.ipam import ipamclaim_owner, owner_claim_uid
from cnidra.util.backoff import Backoff

log = logging.getLogger(__name__)
GRACE_SECONDS = 120.0


@dataclass
class Report:
    freed_claim_addresses: int = 0
    freed_ipamclaim_addresses: int = 0
    released_finalizers: int = 0


class IPAMReconciler:
    def __init__(
        self,
        allocator: Allocator,
        prepared: Callable[[], Collection[str]],
        *,
        persistent_users: Callable[[], Mapping[tuple[str, str], Collection[str]]] = dict,
        grace: float = GRACE_SECONDS,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`persistent_users`: (namespace, IPAMClaim name) -> the claims prepared on this node
        that reference it."""
        self.allocator = allocator
        self.prepared = prepared
        self.persistent_users = persistent_users
        self._announced: set[str] = set()
        self.grace = grace
        self.clock = clock
        self.monotonic = monotonic
        self.passes = 0  # passes run, a failed one included (the health endpoint's ipamPasses)
        # when this process first saw each owner unprepared (monotonic): the wall clock's age
        # of a lease survives restarts, but a clock set forward must not make a lease old, so
        # the grace must also have passed here, on a clock that never jumps
        self._unprepared_since: dict[str, float] = {}

    @property
    def cluster(self) -> IPAMCluster:
        return self.allocator.cluster

    async def once(self, *, lost_nodes: bool = True) -> Report:
        report = Report()
        report.freed_claim_addresses = await self.free_unprepared()
        report.freed_ipamclaim_addresses = await self.free_released_ipamclaims()
        if lost_nodes:
            report.released_finalizers = await self.release_orphaned_ipamclaims()
        return report

    async def free_unprepared(self) -> int:
        state = self.allocator.state
        now, tick = self.clock(), self.monotonic()
        freed = 0
        seen = set()
        for owner in list(state.owners()):
            uid = owner_claim_uid(owner)
            # asked afresh for each: a prepare may have started during the last release
            if uid is None or uid in self.prepared():
                continue
            seen.add(owner)
            first = self._unprepared_since.setdefault(owner, tick)
            leases = state.of_owner(owner)
            old = all(now - lease.since > self.grace for lease in leases)
            if leases and old and tick - first >= self.grace:
                freed += len(await state.release(owner))
                log.info("freed %s of unprepared %s", [x.address for x in leases], owner)
        for owner in set(self._unprepared_since) - seen:  # prepared again, or released
            del self._unprepared_since[owner]
        return freed

    async def free_released_ipamclaims(self) -> int:
        state = self.allocator.state
        freed = 0
        for owner in list(state.owners()):
            if not owner.startswith("ipamclaim/"):
                continue
            _, namespace, name, uid = owner.split("/", 3)
            obj = await self.cluster.ipamclaim(namespace, name)
            meta = (obj or {}).get("metadata") or {}
            same = obj is not None and meta.get("uid") == uid
            if same and not meta.get("deletionTimestamp"):
                continue
            addresses = [lease.address for lease in state.of_owner(owner)]
            holders = await self.holders(namespace, name, addresses)
            if holders:
                await self._kept(owner, obj if same else None, addresses, holders)
                continue
            leases = await state.release(owner)
            self._announced.discard(owner)
            freed += len(leases)
            log.info(
                "freed %s of IPAMClaim %s/%s (%s)",
                [x.address for x in leases],
                namespace,
                name,
                "deleted" if same else "gone",
            )
            if same and obj is not None:
                await self.cluster.unbind_ipamclaim(obj)
        return freed

    async def holders(self, namespace: str, name: str, addresses: Collection[str]) -> list[str]:
        """The claims still holding an IPAMClaim's addresses: this node's prepared claims that
        reference it, and any allocated claim in its namespace (on any node) whose device
        status shows one of them."""
        held = sorted(self.persistent_users().get((namespace, name), ()))
        if addresses:
            in_use = await self.cluster.addresses_in_use(namespace)
            held += sorted({in_use[a] for a in addresses if a in in_use} - set(held))
        return held

    async def _kept(
        self,
        owner: str,
        obj: Mapping[str, Any] | None,
        addresses: list[str],
        holders: list[str],
    ) -> None:
        if owner in self._announced:
            return
        _, namespace, name, _ = owner.split("/", 3)
        message = (
            f"IPAMClaim {namespace}/{name} was deleted, but claim(s) {', '.join(holders)} "
            f"still use {', '.join(addresses)}: kept until their pods go"
        )
        log.warning("%s", message)
        self._announced.add(owner)
        if obj is not None:
            try:
                await self.cluster.record(obj, "AddressesKept", message)
            except Exception as exc:
                log.warning("event on IPAMClaim %s/%s not written: %s", namespace, name, exc)

    async def release_orphaned_ipamclaims(self) -> int:
        """Drop the finalizer of IPAMClaims being deleted whose node is gone (a node that no
        longer exists cannot), once nothing holds their addresses; and of this node's that it
        holds no addresses for (bound, then the status write failed and the allocation was
        undone: free_released_ipamclaims, which goes by this node's leases, never sees them)."""
        released = 0
        alive: dict[str, bool] = {}
        owners = set(self.allocator.state.owners())
        for obj in await self.cluster.bound_ipamclaims():
            meta = obj.get("metadata") or {}
            if not meta.get("deletionTimestamp"):
                continue
            node = str((meta.get("labels") or {}).get(IPAMCLAIM_NODE_LABEL) or "")
            if node == self.allocator.node:
                owner = ipamclaim_owner(
                    str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
                )
                if owner in owners:
                    continue  # leased here: free_released_ipamclaims
                alive[node] = False  # released as a lost node's would be
            if node not in alive:
                alive[node] = await self.cluster.node_exists(node) if node else False
            if alive[node]:
                continue
            try:
                ips = [str(i.ip) for i in parse_claim_ips((obj.get("status") or {}).get("ips"))]
            except ValueError:
                ips = []
            namespace, name = str(meta.get("namespace")), str(meta.get("name"))
            if await self.holders(namespace, name, ips):
                continue
            await self.cluster.unbind_ipamclaim(obj)
            released += 1
            if node == self.allocator.node:
                log.info("released IPAMClaim %s/%s, bound here without addresses", namespace, name)
            else:
                log.info("released IPAMClaim %s/%s of lost node %s", namespace, name, node)
        return released

    async def run(self, interval: float, lost_node_every: int = 10) -> None:
        """For the agent's supervised tasks: the start-up sync, then a pass every `interval`
        (with jitter, so nodes do not scan in step), lost nodes every `lost_node_every`
        passes. An apiserver that cannot be reached fails a pass, not the task: the next pass
        tries again, and the driver stays healthy."""
        synced = False
        # a failed pass is tried again on the one pace (cnidra.util.backoff), up to `interval`;
        # a pass that worked waits `interval` (with its jitter, so nodes do not scan in step)
        failed = Backoff(initial=min(1.0, interval), maximum=interval)
        while True:
            try:
                if not synced:
                    await self.allocator.sync_blocks()
                    synced = True
                report = await self.once(lost_nodes=self.passes % lost_node_every == 0)
                if any(vars(report).values()):
                    log.info("IPAM reconcile: %s", report)
                failed.reset()
                wait = interval * random.uniform(0.9, 1.1)
            except Exception as exc:
                wait = failed.next()
                log.warning("IPAM reconcile pass failed, next in %.1f s: %s", wait, exc)
            self.passes += 1
            await asyncio.sleep(wait)
