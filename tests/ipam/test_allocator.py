"""cnidra IPAM at prepare and its reconciler, against a fake apiserver: no address twice across
nodes, exhaustion named, the same claim the same addresses, IPAMClaims kept until deleted,
lost nodes' blocks adopted, nothing live ever freed."""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path

import pytest

from cnidra.ipam.allocator import AllocationError, Allocator
from cnidra.ipam.reconcile import IPAMReconciler
from cnidra.state.ipam import IPAMState
from cnidra.state.layout import StateLayout
from tests.ipam.fakes import (
    FakeApiserver,
    FakeCluster,
    addresses_of,
    claim_using,
    node_allocator,
)

V4 = {"ranges": [{"subnet": "198.18.130.0/24", "gateway": "198.18.130.1"}], "blockSize": 16}


async def room_in_its_block(node: Allocator) -> int:
    """How many addresses the node's one block of pool `data` holds."""
    pool = await node.pool("data")
    (held,) = node.state.blocks.all()
    return len(list(pool.usable(pool.block(0, held.index))))


@pytest.fixture
def api() -> FakeApiserver:
    server = FakeApiserver()
    server.pool("data", V4)
    return server


async def test_nodes_allocating_at_once_never_share_an_address(
    api: FakeApiserver, tmp_path: Path
) -> None:
    api.latency = 0.001  # so the nodes interleave at every apiserver call
    nodes = [node_allocator(api, tmp_path, f"node-{n}") for n in range(5)]
    claims = [[claim_using("data", f"{n}-{i}") for i in range(40)] for n in range(5)]
    assigned = await asyncio.gather(*(nodes[n].assign(c) for n in range(5) for c in claims[n]))
    addresses = [a for claim in assigned for a in addresses_of(claim)]
    assert len(addresses) == 200 == len(set(addresses))
    owners = {b.name: b.node for b in api.blocks.values()}
    for n, node in enumerate(nodes):  # each node's addresses are in blocks it holds
        for claim in assigned[n * 40 : (n + 1) * 40]:
            ip = ipaddress.ip_interface(addresses_of(claim)[0]).ip
            block = (await node.pool("data")).block_of(ip)
            assert block is not None and owners[block.name] == node.node


async def test_the_common_path_asks_the_apiserver_nothing(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "node-a")
    await node.assign(claim_using("data", "first"))
    room = await room_in_its_block(node)
    api.calls.clear()
    for i in range(room - 1):  # the rest of the first block
        await node.assign(claim_using("data", f"c{i}"))
    assert api.calls == []
    await node.assign(claim_using("data", "next-block"))
    # the first block's LIST named the held ones a moment ago: the next costs its create alone
    assert [c.split()[0] for c in api.calls] == ["create"]


async def test_a_burst_lists_a_pools_blocks_once_and_an_old_list_is_read_again(
    api: FakeApiserver, tmp_path: Path
) -> None:
    now = [0.0]
    api.nodes.update({"a", "b"})
    a = Allocator(
        "a", IPAMState(StateLayout(tmp_path / "a")), FakeCluster(api), clock=lambda: now[0]
    )
    b = node_allocator(api, tmp_path, "b")
    await a.assign(claim_using("data", "a0"))
    room = await room_in_its_block(a)
    for i in range(1, 3 * room):  # two more blocks, within pool_ttl of the first's LIST
        await a.assign(claim_using("data", f"a{i}"))
    assert [c.split()[0] for c in api.calls].count("list") == 1
    assert len(a.state.blocks.all()) == 3
    await b.assign(claim_using("data", "b0"))  # another node's block, after a's LIST
    api.calls.clear()
    for i in range(3 * room, 4 * room):  # a fourth block: b's is skipped at its create
        await a.assign(claim_using("data", f"a{i}"))
    assert len(a.state.blocks.all()) == 4
    assert all(c.split()[0] != "list" for c in api.calls)
    now[0] += a.pool_ttl  # later: LISTed again
    api.calls.clear()
    for i in range(4 * room, 5 * room):
        await a.assign(claim_using("data", f"a{i}"))
    assert [c.split()[0] for c in api.calls if c.split()[0] != "get"][:2] == ["list", "create"]


async def test_a_pool_full_on_an_old_list_is_listed_again_before_it_is_called_exhausted(
    api: FakeApiserver, tmp_path: Path
) -> None:
    api.pool("tiny", {"ranges": [{"subnet": "198.18.131.0/29"}], "blockSize": 4})
    a, b = node_allocator(api, tmp_path, "a"), node_allocator(api, tmp_path, "b")
    await b.assign(claim_using("tiny", "b1"))
    got = [await a.assign(claim_using("tiny", f"a{i}")) for i in (1, 2, 3)]  # its LIST: b's
    assert len({addresses_of(c)[0] for c in got}) == 3
    (held,) = b.state.blocks.all()
    await b.release_claim("b1")
    del api.blocks[held.name]  # b gave its block back: free, though a's last LIST had it held
    api.calls.clear()
    await a.assign(claim_using("tiny", "a4"))  # a's block is full: b's old one, after a LIST
    assert [c.split()[0] for c in api.calls if c.split()[0] != "get"] == ["list", "create"]
    assert len(a.state.blocks.all()) == 2


async def test_an_exhausted_pool_is_named(api: FakeApiserver, tmp_path: Path) -> None:
    api.pool("tiny", {"ranges": [{"subnet": "198.18.131.0/29"}], "blockSize": 4})
    a, b = node_allocator(api, tmp_path, "a"), node_allocator(api, tmp_path, "b")
    got = [await a.assign(claim_using("tiny", "a1")), await b.assign(claim_using("tiny", "b1"))]
    got += [await a.assign(claim_using("tiny", f"a{i}")) for i in (2, 3)]
    got += [await b.assign(claim_using("tiny", f"b{i}")) for i in (2, 3)]
    assert len({addresses_of(c)[0] for c in got}) == 6  # .1 to .6
    with pytest.raises(AllocationError, match=r"CNIIPPool tiny is exhausted.*6 addresses"):
        await a.assign(claim_using("tiny", "a4"))


async def test_the_same_claim_gets_the_same_addresses_until_released(
    api: FakeApiserver, tmp_path: Path
) -> None:
    api.pool(
        "dual",
        {"ranges": [{"subnet": "198.18.132.0/24"}, {"subnet": "2001:db8:132::/64"}]},
    )
    node = node_allocator(api, tmp_path, "a")
    first = addresses_of(await node.assign(claim_using("dual", "x")))
    assert [ipaddress.ip_interface(a).version for a in first] == [4, 6]
    again = node_allocator(api, tmp_path, "a")  # a restart: read back from disk
    assert addresses_of(await again.assign(claim_using("dual", "x"))) == first
    assert await again.release_claim("x") == 2
    other = addresses_of(await again.assign(claim_using("dual", "y")))
    assert other == first  # free again, lowest first


async def test_a_pool_that_does_not_serve_the_namespace_is_refused(
    api: FakeApiserver, tmp_path: Path
) -> None:
    api.pool("team", {**V4, "namespaces": ["team-a"]})
    node = node_allocator(api, tmp_path, "a")
    await node.assign(claim_using("team", "ok", namespace="team-a"))
    with pytest.raises(AllocationError, match="does not serve namespace team-b"):
        await node.assign(claim_using("team", "no", namespace="team-b"))
    with pytest.raises(AllocationError, match="CNIIPPool nope not found"):
        await node.assign(claim_using("nope", "z"))


async def test_the_reconciler_frees_unprepared_claims_after_the_grace_only(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "a")
    await node.assign(claim_using("data", "live"))
    await node.assign(claim_using("data", "orphan"))  # leased, then prepare failed or crashed
    now = [0.0]
    tick = [0.0]
    reconciler = IPAMReconciler(
        node,
        lambda: {"live"},
        grace=60,
        clock=lambda: now[0] + 1e12,
        monotonic=lambda: tick[0],
    )
    now[0] = -1e12  # within the grace: a prepare may still be in flight
    assert (await reconciler.once()).freed_claim_addresses == 0
    now[0] = 0  # the wall clock says old: set forward by a day, say
    assert (await reconciler.once()).freed_claim_addresses == 0  # not seen unprepared for 60 s
    tick[0] = 61
    report = await reconciler.once()
    assert report.freed_claim_addresses == 1
    assert [x.owner for x in node.state.leases.all()] == ["claim/live/net"]


async def test_an_ipamclaim_keeps_its_addresses_across_pods_and_nodes(
    api: FakeApiserver, tmp_path: Path
) -> None:
    api.pool("vms", {**V4, "allowPersistentIPs": True})
    api.ipamclaim("vm-ns", "vm-a.data")
    a, b = node_allocator(api, tmp_path, "a"), node_allocator(api, tmp_path, "b")
    pod1 = await a.assign(
        claim_using("vms", "p1", namespace="vm-ns", ipam_claim="vm-a.data"), ["virt-launcher-1"]
    )
    held = api.ipamclaims[("vm-ns", "vm-a.data")]
    (address,) = held["status"]["ips"]
    assert addresses_of(pod1) == [address]
    ip = address.split("/")[0]
    assert held["status"]["ownerPod"] == {"name": "virt-launcher-1"}
    assert held["metadata"]["finalizers"] == ["cni.dra.networking.x-k8s.io/ipam"]
    await a.release_claim("p1")  # the pod goes: the address stays the IPAMClaim's
    assert a.state.is_taken("vms", ip)
    pod2 = await b.assign(claim_using("vms", "p2", namespace="vm-ns", ipam_claim="vm-a.data"))
    assert addresses_of(pod2) == [address]  # on the other node, the same address
    other = await a.assign(claim_using("vms", "p3", namespace="vm-ns"))
    assert addresses_of(other) != addresses_of(pod1)  # never handed out while held
    # deleted: the node holding it frees it and drops the finalizer
    api.delete_ipamclaim("vm-ns", "vm-a.data")
    report = await IPAMReconciler(a, lambda: {"p3"}).once()
    assert report.freed_ipamclaim_addresses == 1
    assert ("vm-ns", "vm-a.data") not in api.ipamclaims
    assert not a.state.is_taken("vms", ip)


async def test_an_ipamclaim_on_a_pool_without_persistent_ips_is_refused(
    api: FakeApiserver, tmp_path: Path
) -> None:
    api.ipamclaim("vm-ns", "vm-a.data")
    node = node_allocator(api, tmp_path, "a")
    with pytest.raises(AllocationError, match=r"allowPersistentIPs is false"):
        await node.assign(claim_using("data", "p", namespace="vm-ns", ipam_claim="vm-a.data"))
    api.pool("vms", {**V4, "allowPersistentIPs": True})
    with pytest.raises(AllocationError, match="IPAMClaim vm-ns/missing not found"):
        await node.assign(claim_using("vms", "p", namespace="vm-ns", ipam_claim="missing"))
    api.ipamclaim("vm-ns", "foreign", ips=["192.0.2.7/24"])
    with pytest.raises(AllocationError, match=r"holds 192\.0\.2\.7, which is not in CNIIPPool vms"):
        await node.assign(claim_using("vms", "p", namespace="vm-ns", ipam_claim="foreign"))
    assert len(node.state.leases) == 0
    # whoever may write an IPAMClaim's status: the gateway and excluded addresses are never
    # anyone's, as for an address cnidra hands out
    api.pool("vms", {**V4, "allowPersistentIPs": True, "exclude": ["198.18.130.200/29"]})
    node.pool_ttl = 0
    for name, ip in (("gw", "198.18.130.1/24"), ("excl", "198.18.130.201/24")):
        api.ipamclaim("vm-ns", name, ips=[ip])
        with pytest.raises(AllocationError, match="never hands out"):
            await node.assign(claim_using("vms", "p", namespace="vm-ns", ipam_claim=name))
    assert len(node.state.leases) == 0


async def test_an_ipamclaims_address_is_leased_before_use_where_no_node_holds_its_block(
    api: FakeApiserver, tmp_path: Path
) -> None:
    """An address written into an IPAMClaim's status (by a lost node, or anyone who may write
    it) in a block no node holds: the node using it reserves the block and leases it first,
    so no ordinary pod of that block gets it."""
    api.pool("vms", {**V4, "allowPersistentIPs": True})
    api.ipamclaim("vm-ns", "vm-a.data", ips=["198.18.130.20/24"])
    node = node_allocator(api, tmp_path, "a")
    got = await node.assign(claim_using("vms", "vm", namespace="vm-ns", ipam_claim="vm-a.data"))
    assert addresses_of(got) == ["198.18.130.20/24"]
    assert api.blocks["vms.0.1"].node == "a"  # .16-.31
    handed = set()
    for i in range(15):  # the whole block and then some
        handed.update(addresses_of(await node.assign(claim_using("vms", f"o{i}"))))
    assert "198.18.130.20/24" not in handed


async def test_an_ipamclaim_deleted_under_a_running_pod_keeps_its_address_until_the_pod_goes(
    api: FakeApiserver, tmp_path: Path
) -> None:
    api.pool("vms", {**V4, "allowPersistentIPs": True})
    api.ipamclaim("vm-ns", "vm-a.data")
    a, b = node_allocator(api, tmp_path, "a"), node_allocator(api, tmp_path, "b")
    await a.assign(claim_using("vms", "p1", namespace="vm-ns", ipam_claim="vm-a.data"))
    (address,) = api.ipamclaims[("vm-ns", "vm-a.data")]["status"]["ips"]
    ip = address.split("/")[0]
    users = {("vm-ns", "vm-a.data"): {"vm-ns/claim-p1"}}
    reconciler = IPAMReconciler(a, lambda: {"p1"}, persistent_users=lambda: users)
    api.delete_ipamclaim("vm-ns", "vm-a.data")  # while its pod runs on this node
    for _ in range(2):
        assert (await reconciler.once()).freed_ipamclaim_addresses == 0
    assert a.state.is_taken("vms", ip)
    assert ("vm-ns", "vm-a.data") in api.ipamclaims  # kept by the finalizer, Terminating
    ((on, reason, message),) = api.events  # said once
    assert (on, reason) == ("vm-ns/vm-a.data", "AddressesKept")
    assert "vm-ns/claim-p1" in message and ip in message
    # the pod moved to node b (a live migration): b's claim status shows the address
    users = {}
    api.claim_status["vm-ns/claim-p2"] = [ip]
    assert (await reconciler.once()).freed_ipamclaim_addresses == 0
    assert a.state.is_taken("vms", ip)
    other = await a.assign(claim_using("vms", "p3", namespace="vm-ns"))
    assert addresses_of(other) != [address]
    del api.claim_status["vm-ns/claim-p2"]  # the pod is gone
    assert (await reconciler.once()).freed_ipamclaim_addresses == 1
    assert ("vm-ns", "vm-a.data") not in api.ipamclaims
    assert not a.state.is_taken("vms", ip)
    assert b.state.leases.all() == []


async def test_two_nodes_binding_one_ipamclaim_at_once_agree(
    api: FakeApiserver, tmp_path: Path
) -> None:
    """A live migration: the target's pod is prepared while the source's runs."""
    api.pool("vms", {**V4, "allowPersistentIPs": True})
    api.ipamclaim("vm-ns", "vm-a.data")
    api.latency = 0.001
    a, b = node_allocator(api, tmp_path, "a"), node_allocator(api, tmp_path, "b")
    one, two = await asyncio.gather(
        a.assign(claim_using("vms", "p1", namespace="vm-ns", ipam_claim="vm-a.data")),
        b.assign(claim_using("vms", "p2", namespace="vm-ns", ipam_claim="vm-a.data")),
    )
    assert addresses_of(one) == addresses_of(two)
    persistent = [x for n in (a, b) for x in n.state.leases.all()]
    assert len(persistent) == 1  # the loser released what it leased


async def test_a_lost_nodes_blocks_go_with_it_and_its_ipamclaim_addresses_stay_held(
    api: FakeApiserver, tmp_path: Path
) -> None:
    """No node writes another's block: a lost node's go with its Node (garbage collection).
    A live node reserving one of them again leases the IPAMClaim addresses in it first, and a
    lost node's IPAMClaim being deleted is released by a live node once nothing holds it."""
    small = {"ranges": [{"subnet": "198.18.134.0/27"}], "blockSize": 16}
    api.pool("vms", {**small, "allowPersistentIPs": True})  # .1 to .30, two blocks
    api.ipamclaim("vm-ns", "vm-a.data")
    lost, survivor = node_allocator(api, tmp_path, "lost"), node_allocator(api, tmp_path, "b")
    held = addresses_of(
        await lost.assign(claim_using("vms", "p1", namespace="vm-ns", ipam_claim="vm-a.data"))
    )
    for i in range(20):  # a second block on the lost node, with no persistent address
        await lost.assign(claim_using("vms", f"more{i}"))
    assert len([b for b in api.blocks.values() if b.node == "lost"]) == 2
    api.delete_node("lost")
    assert api.blocks == {}
    handed = set()
    for i in range(29):  # the survivor reserves both blocks again: every address but one
        handed.update(addresses_of(await survivor.assign(claim_using("vms", f"new{i}"))))
    assert {b.node for b in api.blocks.values()} == {"b"} and len(api.blocks) == 2
    assert held[0] not in handed and len(handed) == 29
    with pytest.raises(AllocationError, match="exhausted"):
        await survivor.assign(claim_using("vms", "one-too-many"))
    labels = api.ipamclaims[("vm-ns", "vm-a.data")]["metadata"]["labels"]
    assert labels["ipam.cni.networking.x-k8s.io/node"] == "lost"  # nobody relabels
    # one of the lost node's IPAMClaims whose block nobody took again
    orphan = api.ipamclaim("vm-ns", "orphan", ips=["198.18.135.5/24"])
    orphan["metadata"]["labels"]["ipam.cni.networking.x-k8s.io/node"] = "lost"
    orphan["metadata"]["finalizers"].append("cni.dra.networking.x-k8s.io/ipam")
    api.delete_ipamclaim("vm-ns", "vm-a.data")
    api.delete_ipamclaim("vm-ns", "orphan")
    api.claim_status["vm-ns/vm"] = ["198.18.135.5"]  # its pod still runs somewhere
    report = await IPAMReconciler(survivor, set).once()
    assert (report.freed_ipamclaim_addresses, report.released_finalizers) == (1, 0)
    assert ("vm-ns", "vm-a.data") not in api.ipamclaims  # the survivor held its address
    del api.claim_status["vm-ns/vm"]
    assert (await IPAMReconciler(survivor, set).once()).released_finalizers == 1
    assert ("vm-ns", "orphan") not in api.ipamclaims


async def test_an_ipamclaim_bound_here_whose_status_write_failed_is_released_when_deleted(
    api: FakeApiserver, tmp_path: Path
) -> None:
    """The bind is two writes (finalizer and node label, then the status): when the second
    fails the allocation is undone here, and the IPAMClaim keeps this node's finalizer with no
    addresses. Deleted then, it is released by this node's reconciler, not kept forever."""
    api.pool("vms", {**V4, "allowPersistentIPs": True})
    node = node_allocator(api, tmp_path, "a")
    half = api.ipamclaim("vm-ns", "half")
    half["metadata"]["labels"]["ipam.cni.networking.x-k8s.io/node"] = "a"
    half["metadata"]["finalizers"].append("cni.dra.networking.x-k8s.io/ipam")
    api.ipamclaim("vm-ns", "vm-b")  # one this node holds, deleted too
    assert addresses_of(
        await node.assign(claim_using("vms", "p1", namespace="vm-ns", ipam_claim="vm-b"))
    )
    api.delete_ipamclaim("vm-ns", "half")
    api.delete_ipamclaim("vm-ns", "vm-b")
    released = await IPAMReconciler(node, set).release_orphaned_ipamclaims()
    assert released == 1
    assert ("vm-ns", "half") not in api.ipamclaims
    assert ("vm-ns", "vm-b") in api.ipamclaims  # leased here: free_released_ipamclaims


async def test_a_block_created_but_not_recorded_is_recovered_at_start(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "a")
    await node.assign(claim_using("data", "x"))
    (block,) = node.state.blocks.all()
    await node.state.drop_block(block.name)  # as if the driver died before recording it
    restarted = node_allocator(api, tmp_path, "a")
    await restarted.sync_blocks()
    assert [b.name for b in restarted.state.blocks.all()] == [block.name]
    second = addresses_of(await restarted.assign(claim_using("data", "y")))
    assert second != addresses_of(await restarted.assign(claim_using("data", "x")))


async def test_a_down_apiserver_fails_only_what_needs_a_new_block(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "a")
    await node.assign(claim_using("data", "x"))
    room = await room_in_its_block(node)
    api.down = True
    node.pool_ttl = 0  # the cached pool serves while the apiserver is down
    for i in range(room - 1):
        await node.assign(claim_using("data", f"c{i}"))
    with pytest.raises(AllocationError, match="could not be asked for another"):
        await node.assign(claim_using("data", "one-too-many"))
    assert isinstance(node.cluster, FakeCluster)


async def test_the_published_count_moves_with_blocks_not_with_pods(
    api: FakeApiserver, tmp_path: Path
) -> None:
    """What a node publishes as its network device's `addresses` capacity: the scheduler
    counts the claims against it, so a pod taking an address here changes nothing, and
    another node taking a block lowers it once the count is older than its TTL (a resync at
    rest asks the apiserver nothing)."""
    api.pool("small", {"ranges": [{"subnet": "198.18.133.0/28"}], "blockSize": 4})
    a, b = node_allocator(api, tmp_path, "a"), node_allocator(api, tmp_path, "b")
    now = [0.0]
    a.clock = lambda: now[0]
    assert await a.capacity("small") == 14  # .1 to .14
    await a.assign(claim_using("small", "a1"))
    await a.assign(claim_using("small", "a2"))
    assert await a.capacity("small") == 14  # recounted: a took a block
    await b.assign(claim_using("small", "b1"))
    taken_by_b = next(x for x in api.blocks.values() if x.node == "b")
    pool = await b.pool("small")
    in_b = len(list(pool.usable(pool.block(0, int(taken_by_b.name.rsplit(".", 1)[1])))))
    asked = len(api.calls)
    now[0] += a.capacity_ttl - 1
    assert await a.capacity("small") == 14  # kept: no request
    assert len(api.calls) == asked
    now[0] += 2
    assert await a.capacity("small") == 14 - in_b
    assert await a.capacity("missing") is None
    assert await a.capacity("missing") is None
    assert api.calls[-2:] == ["get pool missing"] * 2  # a missing pool is not kept


async def test_a_down_apiserver_fails_a_reconcile_pass_not_the_task(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "a")
    await node.assign(claim_using("data", "x"))
    api.down = True
    task = asyncio.create_task(IPAMReconciler(node, set, grace=0).run(0.01, lost_node_every=1))
    await asyncio.sleep(0.1)
    assert not task.done()  # still passing, every pass failing
    api.down = False
    for _ in range(1500):  # the pass after the outage frees the orphan
        if not node.state.leases:
            break
        await asyncio.sleep(0.02)
    task.cancel()
    assert len(node.state.leases) == 0


async def test_a_claim_being_prepared_keeps_its_address_however_long_it_takes(
    api: FakeApiserver, tmp_path: Path
) -> None:
    """The address is leased before the claim is checkpointed; a prepare that waits on a slow
    apiserver past the grace is still live (the driver counts claims in flight as prepared)."""
    node = node_allocator(api, tmp_path, "a")
    await node.assign(claim_using("data", "slow"))
    in_flight = {"slow"}
    reconciler = IPAMReconciler(node, lambda: in_flight, grace=0)
    assert (await reconciler.once()).freed_claim_addresses == 0
    in_flight.clear()  # it failed and nobody gave the address back
    assert (await reconciler.once()).freed_claim_addresses == 1


async def test_a_pool_name_that_is_no_object_name_is_refused_before_the_apiserver(
    api: FakeApiserver, tmp_path: Path
) -> None:
    """The pool's name comes from a tenant's config and goes into an apiserver URL."""
    node = node_allocator(api, tmp_path, "a")
    with pytest.raises(
        AllocationError, match=r"ipam\.pool: '\.\./\.\./nodes' is not a CNIIPPool name"
    ):
        await node.assign(claim_using("../../nodes", "x"))
    assert api.calls == [] and len(node.state.leases) == 0


async def test_an_ipamclaim_naming_an_address_this_node_gave_to_a_pod_is_refused(
    api: FakeApiserver, tmp_path: Path
) -> None:
    """Whoever could write an IPAMClaim's status must not take a live pod's address with it."""
    api.pool("vms", {**V4, "allowPersistentIPs": True})
    node = node_allocator(api, tmp_path, "a")
    (taken,) = addresses_of(await node.assign(claim_using("vms", "pod", namespace="other")))
    api.ipamclaim("vm-ns", "thief", ips=[taken])
    with pytest.raises(AllocationError, match=f"holds {taken.split('/')[0]}, which this node gave"):
        await node.assign(claim_using("vms", "p", namespace="vm-ns", ipam_claim="thief"))


async def test_pool_usage_is_counted_from_the_nodes_records_for_a_scrape(
    api: FakeApiserver, tmp_path: Path
) -> None:
    from prometheus_client import generate_latest

    from cnidra.observe import metrics

    node = node_allocator(api, tmp_path, "a")
    for i in range(3):
        await node.assign(claim_using("data", f"c{i}"))
    room = await room_in_its_block(node)
    [usage] = node.usage()
    assert (usage.pool, usage.blocks, usage.leased, usage.free) == ("data", 1, 3, room - 3)
    api.calls.clear()
    metrics.POOLS.source = node.usage
    try:
        text = generate_latest(metrics.REGISTRY).decode()
    finally:
        metrics.POOLS.source = lambda: ()
    assert api.calls == []  # a scrape asks the apiserver nothing
    assert 'cnidra_ipam_node_blocks{pool="data"} 1.0' in text
    assert f'cnidra_ipam_node_addresses{{pool="data",state="free"}} {float(room - 3)}' in text
    assert usage.size is not None and usage.pool_blocks is not None
    assert usage.size >= room and usage.pool_blocks >= 1
    assert f'cnidra_ipam_pool_size_addresses{{pool="data"}} {float(usage.size)}' in text
    assert f'cnidra_ipam_pool_blocks{{pool="data"}} {float(usage.pool_blocks)}' in text


@pytest.mark.parametrize("answer", [(403, "forbidden"), (500, "storage is (re)initializing")])
@pytest.mark.parametrize("persistent", [False, True])
async def test_a_call_the_cluster_gives_up_on_fails_the_allocation_and_is_not_asked_again(
    tmp_path: Path, persistent: bool, answer: tuple[int, str]
) -> None:
    """Each apiserver call of a first allocation (the pool GET, the block LIST, the IPAMClaims'
    LIST, the block CREATE, an IPAMClaim's GET and its bind) that fails fails the allocation,
    naming the pool or IPAMClaim and the answer, and leaves nothing leased. The allocator asks
    nothing twice: asking again after a transient answer is the IPAMCluster's (issue 27;
    tests/kube/test_ipam.py), and what it raises is what it gave up on."""
    spec = {**V4, "allowPersistentIPs": True}
    ref = "keep" if persistent else None

    def apiserver() -> FakeApiserver:
        made = FakeApiserver()
        made.pool("data", spec)
        made.ipamclaim("ns", "keep")
        return made

    probe = apiserver()
    await node_allocator(probe, tmp_path / "probe", "a").assign(
        claim_using("data", "p", namespace="ns", ipam_claim=ref)
    )
    kinds = {" ".join(c.split()[:2]) for c in probe.calls}
    assert kinds >= {"get pool", "list blocks", "list ipamclaims", "create block"}, probe.calls
    assert persistent == (kinds >= {"get ipamclaim", "bind ipamclaim"}), probe.calls
    for at, call in enumerate(probe.calls):
        api = apiserver()
        api.failing[at] = answer
        node = node_allocator(api, tmp_path / f"at{at}", "a")
        with pytest.raises(AllocationError) as failed:
            await node.assign(claim_using("data", "p", namespace="ns", ipam_claim=ref))
        assert api.calls == probe.calls[: at + 1], (call, api.calls)  # stopped, not asked again
        message = str(failed.value)
        assert answer[1] in message, (call, message)
        assert "CNIIPPool data" in message or "IPAMClaim ns/keep" in message, (call, message)
        assert list(node.state.owners()) == [], call


async def test_concurrent_claims_lease_distinct_addresses_with_their_fsyncs_shared(
    api: FakeApiserver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's lock is not held while a lease is written: the address is taken (reserved)
    at once, and the leases of a batch's claims go to disk together, each durable before
    its claim's assign returns."""
    import os

    node = node_allocator(api, tmp_path, "node-a")
    await node.assign(claim_using("data", "warm"))  # the block held, the log created
    fsyncs: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        fsyncs.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    claims = [claim_using("data", f"c{i}") for i in range(12)]
    assigned = await asyncio.gather(*(node.assign(c) for c in claims))
    addresses = [a for claim in assigned for a in addresses_of(claim)]
    assert len(set(addresses)) == 12
    assert len(fsyncs) <= 3  # not one per claim
    again = node_allocator(api, tmp_path, "node-a")  # all of them durable
    for claim, got in zip(claims, assigned, strict=True):
        (lease,) = again.state.of_owner(f"claim/{claim.uid}/net")
        assert ipaddress.ip_interface(addresses_of(got)[0]).ip == ipaddress.ip_address(
            lease.address
        )


async def test_a_lease_that_cannot_be_written_is_given_back(
    api: FakeApiserver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    node = node_allocator(api, tmp_path, "node-a")
    first = addresses_of(await node.assign(claim_using("data", "warm")))
    real = os.fsync

    def failing(fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError):
        await node.assign(claim_using("data", "lost"))
    monkeypatch.setattr(os, "fsync", real)
    assert not node.state.of_owner("claim/lost/net")
    # the address it had reserved is free again: the next claim gets it
    again = addresses_of(await node.assign(claim_using("data", "next")))
    assert ipaddress.ip_interface(again[0]).ip == ipaddress.ip_interface(first[0]).ip + 1
