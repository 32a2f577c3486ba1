"""The pure half of cnidra.datapath.shaping, without root: what the read-back makes of the
kernel's qdiscs and classes (what node describe and the metrics will show), the IFB's name, and
the checks made before anything is touched."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cnidra.api.bandwidth import Rate
from cnidra.datapath import shaping
from cnidra.datapath.shaping import (
    LIMIT_CLASS,
    ROOT_HANDLE,
    TC_H_ROOT,
    Direction,
    TcEntry,
    direction,
    entry_of,
)

CEILING = ROOT_HANDLE | 1


def tree(rate: int = 2_500_000, ceil: int = 10_000_000, **counters: int) -> list[TcEntry]:
    """cnidra's tree as the kernel dumps it: rates in bytes per second."""
    return [
        TcEntry("htb", ROOT_HANDLE, TC_H_ROOT),
        TcEntry("pfifo", 0xCD20000, LIMIT_CLASS),
        TcEntry("htb", CEILING, TC_H_ROOT, is_class=True, options={"rate": ceil, "ceil": ceil}),
        TcEntry(
            "htb",
            LIMIT_CLASS,
            CEILING,
            is_class=True,
            options={"rate": rate, "ceil": ceil},
            **counters,
        ),
    ]


def test_the_limit_and_its_counters_are_the_limited_class() -> None:
    found = direction(
        tree(
            sent_bytes=1500,
            sent_packets=1,
            drops=2,
            overlimits=3,
            backlog_bytes=4,
            queued_packets=5,
        )
    )
    assert found == Direction(20_000_000, 80_000_000, 1500, 1, 2, 3, 4, 5)
    assert found.limit == Rate(20_000_000, 80_000_000)


def test_rates_above_32_bits_come_from_the_64_bit_attributes() -> None:
    # 100 Gbit/s: 12.5e9 bytes/s, past the 32-bit field (entry_of takes RATE64 over it)
    found = direction(tree(rate=12_500_000_000, ceil=12_500_000_000))
    assert found is not None and found.rate == found.ceil == 100 * 10**9


@pytest.mark.parametrize(
    "entries",
    [
        [],  # nothing: the default qdisc
        [TcEntry("noqueue", 0, TC_H_ROOT)],
        [TcEntry("htb", 0x10000, TC_H_ROOT)],  # another's HTB (handle 1:)
        [TcEntry("tbf", ROOT_HANDLE, TC_H_ROOT)],  # our handle, not our kind
        tree()[:2],  # our root without its limited class
    ],
)
def test_what_is_not_cnidras_tree_reads_as_no_limit(entries: list[TcEntry]) -> None:
    assert direction(entries) is None


def test_a_ceiling_below_the_rate_reads_as_the_rate() -> None:
    found = direction(tree(rate=2_500_000, ceil=1_000_000))
    assert found is not None and found.ceil == found.rate == 20_000_000


class Attrs(dict[str, Any]):
    """A netlink message or attribute as pyroute2 decodes it: fields by key, attributes by
    get_attr."""

    def __init__(self, fields: dict[str, Any] | None = None, **attrs: Any) -> None:
        super().__init__(fields or {})
        self.attrs = attrs

    def get_attr(self, name: str) -> Any:
        return self.attrs.get(name)


def htb_class(handle: int, parent: int, rate: int, ceil: int, rate64: int = 0) -> Attrs:
    options = Attrs(TCA_HTB_PARMS=Attrs({"rate": rate, "ceil": ceil}))
    if rate64:
        options.attrs["TCA_HTB_RATE64"] = rate64
        options.attrs["TCA_HTB_CEIL64"] = rate64
    stats = Attrs(
        TCA_STATS_BASIC=Attrs({"bytes": 3000, "packets": 2}),
        TCA_STATS_QUEUE=Attrs(
            {"qlen": 1, "backlog": 1514, "drops": 7, "requeues": 0, "overlimits": 9}
        ),
    )
    return Attrs(
        {"handle": handle, "parent": parent, "index": 3},
        TCA_KIND="htb",
        TCA_OPTIONS=options,
        TCA_STATS2=stats,
    )


def test_a_pyroute2_class_message_becomes_an_entry() -> None:
    entry = entry_of(htb_class(LIMIT_CLASS, CEILING, 2_500_000, 10_000_000), is_class=True)
    assert entry == TcEntry(
        "htb",
        LIMIT_CLASS,
        CEILING,
        is_class=True,
        options={"rate": 2_500_000, "ceil": 10_000_000},
        sent_bytes=3000,
        sent_packets=2,
        drops=7,
        overlimits=9,
        backlog_bytes=1514,
        queued_packets=1,
    )
    fast = entry_of(htb_class(LIMIT_CLASS, CEILING, 2**32 - 1, 2**32 - 1, 12_500_000_000), True)
    assert fast.options == {"rate": 12_500_000_000, "ceil": 12_500_000_000}


def test_a_message_without_options_or_stats_is_an_empty_entry() -> None:
    bare = Attrs({"handle": 0, "parent": TC_H_ROOT}, TCA_KIND="noqueue")
    assert entry_of(bare) == TcEntry("noqueue", 0, TC_H_ROOT)
    ingress = Attrs({"handle": 0xFFFF0000, "parent": 0xFFFFFFF1}, TCA_KIND="ingress")
    ingress.attrs["TCA_OPTIONS"] = 786437  # what pyroute2 decodes the ingress qdisc's as
    assert entry_of(ingress).options == {}


NAMES = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_."), min_size=1, max_size=15
).filter(lambda n: n != "lo" and not n.startswith(shaping.IFB_PREFIX))


@given(NAMES, NAMES)
def test_each_interface_has_an_ifb_name_of_its_own(a: str, b: str) -> None:
    name = shaping.ifb_name(a)
    assert len(name.encode()) <= 15 and name.startswith(shaping.IFB_PREFIX)
    assert name == shaping.ifb_name(a)
    assert (name == shaping.ifb_name(b)) == (a == b)  # 36 bits of a hash: no collision here
    assert shaping.check_interface(a) == a


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "interface must be a non-empty name"),
        (None, "interface must be a non-empty name"),
        ("a" * 16, "at most 15 bytes, no '/' or spaces"),
        ("a/b", "at most 15 bytes"),
        (" net1", "at most 15 bytes"),
        ("lo", "'lo' is the namespace's loopback"),
        (shaping.ifb_name("net1"), "is cnidra's IFB; shape the interface it serves"),
    ],
)
def test_a_name_that_cannot_be_shaped(name: Any, message: str) -> None:
    with pytest.raises(shaping.InvalidRequest) as caught:
        shaping.check_interface(name)
    assert message in str(caught.value)


@pytest.mark.parametrize("timeout", [0, -1, "5", None, True, float("nan")])
def test_a_timeout_must_be_seconds_above_zero(timeout: Any) -> None:
    with pytest.raises(shaping.InvalidRequest, match="timeout must be a number of seconds"):
        shaping.check_timeout(timeout)


@given(st.integers(8, 10**14))
def test_queue_and_burst_grow_with_the_rate_within_bounds(bps: int) -> None:
    packets = shaping.queue_packets(bps)
    assert shaping.QUEUE_MIN_PACKETS <= packets <= shaping.QUEUE_MAX_PACKETS
    assert packets <= shaping.queue_packets(bps * 2)
    assert shaping.burst_bytes(bps) >= shaping.BURST_FLOOR_BYTES
    assert shaping.burst_bytes(bps) >= bps / 8 / 1000  # a millisecond of the rate
