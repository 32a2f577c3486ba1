"""What frees addresses nobody holds, and only those (docs/ipam.md):

- an address of a claim this node has not prepared and is not preparing (its checkpoint entry
  is gone: the claim was unprepared, or a prepare died after the address was leased), once
  older than a grace period;
- an IPAMClaim's addresses once it is being deleted or is gone; its finalizer is dropped then;
- a lost node's blocks (its Node object is gone): a live node adopts them with the IPAMClaim
  addresses in them and releases those that hold none.

Everything else is live: an address whose claim is in the checkpoint, or whose IPAMClaim
exists, is never freed."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from cnidra.ipam.allocator import Allocator, IPAMCluster
from cnidra.state.ipam import owner_claim_uid

log = logging.getLogger(__name__)
GRACE_SECONDS = 120.0


@dataclass
class Report:
    freed_claim_addresses: int = 0
    freed_ipamclaim_addresses: int = 0
    adopted_blocks: int = 0
    released_blocks: int = 0


class Reconciler:
    def __init__(
        self,
        allocator: Allocator,
        prepared: Callable[[], Collection[str]],
        *,
        grace: float = GRACE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.allocator = allocator
        self.prepared = prepared
        self.grace = grace
        self.clock = clock

    @property
    def cluster(self) -> IPAMCluster:
        return self.allocator.cluster

    async def once(self, *, lost_nodes: bool = True) -> Report:
        report = Report()
        report.freed_claim_addresses = await self.free_unprepared()
        report.freed_ipamclaim_addresses = await self.free_released_ipamclaims()
        if lost_nodes:
            adopted, released = await self.adopt_lost_blocks()
            report.adopted_blocks, report.released_blocks = adopted, released
        return report

    async def free_unprepared(self) -> int:
        state = self.allocator.state
        now = self.clock()
        freed = 0
        for owner in state.owners():
            uid = owner_claim_uid(owner)
            # asked afresh for each: a prepare may have started during the last release
            if uid is None or uid in self.prepared():
                continue
            leases = state.of_owner(owner)
            if leases and all(now - lease.since > self.grace for lease in leases):
                freed += len(await state.release(owner))
                log.info("freed %s of unprepared %s", [x.address for x in leases], owner)
        return freed

    async def free_released_ipamclaims(self) -> int:
        state = self.allocator.state
        freed = 0
        for owner in state.owners():
            if not owner.startswith("ipamclaim/"):
                continue
            _, namespace, name, uid = owner.split("/", 3)
            obj = await self.cluster.ipamclaim(namespace, name)
            meta = (obj or {}).get("metadata") or {}
            if obj is not None and meta.get("uid") == uid and not meta.get("deletionTimestamp"):
                continue
            leases = await state.release(owner)
            freed += len(leases)
            log.info(
                "freed %s of IPAMClaim %s/%s (%s)",
                [x.address for x in leases],
                namespace,
                name,
                "deleted" if obj is not None and meta.get("uid") == uid else "gone",
            )
            if obj is not None and meta.get("uid") == uid:
                await self.cluster.unbind_ipamclaim(obj)
        return freed

    async def adopt_lost_blocks(self) -> tuple[int, int]:
        adopted = released = 0
        alive: dict[str, bool] = {}
        for obj in await self.cluster.blocks():
            if obj.node == self.allocator.node:
                continue
            if obj.node not in alive:
                alive[obj.node] = await self.cluster.node_exists(obj.node)
            if alive[obj.node]:
                continue
            if not await self.allocator.adopt(obj):
                continue
            adopted += 1
            if await self.release_if_empty(obj.name):
                released += 1
        return adopted, released

    async def release_if_empty(self, name: str) -> bool:
        state = self.allocator.state
        held = state.blocks.get(name)
        if held is None or state.in_block(name):
            return False
        async with self.allocator.pool_lock(held.pool):
            if state.in_block(name):
                return False
            await self.cluster.delete_block(name, held.uid)
            await state.drop_block(name)
        log.info("released empty block %s of CNIIPPool %s", name, held.pool)
        return True

    async def run(self, interval: float, lost_node_every: int = 10) -> None:
        """For the agent's supervised tasks: the start-up sync, then a pass every `interval`
        (with jitter, so nodes do not scan in step), lost nodes every `lost_node_every`
        passes. An apiserver that cannot be reached fails a pass, not the task: the next pass
        tries again, and the driver stays healthy."""
        synced = False
        passes = 0
        while True:
            try:
                if not synced:
                    await self.allocator.sync_blocks()
                    synced = True
                report = await self.once(lost_nodes=passes % lost_node_every == 0)
                if any(vars(report).values()):
                    log.info("IPAM reconcile: %s", report)
            except Exception as exc:
                log.warning("IPAM reconcile pass failed, next in %.0f s: %s", interval, exc)
            passes += 1
            await asyncio.sleep(interval * random.uniform(0.9, 1.1))
