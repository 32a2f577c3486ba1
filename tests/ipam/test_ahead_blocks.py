"""Blocks reserved ahead for the claims read ahead (Allocator.expect): their prepares ask the
apiserver nothing, only as many blocks as they need are reserved, a pool that would refuse the
claim reserves nothing for it, a prepare that needs a block while one is being reserved ahead
takes that one, and what was expected is forgotten once the claim is assigned or released."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cnidra.ipam import allocator as allocator_module
from cnidra.ipam.allocator import Allocator
from tests.ipam.fakes import FakeApiserver, addresses_of, claim_using, node_allocator

V4 = {"ranges": [{"subnet": "198.18.140.0/24", "gateway": "198.18.140.1"}], "blockSize": 16}


@pytest.fixture
def api() -> FakeApiserver:
    server = FakeApiserver()
    server.pool("data", V4)
    server.pool("elsewhere", {**V4, "ranges": [{"subnet": "198.18.141.0/24"}], "namespaces": ["x"]})
    return server


def creates(api: FakeApiserver) -> int:
    return sum(1 for c in api.calls if c.startswith("create"))


async def rooms(node: Allocator) -> list[int]:
    """The usable addresses of each block the node holds of pool `data`, in reserving order."""
    pool = await node.pool("data")
    return [
        sum(1 for _ in pool.usable(pool.block(0, held.index))) for held in node.state.blocks.all()
    ]


async def test_claims_read_ahead_find_their_blocks_and_ask_the_apiserver_nothing(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "node-a")
    claims = [claim_using("data", f"c{i}") for i in range(40)]
    for claim in claims:
        node.expect(claim)
    await node.topped_up()
    room = await rooms(node)
    held = len(room)
    assert sum(room) >= 40 > sum(room) - min(room)  # enough, and not a block more
    api.calls.clear()
    assigned = [await node.assign(c) for c in claims]
    assert api.calls == []  # no GET, no LIST, no create on prepare's path
    assert len({addresses_of(c)[0] for c in assigned}) == 40
    assert node.expecting() == 0  # forgotten once assigned
    # once assigned, nothing more is reserved for them
    node.expect(claims[0])
    await node.topped_up()
    assert len(node.state.blocks.all()) == held


async def test_a_pool_that_would_refuse_the_claim_reserves_nothing_for_it(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "node-a")
    for i in range(20):  # "elsewhere" serves namespace x only; these are in default
        node.expect(claim_using("elsewhere", f"c{i}"))
    node.expect(claim_using("absent", "gone"))  # no such pool: logged, nothing reserved
    await node.topped_up()
    assert node.state.blocks.all() == []
    assert creates(api) == 0


async def test_a_prepare_needing_a_block_while_one_is_reserved_ahead_takes_that_one(
    api: FakeApiserver, tmp_path: Path
) -> None:
    api.latency = 0.01
    node = node_allocator(api, tmp_path, "node-a")
    claim = claim_using("data", "c0")
    node.expect(claim)
    await asyncio.sleep(0.015)  # the top-up is inside its LIST or create now
    await node.assign(claim)
    await node.topped_up()
    assert len(node.state.blocks.all()) == 1 == creates(api)


async def test_expectations_expire_and_a_release_forgets_them(
    api: FakeApiserver, tmp_path: Path
) -> None:
    now = [0.0]
    node = node_allocator(api, tmp_path, "node-a")
    node.clock = lambda: now[0]
    node.expect(claim_using("data", "gone-soon"))
    await node.topped_up()
    assert len(node.state.blocks.all()) == 1
    (room,) = await rooms(node)
    now[0] += allocator_module.EXPECTED_SECONDS
    for i in range(room):  # the block's worth: the expired one no longer counts
        node.expect(claim_using("data", f"c{i}"))
    await node.topped_up()
    assert len(node.state.blocks.all()) == 1
    node.expect(claim_using("data", "one-more"))
    await node.topped_up()
    assert len(node.state.blocks.all()) == 2
    await node.release_claims([f"c{i}" for i in range(room)] + ["one-more"])
    assert node.expecting() == 0


async def test_the_bound_on_claims_counted_holds(
    api: FakeApiserver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(allocator_module, "EXPECTED_CLAIMS", 8)
    node: Allocator = node_allocator(api, tmp_path, "node-a")
    for i in range(100):
        node.expect(claim_using("data", f"c{i}"))
    await node.topped_up()
    assert node.expecting() == 8
    assert len(node.state.blocks.all()) == 1


async def test_a_burst_that_finds_the_pools_read_old_shares_one_get(
    api: FakeApiserver, tmp_path: Path
) -> None:
    api.latency = 0.01
    now = [0.0]
    node = node_allocator(api, tmp_path, "node-a")
    node.clock = lambda: now[0]
    pools = await asyncio.gather(*(node.pool("data") for _ in range(20)))
    assert len({id(p) for p in pools}) == 1
    assert api.calls == ["get pool data"]
    api.pools.pop("data")
    now[0] += node.pool_ttl  # the pool's read is old
    failed = await asyncio.gather(*(node.pool("data") for _ in range(5)), return_exceptions=True)
    assert [str(f) for f in failed] == ["CNIIPPool data not found"] * 5
    assert api.calls == ["get pool data"] * 2
