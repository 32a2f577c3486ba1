"""A tenant's static IPAM addresses are leased through the cluster IPAM (issue 39): the one
CNIIPPool whose range holds an address owns it; it is checked as any address cnidra hands out
and leased to the claim's request, so no two holders, in any namespace or on any node, ever get
one address. Against the fake apiserver of tests/ipam/fakes.py."""

from __future__ import annotations

import asyncio
import ipaddress
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra.api.ipam import static_ipam_addresses
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.ipam.allocator import AllocationError, Allocator
from cnidra.state.checkpoint import PreparedClaim
from tests.ipam.fakes import FakeApiserver, addresses_of, claim_using, node_allocator

# blocks of 16: .0/28 holds the gateway, .240/28 is excluded
LAB = {
    "ranges": [{"subnet": "198.18.10.0/24", "gateway": "198.18.10.1"}],
    "exclude": ["198.18.10.240/28"],
    "blockSize": 16,
    "namespaces": ["team-a", "team-b"],
}


def static_claim(
    uid: str,
    *addresses: str,
    namespace: str = "team-a",
    request: str = "net",
    ranges: Sequence[str] | None = None,
    pool: str | None = None,
    cni_args: tuple[tuple[str, str], ...] = (),
) -> PreparedClaim:
    """A prepared claim whose request's network has static IPAM a tenant wrote (and, with
    `pool`, a second plugin with cnidra IPAM from that pool)."""
    ref = ObjectRef(namespace, f"claim-{uid}", uid)
    plugins: list[dict[str, Any]] = [
        {
            "type": "macvlan",
            "ipam": {"type": "static", "addresses": [{"address": a} for a in addresses]},
        }
    ]
    if pool is not None:
        plugins.append({"type": "macvlan", "ipam": {"type": "cnidra", "pool": pool}})
    network = {"cniVersion": "1.0.0", "name": "lab", "plugins": plugins}
    attachment = Attachment(
        ref,
        request,
        "net1",
        network,
        "node",
        "eth1",
        cni_args=cni_args,
        network_label="lab",
        tenant_pool=pool is not None,
        pool_ranges=tuple(ipaddress.ip_network(r) for r in ranges) if ranges else None,
        tenant_static=True,
    )
    return PreparedClaim(ref, (f"pod-{uid}",), (attachment,))


def leases(node: Allocator) -> dict[str, str]:
    return {x.address: x.owner for x in node.state.leases.all()}


@pytest.fixture
def api() -> FakeApiserver:
    server = FakeApiserver()
    server.pool("lab", LAB)
    return server


async def test_a_static_address_is_leased_and_the_network_left_as_written(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "node-a")
    claim = static_claim("a", "198.18.10.7/24")
    assigned = await node.assign(claim)
    assert assigned == claim  # the tenant's static IPAM, unchanged
    assert leases(node) == {"198.18.10.7": "claim/a/net"}
    assert api.blocks["lab.0.0"].node == "node-a"  # its block reserved for this node
    (lease,) = node.state.leases.all()
    assert lease.holder == "claim team-a/claim-a" and lease.block == "lab.0.0"


async def test_two_claims_in_two_namespaces_one_address_the_second_is_refused(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "node-a")
    await node.assign(static_claim("a", "198.18.10.7/24", namespace="team-a"))
    with pytest.raises(
        AllocationError,
        match=r"static address 198\.18\.10\.7/24 is held by claim team-a/claim-a",
    ):
        await node.assign(static_claim("b", "198.18.10.7/24", namespace="team-b"))
    assert leases(node) == {"198.18.10.7": "claim/a/net"}


async def test_two_requests_of_one_claim_never_share_an_address(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "node-a")
    await node.assign(static_claim("a", "198.18.10.7/24", request="one"))
    with pytest.raises(AllocationError, match="held by claim team-a/claim-a"):
        await node.assign(static_claim("a", "198.18.10.7/24", request="two"))


async def test_another_nodes_block_is_refused_naming_the_node(
    api: FakeApiserver, tmp_path: Path
) -> None:
    """node-b cannot know whether node-a gave the address of a block node-a holds."""
    a, b = node_allocator(api, tmp_path, "node-a"), node_allocator(api, tmp_path, "node-b")
    await a.assign(static_claim("a", "198.18.10.7/24"))
    with pytest.raises(
        AllocationError,
        match=r"static address 198\.18\.10\.9 is in block lab\.0\.0 \(198\.18\.10\.0/28\) of "
        r"CNIIPPool lab, which node node-a holds.*run on node node-a, or take an address of a "
        "block no node holds",
    ):
        await b.assign(static_claim("b", "198.18.10.9/24", namespace="team-b"))
    assert leases(b) == {} and not b.state.blocks.all()
    # a block no node holds is node-b's to reserve
    await b.assign(static_claim("c", "198.18.10.20/24", namespace="team-b"))
    assert api.blocks["lab.0.1"].node == "node-b" and leases(b) == {"198.18.10.20": "claim/c/net"}


async def test_the_pool_allocator_skips_a_static_lease(api: FakeApiserver, tmp_path: Path) -> None:
    """A block reserved for a static address is the node's: its other addresses go to pods of
    the pool, never the leased one; and another node's pool allocations never enter it."""
    a, b = node_allocator(api, tmp_path, "node-a"), node_allocator(api, tmp_path, "node-b")
    await a.assign(static_claim("s", "198.18.10.2/24"))  # .1 is the gateway: .2 the first
    pooled = [await a.assign(claim_using("lab", f"p{i}", namespace="team-a")) for i in range(3)]
    got = [addresses_of(c)[0] for c in pooled]
    assert "198.18.10.2/24" not in got and len(set(got)) == 3
    other = await b.assign(claim_using("lab", "q", namespace="team-a"))
    block = (await b.pool("lab")).block_of(ipaddress.ip_interface(addresses_of(other)[0]).ip)
    assert block is not None and block.name != "lab.0.0"


async def test_static_and_cnidra_ipam_in_one_network_get_two_addresses(
    api: FakeApiserver, tmp_path: Path
) -> None:
    """One request, one lease owner: the cnidra-IPAM plugin never gets the static address the
    tenant wrote for the other plugin, on the first prepare or again."""
    node = node_allocator(api, tmp_path, "node-a")
    claim = static_claim("a", "198.18.10.2/24", pool="lab")
    first = await node.assign(claim)
    static, pooled = (p["ipam"] for p in first.devices[0].network["plugins"])
    assert static == {"type": "static", "addresses": [{"address": "198.18.10.2/24"}]}
    assert pooled["type"] == "static" and pooled["addresses"][0]["address"] != "198.18.10.2/24"
    again = await node.assign(claim)
    assert again == first and len(leases(node)) == 2


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("192.0.2.7/24", r"192\.0\.2\.7/24 lies in no CNIIPPool: a tenant's static address must "
         r"lie in a CNIIPPool that serves namespace team-a \(ask the admin for one\), or use "
         r"ipam: \{type: cnidra, pool: NAME\}"),
        ("198.18.10.1/24", "never hands out"),  # the gateway
        ("198.18.10.0/24", "outside the range"),  # the subnet's network address
        ("198.18.10.245/24", "never hands out"),  # excluded
        ("198.18.10.255/24", r"in the subnet of CNIIPPool lab, outside the range"),  # broadcast
        ("198.18.10.7/16", r"prefix length 16, but CNIIPPool lab's subnet 198\.18\.10\.0/24 "
         "has 24"),
        ("198.18.10.7/32", "prefix length 32"),
        ("not-an-address", "not an address in CIDR notation"),
    ],
)  # fmt: skip
async def test_an_address_the_pool_would_not_hand_out_is_refused(
    api: FakeApiserver, tmp_path: Path, address: str, why: str
) -> None:
    node = node_allocator(api, tmp_path, "node-a")
    with pytest.raises(AllocationError, match=why):
        await node.assign(static_claim("a", address))
    assert leases(node) == {} and not api.blocks


@pytest.mark.parametrize(
    ("spec", "ranges", "why"),
    [
        ({**LAB, "namespaces": ["team-b"]}, None, "does not serve namespace team-a"),
        (
            {k: v for k, v in LAB.items() if k != "namespaces"},
            None,
            "serves only admins' networks",
        ),
        (LAB, ["198.18.10.0/25"], r"range 198\.18\.10\.0/24 is outside the ranges this "
         r"DeviceClass allows claims: 198\.18\.10\.0/25"),
    ],
)  # fmt: skip
async def test_a_pool_that_does_not_serve_the_tenant_is_refused(
    tmp_path: Path, spec: dict[str, Any], ranges: list[str] | None, why: str
) -> None:
    api = FakeApiserver()
    api.pool("lab", spec)
    node = node_allocator(api, tmp_path, "node-a")
    with pytest.raises(AllocationError, match=why) as refused:
        await node.assign(static_claim("a", "198.18.10.7/24", ranges=ranges))
    assert "must lie in a CNIIPPool that serves namespace team-a" in str(refused.value)
    assert leases(node) == {}


async def test_overlapping_pools_are_refused_naming_both(tmp_path: Path) -> None:
    api = FakeApiserver()
    api.pool("lab", LAB)
    api.pool("lab-too", {**LAB, "ranges": [{"subnet": "198.18.10.0/25"}]})
    node = node_allocator(api, tmp_path, "node-a")
    with pytest.raises(AllocationError, match="CNIIPPools lab and lab-too, which overlap"):
        await node.assign(static_claim("a", "198.18.10.7/24"))
    # one pool's range only: that pool owns it
    await node.assign(static_claim("b", "198.18.10.200/24"))
    assert leases(node) == {"198.18.10.200": "claim/b/net"}


async def test_prepared_again_it_keeps_its_lease_and_asks_nothing_twice(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "node-a")
    claim = static_claim("a", "198.18.10.7/24", "198.18.10.8/24")
    await node.assign(claim)
    before = node.state.leases.all()
    api.calls.clear()
    assert await node.assign(claim) == claim
    assert node.state.leases.all() == before and api.calls == []  # pools cached, block held


async def test_the_pools_are_listed_once_within_the_pool_ttl(
    api: FakeApiserver, tmp_path: Path
) -> None:
    now = [0.0]
    node = node_allocator(api, tmp_path, "node-a")
    node.clock = lambda: now[0]
    await node.assign(static_claim("a", "198.18.10.7/24"))
    await node.assign(static_claim("b", "198.18.10.8/24"))
    assert api.calls.count("list pools") == 1
    now[0] = node.pool_ttl + 1
    api.down = True  # the list as last read while the apiserver cannot answer
    await node.assign(static_claim("c", "198.18.10.9/24"))
    assert api.calls.count("list pools") == 2


async def test_pools_that_cannot_be_listed_refuse_the_address(
    api: FakeApiserver, tmp_path: Path
) -> None:
    api.down = True
    node = node_allocator(api, tmp_path, "node-a")
    with pytest.raises(AllocationError, match="the CNIIPPools could not be listed"):
        await node.assign(static_claim("a", "198.18.10.7/24"))


async def test_unprepare_frees_it_and_then_another_claim_gets_it(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "node-a")
    await node.assign(static_claim("a", "198.18.10.7/24"))
    assert await node.release_claim("a") == 1
    await node.assign(static_claim("b", "198.18.10.7/24", namespace="team-b"))
    assert leases(node) == {"198.18.10.7": "claim/b/net"}


async def test_a_refusal_leaves_no_lease_behind(api: FakeApiserver, tmp_path: Path) -> None:
    """Two addresses, the second refused: the first is given back; what the claim held before
    (a prepare that went through) stays."""
    node = node_allocator(api, tmp_path, "node-a")
    await node.assign(static_claim("x", "198.18.10.9/24"))
    with pytest.raises(AllocationError):
        await node.assign(static_claim("a", "198.18.10.7/24", "198.18.10.9/24"))
    assert leases(node) == {"198.18.10.9": "claim/x/net"}
    held = static_claim("b", "198.18.10.20/24", request="one")
    await node.assign(held)
    with pytest.raises(AllocationError, match="never hands out"):
        await node.assign(static_claim("b", "198.18.10.21/24", "198.18.10.1/24", request="two"))
    assert leases(node) == {"198.18.10.9": "claim/x/net", "198.18.10.20": "claim/b/one"}


async def test_an_ipamclaim_never_gets_a_tenants_static_address(tmp_path: Path) -> None:
    api = FakeApiserver()
    api.pool("lab", {**LAB, "allowPersistentIPs": True})
    node = node_allocator(api, tmp_path, "node-a")
    await node.assign(static_claim("a", "198.18.10.7/24"))
    api.ipamclaim("team-a", "vm", ips=["198.18.10.7/24"])
    with pytest.raises(AllocationError, match="which this node gave to claim team-a/claim-a"):
        await node.assign(claim_using("lab", "vm-pod", namespace="team-a", ipam_claim="vm"))


async def test_claims_preparing_at_once_never_share_an_address(
    api: FakeApiserver, tmp_path: Path
) -> None:
    api.latency = 0.001  # the prepares interleave at every apiserver call
    node = node_allocator(api, tmp_path, "node-a")
    claims = [static_claim(f"c{i}", "198.18.10.7/24") for i in range(8)]
    results = await asyncio.gather(*(node.assign(c) for c in claims), return_exceptions=True)
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, AllocationError) for r in results if isinstance(r, BaseException))
    assert len(leases(node)) == 1


def test_every_address_the_static_plugin_could_read_is_counted() -> None:
    network = {
        "plugins": [
            {
                "type": "macvlan",
                "capabilities": {"ips": True},
                "args": {"cni": {"ips": ["198.18.10.3/24"]}},
                "ipam": {"type": "static", "addresses": [{"address": "198.18.10.2/24"}]},
            },
            {"type": "tuning", "ipam": {"type": "cnidra", "pool": "lab"}},
        ]
    }
    got = static_ipam_addresses(
        network,
        (("IP", "198.18.10.9/24"), ("IP", "198.18.10.4/24, 198.18.10.5/24"), ("X", "y")),
        {"ips": ["198.18.10.6/24"]},
    )
    assert got == [
        "198.18.10.2/24",
        "198.18.10.3/24",
        "198.18.10.6/24",
        "198.18.10.4/24",  # the last IP of CNI_ARGS, as Go's LoadArgs reads it
        "198.18.10.5/24",
    ]
    plain = {"plugins": [{"type": "static-less", "ipam": {"type": "static"}}]}
    assert static_ipam_addresses(plain, (), {"ips": ["198.18.10.6/24"]}) == []  # no capability


async def test_an_address_a_tenant_passed_in_cni_args_is_leased(
    api: FakeApiserver, tmp_path: Path
) -> None:
    node = node_allocator(api, tmp_path, "node-a")
    await node.assign(static_claim("a", "198.18.10.7/24"))
    with pytest.raises(AllocationError, match="held by claim team-a/claim-a"):
        await node.assign(static_claim("b", cni_args=(("IP", "198.18.10.7/24"),)))


# ------------------------------------------------------------------ any sequence

ADDRESSES = [f"198.18.20.{i}/28" for i in range(16)] + ["198.18.21.5/28"]
SMALL = {
    "ranges": [{"subnet": "198.18.20.0/28", "gateway": "198.18.20.1"}],
    "blockSize": 4,
    "namespaces": ["team-a", "team-b"],
}
Step = tuple[str, int, int]  # (prepare | unprepare | pool, claim, node)


@settings(max_examples=60, deadline=None)
@given(
    wanted=st.lists(st.sampled_from(ADDRESSES), min_size=6, max_size=6),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["prepare", "unprepare", "pool"]),
            st.integers(0, 5),
            st.integers(0, 1),
        ),
        max_size=25,
    ),
)
def test_no_sequence_of_static_requests_yields_two_live_holders(
    wanted: list[str], steps: list[Step]
) -> None:
    """Claims with static addresses and claims of the pool, prepared and unprepared in any
    order on two nodes: every address a prepare gave is leased on its node, in a block the
    node holds, and no two live claims (across namespaces and nodes) hold one address."""
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(_run(Path(root), wanted, steps))


async def _run(root: Path, wanted: list[str], steps: list[Step]) -> None:
    api = FakeApiserver()
    api.pool("small", SMALL)
    nodes = [node_allocator(api, root, "node-a"), node_allocator(api, root, "node-b")]
    live: dict[str, tuple[int, str]] = {}  # claim uid -> (node, address it was given)
    pooled = 0
    for kind, index, n in steps:
        node = nodes[n]
        if kind == "pool":
            uid = f"pool-{pooled}"
            pooled += 1
            try:
                got = await node.assign(claim_using("small", uid, namespace="team-a"))
            except AllocationError:
                await node.release_claim(uid)
                continue
            live[uid] = (n, str(ipaddress.ip_interface(addresses_of(got)[0]).ip))
            continue
        uid = f"static-{index}"
        at = index % 2  # a claim is allocated to one node
        if kind == "unprepare":
            await nodes[at].release_claim(uid)
            live.pop(uid, None)
            continue
        namespace = "team-a" if index < 3 else "team-b"
        try:
            await nodes[at].assign(static_claim(uid, wanted[index], namespace=namespace))
        except AllocationError:
            assert uid not in live  # a claim prepared before is prepared again
            assert not nodes[at].state.of_owner(f"claim/{uid}/net")
            continue
        live[uid] = (at, str(ipaddress.ip_interface(wanted[index]).ip))
        assert all(a.owner != f"claim/{uid}/net" for a in nodes[1 - at].state.leases.all())
    holders = [address for _, address in live.values()]
    assert len(holders) == len(set(holders)), live
    for uid, (n, address) in live.items():
        lease = nodes[n].state.at("small", address)
        assert lease is not None and lease.owner == f"claim/{uid}/net"
        assert api.blocks[lease.block].node == nodes[n].node
    on_nodes = [x.address for node in nodes for x in node.state.leases.all()]
    assert len(on_nodes) == len(set(on_nodes))


async def test_the_pool_never_hands_out_an_address_the_node_holds(
    api: FakeApiserver, tmp_path: Path
) -> None:
    """A pool whose range holds the node's own address (a storage network's, not excluded):
    the node skips it, so no pod is given the node's address and takes its traffic."""
    node = node_allocator(api, tmp_path, "node-a")
    first = addresses_of(await node.assign(claim_using("lab", "p0", namespace="team-a")))[0]
    base = ipaddress.ip_interface(first).ip
    held = frozenset({base + 1, base + 2})  # the next two in the node's block: the node's
    node.node_addresses = lambda: held
    got = [
        addresses_of(await node.assign(claim_using("lab", f"p{i}", namespace="team-a")))[0]
        for i in range(1, 4)
    ]
    assert got == [f"{base + i}/24" for i in (3, 4, 5)]
