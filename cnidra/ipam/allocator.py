"""cnidra's IPAM at prepare: a claim's cnidra-IPAM networks get addresses from the node's blocks
(a block reserved by creating its CNIIPBlock when the node has no free address left), or from
the IPAMClaim they reference; the networks are rewritten to static IPAM with them, so the NRI
hook runs plugins as it always does and never asks the apiserver anything. The static
addresses a tenant wrote are leased from the CNIIPPool that owns them, so no two holders
anywhere get one address. docs/ipam.md."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from cnidra.api.ipam import (
    Address,
    Block,
    BlockObject,
    Pool,
    PoolError,
    cnidra_ipam,
    parse_claim_ips,
    pool_from_object,
    pool_name_problem,
    static_ipam_addresses,
    with_static_ipam,
)
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment, changed
from cnidra.observe import metrics
from cnidra.observe.metrics import PoolUsage
from cnidra.state.checkpoint import PreparedClaim
from cnidra.state.ipam import (
    HeldBlock,
    IPAMState,
    Lease,
    claim_owner,
    ipamclaim_owner,
    owner_claim_uid,
)
from cnidra.util.backoff import Backoff
from cnidra.util.locks import KeyedLocks

log = logging.getLogger(__name__)
POOL_TTL_SECONDS = 10.0
# how long a pool's published address count is kept before the pool and its blocks are read
# again (a GET and a LIST); a block this node takes recounts at once. Other nodes' blocks are
# seen within this time: until then a node may promise an address another took, and prepare
# refuses, naming the pool (it may anyway, near the end: nodes count the unheld blocks alike)
CAPACITY_TTL_SECONDS = 300.0
# how long the addresses a claim read ahead will ask for count towards the blocks reserved
# ahead (as long as cnidra.dra.ahead keeps the claim), and how many claims are counted at most
EXPECTED_SECONDS = 120.0
EXPECTED_CLAIMS = 4096


@dataclass(frozen=True)
class _Wants:
    """One address a claim read ahead will ask of a pool's every range, and what prepare checks
    before it gives one."""

    pool: str
    namespace: str
    tenant_pool: bool
    ranges: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None


class AllocationError(Exception):
    """Why a claim gets no address; the message names the pool or IPAMClaim."""


class IPAMCluster(Protocol):
    """What the allocator needs of the apiserver (cnidra.kube.ipam; tests use a fake). An
    implementation asks again itself, a bounded number of times, after a transient answer
    (throttled, storage initializing, a timeout or a dropped connection) to the calls that may
    be repeated, and raises only what is not transient, or the last failure: the allocator
    never retries, and fails what it was doing (naming the pool or IPAMClaim)."""

    async def pool(self, name: str) -> Mapping[str, Any] | None: ...

    async def pools(self) -> list[Mapping[str, Any]]:
        """Every CNIIPPool (which one owns a tenant's static address)."""
        ...

    async def blocks(
        self, pool: str | None = None, node: str | None = None
    ) -> list[BlockObject]: ...

    async def create_block(self, block: Block, node: str) -> str | None:
        """The new object's UID; None when the block is another node's already (this node's:
        its UID, as when a create is retried after its answer was lost). The object is owned
        by the Node (ownerReferences), so the garbage collector deletes a lost node's blocks:
        no node ever writes another node's block."""
        ...

    async def delete_block(self, name: str, uid: str) -> None: ...

    async def own_block(self, block: BlockObject, node: str) -> None:
        """Make `node`'s Node the owner of a block of it made before blocks had owners."""
        ...

    async def ipamclaim(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    async def bind_ipamclaim(
        self, claim: Mapping[str, Any], ips: Sequence[str], pod: str, node: str
    ) -> bool:
        """Write the addresses into the IPAMClaim (finalizer and node label first); False when
        it changed since it was read (someone else bound it)."""
        ...

    async def bound_ipamclaims(self) -> list[Mapping[str, Any]]:
        """Every IPAMClaim cnidra wrote addresses into (its node label set), all namespaces."""
        ...

    async def unbind_ipamclaim(self, claim: Mapping[str, Any]) -> None:
        """Drop cnidra's finalizer: its addresses are free."""
        ...

    async def node_exists(self, name: str) -> bool: ...

    async def addresses_in_use(self, namespace: str) -> dict[str, str]:
        """address -> the claim ("namespace/name") whose device status shows it, for every
        allocated ResourceClaim of this driver in `namespace`, whichever node prepared it."""
        ...

    async def record(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        """A Normal Event on an IPAMClaim."""
        ...


def _pod(namespace: str, pods: Sequence[str]) -> str:
    """The claim's one pod as `namespace/name` (a reservation's key), or "" when it has
    several or none."""
    return f"{namespace}/{pods[0]}" if len(pods) == 1 else ""


def _gave(what: str, address: Address, lease: Lease) -> str:
    return f"{what} holds {address}, which this node gave to {lease.holder or 'another owner'}"


class Allocator:
    def __init__(
        self,
        node: str,
        state: IPAMState,
        cluster: IPAMCluster,
        *,
        pool_ttl: float = POOL_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        blocks_changed: Callable[[], None] = lambda: None,
        node_addresses: Callable[[], frozenset[Address]] = frozenset,
    ) -> None:
        self.node = node
        # the addresses this node holds on its links now: never handed out to a pod (a pool
        # whose range holds one, unexcluded, would give the pod the node's address)
        self.node_addresses = node_addresses
        self.state = state
        self.cluster = cluster
        self.pool_ttl = pool_ttl
        self.clock = clock
        self.blocks_changed = blocks_changed  # the inventory recounts the pools' addresses
        self._pools: dict[str, tuple[float, Pool]] = {}
        self._reading: dict[str, asyncio.Future[Pool]] = {}  # pool -> its GET in flight
        self._pool_list: tuple[float, list[Pool]] | None = None
        self._counts: dict[str, tuple[float, int]] = {}
        # pool -> (when LISTed, the names of its blocks held then, with those this node tried
        # to create since): the next block of a burst is reserved without another LIST
        self._taken: dict[str, tuple[float, set[str]]] = {}
        self.capacity_ttl = CAPACITY_TTL_SECONDS
        self._locks = KeyedLocks()
        # held while a block is reserved (inside a pool's lock at prepare, alone ahead)
        self._reserving = KeyedLocks()
        # claim UID -> (when, what it will ask for): the claims read ahead, not yet prepared
        self._expected: dict[str, tuple[float, tuple[_Wants, ...]]] = {}
        self._topping: dict[str, asyncio.Task[None]] = {}  # pool -> its top-up running
        self._again: set[str] = set()  # pools whose demand grew while topped up

    def pool_lock(self, pool: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Held while a pool's addresses or blocks of this node change."""
        return self._locks.hold(pool)

    # ------------------------------------------------------------------ ahead

    def expect(self, prepared: PreparedClaim) -> None:
        """A claim read ahead (cnidra.dra.ahead) will ask for these addresses: the blocks they
        need are reserved now, in the background, so that its prepare asks the apiserver
        nothing (and the pool is read again now if its GET is older than `pool_ttl`). Counted
        only as prepare would serve them: a pool that does not serve the claim's namespace
        reserves nothing for it. Forgotten when the claim is assigned or released, or after
        EXPECTED_SECONDS; blocks stay the node's, as those reserved at prepare do."""
        if self.state.claim_owners(prepared.uid):
            return  # prepared before: it keeps what it holds
        wants = tuple(
            _Wants(
                str(uses[0][1].get("pool", "")),
                prepared.ref.namespace,
                a.tenant_pool,
                a.pool_ranges,
            )
            for a in prepared.devices
            if not a.ipam_claim and len(uses := cnidra_ipam(a.network)) == 1
        )
        wants = tuple(w for w in wants if not pool_name_problem(w.pool))
        if not wants:
            return
        self._expected.pop(prepared.uid, None)
        self._expected[prepared.uid] = (self.clock(), wants)
        while len(self._expected) > EXPECTED_CLAIMS:
            del self._expected[next(iter(self._expected))]
        for name in sorted({w.pool for w in wants}):
            self._top_up_soon(name)

    def expecting(self) -> int:
        """How many claims read ahead are expected (not yet assigned, released or expired)."""
        return len(self._expected)

    def _demand(self, pool: Pool) -> int:
        """How many addresses of each of the pool's ranges the claims read ahead will ask for."""
        now = self.clock()
        for uid in [u for u, (t, _) in self._expected.items() if now - t >= EXPECTED_SECONDS]:
            del self._expected[uid]
        return sum(
            1
            for _, wants in self._expected.values()
            for w in wants
            if w.pool == pool.name
            and pool.allows_namespace(w.namespace)
            and not (w.tenant_pool and pool.tenant_problem(w.namespace, w.ranges))
        )

    def _free_held(self, pool: Pool, range_index: int) -> int:
        """The addresses of the node's blocks of a range that no one holds."""
        free = 0
        for held in self.state.held_blocks(pool.name, range_index):
            taken = self.state.taken_in(held.name)
            free += sum(
                1 for _, text in pool.usable_texts_at(range_index, held.index) if text not in taken
            )
        return free

    def _top_up_soon(self, name: str) -> None:
        if name in self._topping:
            self._again.add(name)
            return
        task = asyncio.create_task(self._top_up(name), name=f"ipam top-up {name}")
        self._topping[name] = task
        task.add_done_callback(lambda _: self._topping.pop(name, None))

    async def _top_up(self, name: str) -> None:
        """Reserve blocks of the pool until its free addresses on this node cover what the
        claims read ahead will ask for. A failure is logged; their prepares reserve what they
        still need, as without the read-ahead."""
        try:
            again = True
            while again:
                self._again.discard(name)
                pool = await self.pool(name)
                for index in range(len(pool.spec.ranges)):
                    while True:
                        async with self._reserving.hold(name):
                            if self._free_held(pool, index) >= self._demand(pool):
                                break
                            await self._reserve_block(pool, index)
                        metrics.IPAM_BLOCKS_RESERVED.labels("ahead").inc()
                again = name in self._again
        except AllocationError as exc:
            log.info("no block reserved ahead: %s", exc)
        except Exception:
            log.exception("reserving blocks of CNIIPPool %s ahead failed", name)

    async def topped_up(self) -> None:
        """Every top-up started so far finished (tests, benchmarks)."""
        while self._topping:
            await asyncio.gather(*self._topping.values(), return_exceptions=True)

    # ------------------------------------------------------------------ prepare

    async def assign(self, prepared: PreparedClaim, pods: Sequence[str] = ()) -> PreparedClaim:
        """The claim with addresses in its cnidra-IPAM networks. The same claim and request
        get the same addresses every time (kubelet prepares a claim again after a restart). The
        static addresses a tenant wrote are leased first, the network left as written. A
        refusal gives back what this call leased (what the claim held before stays)."""
        self._expected.pop(prepared.uid, None)
        before = {
            lease.key
            for owner in self.state.claim_owners(prepared.uid)
            for lease in self.state.of_owner(owner)
        }
        try:
            return await self._assign(prepared, pods)
        except AllocationError:
            for owner in self.state.claim_owners(prepared.uid):
                for lease in self.state.of_owner(owner):
                    if lease.key not in before:
                        await self.state.unlease(lease)
            raise

    async def _assign(self, prepared: PreparedClaim, pods: Sequence[str]) -> PreparedClaim:
        devices = []
        for attachment in prepared.devices:
            static = (
                await self._static(prepared, attachment, pods) if attachment.tenant_static else []
            )
            uses = cnidra_ipam(attachment.network)
            if not uses:
                devices.append(attachment)
                continue
            if len(uses) > 1:
                raise AllocationError(
                    f"request {attachment.request!r}: {len(uses)} plugins of network "
                    f"{attachment.network_name!r} ask for cnidra IPAM; one may"
                )
            pool = await self.pool(str(uses[0][1].get("pool", "")))
            if not pool.allows_namespace(prepared.ref.namespace):
                raise AllocationError(
                    f"request {attachment.request!r}: CNIIPPool {pool.name} does not serve "
                    f"namespace {prepared.ref.namespace} (its spec.namespaces)"
                )
            if attachment.tenant_pool:
                problem = pool.tenant_problem(prepared.ref.namespace, attachment.pool_ranges)
                if problem:
                    raise AllocationError(f"request {attachment.request!r}: {problem}")
            if attachment.ipam_claim:
                addresses = await self._persistent(pool, prepared.ref, attachment, pods)
            else:
                owner = claim_owner(prepared.uid, attachment.request)
                holder = f"claim {prepared.ref}"
                pinned = await self._reserved(pool, prepared.ref.namespace, pods, owner, holder)
                addresses = await self._allocate(pool, owner, holder, static, pinned)
            network = with_static_ipam(attachment.network, pool, addresses)
            devices.append(changed(attachment, network=network))
        return replace(prepared, devices=tuple(devices))

    async def release_claim(self, uid: str) -> int:
        """Free what a claim's requests hold (not what IPAMClaims hold)."""
        return await self.release_claims([uid])

    async def release_claims(self, uids: Sequence[str]) -> int:
        """`release_claim` for several claims, their leases removed as one change."""
        wanted = set(uids)
        for uid in wanted:
            self._expected.pop(uid, None)
        owners = [o for o in self.state.owners() if owner_claim_uid(o) in wanted]
        return len(await self.state.release_many(owners))

    async def pool(self, name: str) -> Pool:
        problem = pool_name_problem(name)
        if problem:  # a tenant's config: never a path in an apiserver URL
            raise AllocationError(f"ipam.pool: {problem}")
        cached = self._pools.get(name)
        if cached is not None and self.clock() - cached[0] < self.pool_ttl:
            return cached[1]
        # one GET a pool at a time: a burst's prepares (and the blocks reserved ahead) that
        # find the pool's read old share the one that reads it again
        reading = self._reading.get(name)
        if reading is None:
            reading = asyncio.ensure_future(self._read_pool(name, cached))
            self._reading[name] = reading
            reading.add_done_callback(functools.partial(self._read, name))
        return await asyncio.shield(reading)

    def _read(self, name: str, reading: asyncio.Future[Pool]) -> None:
        self._reading.pop(name, None)
        if not reading.cancelled():
            reading.exception()  # retrieved: its callers, if any are left, got it

    async def _read_pool(self, name: str, cached: tuple[float, Pool] | None) -> Pool:
        try:
            obj = await self.cluster.pool(name)
        except Exception as exc:
            if cached is not None:
                return cached[1]  # the pool as last read, while the apiserver cannot answer
            raise AllocationError(f"CNIIPPool {name} could not be read: {exc}") from None
        if obj is None:
            raise AllocationError(f"CNIIPPool {name} not found")
        try:
            pool = pool_from_object(obj)
        except PoolError as exc:
            raise AllocationError(str(exc)) from None
        self._pools[name] = (self.clock(), pool)
        return pool

    async def pools(self) -> list[Pool]:
        """Every CNIIPPool, read with one LIST and kept as long as a pool's GET (a pool that
        does not parse is left out: nothing is ever leased from it)."""
        cached = self._pool_list
        if cached is not None and self.clock() - cached[0] < self.pool_ttl:
            return cached[1]
        try:
            objects = await self.cluster.pools()
        except Exception as exc:
            if cached is not None:
                return cached[1]  # the pools as last read, while the apiserver cannot answer
            raise AllocationError(f"the CNIIPPools could not be listed: {exc}") from None
        pools = []
        for obj in objects:
            try:
                pools.append(pool_from_object(obj))
            except PoolError as exc:
                log.warning("%s; no static address is leased from it", exc)
        self._pool_list = (self.clock(), pools)
        return pools

    async def _allocate(
        self,
        pool: Pool,
        owner: str,
        holder: str,
        static: Sequence[Address] = (),
        pinned: Sequence[Address] = (),
    ) -> list[Address]:
        """One address of each of the pool's ranges for `owner`: the one reserved for its pod
        (`pinned`, leased already), else the one it has, if any (not the tenant's `static`
        addresses the same owner leased for another plugin), else a free one."""
        leases: list[Lease] = []
        async with self._locks.hold(pool.name):
            held = {
                ipaddress.ip_address(a.address)
                for a in self.state.of_owner(owner)
                if a.pool == pool.name
            } - set(static)
            addresses: list[Address] = []
            try:
                for index, r in enumerate(pool.spec.ranges):
                    reserved = [a for a in pinned if a.version == r.subnet.version]
                    if reserved:
                        addresses.append(reserved[0])
                        continue
                    mine = [a for a in held if a.version == r.subnet.version]
                    if mine:
                        addresses.append(min(mine))
                        continue
                    address, block = await self._free_address(pool, index)
                    lease = Lease(pool.name, str(address), block.name, owner, holder)
                    leases.append(self.state.reserve(lease))
                    addresses.append(address)
            except BaseException:
                self.state.unreserve(leases)
                raise
        # written after the pool's lock is let go: the addresses are taken from the moment
        # they are reserved, and the leases of concurrent prepares go to disk together; the
        # claim is checkpointed only once they are durable (its caller awaits this)
        if leases:
            await self.state.commit(leases)
        return addresses

    async def _free_address(self, pool: Pool, range_index: int) -> tuple[Address, HeldBlock]:
        node = self.node_addresses()

        def free(address: Address) -> bool:
            return (
                address not in node
                and pool.reserved_for(address) is None
                and not self.state.is_taken(pool.name, str(address))
            )

        def in_held() -> tuple[Address, HeldBlock] | None:
            for held in self.state.held_blocks(pool.name, range_index):
                taken = self.state.taken_in(held.name)
                for address, text in pool.usable_texts_at(range_index, held.index):
                    if text not in taken and free(address):
                        return address, held
            return None

        found = in_held()
        if found is not None:
            return found
        async with self._reserving.hold(pool.name):
            found = in_held()  # a block reserved ahead while this waited
            if found is not None:
                return found
            held = await self._reserve_block(pool, range_index)
        metrics.IPAM_BLOCKS_RESERVED.labels("prepare").inc()
        block = pool.block(range_index, held.index)
        for address in pool.usable(block):
            if free(address):
                return address, held
        raise AllocationError(f"CNIIPPool {pool.name}: block {held.name} has no free address")

    async def _reserve_block(self, pool: Pool, range_index: int) -> HeldBlock:
        """A block no node holds, reserved by creating its object (the held ones skipped as a
        LIST named them, then creates until one succeeds). A LIST is used for `pool_ttl`
        seconds: the next block of a burst costs its create alone. A create is what decides (a
        block another node created since is a conflict, and the next is tried); a block freed
        since is missed only until that LIST is read again, which a pool seen exhausted on an
        older LIST is first."""
        family = pool.spec.ranges[range_index].subnet
        kept = self._taken.get(pool.name)
        recent = kept is not None and self.clock() - kept[0] < self.pool_ttl
        for fresh in (False, True) if recent else (True,):
            try:
                taken = await self._taken_blocks(pool) if fresh else self._taken[pool.name][1]
                bound = await self._bound(pool)
            except Exception as exc:
                raise AllocationError(
                    f"CNIIPPool {pool.name}: this node's blocks of {family} are full and the "
                    f"apiserver could not be asked for another: {exc}"
                ) from None
            held = await self._create_free_block(pool, range_index, taken, bound)
            if held is not None:
                return held
        raise AllocationError(
            f"CNIIPPool {pool.name} is exhausted: every block of {family} is held by a node "
            f"and this node's are full ({pool.range_capacity(range_index)} addresses in all)"
        )

    async def _taken_blocks(self, pool: Pool) -> set[str]:
        taken = {b.name for b in await self.cluster.blocks(pool=pool.name)}
        self._taken[pool.name] = (self.clock(), taken)
        return taken

    async def _create_free_block(
        self, pool: Pool, range_index: int, taken: set[str], bound: list[Mapping[str, Any]]
    ) -> HeldBlock | None:
        indices = pool.block_indices(range_index)
        start = pool.first_block_to_try(range_index, self.node) - indices.start
        for step in range(len(indices)):
            index = indices.start + (start + step) % len(indices)
            block = pool.block(range_index, index)
            if block.name in taken or all(
                pool.reserved_for(a) is not None for a in pool.usable(block)
            ):
                continue  # held, or nothing in it anyone but a reservation's pod may get
            try:
                uid = await self.cluster.create_block(block, self.node)
            except Exception as exc:
                raise AllocationError(
                    f"CNIIPPool {pool.name}: block {block.name} could not be reserved: {exc}"
                ) from None
            taken.add(block.name)  # held now, this node's or another's
            if uid is None:
                continue  # another node created it since the LIST
            held = HeldBlock(pool.name, block.name, range_index, index, str(block.cidr), uid)
            await self._hold_with_persistent(pool, block, held, bound)
            log.info("reserved block %s (%s) of CNIIPPool %s", block.name, block.cidr, pool.name)
            return held
        return None

    async def _bound(self, pool: Pool) -> list[Mapping[str, Any]]:
        """The IPAMClaims holding addresses (none can in a pool without persistent IPs)."""
        return await self.cluster.bound_ipamclaims() if pool.spec.allow_persistent_ips else []

    async def _hold_with_persistent(
        self, pool: Pool, block: Block, held: HeldBlock, bound: list[Mapping[str, Any]]
    ) -> None:
        """Record a block as this node's, with the IPAMClaim addresses in it leased first: a
        lost node's block comes back free, but the addresses its IPAMClaims keep do not (they
        were read before the block was created, so none is missed)."""
        for lease in self._persistent_in(pool, block, bound):
            await self.state.lease(lease)
        await self.state.hold(held)
        self._counts.pop(pool.name, None)
        self.blocks_changed()

    async def capacity(self, name: str) -> int | None:
        """How many addresses of a pool this node can give its claims: the ones its claims
        hold, the free ones of its blocks, and those of blocks no node holds (one LIST). It
        does not change when a claim here takes an address, so the ResourceSlice that
        carries it is rewritten only when blocks or the pool change; the scheduler counts
        the claims. Nodes count the unheld blocks alike, so near the end two may both
        promise the last one: prepare then refuses, naming the pool. A count is kept for
        `capacity_ttl` seconds, or until this node takes a block."""
        kept = self._counts.get(name)
        if kept is not None and self.clock() - kept[0] < self.capacity_ttl:
            return kept[1]
        count = await self._count(name)
        if count is not None:  # a pool not read or not there yet is asked again next time
            self._counts[name] = (self.clock(), count)
        return count

    async def _count(self, name: str) -> int | None:
        try:
            pool = await self.pool(name)
        except AllocationError:
            return None
        taken = await self.cluster.blocks(pool=name)
        counts = []
        for index in range(len(pool.spec.ranges)):
            mine = self.state.held_blocks(name, index)
            held_anywhere = {b.name for b in taken} | {b.name for b in mine}
            in_blocks = 0
            for block_name in held_anywhere:
                _, range_text, block_index = block_name.rsplit(".", 2)
                if int(range_text) == index:
                    in_blocks += sum(1 for _ in pool.usable(pool.block(index, int(block_index))))
            unheld = pool.range_capacity(index) - in_blocks
            own = 0
            for held in mine:
                for address in pool.usable(pool.block(index, held.index)):
                    lease = self.state.at(name, str(address))
                    if lease is None or not lease.persistent:
                        own += 1
            counts.append(unheld + own)
        return max(min(counts), 0)

    def usage(self) -> list[PoolUsage]:
        """Per pool: this node's blocks, leases, and free addresses in its blocks (from the
        pools read last; no apiserver call, for a scrape)."""
        out = []
        for name in sorted({b.pool for b in self.state.blocks.all()}):
            held = self.state.held_blocks(name)
            leased = sum(len(self.state.in_block(b.name)) for b in held)
            cached = self._pools.get(name)
            if cached is None:
                out.append(PoolUsage(name, len(held), leased, None))
                continue
            pool = cached[1]
            usable = sum(
                sum(1 for _ in pool.usable(pool.block(b.range_index, b.index))) for b in held
            )
            ranges = range(len(pool.spec.ranges))
            out.append(
                PoolUsage(
                    name,
                    len(held),
                    leased,
                    max(usable - leased, 0),
                    size=sum(pool.range_capacity(i) for i in ranges),
                    pool_blocks=sum(len(pool.block_indices(i)) for i in ranges),
                )
            )
        return out

    # ------------------------------------------------------------------ reservations

    async def _reserved(
        self, pool: Pool, namespace: str, pods: Sequence[str], owner: str, holder: str
    ) -> list[Address]:
        """The addresses the pool reserves for the claim's pod (`spec.reservations`), leased
        to the request: in this node's block or one no node holds (reserved now), or left to
        the node holding the block, which never hands a reserved address to anyone else.
        Refused, naming the holder, while another claim on this node still holds it."""
        pod = _pod(namespace, pods)
        if not pod:
            return []  # a claim shared by several pods: no one pod's reservation applies
        addresses = pool.reservations_of(pod)
        for address in addresses:
            what = f"CNIIPPool {pool.name} reserves {address} for pod {pod}"

            def taken(lease: Lease, what: str = what) -> str:
                return (
                    f"{what}, but {lease.holder or 'another owner'} still holds it (leased on "
                    f"node {self.node}); the pod gets it once that holder lets it go"
                )

            await self._lease_claimed(pool, address, owner, what, holder, taken)
        if addresses:
            log.info("%s: reserved %s", pod, ", ".join(map(str, addresses)))
        return addresses

    def _reserved_elsewhere(self, pool: Pool, address: Address, pod: str, what: str) -> None:
        """Refuse an address reserved for another pod (a static address, an IPAMClaim's)."""
        owner = pool.reserved_for(address)
        if owner is not None and owner != pod:
            raise AllocationError(
                f"{what}: {address} is reserved for pod {owner} in CNIIPPool {pool.name} "
                "(spec.reservations)"
            )

    # ------------------------------------------------------------------ IPAMClaims

    async def _persistent(
        self, pool: Pool, claim: ObjectRef, attachment: Attachment, pods: Sequence[str]
    ) -> list[Address]:
        name = attachment.ipam_claim or ""
        what = f"request {attachment.request!r}: IPAMClaim {claim.namespace}/{name}"
        if not pool.spec.allow_persistent_ips:
            raise AllocationError(
                f"{what} cannot be honoured: CNIIPPool {pool.name} does not allow persistent "
                "IPs (spec.allowPersistentIPs is false)"
            )
        # an IPAMClaim another node binds meanwhile is read again, on the one pace (client-go's
        # RetryOnConflict shape: a few short steps)
        conflicts = Backoff(initial=0.01, maximum=0.2)
        for attempt in range(5):
            if attempt:
                await asyncio.sleep(conflicts.next())
            try:
                obj = await self.cluster.ipamclaim(claim.namespace, name)
            except Exception as exc:
                raise AllocationError(f"{what} could not be read: {exc}") from None
            if obj is None:
                raise AllocationError(
                    f"{what} not found (the workload's controller creates it before the pod)"
                )
            meta = obj.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                raise AllocationError(f"{what} is being deleted")
            try:
                ips = parse_claim_ips((obj.get("status") or {}).get("ips"))
            except ValueError as exc:
                raise AllocationError(f"{what}: status.ips: {exc}") from None
            owner = ipamclaim_owner(claim.namespace, name, str(meta.get("uid")))
            if ips:
                for ip in ips:
                    self._reserved_elsewhere(pool, ip.ip, _pod(claim.namespace, pods), what)
                return await self._claimed(pool, what, [i.ip for i in ips], owner)
            addresses = await self._allocate(pool, owner, f"IPAMClaim {claim.namespace}/{name}")
            cidrs = [pool.interface_text(a) for a in addresses]
            try:
                bound = await self.cluster.bind_ipamclaim(
                    obj, cidrs, pods[0] if pods else "", self.node
                )
            except Exception as exc:
                await self.state.release(owner)
                raise AllocationError(f"{what}: its status could not be written: {exc}") from None
            if bound:
                log.info("IPAMClaim %s/%s holds %s", claim.namespace, name, ", ".join(cidrs))
                return addresses
            await self.state.release(owner)
        raise AllocationError(f"{what} kept changing while its addresses were written")

    async def _claimed(
        self, pool: Pool, what: str, addresses: list[Address], owner: str
    ) -> list[Address]:
        """An IPAMClaim's addresses, checked as any address cnidra hands out: in the pool's
        range, not its gateway nor excluded, not given to anyone else; then leased, in this
        node's block (reserved now if no node holds it) or left to the node holding it, which
        leased it when it allocated or reserved the block. Whoever else may write the status
        must not take an address this node gave to another pod."""
        for address in addresses:
            lease = self.state.at(pool.name, str(address))
            if lease is not None and lease.owner != owner:
                raise AllocationError(_gave(what, address, lease))
        outside = [str(a) for a in addresses if pool.block_of(a) is None]
        if outside:
            raise AllocationError(
                f"{what} holds {', '.join(outside)}, which is not in CNIIPPool {pool.name}"
            )
        for address in addresses:
            if not pool.hands_out(address):
                raise AllocationError(
                    f"{what} holds {address}, which CNIIPPool {pool.name} never hands out "
                    "(its gateway, an excluded address, or a subnet's network or broadcast)"
                )
        families = [r.subnet.version for r in pool.spec.ranges]
        if sorted(a.version for a in addresses) != sorted(families):
            raise AllocationError(
                f"{what} holds {', '.join(map(str, addresses))}, not one address of each of "
                f"CNIIPPool {pool.name}'s ranges"
            )
        holder = what.split(": ", 1)[-1]
        for address in addresses:
            taken = functools.partial(_gave, what, address)
            await self._lease_claimed(pool, address, owner, what, holder, taken)
        return sorted(addresses, key=lambda a: families.index(a.version))

    async def _lease_claimed(
        self,
        pool: Pool,
        address: Address,
        owner: str,
        what: str,
        holder: str,
        taken: Callable[[Lease], str],
        *,
        strict: bool = False,
    ) -> None:
        """Lease an address someone chose (not this allocator) to `owner`, under the pool's
        lock: refused (`taken`) if this node leased it to another owner; in this node's block,
        or in a block no node holds, reserved now. In a block another node holds: left to that
        node (an IPAMClaim's address: it leased it when it allocated it or reserved the block),
        or, `strict`, refused, since that node hands the block's addresses out itself and this
        one cannot know whether it did."""
        block = pool.block_of(address)
        assert block is not None
        async with self._locks.hold(pool.name):
            lease = self.state.at(pool.name, str(address))
            if lease is not None:
                if lease.owner != owner:
                    raise AllocationError(taken(lease))
                return  # leased here already, to this owner
            if self.state.blocks.get(block.name) is None:
                try:
                    bound = await self._bound(pool)
                    uid = await self.cluster.create_block(block, self.node)
                except Exception as exc:
                    raise AllocationError(
                        f"{what}: block {block.name} of its address {address} could not be "
                        f"checked or reserved: {exc}"
                    ) from None
                if uid is None:
                    if strict:
                        raise AllocationError(
                            await self._held_elsewhere(pool, block, address, what)
                        )
                    return  # another node holds the block, and leased the address in it
                held = HeldBlock(
                    pool.name, block.name, block.range_index, block.index, str(block.cidr), uid
                )
                await self._hold_with_persistent(pool, block, held, bound)
                log.info("reserved block %s of claimed address %s", block.name, address)
                lease = self.state.at(pool.name, str(address))
                if lease is not None and lease.owner != owner:  # an IPAMClaim's, in it
                    raise AllocationError(taken(lease))
            if self.state.at(pool.name, str(address)) is None:
                await self.state.lease(Lease(pool.name, str(address), block.name, owner, holder))

    async def _held_elsewhere(self, pool: Pool, block: Block, address: Address, what: str) -> str:
        """Why a static address in a block another node holds is refused, naming that node
        (one LIST of the pool's blocks, on this refusal only)."""
        try:
            objects = await self.cluster.blocks(pool=pool.name)
            holder = next((b.node for b in objects if b.name == block.name), None)
        except Exception:
            holder = None
        node = f"node {holder}" if holder else "another node"
        return (
            f"{what}: static address {address} is in block {block.name} ({block.cidr}) of "
            f"CNIIPPool {pool.name}, which {node} holds: that node hands out the block's "
            f"addresses itself and this node ({self.node}) cannot know whether it gave "
            f"{address} to a pod; the pod can run on {node}, or take an address of a block no "
            "node holds (kubectl get cniipblocks)"
        )

    # ------------------------------------------------------------------ tenants' static IPAM

    async def _static(
        self, prepared: PreparedClaim, attachment: Attachment, pods: Sequence[str] = ()
    ) -> list[Address]:
        """The static addresses a tenant wrote for this request, each leased to the request
        (the owner a pool allocation has, so unprepare frees it) from the one CNIIPPool whose
        range holds it: a pool that serves the claim's namespace as a tenant's pool (its
        `namespaces` names it, its ranges inside the class's claims.ipRanges), the prefix
        length the pool's subnet has, an address the pool hands out, not leased here to
        another owner, in this node's block or one no node holds (reserved now). The network
        stays as the tenant wrote it."""
        what = f"request {attachment.request!r}"
        namespace = prepared.ref.namespace
        texts = static_ipam_addresses(
            attachment.network, attachment.cni_args, attachment.capability_args
        )
        if not texts:
            return []
        owner = claim_owner(prepared.uid, attachment.request)
        holder = f"claim {prepared.ref}"
        pools = await self.pools()
        leased: list[Address] = []
        for text in texts:
            try:
                written = ipaddress.ip_interface(text)
            except ValueError:
                raise AllocationError(
                    f"{what}: static address {text!r} is not an address in CIDR notation"
                ) from None
            address = written.ip
            pool = self._static_pool(pools, written, namespace, attachment, what)
            r = pool.range_of(address)
            assert r is not None
            if written.network.prefixlen != r.subnet.prefixlen:
                raise AllocationError(
                    f"{what}: static address {text} has prefix length "
                    f"{written.network.prefixlen}, but CNIIPPool {pool.name}'s subnet "
                    f"{r.subnet} has {r.subnet.prefixlen}: write {address}/{r.subnet.prefixlen}"
                )
            if not pool.hands_out(address):
                raise AllocationError(
                    f"{what}: static address {text} is one CNIIPPool {pool.name} never hands "
                    "out (its gateway, an excluded address, or a subnet's network or broadcast)"
                )
            self._reserved_elsewhere(
                pool, address, _pod(namespace, pods), f"{what}: static address"
            )

            def taken(lease: Lease, text: str = text) -> str:
                return (
                    f"{what}: static address {text} is held by "
                    f"{lease.holder or 'another owner'} (leased on node {self.node})"
                )

            await self._lease_claimed(pool, address, owner, what, holder, taken, strict=True)
            leased.append(address)
        return leased

    def _static_pool(
        self,
        pools: Sequence[Pool],
        written: ipaddress.IPv4Interface | ipaddress.IPv6Interface,
        namespace: str,
        attachment: Attachment,
        what: str,
    ) -> Pool:
        """The one pool whose range holds a tenant's static address, if it may serve it."""
        address = written.ip
        owners = [p for p in pools if p.block_of(address) is not None]
        ask = (
            f"a tenant's static address must lie in a CNIIPPool that serves namespace "
            f"{namespace} (ask the admin for one), or use "
            "ipam: {type: cnidra, pool: NAME}"
        )
        if len(owners) > 1:
            names = " and ".join(p.name for p in sorted(owners, key=lambda p: p.name)[:2])
            raise AllocationError(
                f"{what}: static address {written} lies in the ranges of CNIIPPools {names}, "
                "which overlap (the admin's to fix; cnidra does not guess which one holds it)"
            )
        if not owners:
            near = [p.name for p in pools if p.in_subnet(address)]
            where = (
                f" (it is in the subnet of CNIIPPool {', '.join(sorted(near))}, outside the "
                "range it hands out)"
                if near
                else ""
            )
            raise AllocationError(
                f"{what}: static address {written} lies in no CNIIPPool{where}: {ask}"
            )
        pool = owners[0]
        problem = pool.tenant_problem(namespace, attachment.pool_ranges)
        if problem:
            raise AllocationError(f"{what}: static address {written}: {problem}; {ask}")
        return pool

    # ------------------------------------------------------------------ start-up

    async def sync_blocks(self) -> None:
        """Blocks the apiserver says are this node's but the disk does not know (a crash
        between creating one and recording it) are recorded, with the IPAMClaim addresses in
        them leased first, so none is handed out twice. Blocks the disk holds but the
        apiserver lost (the Node object was deleted and made again, and the garbage collector
        took its blocks) are reserved again, or named in the log if another node has them."""
        objects = await self.cluster.blocks(node=self.node)
        bound: list[Mapping[str, Any]] | None = None
        names = {obj.name for obj in objects}
        for obj in objects:
            if not obj.owned:
                await self.cluster.own_block(obj, self.node)
            if self.state.blocks.get(obj.name) is None:
                bound = bound if bound is not None else await self.cluster.bound_ipamclaims()
                await self._record(obj, bound)
        for held in self.state.blocks.all():
            if held.name in names:
                continue
            try:
                pool = await self.pool(held.pool)
            except AllocationError as exc:
                log.warning("block %s not checked: %s", held.name, exc)
                continue
            block = pool.block(held.range_index, held.index)
            uid = await self.cluster.create_block(block, self.node)
            if uid is not None:
                await self.state.hold(replace(held, uid=uid))
                log.warning("block %s was gone from the apiserver; reserved again", held.name)
            else:
                log.error(
                    "block %s is another node's now; the %d addresses of it this node gave "
                    "may be given twice until their pods go",
                    held.name,
                    len(self.state.in_block(held.name)),
                )

    async def _record(self, obj: BlockObject, bound: list[Mapping[str, Any]]) -> bool:
        """Record one of this node's blocks the disk forgot."""
        try:
            pool = await self.pool(obj.pool)
        except AllocationError as exc:
            log.warning("block %s not recorded: %s", obj.name, exc)
            return False
        _, range_text, index_text = obj.name.rsplit(".", 2)
        block = pool.block(int(range_text), int(index_text))
        async with self._locks.hold(pool.name):
            held = HeldBlock(
                pool.name, block.name, block.range_index, block.index, str(block.cidr), obj.uid
            )
            await self._hold_with_persistent(pool, block, held, bound)
        log.info("recorded block %s of CNIIPPool %s", obj.name, pool.name)
        return True

    def _persistent_in(
        self, pool: Pool, block: Block, bound: list[Mapping[str, Any]]
    ) -> list[Lease]:
        leases = []
        for obj in bound:
            meta = obj.get("metadata") or {}
            try:
                ips = parse_claim_ips((obj.get("status") or {}).get("ips"))
            except ValueError:
                continue
            for ip in ips:
                if ip.ip in block.cidr and not self.state.is_taken(pool.name, str(ip.ip)):
                    owner = ipamclaim_owner(
                        str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
                    )
                    holder = f"IPAMClaim {meta.get('namespace')}/{meta.get('name')}"
                    leases.append(Lease(pool.name, str(ip.ip), block.name, owner, holder))
        return leases
