"""Prepare with cnidra IPAM and prepare's use of the apiserver: addresses given at prepare and
given back when a claim is not prepared after all, a bounded number of claims asking the
apiserver at once, claims in flight visible to the IPAM reconciler."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.refs import ObjectRef
from cnidra.dra.ahead import ClaimsAhead
from cnidra.dra.prepare import APISERVER_SLOTS, PrepareError, Preparer
from cnidra.state.checkpoint import Checkpoint, PreparedClaim
from cnidra.state.layout import StateLayout
from tests.dra.test_prepare import DIRS, DRIVER, POLICY, VIEW, Claims, claim, params
from tests.ipam.fakes import FakeApiserver, node_allocator


def pooled(name: str, uid: str) -> dict[str, Any]:
    """A claim whose network takes its address from CNIIPPool `data`, under a class whose
    policy allows cnidra IPAM."""
    return tenants(name, uid, {"type": "cnidra", "pool": "data"})


def static(name: str, uid: str, address: str, node: str = "n1") -> dict[str, Any]:
    """A claim whose own network has static IPAM with `address`."""
    return tenants(name, uid, {"type": "static", "addresses": [{"address": address}]}, node)


def tenants(name: str, uid: str, ipam: dict[str, Any], node: str = "n1") -> dict[str, Any]:
    """A claim whose own network (the tenant's) has this IPAM, under a class whose policy
    allows cnidra and static IPAM, allocated a link of `node`."""
    policy = copy.deepcopy(POLICY)
    plugins = policy["opaque"]["parameters"]["claims"]["plugins"]
    plugins += [p for p in ("cnidra", "static") if p not in plugins]
    network = {
        "cniVersion": "1.0.0",
        "name": "n",
        "plugins": [{"type": "macvlan", "master": "eth1", "ipam": ipam}],
    }
    configs = [
        policy,
        {
            "source": "FromClaim",
            "requests": ["net"],
            "opaque": {"driver": DRIVER, "parameters": params(config=network, ifName=f"{name}0")},
        },
    ]
    result = {"request": "net", "driver": DRIVER, "pool": node, "device": "eth1"}
    c = claim(configs, [result], node=node)
    c["metadata"].update(name=name, uid=uid)
    del c["status"]["allocation"]["devices"]["config"][0]  # the default POLICY: one per class
    return c


DATA_POOL = {"ranges": [{"subnet": "198.18.130.0/24"}], "blockSize": 16, "namespaces": ["ns"]}


def ipam_preparer(
    tmp_path: Path,
    *claims: dict[str, Any],
    limit: int = 8,
    pool: dict[str, Any] | None = None,
    api: FakeApiserver | None = None,
    node: str = "n1",
) -> Preparer:
    if api is None:
        api = FakeApiserver()
        api.pool("data", pool or DATA_POOL)
    return Preparer(
        node,
        Claims(*claims),
        Checkpoint(StateLayout(tmp_path / f"state-{node}")),
        DIRS,
        max_attachments=limit,
        view=lambda: VIEW,
        ipam=node_allocator(api, tmp_path, node),
    )


async def test_prepare_gives_static_addresses_and_unprepare_frees_them(tmp_path: Path) -> None:
    preparer = ipam_preparer(tmp_path, pooled("a", "u-a"))
    prepared = await preparer.prepare(ObjectRef("ns", "a", "u-a"))
    ipam = prepared.devices[0].network["plugins"][0]["ipam"]
    assert ipam["type"] == "static" and len(ipam["addresses"]) == 1
    assert preparer.checkpoint.get("u-a") == prepared
    assert preparer.ipam is not None and len(preparer.ipam.state.leases) == 1
    await preparer.unprepare(ObjectRef("ns", "a", "u-a"))
    assert len(preparer.ipam.state.leases) == 0


async def test_a_claim_refused_after_its_address_was_leased_gives_it_back(
    tmp_path: Path,
) -> None:
    """One pod, two claims in one batch, one interface allowed: the second is refused after
    both got addresses, and its address is free again at once."""
    preparer = ipam_preparer(tmp_path, pooled("a", "u-a"), pooled("b", "u-b"), limit=1)
    first, second = await preparer.prepare_batch(
        [ObjectRef("ns", "a", "u-a"), ObjectRef("ns", "b", "u-b")]
    )
    assert isinstance(first, PreparedClaim) and isinstance(second, PrepareError)
    assert preparer.ipam is not None
    assert [x.owner for x in preparer.ipam.state.leases.all()] == ["claim/u-a/net"]


class SlowClaims(Claims):
    """An apiserver that answers after a while, counting the requests open at once."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        super().__init__(*claims)
        self.open = self.most = 0
        self.release = asyncio.Event()

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.open += 1
        self.most = max(self.most, self.open)
        try:
            await self.release.wait()
            return await super().get(namespace, name)
        finally:
            self.open -= 1


async def test_at_most_a_bounded_number_of_claims_ask_the_apiserver_at_once(
    tmp_path: Path,
) -> None:
    """The client's one HTTP/2 connection fails its 101st stream rather than queueing it."""
    uids = [f"u-{i}" for i in range(100)]
    source = SlowClaims(*(pooled(f"c{i}", uid) for i, uid in enumerate(uids)))
    preparer = Preparer(
        "n1",
        source,
        Checkpoint(StateLayout(tmp_path)),
        DIRS,
        max_attachments=200,
        view=lambda: VIEW,
    )
    batch = asyncio.create_task(
        preparer.prepare_batch([ObjectRef("ns", f"c{i}", uid) for i, uid in enumerate(uids)])
    )
    for _ in range(3000):  # every slot taken: the rest wait for one
        if source.open == APISERVER_SLOTS:
            break
        await asyncio.sleep(0.01)
    assert source.open == APISERVER_SLOTS
    assert preparer.in_flight() == set(uids)  # all of them live for the IPAM reconciler
    source.release.set()
    await batch
    assert source.most == APISERVER_SLOTS and preparer.in_flight() == set()


async def test_a_tenants_network_gets_a_pool_only_inside_its_namespace_and_ranges(
    tmp_path: Path,
) -> None:
    """The pool a claim's own network names is the tenant's choice: it must name the claim's
    namespace (a pool without namespaces serves admins' networks only) and lie in the class's
    claims.ipRanges, as any address a tenant writes."""
    ref = ObjectRef("ns", "a", "u-a")
    cases = [
        ({**DATA_POOL, "namespaces": None}, "serves only admins' networks"),
        ({**DATA_POOL, "namespaces": ["other"]}, "does not serve namespace ns"),
        (
            {**DATA_POOL, "ranges": [{"subnet": "10.50.0.0/16"}]},
            r"range 10\.50\.0\.0/16 is outside the ranges this DeviceClass allows",
        ),
    ]
    for i, (given, why) in enumerate(cases):
        spec = {k: v for k, v in given.items() if v is not None}
        preparer = ipam_preparer(tmp_path / str(i), pooled("a", "u-a"), pool=spec)
        with pytest.raises(PrepareError, match=why):
            await preparer.prepare(ref)
        assert preparer.ipam is not None and len(preparer.ipam.state.leases) == 0
    ok = ipam_preparer(tmp_path / "ok", pooled("a", "u-a"))
    assert len((await ok.prepare(ref)).devices) == 1


async def test_a_tenants_static_address_is_leased_so_a_second_holder_is_refused(
    tmp_path: Path,
) -> None:
    """Issue 39: two claims write one static address; the second is refused naming the first,
    until the first is unprepared. The network stays as the tenant wrote it."""
    a, b = ObjectRef("ns", "a", "u-a"), ObjectRef("ns", "b", "u-b")
    preparer = ipam_preparer(
        tmp_path, static("a", "u-a", "198.18.130.7/24"), static("b", "u-b", "198.18.130.7/24")
    )
    prepared = await preparer.prepare(a)
    ipam = prepared.devices[0].network["plugins"][0]["ipam"]
    assert ipam == {"type": "static", "addresses": [{"address": "198.18.130.7/24"}]}
    assert preparer.ipam is not None
    assert [x.owner for x in preparer.ipam.state.leases.all()] == ["claim/u-a/net"]
    assert await preparer.prepare(a) == prepared  # kubelet prepares again: the same lease
    with pytest.raises(
        PrepareError,
        match=r"claim ns/b: request 'net': static address 198\.18\.130\.7/24 is held by "
        "claim ns/a",
    ):
        await preparer.prepare(b)
    assert preparer.checkpoint.get("u-b") is None
    await preparer.unprepare(a)
    await preparer.prepare(b)
    assert [x.owner for x in preparer.ipam.state.leases.all()] == ["claim/u-b/net"]


async def test_a_static_address_in_another_nodes_block_is_refused(tmp_path: Path) -> None:
    api = FakeApiserver()
    api.pool("data", DATA_POOL)
    one = ipam_preparer(tmp_path, static("a", "u-a", "198.18.130.7/24"), api=api)
    two = ipam_preparer(
        tmp_path, static("b", "u-b", "198.18.130.9/24", node="n2"), api=api, node="n2"
    )
    await one.prepare(ObjectRef("ns", "a", "u-a"))
    with pytest.raises(PrepareError, match=r"claim ns/b: .*which node n1 holds"):
        await two.prepare(ObjectRef("ns", "b", "u-b"))
    assert two.ipam is not None and len(two.ipam.state.leases) == 0


async def test_a_refused_static_address_leaves_no_lease(tmp_path: Path) -> None:
    """One pod, two claims in one batch: the one whose address lies in no pool is refused,
    and what its batch leased for it is given back."""
    preparer = ipam_preparer(
        tmp_path, static("a", "u-a", "198.18.130.7/24"), static("b", "u-b", "198.18.200.7/24")
    )
    first, second = await preparer.prepare_batch(
        [ObjectRef("ns", "a", "u-a"), ObjectRef("ns", "b", "u-b")]
    )
    assert isinstance(first, PreparedClaim) and isinstance(second, PrepareError)
    assert "198.18.200.7/24 lies in no CNIIPPool" in str(second)
    assert "must lie in a CNIIPPool that serves namespace ns" in str(second)
    assert preparer.ipam is not None
    assert [x.owner for x in preparer.ipam.state.leases.all()] == ["claim/u-a/net"]


async def test_without_the_allocator_a_tenants_static_address_is_refused(
    tmp_path: Path,
) -> None:
    """No apiserver, no allocator: no owner of the address can be asked."""
    preparer = Preparer(
        "n1",
        Claims(static("a", "u-a", "198.18.130.7/24")),
        Checkpoint(StateLayout(tmp_path)),
        DIRS,
        view=lambda: VIEW,
    )
    with pytest.raises(
        PrepareError,
        match=r"claim ns/a: request 'net': a tenant's static IPAM addresses are leased "
        "through cnidra's cluster IPAM",
    ):
        await preparer.prepare(ObjectRef("ns", "a", "u-a"))
    assert preparer.checkpoint.get("u-a") is None


async def test_a_claim_read_ahead_has_its_block_reserved_and_its_prepare_asks_nothing(
    tmp_path: Path,
) -> None:
    """Issue 42: claims read before kubelet asks. The read-ahead's judgement tells the
    allocator what the claim will ask for; the block is reserved then, and prepare, finding
    the claim read and judged, makes no apiserver call at all (no GET of the claim, the pool,
    or the blocks, no create)."""
    api = FakeApiserver()
    api.pool("data", DATA_POOL)
    claims = [pooled(f"c{i}", f"u-{i}") for i in range(20)]
    for c in claims:
        c["metadata"].update(namespace="ns", resourceVersion="5")
    preparer = ipam_preparer(tmp_path, *claims, api=api, limit=20)
    preparer.ahead = ClaimsAhead()
    for c in claims:
        assert preparer.ahead.put(c)
        await preparer.warm(c)
    assert preparer.ipam is not None
    await preparer.ipam.topped_up()
    assert len(preparer.ipam.state.blocks.all()) == 2  # 20 addresses: two blocks of 16
    api.calls.clear()
    preparer.claims = NoGets()
    answers = await preparer.prepare_batch([ObjectRef("ns", f"c{i}", f"u-{i}") for i in range(20)])
    assert [a for a in answers if not isinstance(a, PreparedClaim)] == []
    assert api.calls == []


class NoGets(Claims):
    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        raise AssertionError(f"GET {namespace}/{name}: the claim was read ahead")
