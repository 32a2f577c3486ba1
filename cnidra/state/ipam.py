"""The node's part of cnidra's cluster-wide IPAM, on disk: the blocks it holds and which owner
has each address it handed out from them (docs/ipam.md).

Write-through like the checkpoint: an address is on disk (its store's log fsynced) before
prepare checkpoints the claim that uses it, so a crash between the two leaves an address the
reconciler frees, never a claim whose address is unrecorded. One file per block and per address
under `<state>/pools/{blocks,addresses}/`, written when the stores settle (cnidra.state.store)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from cnidra.state.layout import StateLayout
from cnidra.state.store import JsonDirStore


@dataclass(frozen=True)
class HeldBlock:
    pool: str
    name: str
    range_index: int
    index: int
    cidr: str
    uid: str


@dataclass(frozen=True)
class Lease:
    """One address handed out. `owner` is what keeps it: `claim/<uid>/<request>` (freed when the
    claim is unprepared) or `ipamclaim/<namespace>/<name>/<uid>` (persistent: freed when the
    IPAMClaim is deleted)."""

    pool: str
    address: str
    block: str
    owner: str
    holder: str = ""  # for people: the claim or IPAMClaim, namespace/name
    since: float = 0.0

    @property
    def persistent(self) -> bool:
        return self.owner.startswith("ipamclaim/")

    @property
    def key(self) -> str:
        return f"{self.pool}_{self.address.replace(':', '-')}"


def claim_owner(uid: str, request: str) -> str:
    return f"claim/{uid}/{request}"


def ipamclaim_owner(namespace: str, name: str, uid: str) -> str:
    return f"ipamclaim/{namespace}/{name}/{uid}"


def owner_claim_uid(owner: str) -> str | None:
    kind, _, rest = owner.partition("/")
    return rest.split("/", 1)[0] if kind == "claim" else None


def _lease(data: Mapping[str, Any]) -> Lease:
    return Lease(**{k: data[k] for k in Lease.__dataclass_fields__ if k in data})


def _block(data: Mapping[str, Any]) -> HeldBlock:
    return HeldBlock(**{k: data[k] for k in HeldBlock.__dataclass_fields__})


def _record(item: Lease | HeldBlock) -> dict[str, Any]:
    """A record as dataclasses.asdict writes it (every field, in the order declared), without
    asdict's deep copy of each value: the fields are all str, int or float."""
    return {name: getattr(item, name) for name in item.__dataclass_fields__}


class IPAMState:
    def __init__(self, layout: StateLayout) -> None:
        root = layout.root / "pools"
        self.blocks = JsonDirStore[HeldBlock](root / "blocks", _block, _record, lambda b: b.name)
        self.leases = JsonDirStore[Lease](root / "addresses", _lease, _record, lambda a: a.key)
        self._by_owner: dict[str, list[Lease]] = {}
        # a claim's UID -> its owners (`claim/<uid>/<request>`) in `_by_owner`'s order: what a
        # prepare looks up without walking every owner of the node
        self._claim_owners: dict[str, dict[str, None]] = {}
        # leases handed out and being written (`reserve`, then `commit`): taken for every
        # other allocation from the moment they are reserved, though not yet durable
        self._reserved: dict[str, Lease] = {}
        # the addresses taken in each block (leased or reserved), as text: what an allocation
        # skips without building each address's key
        self._taken: dict[str, set[str]] = {}
        for lease in self.leases.all():
            self._own(lease)
            self._take(lease)

    def close(self) -> None:
        """A clean stop: both stores settle into their files (cnidra.state.store)."""
        self.blocks.close()
        self.leases.close()

    def held_blocks(self, pool: str, range_index: int | None = None) -> list[HeldBlock]:
        return sorted(
            (
                b
                for b in self.blocks.all()
                if b.pool == pool and (range_index is None or b.range_index == range_index)
            ),
            key=lambda b: b.index,
        )

    def at(self, pool: str, address: str) -> Lease | None:
        key = f"{pool}_{address.replace(':', '-')}"
        return self.leases.get(key) or self._reserved.get(key)

    def is_taken(self, pool: str, address: str) -> bool:
        return self.at(pool, address) is not None

    def taken_in(self, block: str) -> AbstractSet[str]:
        """The addresses of `block` leased or reserved (to read, not to keep: it changes)."""
        return self._taken.get(block, frozenset())

    def _take(self, lease: Lease) -> None:
        self._taken.setdefault(lease.block, set()).add(lease.address)

    def _untake(self, lease: Lease) -> None:
        if self.at(lease.pool, lease.address) is not None:
            return  # still leased (or reserved) under its key
        taken = self._taken.get(lease.block)
        if taken is not None:
            taken.discard(lease.address)
            if not taken:
                del self._taken[lease.block]

    def of_owner(self, owner: str) -> list[Lease]:
        return list(self._by_owner.get(owner, ()))

    def in_block(self, block: str) -> list[Lease]:
        leases = [*self.leases.all(), *self._reserved.values()]
        return [a for a in leases if a.block == block]

    def owners(self) -> Iterable[str]:
        return list(self._by_owner)

    def claim_owners(self, uid: str) -> list[str]:
        """`owners()` that start with `claim/<uid>/`, in its order."""
        prefix = f"claim/{uid}/"
        if "/" in uid:  # not a UID Kubernetes makes: not what the index keys
            return [o for o in self._by_owner if o.startswith(prefix)]
        return [o for o in self._claim_owners.get(uid, ()) if o.startswith(prefix)]

    def _own(self, lease: Lease) -> None:
        held = self._by_owner.get(lease.owner)
        if held is None:
            held = self._by_owner[lease.owner] = []
            uid = owner_claim_uid(lease.owner)
            if uid is not None:
                self._claim_owners.setdefault(uid, {})[lease.owner] = None
        held.append(lease)

    def _disown(self, owner: str) -> list[Lease]:
        held = self._by_owner.pop(owner, [])
        uid = owner_claim_uid(owner)
        owners = self._claim_owners.get(uid) if uid is not None else None
        if owners is not None:
            owners.pop(owner, None)
            if not owners:
                del self._claim_owners[uid]  # type: ignore[arg-type]
        return held

    async def hold(self, block: HeldBlock) -> None:
        await self.blocks.put(block)

    async def drop_block(self, name: str) -> None:
        await self.blocks.remove(name)

    async def lease(self, lease: Lease) -> Lease:
        reserved = self.reserve(lease)
        await self.commit([reserved])
        return reserved

    def reserve(self, lease: Lease) -> Lease:
        """The address taken at once (for `at`, `is_taken` and `in_block`), without waiting
        for the disk: `commit` makes it durable, or gives it back if that fails. So the pool's
        lock need not be held while the lease is written, and the leases of concurrent
        prepares are written together (one fsync, cnidra.state.store)."""
        lease = Lease(
            lease.pool,
            lease.address,
            lease.block,
            lease.owner,
            lease.holder,
            lease.since or time.time(),
        )
        self._reserved[lease.key] = lease
        self._take(lease)
        return lease

    def unreserve(self, leases: list[Lease]) -> None:
        """Reserved leases given back unwritten."""
        for lease in leases:
            self._reserved.pop(lease.key, None)
            self._untake(lease)

    async def commit(self, leases: list[Lease]) -> None:
        """Reserved leases written durably as one change, then held by their owners."""
        try:
            await self.leases.put_many(leases)
        except BaseException:
            self.unreserve(leases)
            raise
        for lease in leases:
            self._reserved.pop(lease.key, None)
        for lease in leases:
            self._own(lease)

    async def unlease(self, lease: Lease) -> None:
        """Free one address (a prepare that failed after leasing it gives it back)."""
        kept = [x for x in self._by_owner.get(lease.owner, []) if x.key != lease.key]
        if kept:
            self._by_owner[lease.owner] = kept
        else:
            self._disown(lease.owner)
        await self.leases.remove(lease.key)
        self._untake(lease)

    async def release(self, owner: str) -> list[Lease]:
        return await self.release_many([owner])

    async def release_many(self, owners: Iterable[str]) -> list[Lease]:
        """What the owners hold, freed as one change."""
        released = [lease for owner in owners for lease in self._disown(owner)]
        await self.leases.remove_many([lease.key for lease in released])
        for lease in released:
            self._untake(lease)
        return released
