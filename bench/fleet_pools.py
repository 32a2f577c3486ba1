"""What pool accounting costs at fleet scale, in-process (no control plane; `python -m
bench.fleet --pool-accounting`): the pool accountant's memory for P pools and N nodes holding
B blocks each, the time of one flush, and the apiserver requests at rest and per allocation,
counted on a fake cluster that answers each call as the apiserver would (docs/ipam.md, "Pool
accounting"). Not a test: numbers.

- memory: tracemalloc around the accountant's LIST of every pool and block;
- at rest: flushes of every node's block writer and of the accountant with nothing changed,
  and FailedScheduling Events while no pool is exhausted: requests counted;
- allocations: A leases spread over random nodes' blocks between two flushes (a burst), then
  two flushes (a count is written once it settled); and one allocation per flush interval
  (the worst case for coalescing);
- the Lease: per node a minute, from the intervals (a candidate GETs once a minute, the holder
  PATCHes every 20 s, preconditioned on its own last write: no GET)."""

from __future__ import annotations

import asyncio
import random
import time
import tracemalloc
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from cnidra.api.constants import DRIVER_NAME
from cnidra.ipam.accounting import (
    LEASE_SECONDS,
    RENEW_SECONDS,
    BlockLeaseWriter,
    PoolAccountant,
)


@dataclass(frozen=True)
class _Block:
    name: str


class NodeLeases:
    """A node's leases as IPAMState answers BlockLeaseWriter (blocks.all(), in_block()),
    in memory: the writer's work, without the node's disk."""

    def __init__(self, blocks: list[str]) -> None:
        self.leased = dict.fromkeys(blocks, 0)
        self.blocks = self

    def all(self) -> list[_Block]:
        return [_Block(name) for name in self.leased]

    def in_block(self, name: str) -> list[None]:
        return [None] * self.leased[name]


class CountingCluster:
    """The apiserver as the accountant and the nodes' writers see it; every call counted."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.pools: list[Mapping[str, Any]] = []
        self.blocks: dict[str, dict[str, Any]] = {}
        self.accountant: PoolAccountant | None = None

    def count(self, what: str) -> None:
        self.requests[what] = self.requests.get(what, 0) + 1

    async def write_block_leased(self, name: str, leased: int) -> None:
        self.count("PATCH cniipblocks/status")
        block = self.blocks[name]
        block["status"] = {"leased": leased}
        if self.accountant is not None:  # the accountant's watch event
            self.accountant.block_changed(block)

    async def write_pool_status(self, name: str, status: Mapping[str, int]) -> None:
        self.count("PATCH cniippools/status")

    async def pool_objects(self) -> list[Mapping[str, Any]]:
        self.count("LIST cniippools")
        return self.pools

    async def block_objects(self) -> list[Mapping[str, Any]]:
        self.count("LIST cniipblocks")
        return list(self.blocks.values())

    async def _never(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        await asyncio.Event().wait()
        yield "", {}

    def watch_pools(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        return self._never()

    def watch_blocks(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        return self._never()

    def watch_failed_scheduling(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        return self._never()

    async def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.count("GET pods")
        return None

    async def resource_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.count("GET resourceclaims")
        return None

    async def network_pools(self) -> dict[str, str]:
        self.count("LIST resourceslices")
        return {}

    async def warn(self, kind: str, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self.count("POST events")


def pool_object(index: int, block_size: int) -> dict[str, Any]:
    # a /16 each: 65,534 addresses, 4,096 blocks of 16
    return {
        "metadata": {"name": f"pool-{index}"},
        "spec": {"ranges": [{"subnet": f"10.{index % 256}.0.0/16"}], "blockSize": block_size},
    }


def measure(
    pools: int = 100,
    nodes: int = 1000,
    blocks_per_node: int = 4,
    allocations: int = 1000,
    seed: int = 28,
) -> dict[str, Any]:
    return asyncio.run(_measure(pools, nodes, blocks_per_node, allocations, seed))


async def _measure(
    pools: int, nodes: int, blocks_per_node: int, allocations: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    cluster = CountingCluster()
    cluster.pools = [pool_object(i, 16) for i in range(pools)]
    next_block = dict.fromkeys(range(pools), 0)
    writers: list[tuple[NodeLeases, BlockLeaseWriter]] = []
    for n in range(nodes):
        names = []
        for _ in range(blocks_per_node):
            p = rng.randrange(pools)
            name = f"pool-{p}.0.{next_block[p]}"
            next_block[p] += 1
            cluster.blocks[name] = {
                "metadata": {"name": name},
                "spec": {"pool": f"pool-{p}", "range": 0, "node": f"node-{n}"},
            }
            names.append(name)
        leases = NodeLeases(names)
        writers.append((leases, BlockLeaseWriter(leases, cluster)))  # type: ignore[arg-type]

    accountant = PoolAccountant(cluster, DRIVER_NAME)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    accountant.replace(await cluster.pool_objects(), await cluster.block_objects())
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    memory = sum(s.size_diff for s in after.compare_to(before, "filename"))
    cluster.accountant = accountant

    async def flush_all(times: int = 1) -> None:
        for _ in range(times):
            for _, writer in writers:
                await writer.flush()
            await accountant.flush()

    # start-up: each block's count once (settled: the same at two flushes), each pool's once
    await flush_all(2)
    startup = dict(cluster.requests)
    cluster.requests.clear()

    rest_rounds = 12  # a minute at the default 5 s
    for _ in range(rest_rounds):
        await flush_all()
    for i in range(1000):
        event = {"involvedObject": {"kind": "Pod", "namespace": "ns", "name": f"p{i}"}}
        await accountant.failed_scheduling(event)
    at_rest = dict(cluster.requests)
    cluster.requests.clear()

    for _ in range(allocations):  # a burst between two flushes
        leases, _ = writers[rng.randrange(nodes)]
        block = rng.choice(list(leases.leased))
        leases.leased[block] += 1
    await flush_all(2)  # the second: the counts settled, written
    burst = dict(cluster.requests)
    cluster.requests.clear()

    single = 50  # one allocation per interval, the worst case
    for i in range(single):
        leases, _ = writers[rng.randrange(nodes)]
        leases.leased[rng.choice(list(leases.leased))] += 1
        await flush_all(2 if i == single - 1 else 1)  # the last one's too, once settled
    one_by_one = dict(cluster.requests)

    started = time.perf_counter()
    accountant._written.clear()  # every pool changed: the heaviest flush
    cluster.requests.clear()
    await accountant.flush()
    flush_ms = (time.perf_counter() - started) * 1000
    blocks = len(cluster.blocks)
    return {
        "pools": pools,
        "nodes": nodes,
        "blocks": blocks,
        "accountant_memory_bytes": memory,
        "accountant_bytes_per_block": round(memory / max(blocks, 1), 1),
        "startup_requests": startup,
        "at_rest_requests_per_min": sum(at_rest.values()),
        "failed_scheduling_events_while_none_exhausted": 1000,
        "burst_allocations": allocations,
        "burst_requests": burst,
        "burst_requests_per_allocation": round(sum(burst.values()) / allocations, 3),
        "one_allocation_per_interval_requests_per_allocation": round(
            sum(one_by_one.values()) / single, 3
        ),
        "full_flush_ms": round(flush_ms, 2),
        "lease_requests_per_min": {
            "each_other_node": round(60 / LEASE_SECONDS, 2),
            "holder": round(60 / RENEW_SECONDS, 2),
            "fleet_per_second": round(
                ((nodes - 1) * 60 / LEASE_SECONDS + 60 / RENEW_SECONDS) / 60, 2
            ),
        },
    }


def report(result: Mapping[str, Any]) -> str:
    r = result
    return "\n".join(
        [
            f"pool accounting: {r['pools']} pools, {r['nodes']} nodes, {r['blocks']} blocks",
            f"  accountant memory: {r['accountant_memory_bytes'] / 1024:.0f} KiB "
            f"({r['accountant_bytes_per_block']} B a block)",
            f"  start-up requests: {r['startup_requests']}",
            f"  at rest: {r['at_rest_requests_per_min']} requests a minute "
            f"({r['failed_scheduling_events_while_none_exhausted']} FailedScheduling Events "
            "with no pool exhausted included)",
            f"  a burst of {r['burst_allocations']} allocations in one interval: "
            f"{r['burst_requests']} ({r['burst_requests_per_allocation']} a allocation)",
            "  one allocation per interval: "
            f"{r['one_allocation_per_interval_requests_per_allocation']} requests each",
            f"  a flush with every pool changed: {r['full_flush_ms']} ms",
            f"  Lease: {r['lease_requests_per_min']}",
        ]
    )
