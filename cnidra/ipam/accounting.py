"""A pool's accounting, cluster-wide, with no apiserver call per pod or per allocation
(docs/ipam.md, "Pool accounting"):

- each node writes how many addresses it leased in each of its CNIIPBlocks into the block's
  `status.leased` (`BlockLeaseWriter`): a block is written only by its node, so there is no
  contention; counts changed by allocations are coalesced and written once they settled (the
  same at two flushes `interval` seconds apart; a count still changing after SETTLE_FLUSHES
  flushes is written then), with server-side apply on the status subresource: a burst of pods
  costs a write per block after it, not one per block per interval during it;
- one `PoolAccountant` (in the one driver that holds the accountant's Lease,
  `run_while_leading`) LISTs then watches CNIIPPools and CNIIPBlocks, keeps each pool's counts in
  memory (a few integers per pool and per block), and writes a pool's `status` (size, held,
  free; `kubectl get cniippools` shows them) when they changed, once settled as a block's
  count is (at once when the pool becomes exhausted or stops being so);
- it watches the scheduler's FailedScheduling Events (a field selector: the apiserver filters).
  While no pool is exhausted an Event costs nothing. While one is, it reads the pod and its
  unallocated claims (one GET each, per scheduler attempt, not per pod at rest), finds the
  pools the claims ask of (their selectors name a network or a pool; a network's pool is what
  the nodes publish as the device's `ipPool`, LISTed at most every `NETWORKS_TTL` seconds), and
  writes a Warning Event naming the pool, its size and its held count on the pod and on each
  such claim, once per pod, claim and count."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Protocol

from cnidra.api.ipam import (
    EXHAUSTED_REASON,
    PoolCounts,
    PoolError,
    claim_pools,
    exhausted_message,
    pool_from_object,
)
from cnidra.kube.api import NotFound
from cnidra.observe.metrics import PoolAccount
from cnidra.state.ipam import IPAMState
from cnidra.util.backoff import Backoff

log = logging.getLogger(__name__)
FLUSH_SECONDS = 5.0
SETTLE_FLUSHES = 6  # a block's count that keeps changing is written after this many flushes
NETWORKS_TTL = 30.0
NOTICES_KEPT = 4096
RECENT_SECONDS = 60.0
WATCH_BACKOFF_MAX = 300.0  # the longest wait before a failed watch is LISTed again


class BlockStatusSink(Protocol):
    async def write_block_leased(self, name: str, leased: int) -> None:
        """Server-side apply of a block's status.leased (its node's own field manager)."""


class BlockLeaseWriter:
    """A node's leased count per block, written batched: `flush` writes the blocks whose count
    changed since they were last written and has settled (the same as at the flush before),
    or has waited `settle_flushes` flushes. The pool accountant lags at most that many
    intervals behind a burst; it asks again, when a pool becomes exhausted, the Pending pods
    of the RECENT_SECONDS before (PoolAccountant._replay)."""

    def __init__(
        self, state: IPAMState, sink: BlockStatusSink, settle_flushes: int = SETTLE_FLUSHES
    ) -> None:
        self.state = state
        self.sink = sink
        self.settle_flushes = settle_flushes
        self._written: dict[str, int] = {}
        # block -> (its count at the last flush, the flushes it has waited): changed, unwritten
        self._pending: dict[str, tuple[int, int]] = {}
        self.writes = 0

    def counts(self) -> dict[str, int]:
        return {b.name: len(self.state.in_block(b.name)) for b in self.state.blocks.all()}

    async def flush(self) -> int:
        """Write what changed; a failed write is tried again at the next flush."""
        counts = self.counts()
        written = 0
        for name, leased in sorted(counts.items()):
            if self._written.get(name) == leased:
                self._pending.pop(name, None)
                continue
            seen, waited = self._pending.get(name, (None, 0))
            if seen != leased and waited < self.settle_flushes:
                self._pending[name] = (leased, waited + 1)  # still changing: not yet
                continue
            self._pending[name] = (leased, waited)  # failed: tried again at the next flush
            try:
                await self.sink.write_block_leased(name, leased)
            except NotFound:
                # the block is gone (its node's object collected), or the CRD has no status
                # subresource yet (CRDs not upgraded): asked again only when the count changes
                log.info("leased count of CNIIPBlock %s not written: not found", name)
            except Exception as exc:
                log.warning("leased count of CNIIPBlock %s not written: %s", name, exc)
                continue
            self._written[name] = leased
            self._pending.pop(name, None)
            written += 1
        for gone in set(self._written) - set(counts):
            del self._written[gone]
        for gone in set(self._pending) - set(counts):
            del self._pending[gone]
        self.writes += written
        return written

    async def run(self, interval: float = FLUSH_SECONDS) -> None:
        while True:
            await self.flush()
            await asyncio.sleep(interval)


class AccountsCluster(Protocol):
    """What the accountant asks the apiserver (cnidra.kube.ipam.KubeIPAM)."""

    async def pool_objects(self) -> list[Mapping[str, Any]]: ...

    async def block_objects(self) -> list[Mapping[str, Any]]: ...

    def watch_pools(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]: ...

    def watch_blocks(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]: ...

    def watch_failed_scheduling(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]: ...

    async def write_pool_status(self, name: str, status: Mapping[str, int]) -> None: ...

    async def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    async def resource_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    async def network_pools(self) -> dict[str, str]:
        """network -> pool, from the devices the nodes publish (`network`, `ipPool`)."""

    async def warn(self, kind: str, obj: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning Event on a Pod or ResourceClaim (the one recorder)."""


@dataclass
class _PoolShape:
    size: int
    pool_blocks: int
    ranges: int


@dataclass
class AccountantStats:
    status_writes: int = 0
    notices: int = 0
    reads: int = 0  # GETs and LISTs made for notices
    events_seen: int = 0
    ignored_events: int = 0  # FailedScheduling while no pool was exhausted: no call


@dataclass
class PoolAccountant:
    cluster: AccountsCluster
    driver: str
    interval: float = FLUSH_SECONDS
    clock: Callable[[], float] = time.monotonic
    _shapes: dict[str, _PoolShape] = field(default_factory=dict)
    # block name -> (pool, range index, leased)
    _blocks: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    _block_nodes: dict[str, str] = field(default_factory=dict)  # block name -> its node
    _written: dict[str, dict[str, int]] = field(default_factory=dict)
    # pool -> (its status at the last flush, the flushes it has waited): changed, unwritten
    _pending: dict[str, tuple[dict[str, int], int]] = field(default_factory=dict)
    settle_flushes: int = SETTLE_FLUSHES
    _networks: tuple[float, dict[str, str]] | None = None
    _noticed: dict[tuple[str, str, int], None] = field(default_factory=dict)
    stats: AccountantStats = field(default_factory=AccountantStats)
    # the counts of the last flush, replaced whole (the metrics' scrape reads it from its own
    # thread); empty while this process does not lead
    latest: tuple[PoolAccount, ...] = ()
    # the pods of FailedScheduling Events seen while no pool was counted exhausted (a node's
    # leased count lags up to `interval`), with when: those of the last RECENT_SECONDS are
    # asked again when a pool becomes exhausted, so the scheduler's first attempt is not
    # missed; bounded
    _recent: dict[tuple[str, str], float] = field(default_factory=dict)
    _exhausted: frozenset[str] = frozenset()

    # ------------------------------------------------------------- what the watches say

    def pool_changed(self, obj: Mapping[str, Any]) -> None:
        try:
            pool = pool_from_object(obj)
        except PoolError as exc:
            log.warning("%s: not counted", exc)
            return
        ranges = range(len(pool.spec.ranges))
        self._shapes[pool.name] = _PoolShape(
            pool.capacity(), sum(len(pool.block_indices(i)) for i in ranges), len(ranges)
        )

    def pool_deleted(self, name: str) -> None:
        self._shapes.pop(name, None)
        self._written.pop(name, None)
        self._pending.pop(name, None)

    def block_changed(self, obj: Mapping[str, Any]) -> None:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        leased = (obj.get("status") or {}).get("leased") or 0
        name = str(meta.get("name") or "")
        try:
            self._blocks[name] = (str(spec.get("pool")), int(spec.get("range") or 0), int(leased))
        except (TypeError, ValueError):
            log.warning("CNIIPBlock %s: not counted (range or leased not a number)", name)
        if isinstance(spec.get("node"), str) and spec["node"]:
            self._block_nodes[name] = spec["node"]

    def block_deleted(self, name: str) -> None:
        self._blocks.pop(name, None)
        self._block_nodes.pop(name, None)

    def nodes(self) -> frozenset[str]:
        """The nodes holding blocks: those running cnidra's IPAM, the Lease's candidates."""
        return frozenset(self._block_nodes.values())

    def replace(self, pools: list[Mapping[str, Any]], blocks: list[Mapping[str, Any]]) -> None:
        """A fresh LIST of both: what the watches may have missed is forgotten."""
        self._shapes.clear()
        self._blocks.clear()
        self._block_nodes.clear()
        for obj in pools:
            self.pool_changed(obj)
        for obj in blocks:
            self.block_changed(obj)

    # ------------------------------------------------------------- the counts

    def counts(self) -> dict[str, PoolCounts]:
        held: dict[str, list[int]] = {}
        reserved: dict[str, int] = {}
        for pool, range_index, leased in self._blocks.values():
            shape = self._shapes.get(pool)
            if shape is None or range_index >= shape.ranges:
                continue
            held.setdefault(pool, [0] * shape.ranges)[range_index] += leased
            reserved[pool] = reserved.get(pool, 0) + 1
        return {
            name: PoolCounts(
                name,
                shape.size,
                max(held.get(name, [0])),  # a dual-stack pod holds one of each range
                reserved.get(name, 0),
                shape.pool_blocks,
            )
            for name, shape in self._shapes.items()
        }

    def exhausted(self) -> dict[str, PoolCounts]:
        return {n: c for n, c in self.counts().items() if c.free == 0}

    async def flush(self) -> int:
        """Write the status of each pool whose counts changed since last written: at once when
        it is the first this leader writes or the pool became exhausted or stopped being so,
        else once the counts settled (the same as at the flush before; a burst moves them at
        every flush) or waited `settle_flushes` flushes."""
        written = 0
        counted = sorted(self.counts().items())
        self.latest = tuple(PoolAccount(n, c.size, c.held, c.free) for n, c in counted)
        for name, counts in counted:
            status = counts.status()
            last = self._written.get(name)
            if last == status:
                self._pending.pop(name, None)
                continue
            seen, waited = self._pending.get(name, (None, 0))
            urgent = last is None or (last.get("free") == 0) != (status["free"] == 0)
            if not urgent and seen != status and waited < self.settle_flushes:
                self._pending[name] = (status, waited + 1)
                continue
            self._pending[name] = (status, waited)
            try:
                await self.cluster.write_pool_status(name, status)
            except Exception as exc:
                log.warning("status of CNIIPPool %s not written: %s", name, exc)
                continue
            self._written[name] = status
            self._pending.pop(name, None)
            written += 1
        for gone in set(self._pending) - {n for n, _ in counted}:
            del self._pending[gone]
        self.stats.status_writes += written
        exhausted = frozenset(n for n, c in counted if c.free == 0)
        if exhausted - self._exhausted and self._recent:
            await self._replay()
        self._exhausted = exhausted
        return written

    async def _replay(self) -> None:
        """A pool has just become exhausted: the pods the scheduler left Pending meanwhile."""
        recent, self._recent = self._recent, {}
        since = self.clock() - RECENT_SECONDS
        for (namespace, name), seen in recent.items():
            if seen < since:
                continue
            event = {"involvedObject": {"kind": "Pod", "namespace": namespace, "name": name}}
            try:
                await self.failed_scheduling(event)
            except Exception as exc:
                log.warning("exhausted pool not named on a Pending pod: %s", exc)

    # ------------------------------------------------------------- a Pending pod

    async def failed_scheduling(self, event: Mapping[str, Any]) -> int:
        """The Warning Events written for one of the scheduler's FailedScheduling Events."""
        self.stats.events_seen += 1
        exhausted = self.exhausted()
        involved = event.get("involvedObject") or {}
        if involved.get("kind") != "Pod":
            self.stats.ignored_events += 1
            return 0
        namespace, name = str(involved.get("namespace")), str(involved.get("name"))
        if not exhausted:
            self.stats.ignored_events += 1
            self._recent.pop((namespace, name), None)
            self._recent[(namespace, name)] = self.clock()
            while len(self._recent) > NOTICES_KEPT:
                del self._recent[next(iter(self._recent))]
            return 0
        self.stats.reads += 1
        pod = await self.cluster.pod(namespace, name)
        if pod is None:
            self._recent.pop((namespace, name), None)
            return 0
        networks = await self._network_pools()
        written = 0
        for claim_name in _claim_names(pod):
            self.stats.reads += 1
            claim = await self.cluster.resource_claim(namespace, claim_name)
            if claim is None or (claim.get("status") or {}).get("allocation"):
                continue
            for pool in sorted(claim_pools(claim, self.driver, networks) & set(exhausted)):
                counts = exhausted[pool]
                uid = str((claim.get("metadata") or {}).get("uid") or claim_name)
                key = (uid, pool, counts.held)
                if key in self._noticed:
                    continue
                message = exhausted_message(counts, f"{namespace}/{claim_name}")
                await self.cluster.warn("Pod", pod, EXHAUSTED_REASON, message)
                await self.cluster.warn("ResourceClaim", claim, EXHAUSTED_REASON, message)
                self._noticed[key] = None
                while len(self._noticed) > NOTICES_KEPT:
                    del self._noticed[next(iter(self._noticed))]
                written += 2
        self.stats.notices += written
        return written

    async def _network_pools(self) -> dict[str, str]:
        now = self.clock()
        if self._networks is None or now - self._networks[0] > NETWORKS_TTL:
            self.stats.reads += 1
            self._networks = (now, await self.cluster.network_pools())
        return self._networks[1]

    # ------------------------------------------------------------- running

    async def run(self) -> None:
        """LIST both kinds, then follow them and the scheduler, flushing every `interval`;
        a watch that ends LISTs again (what it missed is read afresh)."""
        try:
            await asyncio.gather(self._follow(), self._flusher(), self._scheduler())
        finally:
            self.latest = ()
            self._written.clear()  # a new leader may have written since
            self._pending.clear()

    async def _follow(self) -> None:
        backoff = Backoff(initial=self.interval, maximum=WATCH_BACKOFF_MAX)
        while True:
            started = time.monotonic()
            try:
                self.replace(await self.cluster.pool_objects(), await self.cluster.block_objects())
                async with asyncio.TaskGroup() as group:  # one ends: both end, then a LIST
                    group.create_task(self._watch_pools())
                    group.create_task(self._watch_blocks())
            except Exception as exc:
                log.warning("pool accounting watch ended, listing again: %s", exc)
            # the one pace (cnidra.util.backoff): a watch that had run a while starts it again
            await asyncio.sleep(backoff.after_run(time.monotonic() - started))

    async def _watch_pools(self) -> None:
        async for kind, obj in self.cluster.watch_pools():
            if kind == "DELETED":
                self.pool_deleted(str((obj.get("metadata") or {}).get("name")))
            else:
                self.pool_changed(obj)
        raise ConnectionError("CNIIPPool watch ended")

    async def _watch_blocks(self) -> None:
        async for kind, obj in self.cluster.watch_blocks():
            if kind == "DELETED":
                self.block_deleted(str((obj.get("metadata") or {}).get("name")))
            else:
                self.block_changed(obj)
        raise ConnectionError("CNIIPBlock watch ended")

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.flush()

    async def _scheduler(self) -> None:
        backoff = Backoff(initial=self.interval, maximum=WATCH_BACKOFF_MAX)
        while True:
            started = time.monotonic()
            try:
                async for kind, event in self.cluster.watch_failed_scheduling():
                    if kind in ("ADDED", "MODIFIED"):  # MODIFIED: the scheduler's count += 1
                        try:
                            await self.failed_scheduling(event)
                        except Exception as exc:
                            log.warning("exhausted pool not named on a Pending pod: %s", exc)
            except Exception as exc:
                log.warning("FailedScheduling watch ended: %s", exc)
            await asyncio.sleep(backoff.after_run(time.monotonic() - started))


def _claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The pod's ResourceClaims' names (the ones made from templates as the pod's status has
    them, and the ones it names directly)."""
    names = [
        str(s.get("resourceClaimName"))
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if s.get("resourceClaimName")
    ]
    names += [
        str(c.get("resourceClaimName"))
        for c in (pod.get("spec") or {}).get("resourceClaims") or []
        if c.get("resourceClaimName")
    ]
    return list(dict.fromkeys(names))


LEASE_NAME = "cnidra-pool-accountant"
# a lapsed Lease is taken over after a minute; its holder renews it every 20 s and names
# SUCCESSOR_COUNT successors in it (nodes holding blocks, by rendezvous hash with its own name):
# they ask once a minute, every other driver once every STANDBY_FACTOR minutes (measured at
# 1,000 nodes: one GET a node a minute, 1.02 of the 1.68 requests a node made at rest, before
# the successors). So the counts stop for about two minutes when the accountant's node goes,
# and for about eleven when its successors went with it
LEASE_SECONDS = 60.0
RENEW_SECONDS = 20.0
SUCCESSOR_COUNT = 2
STANDBY_FACTOR = 10.0


def successors(holder: str, nodes: Iterable[str], count: int = SUCCESSOR_COUNT) -> list[str]:
    """The `count` nodes (not the holder) that take over first: highest rendezvous hash with
    the holder's name, so each holder names others and every node agrees on them."""

    def weight(node: str) -> bytes:
        return hashlib.sha256(f"{holder}\0{node}".encode()).digest()

    return sorted((n for n in set(nodes) if n != holder), key=weight, reverse=True)[:count]


class LeaseHolder(Protocol):
    successors: frozenset[str] | None

    async def lead(
        self,
        namespace: str,
        name: str,
        identity: str,
        duration: float,
        successors: Sequence[str] = (),
    ) -> bool: ...


async def account_while_leading(
    accountant: PoolAccountant,
    lease: LeaseHolder,
    namespace: str,
    identity: str,
    duration: float = LEASE_SECONDS,
) -> None:
    """The accountant run by whichever driver holds the Lease (as `cnidra driver` and
    bench.fleet wire it): the holder renews every third of `duration` naming its successors;
    a named successor, or any driver while none is named, asks every `duration`; the others
    every STANDBY_FACTOR times that."""

    async def lead() -> bool:
        named = successors(identity, accountant.nodes())
        return await lease.lead(namespace, LEASE_NAME, identity, duration, named)

    def retry() -> float:
        named = lease.successors
        return duration if named is None or identity in named else duration * STANDBY_FACTOR

    await run_while_leading(accountant.run, lead, renew_every=duration / 3, retry_every=retry)


async def run_while_leading(
    work: Callable[[], Coroutine[Any, Any, None]],
    lead: Callable[[], Awaitable[bool]],
    *,
    renew_every: float = RENEW_SECONDS,
    retry_every: float | Callable[[], float] = LEASE_SECONDS,
) -> None:
    """Run `work` while `lead()` says this process holds the Lease: asked every `renew_every`
    seconds while leading, every `retry_every` (with jitter; a callable: asked each time)
    while not; stop it as soon as
    it does not lead (a failed renewal counts as lost: two accountants at once would only
    write the same counts twice, but one is enough)."""
    task: asyncio.Task[None] | None = None
    try:
        while True:
            try:
                leading = await lead()
            except Exception as exc:
                log.warning("pool accountant Lease not renewed: %s", exc)
                leading = False
            if leading and (task is None or task.done()):
                if task is not None and not task.cancelled() and task.exception():
                    log.warning("pool accountant stopped: %s", task.exception())
                log.info("pool accountant: leading")
                task = asyncio.create_task(work(), name="pool-accounts")
            elif not leading and task is not None:
                log.info("pool accountant: not leading")
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                task = None
            retry = retry_every() if callable(retry_every) else retry_every
            wait = renew_every if leading else retry * random.uniform(0.8, 1.2)
            await asyncio.sleep(wait)
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
