"""Pool accounting with a fake cluster: each node's leased counts written to its blocks batched
(one write per changed block per flush, none per allocation), the accountant's counts from the
pools and blocks it follows, the pool status written only when it changed, and a Pending pod
whose claim asks an exhausted pool told which pool, its size and what is held, while a
FailedScheduling Event costs nothing when no pool is exhausted; one accountant at a time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.ipam import EXHAUSTED_REASON
from cnidra.ipam.accounting import (
    STANDBY_FACTOR,
    BlockLeaseWriter,
    PoolAccountant,
    account_while_leading,
    run_while_leading,
    successors,
)
from cnidra.kube.api import NotFound
from cnidra.state.ipam import HeldBlock, IPAMState, Lease
from cnidra.state.layout import StateLayout

DRIVER = "cni.dra.networking.x-k8s.io"
SELECT = f'device.attributes["{DRIVER}"].network == "net-a"'


def pool(name: str, subnet: str, block_size: int = 4, **range_: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"ranges": [{"subnet": subnet, **range_}], "blockSize": block_size},
    }


def block(name: str, pool: str, leased: int | None, range_index: int = 0) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name}, "spec": {"pool": pool, "range": range_index}}
    if leased is not None:
        obj["status"] = {"leased": leased}
    return obj


class FakeCluster:
    def __init__(self) -> None:
        self.pools: list[Mapping[str, Any]] = []
        self.blocks: list[Mapping[str, Any]] = []
        self.statuses: dict[str, Mapping[str, int]] = {}
        self.status_writes = 0
        self.pods: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.networks = {"net-a": "pool-a"}
        self.warnings: list[tuple[str, str, str, str]] = []
        self.reads: list[str] = []
        self.scheduler: asyncio.Queue[tuple[str, Mapping[str, Any]]] = asyncio.Queue()
        self.block_events: asyncio.Queue[tuple[str, Mapping[str, Any]]] = asyncio.Queue()
        self.leased: dict[str, int] = {}
        self.fail_next_block_write = False

    async def pool_objects(self) -> list[Mapping[str, Any]]:
        self.reads.append("list pools")
        return list(self.pools)

    async def block_objects(self) -> list[Mapping[str, Any]]:
        self.reads.append("list blocks")
        return list(self.blocks)

    async def watch_pools(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        for obj in self.pools:
            yield "ADDED", obj
        await asyncio.Event().wait()

    async def watch_blocks(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        while True:
            yield await self.block_events.get()

    async def watch_failed_scheduling(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        while True:
            yield await self.scheduler.get()

    async def write_pool_status(self, name: str, status: Mapping[str, int]) -> None:
        self.status_writes += 1
        self.statuses[name] = dict(status)

    async def write_block_leased(self, name: str, leased: int) -> None:
        if self.fail_next_block_write:
            self.fail_next_block_write = False
            raise ConnectionError("apiserver down")
        if name.startswith("gone"):
            raise NotFound(404, "not found")
        self.leased[name] = leased

    async def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads.append(f"get pod {namespace}/{name}")
        return self.pods.get((namespace, name))

    async def resource_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads.append(f"get claim {namespace}/{name}")
        return self.claims.get((namespace, name))

    async def network_pools(self) -> dict[str, str]:
        self.reads.append("list slices")
        return dict(self.networks)

    async def warn(self, kind: str, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self.warnings.append((kind, str(obj["metadata"]["name"]), reason, message))


def failed(pod: str, namespace: str = "ns") -> dict[str, Any]:
    return {
        "reason": "FailedScheduling",
        "involvedObject": {"kind": "Pod", "namespace": namespace, "name": pod},
    }


def pending_pod(cluster: FakeCluster, name: str, claim: str, allocated: bool = False) -> None:
    cluster.pods[("ns", name)] = {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "status": {"resourceClaimStatuses": [{"name": "c0", "resourceClaimName": claim}]},
    }
    cluster.claims[("ns", claim)] = {
        "metadata": {"name": claim, "namespace": "ns", "uid": f"uid-{claim}"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "data", "exactly": {"selectors": [{"cel": {"expression": SELECT}}]}}
                ]
            }
        },
        "status": {"allocation": {"devices": {}}} if allocated else {},
    }


def accountant(cluster: FakeCluster) -> PoolAccountant:
    return PoolAccountant(cluster, DRIVER, interval=0.01)


async def test_counts_from_pools_and_the_nodes_leased_counts() -> None:
    cluster = FakeCluster()
    books = accountant(cluster)
    books.replace(
        [
            pool("pool-a", "198.18.141.0/29", rangeStart="198.18.141.1", rangeEnd="198.18.141.2"),
            pool("pool-b", "198.18.142.0/28"),
            {"metadata": {"name": "bad"}, "spec": {"ranges": []}},  # not counted, no crash
        ],
        [
            block("pool-a.0.0", "pool-a", 2),
            block("pool-b.0.0", "pool-b", 3),
            block("pool-b.0.1", "pool-b", None),  # a node that has not written yet: 0
            block("gone.0.0", "gone", 4),  # a block of no pool known: not counted
            block("pool-b.1.0", "pool-b", 9, range_index=1),  # a range the pool lacks
        ],
    )
    counts = books.counts()
    assert set(counts) == {"pool-a", "pool-b"}
    assert (counts["pool-a"].size, counts["pool-a"].held, counts["pool-a"].free) == (2, 2, 0)
    assert (counts["pool-b"].size, counts["pool-b"].held, counts["pool-b"].free) == (
        14,
        3,
        11,
    )  # network and broadcast are not handed out
    assert (counts["pool-b"].blocks, counts["pool-b"].pool_blocks) == (2, 4)
    assert set(books.exhausted()) == {"pool-a"}
    books.block_deleted("pool-a.0.0")
    books.pool_deleted("pool-b")
    assert books.exhausted() == {} and set(books.counts()) == {"pool-a"}


async def test_a_dual_stack_pool_counts_pods_not_addresses() -> None:
    cluster = FakeCluster()
    books = accountant(cluster)
    dual = {
        "metadata": {"name": "dual"},
        "spec": {
            "ranges": [{"subnet": "198.18.143.0/30"}, {"subnet": "fd00:1::/126"}],
            "blockSize": 4,
        },
    }
    books.replace([dual], [block("dual.0.0", "dual", 1), block("dual.1.0", "dual", 1, 1)])
    counts = books.counts()["dual"]
    assert (counts.size, counts.held) == (2, 1)  # one pod, not two addresses


async def test_the_pool_status_is_written_when_it_changed_and_settled() -> None:
    cluster = FakeCluster()
    books = accountant(cluster)
    books.replace([pool("pool-b", "198.18.142.0/28")], [block("pool-b.0.0", "pool-b", 1)])
    assert await books.flush() == 1
    assert cluster.statuses["pool-b"] == {
        "size": 14,
        "held": 1,
        "free": 13,
        "blocks": 1,
        "poolBlocks": 4,
    }
    assert await books.flush() == 0  # nothing changed: no request
    for leased in range(2, 52):  # many allocations between two flushes: one write (held 3)
        books.block_changed(block("pool-b.0.0", "pool-b", leased % 4))
    assert await books.flush() == 0  # changed: written once the same at the next flush
    assert await books.flush() == 1 and cluster.status_writes == 2
    assert cluster.statuses["pool-b"]["held"] == 3
    for leased in (5, 6, 7):  # a burst across flushes: written after it
        books.block_changed(block("pool-b.0.0", "pool-b", leased))
        assert await books.flush() == 0
    assert await books.flush() == 1 and cluster.statuses["pool-b"]["held"] == 7
    books.block_changed(block("pool-b.0.0", "pool-b", 14))  # exhausted: written at once
    assert await books.flush() == 1 and cluster.statuses["pool-b"]["free"] == 0
    books.block_changed(block("pool-b.0.0", "pool-b", 13))  # and no longer
    assert await books.flush() == 1 and cluster.statuses["pool-b"]["free"] == 1


async def test_a_pending_pod_gets_the_pool_its_size_and_held_count() -> None:
    cluster = FakeCluster()
    books = accountant(cluster)
    books.replace(
        [pool("pool-a", "198.18.141.0/29", rangeStart="198.18.141.1", rangeEnd="198.18.141.2")],
        [block("pool-a.0.0", "pool-a", 2)],
    )
    pending_pod(cluster, "p3", "p3-c0")
    assert await books.failed_scheduling(failed("p3")) == 2
    message = (
        "claim ns/p3-c0: CNIIPPool pool-a has no address left on any node: 2 addresses, "
        "2 held, 0 free (1 of 1 blocks reserved by nodes)"
    )
    assert cluster.warnings == [
        ("Pod", "p3", EXHAUSTED_REASON, message),
        ("ResourceClaim", "p3-c0", EXHAUSTED_REASON, message),
    ]
    # the scheduler tries again: the same claim, pool and count are not told twice, and the
    # network's pool is not LISTed again within its TTL
    assert await books.failed_scheduling(failed("p3")) == 0
    assert cluster.reads.count("list slices") == 1
    # an allocated claim (the pod waits for something else), a gone pod: nothing
    pending_pod(cluster, "p4", "p4-c0", allocated=True)
    assert await books.failed_scheduling(failed("p4")) == 0
    assert await books.failed_scheduling(failed("nobody")) == 0
    assert len(cluster.warnings) == 2


async def test_failed_scheduling_costs_nothing_while_no_pool_is_exhausted() -> None:
    cluster = FakeCluster()
    books = accountant(cluster)
    books.replace([pool("pool-a", "198.18.141.0/29")], [block("pool-a.0.0", "pool-a", 1)])
    pending_pod(cluster, "p3", "p3-c0")
    for _ in range(1000):
        assert await books.failed_scheduling(failed("p3")) == 0
    assert cluster.reads == [] and cluster.warnings == []
    assert books.stats.ignored_events == 1000
    # a pool of another network exhausted: the pod is read, but not told about it
    books.replace(
        [pool("pool-a", "198.18.141.0/29"), pool("other", "198.18.144.0/30")],
        [block("other.0.0", "other", 4)],
    )
    assert await books.failed_scheduling(failed("p3")) == 0 and cluster.warnings == []


async def test_run_follows_blocks_and_the_scheduler(tmp_path: Path) -> None:
    cluster = FakeCluster()
    cluster.pools = [
        pool("pool-a", "198.18.141.0/29", rangeStart="198.18.141.1", rangeEnd="198.18.141.2")
    ]
    cluster.blocks = [block("pool-a.0.0", "pool-a", 1)]
    books = accountant(cluster)
    pending_pod(cluster, "p3", "p3-c0")
    task = asyncio.create_task(books.run())
    try:
        for _ in range(3000):  # 30 s: a hang's bound
            await asyncio.sleep(0.01)
            if cluster.statuses.get("pool-a", {}).get("held") == 1:
                break
        assert cluster.statuses["pool-a"]["free"] == 1
        await cluster.block_events.put(("MODIFIED", block("pool-a.0.0", "pool-a", 2)))
        await cluster.scheduler.put(("ADDED", failed("p3")))
        for _ in range(3000):  # 30 s: a hang's bound
            await asyncio.sleep(0.01)
            if cluster.warnings and cluster.statuses["pool-a"]["free"] == 0:
                break
        assert cluster.warnings[0][:3] == ("Pod", "p3", EXHAUSTED_REASON)
        assert cluster.statuses["pool-a"] == {
            "size": 2,
            "held": 2,
            "free": 0,
            "blocks": 1,
            "poolBlocks": 1,
        }
        await cluster.block_events.put(("DELETED", block("pool-a.0.0", "pool-a", 2)))
        for _ in range(3000):  # 30 s: a hang's bound
            await asyncio.sleep(0.01)
            if cluster.statuses["pool-a"]["held"] == 0:
                break
        assert cluster.statuses["pool-a"]["free"] == 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_node_writes_its_blocks_leased_counts_batched(tmp_path: Path) -> None:
    cluster = FakeCluster()
    state = IPAMState(StateLayout(tmp_path))
    held = HeldBlock("pool-a", "pool-a.0.0", 0, 0, "198.18.141.0/30", "uid")
    await state.hold(held)
    writer = BlockLeaseWriter(state, cluster)
    assert await writer.flush() == 0  # seen once: written when it is the same at the next
    assert await writer.flush() == 1 and cluster.leased == {"pool-a.0.0": 0}
    for i in range(1, 4):  # three allocations, then flushes: one write, once settled
        await state.lease(Lease("pool-a", f"198.18.141.{i}", held.name, f"claim/u{i}/r"))
    assert await writer.flush() == 0
    assert await writer.flush() == 1 and cluster.leased == {"pool-a.0.0": 3}
    assert await writer.flush() == 0  # at rest: no request
    await state.release("claim/u1/r")
    assert await writer.flush() == 0
    cluster.fail_next_block_write = True
    assert await writer.flush() == 0  # failed: tried again at the next flush
    assert await writer.flush() == 1 and cluster.leased == {"pool-a.0.0": 2}
    assert writer.writes == 3
    # a block the apiserver no longer has: not asked again until its count changes
    await state.hold(HeldBlock("gone", "gone.0.0", 0, 0, "198.18.150.0/30", "uid2"))
    calls = writer.writes
    for _ in range(4):
        await writer.flush()
    assert writer.writes == calls + 1  # the one attempt counted, none after


async def test_a_burst_costs_a_write_per_block_after_it_and_a_long_one_is_not_left_unsaid(
    tmp_path: Path,
) -> None:
    cluster = FakeCluster()
    state = IPAMState(StateLayout(tmp_path))
    held = HeldBlock("pool-a", "pool-a.0.0", 0, 0, "198.18.141.0/28", "uid")
    await state.hold(held)
    writer = BlockLeaseWriter(state, cluster, settle_flushes=4)
    await writer.flush()
    await writer.flush()
    base = writer.writes
    for i in range(1, 4):  # a burst across three flushes: the count changes at each
        await state.lease(Lease("pool-a", f"198.18.141.{i}", held.name, f"claim/u{i}/r"))
        assert await writer.flush() == 0
    assert await writer.flush() == 1 and cluster.leased == {"pool-a.0.0": 3}
    assert writer.writes == base + 1  # not one a flush while it rose
    for i in range(4, 10):  # a count that never settles: written after settle_flushes
        await state.lease(Lease("pool-a", f"198.18.141.{i}", held.name, f"claim/u{i}/r"))
        await writer.flush()
    assert writer.writes == base + 2 and cluster.leased["pool-a.0.0"] in range(4, 10)


async def test_only_the_lease_holder_runs_the_accountant() -> None:
    answers = [False, True, True, False, True]
    asked = 0
    runs: list[str] = []

    async def lead() -> bool:
        nonlocal asked
        asked += 1
        if asked == 6:
            raise ConnectionError("apiserver down")  # counts as lost
        return answers[min(asked - 1, len(answers) - 1)]

    async def work() -> None:
        runs.append("start")
        try:
            await asyncio.Event().wait()
        finally:
            runs.append("stop")

    task = asyncio.create_task(run_while_leading(work, lead, renew_every=0.01, retry_every=0.01))
    for _ in range(3000):  # 30 s: a hang's bound
        await asyncio.sleep(0.01)
        if asked >= 8:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # led at 2 (started), lost at 4 (stopped), led at 5 (started), lost at 6 (error), led at 7
    assert runs[:4] == ["start", "stop", "start", "stop"]
    assert runs[-1] == "stop"  # cancelled with the runner


async def test_metrics_per_pool_from_the_last_flush_only_while_leading() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from cnidra.observe.metrics import PoolAccountCollector

    cluster = FakeCluster()
    cluster.pools = [pool("pool-b", "198.18.142.0/28")]
    cluster.blocks = [block("pool-b.0.0", "pool-b", 13)]
    books = accountant(cluster)
    collector = PoolAccountCollector()
    collector.source = lambda: books.latest
    registry = CollectorRegistry()
    registry.register(collector)
    task = asyncio.create_task(books.run())
    for _ in range(3000):  # 30 s: a hang's bound
        await asyncio.sleep(0.01)
        if books.latest:
            break
    text = generate_latest(registry).decode()
    assert 'cnidra_ipam_pool_addresses{pool="pool-b",state="size"} 14.0' in text
    assert 'cnidra_ipam_pool_addresses{pool="pool-b",state="held"} 13.0' in text
    assert 'cnidra_ipam_pool_addresses{pool="pool-b",state="free"} 1.0' in text
    assert 'cnidra_ipam_pool_used_ratio{pool="pool-b"} 0.928' in text
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert books.latest == ()  # not leading: another driver exports them
    assert "cnidra_ipam_pool_used_ratio{" not in generate_latest(registry).decode()


async def test_a_pod_seen_before_its_pool_counted_exhausted_is_told_at_the_next_flush() -> None:
    """A node's leased count lags up to a flush interval: the scheduler's first attempt may
    come first. The pod is remembered (bounded) and told once the pool is counted exhausted."""
    cluster = FakeCluster()
    books = accountant(cluster)
    books.replace(
        [pool("pool-a", "198.18.141.0/29", rangeStart="198.18.141.1", rangeEnd="198.18.141.2")],
        [block("pool-a.0.0", "pool-a", 1)],
    )
    pending_pod(cluster, "p3", "p3-c0")
    await books.flush()
    assert await books.failed_scheduling(failed("p3")) == 0 and cluster.reads == []
    books.block_changed(block("pool-a.0.0", "pool-a", 2))
    await books.flush()
    assert [w[:2] for w in cluster.warnings] == [("Pod", "p3"), ("ResourceClaim", "p3-c0")]
    await books.flush()  # still exhausted: nothing replayed again
    assert len(cluster.warnings) == 2


async def test_a_watch_that_ends_ends_the_other_and_everything_is_listed_again() -> None:
    cluster = FakeCluster()
    cluster.pools = [pool("pool-b", "198.18.142.0/28")]
    cluster.blocks = [block("pool-b.0.0", "pool-b", 1)]
    ended = 0
    blocks_open = 0

    async def short_watch() -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        nonlocal ended
        ended += 1
        if ended > 1:
            await asyncio.Event().wait()
        yield "ADDED", cluster.pools[0]

    async def block_watch() -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        nonlocal blocks_open
        blocks_open += 1
        try:
            await asyncio.Event().wait()
            yield "ADDED", {}
        finally:
            blocks_open -= 1

    cluster.watch_pools = short_watch  # type: ignore[method-assign]
    cluster.watch_blocks = block_watch  # type: ignore[method-assign]
    books = accountant(cluster)
    task = asyncio.create_task(books._follow())
    for _ in range(3000):  # 30 s: a hang's bound
        await asyncio.sleep(0.01)
        if cluster.reads.count("list blocks") >= 2 and blocks_open == 1:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cluster.reads.count("list pools") == 2  # listed again after the watch ended
    assert blocks_open == 0  # no block watch left behind


def test_successors_are_two_other_nodes_every_node_agrees_on() -> None:
    nodes = [f"node-{i}" for i in range(1000)]
    named = successors("node-7", nodes)
    assert len(named) == 2 and "node-7" not in named
    assert successors("node-7", reversed(nodes)) == named  # the order nodes come in: none
    assert successors("node-8", nodes) != named  # another holder, others (almost surely)
    assert successors("a", ["a"]) == [] and successors("a", ["a", "b"]) == ["b"]
    # spread: 1,000 holders name 2 each, and no node is named by many
    counts: dict[str, int] = {}
    for holder in nodes:
        for node in successors(holder, nodes):
            counts[node] = counts.get(node, 0) + 1
    assert max(counts.values()) < 12


def test_the_accountant_knows_the_nodes_holding_blocks() -> None:
    accountant = PoolAccountant(FakeCluster(), "d")  # type: ignore[arg-type]
    accountant.replace([], [{**block("b1", "p", 1), "spec": {"pool": "p", "node": "n1"}}])
    accountant.block_changed({**block("b2", "p", 1), "spec": {"pool": "p", "node": "n2"}})
    assert accountant.nodes() == {"n1", "n2"}
    accountant.block_deleted("b1")
    assert accountant.nodes() == {"n2"}


class FakeLease:
    """The Lease as each node's KubeIPAM sees it: held by `holder`, naming `named`."""

    def __init__(self, holder: str, named: frozenset[str] | None) -> None:
        self.holder, self.successors = holder, named
        self.asked: list[tuple[str, float]] = []
        self.wrote: list[list[str]] = []

    async def lead(self, ns: str, name: str, me: str, duration: float, named: Any = ()) -> bool:
        self.asked.append((me, asyncio.get_running_loop().time()))
        if me == self.holder:
            self.wrote.append(list(named))
        return me == self.holder


@pytest.mark.parametrize(
    ("me", "named", "pace"),
    [
        ("b", frozenset({"b", "c"}), 1.0),
        ("d", frozenset({"b", "c"}), STANDBY_FACTOR),
        ("d", None, 1.0),
    ],
)
async def test_a_named_successor_asks_every_lease_the_others_every_ten(
    me: str, named: frozenset[str] | None, pace: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pace of a driver that does not hold the Lease: a successor the holder named, or
    anyone while none is named, asks once a lease; the others STANDBY_FACTOR times less."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) >= 3:
            raise asyncio.CancelledError

    monkeypatch.setattr("cnidra.ipam.accounting.asyncio.sleep", sleep)
    lease = FakeLease("a", named)
    with pytest.raises(asyncio.CancelledError):
        await account_while_leading(PoolAccountant(FakeCluster(), "d"), lease, "ns", me, 60.0)  # type: ignore[arg-type]
    assert all(60.0 * pace * 0.8 <= w <= 60.0 * pace * 1.2 for w in waits), waits


async def test_the_holder_names_successors_from_the_blocks_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) >= 2:
            raise asyncio.CancelledError

    monkeypatch.setattr("cnidra.ipam.accounting.asyncio.sleep", sleep)
    accountant = PoolAccountant(FakeCluster(), "d")  # type: ignore[arg-type]
    accountant.replace(
        [], [{**block(f"b{n}", "p", 1), "spec": {"pool": "p", "node": n}} for n in "abcd"]
    )
    accountant.run = lambda: asyncio.Event().wait()  # type: ignore[method-assign]
    lease = FakeLease("a", None)
    with pytest.raises(asyncio.CancelledError):
        await account_while_leading(accountant, lease, "ns", "a", 60.0)  # type: ignore[arg-type]
    assert waits == [20.0, 20.0]  # renewed every third of the lease
    assert lease.wrote[0] == successors("a", "abcd") and len(lease.wrote[0]) == 2
