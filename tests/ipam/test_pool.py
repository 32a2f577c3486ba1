"""Pools and blocks, the pure part: blocks cut a range into disjoint parts that together hold
exactly the addresses pods may get; bad pools are refused naming the field."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra.api.ipam import Pool, PoolError, pool_from_object, with_static_ipam


def pool(spec: dict[str, object], name: str = "data") -> Pool:
    return pool_from_object({"metadata": {"name": name}, "spec": spec})


@st.composite
def ipv4_pools(draw: st.DrawFn) -> Pool:
    prefix = draw(st.integers(22, 30))
    base = int(ipaddress.IPv4Address("198.18.0.0")) + draw(st.integers(0, 255)) * 1024
    subnet = ipaddress.IPv4Network((base, prefix), strict=False)
    hosts = list(range(int(subnet.network_address), int(subnet.broadcast_address) + 1))
    start = draw(st.sampled_from(hosts[1:-1] or hosts))
    end = draw(st.sampled_from([h for h in hosts if h >= start][:-1] or [start]))
    gateway = draw(st.none() | st.sampled_from(hosts[1:-1] or hosts))
    exclude = draw(
        st.lists(st.sampled_from(hosts).map(lambda h: f"{ipaddress.IPv4Address(h)}/32"), max_size=3)
    )
    block = 2 ** draw(st.integers(0, min(5, 32 - prefix)))
    spec: dict[str, object] = {
        "ranges": [
            {
                "subnet": str(subnet),
                "rangeStart": str(ipaddress.IPv4Address(start)),
                "rangeEnd": str(ipaddress.IPv4Address(end)),
                **({"gateway": str(ipaddress.IPv4Address(gateway))} if gateway else {}),
            }
        ],
        "exclude": exclude,
        "blockSize": block,
    }
    return pool(spec)


@settings(max_examples=200, deadline=None)
@given(ipv4_pools())
def test_blocks_partition_exactly_the_addresses_pods_may_get(p: Pool) -> None:
    r = p.spec.ranges[0]
    expected = {
        ipaddress.IPv4Address(v)
        for v in range(int(r.first), int(r.last) + 1)
        if ipaddress.IPv4Address(v) != r.gateway
        and not any(ipaddress.IPv4Address(v) in n for n in p.spec.exclude)
    }
    seen: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for index in p.block_indices(0):
        block = p.block(0, index)
        usable = list(p.usable(block))
        assert all(a in block.cidr for a in usable)
        assert all(p.block_of(a) == block for a in usable)
        seen += usable
    assert len(seen) == len(set(seen))
    assert set(seen) == expected
    assert p.range_capacity(0) == len(expected)


def test_ipv6_ranges_are_counted_not_walked() -> None:
    p = pool({"ranges": [{"subnet": "2001:db8:1::/64"}], "blockSize": 256})
    assert p.range_capacity(0) == 2**64 - 1
    assert len(p.block_indices(0)) == 2**56
    assert str(p.block(0, 3).cidr) == "2001:db8:1::300/120"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"ranges": []}, "spec.ranges: List should have at least 1 item"),
        (
            {"ranges": [{"subnet": "198.18.0.0/24", "gateway": "198.18.1.1"}]},
            "spec.ranges[0]: gateway 198.18.1.1 is not in subnet 198.18.0.0/24",
        ),
        (
            {"ranges": [{"subnet": "198.18.0.0/24"}, {"subnet": "198.18.1.0/24"}]},
            "at most one range per address family",
        ),
        ({"ranges": [{"subnet": "198.18.0.0/24"}], "blockSize": 12}, "12 is not a power of two"),
        (
            {"ranges": [{"subnet": "198.18.0.0/30"}], "blockSize": 8},
            "8 addresses do not fit in subnet 198.18.0.0/30",
        ),
        ({"ranges": [{"subnet": "198.18.0.0/24"}], "ipMasq": True}, "spec.ipMasq: Extra inputs"),
    ],
)
def test_a_bad_pool_is_refused_naming_the_field(spec: dict[str, object], message: str) -> None:
    with pytest.raises(PoolError, match="CNIIPPool data is invalid") as caught:
        pool(spec)
    assert message in str(caught.value)


def test_the_plugin_gets_static_ipam_with_the_pools_gateway_and_routes() -> None:
    p = pool(
        {
            "ranges": [
                {"subnet": "198.18.130.0/24", "gateway": "198.18.130.1"},
                {"subnet": "2001:db8:130::/64"},
            ],
            "routes": [{"dst": "198.51.100.0/24", "gw": "198.18.130.1"}],
        }
    )
    conflist = {
        "name": "data",
        "plugins": [
            {"type": "macvlan", "ipam": {"type": "cnidra", "pool": "data", "dns": {"domain": "x"}}},
            {"type": "tuning"},
        ],
    }
    out = with_static_ipam(
        conflist,
        p,
        [ipaddress.ip_address("198.18.130.9"), ipaddress.ip_address("2001:db8:130::9")],
    )
    assert out["plugins"][0]["ipam"] == {
        "type": "static",
        "dns": {"domain": "x"},
        "addresses": [
            {"address": "198.18.130.9/24", "gateway": "198.18.130.1"},
            {"address": "2001:db8:130::9/64"},
        ],
        "routes": [{"dst": "198.51.100.0/24", "gw": "198.18.130.1"}],
    }
    assert out["plugins"][1] == {"type": "tuning"}


def test_a_network_asks_one_pool_and_an_ipamclaim_needs_cnidra_ipam() -> None:
    from cnidra.api.issues import FieldPath, Issues
    from cnidra.api.validate import parse_parameters
    from tests.api.helpers import conflist, params

    pooled = {"type": "macvlan", "ipam": {"type": "cnidra", "pool": "data"}}
    issues = Issues()
    assert parse_parameters(params(conflist(pooled)), FieldPath(), issues, complete=True)
    assert not issues.items
    twice = params(conflist(pooled, {"type": "tuning", "ipam": {"type": "cnidra", "pool": "b"}}))
    issues = Issues()
    assert parse_parameters(twice, FieldPath(), issues, complete=True) is None
    assert "2 plugins ask for cnidra IPAM" in issues.errors[0].message
    ignored = params(
        conflist({"type": "macvlan", "ipam": {"type": "host-local", "subnet": "198.18.0.0/24"}}),
        ipamClaimReference="vm-a.data",
    )
    issues = Issues()
    assert parse_parameters(ignored, FieldPath(), issues, complete=True)
    assert [str(w.path) for w in issues.warnings] == ["ipamClaimReference"]
    bad_pool = params(conflist({"type": "macvlan", "ipam": {"type": "cnidra", "pool": "Not/A"}}))
    issues = Issues()
    parse_parameters(bad_pool, FieldPath(), issues, complete=True)
    assert any("pool" in str(i.path) for i in issues.items), issues.items


def test_only_the_networks_dns_and_routes_reach_the_static_plugin() -> None:
    p = pool({"ranges": [{"subnet": "198.18.130.0/24"}]})
    conflist = {
        "name": "data",
        "plugins": [
            {
                "type": "macvlan",
                "ipam": {
                    "type": "cnidra",
                    "pool": "data",
                    "addresses": [{"address": "192.0.2.9/24"}],
                    "dataDir": "/etc",
                    "routes": [{"dst": "198.51.100.0/24"}],
                },
            }
        ],
    }
    ipam = with_static_ipam(conflist, p, [ipaddress.ip_address("198.18.130.9")])["plugins"][0][
        "ipam"
    ]
    assert ipam == {
        "type": "static",
        "addresses": [{"address": "198.18.130.9/24"}],
        "routes": [{"dst": "198.51.100.0/24"}],
    }


def test_usable_texts_at_is_usable_texts_of_the_block() -> None:
    """The allocation's look at a held block's addresses, kept or not, is the block's own."""
    from cnidra.api.ipam import PoolSpec

    spec = PoolSpec.model_validate(
        {
            "ranges": [
                {"subnet": "10.1.0.0/24", "gateway": "10.1.0.1", "rangeStart": "10.1.0.5"},
                {"subnet": "fd00::/120"},
            ],
            "blockSize": 16,
            "exclude": ["10.1.0.16/30"],
        }
    )
    for fresh in (True, False):
        pool = Pool("p", spec)
        for range_index in (0, 1):
            for index in pool.block_indices(range_index):
                block = pool.block(range_index, index)
                expected = tuple((a, str(a)) for a in pool.usable(block))
                if fresh:  # first asked by indexes, then by the block: one answer
                    assert pool.usable_texts_at(range_index, index) == expected
                    assert pool.usable_texts(block) == expected
                else:
                    assert pool.usable_texts(block) == expected
                    assert pool.usable_texts_at(range_index, index) == expected


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**128 - 1))
def test_interface_text_is_the_interface_written(v4: int, v6: int) -> None:
    """The text static IPAM gets for an address is `str(pool.interface(address))`, for every
    address of either family, and the same refusal for one in no range."""
    from cnidra.api.ipam import PoolSpec

    spec = PoolSpec.model_validate(
        {"ranges": [{"subnet": "10.128.0.0/9"}, {"subnet": "fd00:0:0:1::/64"}]}
    )
    pool = Pool("p", spec)
    for address in (
        ipaddress.IPv4Address(v4),
        ipaddress.IPv6Address(v6),
        ipaddress.IPv4Address("10.128.0.1"),
        ipaddress.IPv6Address("fd00:0:0:1::1"),
        ipaddress.IPv6Address("fd00:0:0:1:ffff:0:0:0"),
        ipaddress.IPv6Address("fd00:0:0:1:0:ffff:a00:1"),
    ):
        try:
            expected = str(pool.interface(address))
        except ValueError as exc:
            with pytest.raises(ValueError, match="in no range") as caught:
                pool.interface_text(address)
            assert str(caught.value) == str(exc)
            continue
        assert pool.interface_text(address) == expected
