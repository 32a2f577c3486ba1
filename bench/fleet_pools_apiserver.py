"""What pool accounting costs a real apiserver (`python -m bench.fleet --pool-accounting
--control-plane`): the fleet's own etcd and kube-apiserver (bench.fleet.ControlPlane, the test
bed's build), N Nodes, P CNIIPPools and B blocks a node made by the driver's own KubeIPAM, then
the driver's own pool accounting on them: every node's `BlockLeaseWriter` (their leased counts
in memory, as bench/fleet_pools.py; all nodes on one client of the driver's kind, each writing
under its own field manager) and one `PoolAccountant` on a client of its own, running as the
driver runs it (LIST, the three watches, a flush every `interval`). Not a test: numbers.

Measured, each request counted by an httpx hook on the clients, the apiserver's and etcd's CPU
from /proc:

- start-up: from the accountant's start to every pool's status written (its LISTs, then one
  server-side apply a pool);
- at rest: a minute of every writer's and the accountant's flushes with nothing changed, and
  1,000 FailedScheduling Events (made on the apiserver) while no pool is exhausted;
- a burst: A leases spread over random nodes' blocks, two flushes of every writer (a status
  apply per changed block at the second, which finds the counts settled), and the time until
  the pools' status, as a LIST reads it, holds all A;
- one allocation at a time: its block's write (two flushes of its node's writer), and the time
  until its pool's status says so (the accountant's watch, then its flushes: the second finds
  it settled)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from typing import Any

from bench.fleet import (
    ControlPlane,
    CustomResourceDefinition,
    RequestLog,
    counted_client,
    each,
    node_ip,
    node_name,
    node_object,
    say,
    served,
)
from bench.fleet_pools import NodeLeases, pool_object
from cnidra.api.constants import DRIVER_NAME
from cnidra.api.ipam import pool_from_object
from cnidra.ipam.accounting import BlockLeaseWriter, PoolAccountant
from cnidra.kube.api import AsyncClient, Event, Node
from cnidra.kube.ipam import CNIIPBlock, CNIIPPool, KubeIPAM
from testbed.layout import REPO

TIMEOUT = 30.0
NAMESPACE = "default"


async def install_crds(client: AsyncClient) -> None:
    import yaml

    crds = REPO / "charts" / "cnidra" / "crds"
    for path in sorted(crds.glob("*.yaml")):
        await client.create(CustomResourceDefinition, yaml.safe_load(path.read_text()))
    for kind in (CNIIPPool, CNIIPBlock):
        await served(client, kind)


async def held_in_status(client: AsyncClient) -> int:
    """The addresses every pool's status says are held, as a LIST reads them."""
    total = 0
    async for pool in client.list(CNIIPPool):
        total += int((pool.get("status") or {}).get("held") or 0)
    return total


async def until(what: str, check: Any, within: float, every: float = 0.05) -> float:
    """Seconds until `await check()` is true."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > within:
            raise TimeoutError(f"{what}: not within {within:g} s")
        await asyncio.sleep(every)
    return time.monotonic() - started


def requests_between(log: RequestLog, start: float, end: float) -> dict[str, int]:
    return dict(sorted(log.between(start, end).items()))


async def run(  # noqa: PLR0915 - one linear script of measurements, as bench.fleet's run
    plane: ControlPlane,
    *,
    pools: int,
    nodes: int,
    blocks_per_node: int = 4,
    allocations: int = 1000,
    interval: float = 5.0,
    rest_seconds: float = 60.0,
    events: int = 1000,
    singles: int = 5,
    seed: int = 28,
) -> dict[str, Any]:
    """`interval`: the flush interval of the writers and the accountant (the driver's default,
    5 s); `rest_seconds`: how long at rest, with `events` FailedScheduling Events; `singles`:
    allocations one at a time."""
    rng = random.Random(seed)
    api_proc, etcd_proc = plane.procs["kube-apiserver"], plane.procs["etcd"]
    log = RequestLog()
    admin = counted_client(plane.admin, RequestLog(), "admin", TIMEOUT)
    writers_client = counted_client(plane.admin, log, "writers", TIMEOUT)
    accountant_client = counted_client(plane.admin, log, "accountant", TIMEOUT)

    built = time.monotonic()
    await install_crds(admin)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    names = [node_name(i) for i in range(nodes)]
    await each(
        range(nodes),
        lambda i: admin.create(Node, node_object(names[i], node_ip(i), now)),
    )
    specs = [pool_object(p, 16) for p in range(pools)]
    await each(specs, lambda obj: admin.create(CNIIPPool, obj))
    parsed = [pool_from_object(obj) for obj in specs]
    next_block = [0] * pools
    placed: list[tuple[str, Any]] = []
    per_node: dict[str, list[str]] = {n: [] for n in names}
    for node in names:
        for _ in range(blocks_per_node):
            p = rng.randrange(pools)
            block = parsed[p].block(0, next_block[p])
            next_block[p] += 1
            placed.append((node, block))
            per_node[node].append(block.name)
    maker = KubeIPAM(admin, TIMEOUT)
    await each(placed, lambda nb: maker.create_block(nb[1], nb[0]))
    say(
        f"{nodes} nodes, {pools} pools, {len(placed)} blocks made in "
        f"{time.monotonic() - built:.1f} s"
    )

    leases = {n: NodeLeases(per_node[n]) for n in names}
    writers = [
        BlockLeaseWriter(leases[n], KubeIPAM(writers_client, TIMEOUT, n))  # type: ignore[arg-type]
        for n in names
    ]

    async def flush_writers(times: int = 1) -> int:
        """Every writer's flush, `times` over (a count is written at the flush that finds it
        settled: the second after a change)."""
        written = 0
        for _ in range(times):
            written += sum(await asyncio.gather(*(w.flush() for w in writers)))
        return written

    await flush_writers(2)  # each block's count once (0), before the accountant starts
    accountant = PoolAccountant(
        KubeIPAM(accountant_client, TIMEOUT, "accountant"), DRIVER_NAME, interval=interval
    )
    cpu = (api_proc.cpu_seconds(), etcd_proc.cpu_seconds())
    start = time.monotonic()
    task = asyncio.create_task(accountant.run(), name="pool-accounts")
    try:

        async def all_written() -> bool:
            return accountant.stats.status_writes >= pools

        startup_s = await until("every pool's status written", all_written, 120)
        startup = {
            "seconds": round(startup_s, 2),
            "requests": requests_between(log, start, time.monotonic()),
            "apiserver_cpu_s": round(api_proc.cpu_seconds() - cpu[0], 2),
            "etcd_cpu_s": round(etcd_proc.cpu_seconds() - cpu[1], 2),
        }
        say(f"start-up: {startup}")

        # at rest: a minute of flushes with nothing changed, and FailedScheduling Events
        await asyncio.sleep(interval)
        cpu = (api_proc.cpu_seconds(), etcd_proc.cpu_seconds())
        rest_from = time.monotonic()
        ignored = accountant.stats.ignored_events
        made = 0

        async def failed_scheduling(i: int) -> None:
            event = {
                "metadata": {"name": f"p{i}.fleet", "namespace": NAMESPACE},
                "involvedObject": {"kind": "Pod", "namespace": NAMESPACE, "name": f"p{i}"},
                "reason": "FailedScheduling",
                "message": "0/1000 nodes are available: cannot allocate all claims.",
                "type": "Warning",
                "source": {"component": "default-scheduler"},
            }
            await admin.create(Event, event, namespace=NAMESPACE)

        rest_rounds = max(1, round(rest_seconds / interval))
        per_round = -(-events // rest_rounds)
        for _ in range(rest_rounds):
            round_start = time.monotonic()
            await flush_writers()
            batch = range(made, min(made + per_round, events))  # spread over the rounds
            await each(batch, failed_scheduling)
            made += len(batch)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - round_start)))
        rest_to = time.monotonic()
        at_rest = {
            "seconds": round(rest_to - rest_from, 1),
            "requests": requests_between(log, rest_from, rest_to),
            "failed_scheduling_events": made,
            "events_ignored_by_the_accountant": accountant.stats.ignored_events - ignored,
            "apiserver_cpu_s": round(api_proc.cpu_seconds() - cpu[0], 2),
            "etcd_cpu_s": round(etcd_proc.cpu_seconds() - cpu[1], 2),
        }
        say(f"at rest: {at_rest}")

        # a burst: `allocations` leases over random nodes' blocks, one flush of every writer
        for _ in range(allocations):
            node = leases[names[rng.randrange(nodes)]]
            node.leased[rng.choice(list(node.leased))] += 1
        cpu = (api_proc.cpu_seconds(), etcd_proc.cpu_seconds())
        burst_from = time.monotonic()
        changed = await flush_writers(2)
        flushed_s = time.monotonic() - burst_from

        async def counted() -> bool:
            return await held_in_status(admin) == allocations

        seen_s = await until("the pools' status to hold the burst", counted, 120, every=0.2)
        burst_to = time.monotonic()
        burst = {
            "allocations": allocations,
            "blocks_written": changed,
            "writers_flush_s": round(flushed_s, 2),
            "until_pools_status_s": round(seen_s + flushed_s, 2),
            "requests": requests_between(log, burst_from, burst_to),
            "apiserver_cpu_s": round(api_proc.cpu_seconds() - cpu[0], 2),
            "etcd_cpu_s": round(etcd_proc.cpu_seconds() - cpu[1], 2),
        }
        say(f"burst: {burst}")

        # one allocation at a time: its pool's status follows within the flush interval
        waited = []
        for _ in range(singles):
            node_index = rng.randrange(nodes)
            node = leases[names[node_index]]
            block = rng.choice(list(node.leased))
            node.leased[block] += 1
            pool = block.rsplit(".", 2)[0]
            expected = sum(
                count
                for n in leases.values()
                for b, count in n.leased.items()
                if b.startswith(pool + ".")
            )
            await writers[node_index].flush()
            await writers[node_index].flush()  # settled: written

            async def pool_says(pool: str = pool, expected: int = expected) -> bool:
                found = await admin.get(CNIIPPool, pool)
                return int((found.get("status") or {}).get("held") or 0) == expected

            waited.append(await until("one allocation's pool status", pool_says, 60))
        one_by_one = {
            "seconds_until_pool_status": [round(s, 2) for s in waited],
            "flush_interval_s": interval,
        }
        say(f"one at a time: {one_by_one}")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return {
        "mode": "control-plane",
        "pools": pools,
        "nodes": nodes,
        "blocks": len(placed),
        "startup": startup,
        "at_rest": at_rest,
        "burst": burst,
        "one_allocation": one_by_one,
        "apiserver_rss_mib": round(api_proc.rss_mib(), 1),
    }


def report(result: Mapping[str, Any]) -> str:
    r = result
    return "\n".join(
        [
            f"pool accounting on a real apiserver: {r['pools']} pools, {r['nodes']} nodes, "
            f"{r['blocks']} blocks",
            f"  start-up (accountant's LISTs and every pool's status): {r['startup']}",
            f"  at rest: {r['at_rest']}",
            f"  a burst: {r['burst']}",
            f"  one allocation at a time: {r['one_allocation']}",
            f"  apiserver RSS: {r['apiserver_rss_mib']} MiB",
        ]
    )
