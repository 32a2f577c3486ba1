"""The bandwidth a claim reserved as the rate cnidra enforces (cnidra.api.bandwidth): Kubernetes
quantities parsed exactly, the CNIPolicy's `bandwidth` validated with messages that say what is
allowed, and `enforced_rate`'s decision."""

from __future__ import annotations

import copy
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra.api.bandwidth import (
    DEFAULT_RULES,
    LEFTOVER,
    MAX_RATE_BPS,
    MIN_RATE_BPS,
    SHARE_FLOOR_BPS,
    BandwidthRules,
    QuantityError,
    Rate,
    Terms,
    enforced_rate,
    format_rate,
    granted_bps,
    leftover_share,
    parse_quantity,
    rate_bps,
)
from cnidra.api.constants import API_VERSION, DRIVER_NAME
from cnidra.api.issues import FieldPath, Issues
from cnidra.api.policy import class_bandwidth, parse_policy
from cnidra.api.validate import validate_documents
from tests.api.test_policy import DEFAULT_CLASSES, MACVLAN, claim, network

DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
SUFFIXES = {**DECIMAL, **BINARY}

# ------------------------------------------------------------------ quantities


@given(st.integers(0, 10**6), st.sampled_from(sorted(SUFFIXES)), st.sampled_from(["", "+"]))
def test_a_whole_number_with_a_suffix_is_that_many_units(n: int, suffix: str, sign: str) -> None:
    assert parse_quantity(f"{sign}{n}{suffix}") == n * SUFFIXES[suffix]
    assert parse_quantity(f"-{n}{suffix}") == -n * SUFFIXES[suffix]


@given(
    st.integers(0, 10**9),
    st.integers(0, 999),
    st.sampled_from(["", "k", "M", "G", "Ki", "Mi", "m"]),
)
def test_decimals_are_exact(whole: int, fraction: int, suffix: str) -> None:
    multiplier = Decimal(SUFFIXES.get(suffix, 1)) if suffix != "m" else Decimal("0.001")
    expected = (Decimal(whole) + Decimal(fraction) / 1000) * multiplier
    assert parse_quantity(f"{whole}.{fraction:03d}{suffix}") == expected


@given(st.integers(0, 10**6), st.integers(-12, 12), st.sampled_from(["e", "E"]))
def test_an_exponent_scales_by_ten(n: int, exponent: int, letter: str) -> None:
    assert parse_quantity(f"{n}{letter}{exponent}") == Decimal(n).scaleb(exponent)


@pytest.mark.parametrize(
    ("text", "value"),
    [("1.5Gi", 1610612736), ("100m", Decimal("0.1")), ("2e3", 2000), ("1k", 1000),
     ("-1Mi", -1048576), ("+10M", 10_000_000), ("0.5", Decimal("0.5")), ("1E-2", Decimal("0.01"))],
)  # fmt: skip
def test_the_same_number_as_kubernetes_reads(text: str, value: Decimal | int) -> None:
    """Values as apimachinery's resource.Quantity reads them (its suffixes and exponents)."""
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize(
    "text",
    ["", "G", "1 G", "1g", "1Gb", "1Gi ", "1.2.3", "1e", "1e+", "--1", "0x10", "1Kb", "∞", "1ZB"],
)
def test_what_is_no_quantity_is_refused_by_name(text: str) -> None:
    with pytest.raises(QuantityError, match="is not a quantity: a number with an optional suffix"):
        parse_quantity(text)


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=12), st.floats(), st.none(), st.booleans(), st.lists(st.none())))
def test_any_input_parses_or_is_a_quantity_error(value: Any) -> None:
    try:
        parse_quantity(value)
    except QuantityError as exc:
        assert repr(value)[:20] in str(exc) or "exponent" in str(exc)


# ------------------------------------------------------------------ rates


@given(st.integers(1, MAX_RATE_BPS))
def test_a_rate_is_whole_bytes_rounded_up(bits: int) -> None:
    rate = rate_bps(bits)
    assert rate % 8 == 0 and bits <= rate < bits + 8 and rate >= MIN_RATE_BPS


@given(st.integers(1, MAX_RATE_BPS // 8).map(lambda b: b * 8))
def test_a_formatted_rate_reads_back_the_same(bits: int) -> None:
    assert rate_bps(format_rate(bits)) == bits


def test_formatting_picks_the_largest_exact_suffix() -> None:
    assert [format_rate(b) for b in (20_000_000, 1_000_000_000, 1_500_000, 1_000, 8)] == [
        "20M",
        "1G",
        "1500k",
        "1k",
        "8",
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be above 0 (bits per second, e.g. 100M or 1G), got 0"),
        ("-1G", "must be above 0 (bits per second, e.g. 100M or 1G), got '-1G'"),
        ("0.0", "must be above 0"),
        ("101T", "must be at most 100T (bits per second), got '101T'"),
        ("fast", "'fast' is not a quantity"),
        ("1e99", "exponent 99 is out of range"),
    ],
)
def test_a_rate_outside_what_is_enforced_says_what_is_allowed(value: Any, message: str) -> None:
    with pytest.raises(QuantityError, match=r"^the rate") as caught:
        rate_bps(value, "the rate")
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("rate", "ceil", "message"),
    [
        (0, 0, "rate must be 8 (a byte a second) to 100T bits per second, got 0"),
        (-8, 8, "rate must be 8 (a byte a second) to 100T bits per second, got -8"),
        (12, 16, "rate must be whole bytes per second, got 12 bit/s"),
        (16, 8, "ceil (8) must not be below rate (16)"),
        (True, 8, "rate must be an integer number of bits per second"),
    ],
)
def test_a_rate_that_cannot_be_enforced_is_not_made(rate: Any, ceil: Any, message: str) -> None:
    with pytest.raises(QuantityError) as caught:
        Rate(rate, ceil)
    assert str(caught.value) == message


def test_a_rate_says_itself() -> None:
    assert str(Rate(20_000_000, 20_000_000)) == "20Mbit/s"
    assert str(Rate(20_000_000, 10**9)) == "20Mbit/s (bursts to 1Gbit/s)"


# ------------------------------------------------------------------ the policy


def policy_issues(bandwidth: Any) -> list[str]:
    issues = Issues()
    parse_policy(
        {
            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
            "kind": "CNIPolicy",
            "bandwidth": bandwidth,
        },
        FieldPath(("policy",)),
        issues,
    )
    return [f"{i.path}: {i.message}" for i in issues.errors]


@pytest.mark.parametrize(
    "bandwidth",
    [
        {},
        {"whenUnreserved": "Unlimited"},
        {"whenUnreserved": "100M", "burst": "Allowed"},
        {"whenUnreserved": 1_000_000, "burst": "Denied"},
        {"burst": "Allowed", "burstCeiling": "10G"},
        {"whenUnreserved": "1G", "burst": "Allowed", "burstCeiling": "1G"},
    ],
)
def test_valid_bandwidth_rules(bandwidth: dict[str, Any]) -> None:
    assert policy_issues(bandwidth) == []


@pytest.mark.parametrize(
    ("bandwidth", "message"),
    [
        (
            {"whenUnreserved": "fast"},
            "policy.bandwidth.whenUnreserved: whenUnreserved: 'fast' is not a quantity: a number "
            "with an optional suffix (k, M, G, T, Ki, Mi, Gi, e6, ...); or 'Leftover' or "
            "'Unlimited'",
        ),
        (
            {"whenUnreserved": "0"},
            "policy.bandwidth.whenUnreserved: whenUnreserved must be above 0 (bits per second, "
            "e.g. 100M or 1G), got '0'; or 'Leftover' or 'Unlimited'",
        ),
        (
            {"whenUnreserved": "unlimited"},
            "policy.bandwidth.whenUnreserved: whenUnreserved: 'unlimited' is not a quantity",
        ),
        ({"burst": "Sometimes"}, "policy.bandwidth.burst: Input should be 'Allowed' or 'Denied'"),
        (
            {"burstCeiling": "10G"},
            "policy.bandwidth: burstCeiling needs burst: Allowed (with Denied nothing bursts)",
        ),
        (
            {"burst": "Allowed", "burstCeiling": "-1"},
            "policy.bandwidth.burstCeiling: burstCeiling must be above 0",
        ),
        (
            {"whenUnreserved": "2G", "burst": "Allowed", "burstCeiling": "1G"},
            "policy.bandwidth: whenUnreserved (2G) is above burstCeiling (1G)",
        ),
        ({"rate": "1G"}, "policy.bandwidth.rate: Extra inputs are not permitted"),
        ("1G", "policy.bandwidth: Input should be a valid dictionary"),
    ],
)
def test_invalid_bandwidth_rules_say_what_is_allowed(bandwidth: Any, message: str) -> None:
    found = policy_issues(bandwidth)
    assert any(e.startswith(message) for e in found), found


def test_a_class_with_bad_rules_fails_the_claims_that_use_it() -> None:
    classes = copy.deepcopy(DEFAULT_CLASSES)
    classes[0]["spec"]["config"][0]["opaque"]["parameters"]["bandwidth"] = {
        "whenUnreserved": "1Gbps"
    }
    [report] = validate_documents([claim({"ifName": "net1"})], classes, {})
    assert any("bandwidth.whenUnreserved" in str(i.path) for i in report.issues.errors)
    classes[0]["spec"]["config"][0]["opaque"]["parameters"]["bandwidth"] = {
        "whenUnreserved": "1G",
        "burst": "Allowed",
    }
    [report] = validate_documents([claim(network(MACVLAN))], classes, {})
    assert not report.issues.errors


# ------------------------------------------------------------------ the decision

LINK = 10 * 10**9  # a 10 Gbit/s link


def rules(**fields: Any) -> BandwidthRules:
    return BandwidthRules.model_validate(fields)


def test_a_reservation_is_enforced_whatever_the_class_says() -> None:
    granted = {"bandwidth": "1G"}
    assert enforced_rate(granted, None, LINK) == Rate(10**9, 10**9)
    assert enforced_rate(granted, rules(whenUnreserved="1M"), LINK) == Rate(10**9, 10**9)


def test_nothing_reserved_is_the_class_default() -> None:
    for nothing in (None, {}, {"bandwidth": "0"}, {"bandwidth": 0}, {"subInterfaces": "1"}):
        assert enforced_rate(nothing, None, LINK) is None
        assert enforced_rate(nothing, rules(whenUnreserved="Unlimited"), LINK) is None
        assert enforced_rate(nothing, rules(whenUnreserved="100M"), LINK) == Rate(10**8, 10**8)


def test_bursts_reach_the_ceiling_the_link_or_no_bound() -> None:
    burst = rules(burst="Allowed")
    assert enforced_rate({"bandwidth": "1G"}, burst, LINK) == Rate(10**9, LINK)
    capped = rules(burst="Allowed", burstCeiling="2G")
    assert enforced_rate({"bandwidth": "1G"}, capped, LINK) == Rate(10**9, 2 * 10**9)
    assert enforced_rate({"bandwidth": "1G"}, burst, None) == Rate(10**9, MAX_RATE_BPS)
    # a grant above the link's speed (a link that slowed down): never a ceiling below the rate
    assert enforced_rate({"bandwidth": "20G"}, burst, LINK) == Rate(2 * 10**10, 2 * 10**10)


@given(
    st.one_of(st.none(), st.integers(0, 10**11).map(lambda b: {"bandwidth": str(b)})),
    st.sampled_from(["Unlimited", "1M", "100M"]),
    st.sampled_from(["Allowed", "Denied"]),
    st.one_of(st.none(), st.integers(1, 10**11)),
)
def test_the_decision_holds_what_was_granted(
    granted: dict[str, str] | None, unreserved: str, burst: str, link: int | None
) -> None:
    policy = rules(whenUnreserved=unreserved, burst=burst)
    rate = enforced_rate(granted, policy, link)
    reserved = granted_bps(granted)
    if reserved is None and unreserved == "Unlimited":
        assert rate is None
        return
    assert rate is not None
    assert rate.rate == (reserved if reserved is not None else rate_bps(unreserved))
    assert (rate.ceil == rate.rate) == (burst == "Denied" or rate.ceil == rate.rate)
    if burst == "Denied":
        assert rate.ceil == rate.rate


def test_the_documented_policy_is_valid_and_means_what_the_doc_says() -> None:
    """docs/configuration.md, "Bandwidth": its CNIPolicy example parses, and a claim that
    reserved nothing is held to 100M, bursting to 10G."""
    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    section = doc[doc.index("## Bandwidth") :]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    policy = next(yaml.safe_load(b) for b in blocks if "kind: CNIPolicy" in b)
    found = rules(**policy["bandwidth"])
    assert enforced_rate(None, found, LINK) == Rate(10**8, 10**10)
    assert enforced_rate({"bandwidth": "1G"}, found, LINK) == Rate(10**9, 10**10)


# ------------------------------------------------------------------ Leftover


def test_leftover_is_the_default_and_shares_only_what_reservations_leave() -> None:
    assert DEFAULT_RULES.when_unreserved == LEFTOVER and DEFAULT_RULES.shares_leftover
    # the node says what is left (cnidra.nri.bandwidth); prepare alone cannot: no limit yet
    assert enforced_rate(None, None, LINK) is None
    share = leftover_share(LINK, 4 * 10**9, 2)  # 10G, 4G reserved, two unreserved
    assert share == 3 * 10**9
    assert enforced_rate(None, None, LINK, share) == Rate(share, share)
    # an unreserved claim never bursts above its share, even where the class lets bursts
    assert enforced_rate(None, rules(burst="Allowed"), LINK, share) == Rate(share, share)
    # a reservation is held to its grant, whatever is left
    assert enforced_rate({"bandwidth": "1G"}, None, LINK, share) == Rate(10**9, 10**9)
    # Unlimited and a fixed rate ignore the share
    assert enforced_rate(None, rules(whenUnreserved="Unlimited"), LINK, share) is None
    assert enforced_rate(None, rules(whenUnreserved="1M"), LINK, share) == Rate(10**6, 10**6)


def test_a_link_reserved_whole_leaves_the_floor_and_an_unknown_speed_no_limit() -> None:
    assert leftover_share(LINK, LINK, 3) == SHARE_FLOOR_BPS
    assert leftover_share(LINK, 2 * LINK, 1) == SHARE_FLOOR_BPS  # over-reserved: a slower link
    assert leftover_share(None, 0, 1) is None
    assert leftover_share(0, 0, 1) is None
    assert leftover_share(LINK, 0, 0) == LINK  # asked for one about to come


@given(
    st.integers(1, 10**12),
    st.lists(st.integers(1, 10**11), max_size=8),
    st.integers(1, 50),
)
def test_shares_and_reservations_never_exceed_the_link(
    link: int, grants: list[int], sharers: int
) -> None:
    reserved = sum(grants)
    share = leftover_share(link, reserved, sharers)
    assert share is not None
    assert share % 8 == 0 and share >= SHARE_FLOOR_BPS
    if link - reserved >= sharers * SHARE_FLOOR_BPS:  # room for every floor: the link holds
        assert reserved + sharers * share <= link
        assert link - reserved - sharers * share < sharers * 8 + sharers  # little is left over


def test_terms_round_trip_and_bad_ones_are_named() -> None:
    terms = Terms(10**9, LINK, rules(burst="Allowed", burstCeiling="2G"), "gold")
    assert Terms.from_json(terms.to_json()) == terms
    assert Terms.from_json(None) is None
    unreserved = Terms(None, None, DEFAULT_RULES)
    assert Terms.from_json(unreserved.to_json()) == unreserved
    assert unreserved.shares() and not terms.shares()
    assert terms.decide() == Rate(10**9, 2 * 10**9)
    assert terms.decide(rules()) == Rate(10**9, 10**9)  # the class's rules now: Denied
    for bad, field in (
        ({"granted": "1G"}, "bandwidth.granted"),
        ({"link": -1}, "bandwidth.link"),
        ({"rules": {"burst": "Sometimes"}}, "bandwidth.rules"),
        ({"deviceClass": 3}, "bandwidth.deviceClass"),
        ([], "bandwidth must be an object"),
    ):
        with pytest.raises(ValueError, match=re.escape(field)):
            Terms.from_json(bad)


def device_class(*configs: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "gold"},
        "spec": {"config": [{"opaque": {"driver": DRIVER_NAME, "parameters": c}} for c in configs]},
    }


def test_a_classes_rules_are_its_cnipolicys() -> None:
    policy = {"apiVersion": API_VERSION, "kind": "CNIPolicy"}
    issues = Issues()
    assert class_bandwidth(device_class(), issues) == DEFAULT_RULES
    assert class_bandwidth(device_class(policy), issues) == DEFAULT_RULES
    given_rules = {**policy, "bandwidth": {"whenUnreserved": "10M"}}
    assert class_bandwidth(device_class(given_rules), issues) == rules(whenUnreserved="10M")
    assert not issues.errors
    bad = {**policy, "bandwidth": {"whenUnreserved": "fast"}}
    assert class_bandwidth(device_class(bad), issues) is None
    assert any("bandwidth.whenUnreserved" in str(e.path) for e in issues.errors)
    two = Issues()
    assert class_bandwidth(device_class(policy, policy), two) is None
    assert "one CNIPolicy" in str(two.errors[0])


def test_a_claim_that_may_burst_borrows_only_what_nobody_reserved() -> None:
    burst = rules(burst="Allowed")
    # its even share of what the link's grants leave caps its ceiling
    assert enforced_rate({"bandwidth": "1G"}, burst, LINK, 2 * 10**9) == Rate(10**9, 3 * 10**9)
    # a lower burstCeiling still holds; an unknown share leaves the ceiling alone
    capped = rules(burst="Allowed", burstCeiling="2G")
    assert enforced_rate({"bandwidth": "1G"}, capped, LINK, 5 * 10**9) == Rate(10**9, 2 * 10**9)
    assert enforced_rate({"bandwidth": "1G"}, burst, LINK) == Rate(10**9, LINK)
    # with bursts denied the share changes nothing
    assert enforced_rate({"bandwidth": "1G"}, rules(), LINK, 10**9) == Rate(10**9, 10**9)
    reserved = Terms(10**9, LINK, burst)
    assert reserved.borrows() and reserved.takes() and not reserved.shares()
    assert not Terms(10**9, LINK, rules()).takes()
    assert Terms(None, LINK, DEFAULT_RULES).takes()
    assert not Terms(None, LINK, rules(whenUnreserved="Unlimited", burst="Allowed")).takes()


@given(
    st.integers(10**6, 10**12),
    st.lists(st.tuples(st.integers(1, 10**10), st.booleans()), max_size=6),
    st.integers(0, 6),
)
def test_ceilings_and_grants_never_exceed_the_link(
    link: int, reserved: list[tuple[int, bool]], unreserved: int
) -> None:
    """However many claims reserve (bursting or not) and reserve nothing on a link, the
    ceilings of all of them add up to no more than the link, once there is room for every
    taker's floor: nobody's reservation can be crowded."""
    granted = sum(g for g, _ in reserved)
    takers = unreserved + sum(1 for _, b in reserved if b)
    share = leftover_share(link, granted, takers)
    assert share is not None
    ceilings = [
        decided.ceil
        for g, may_burst in reserved
        if (
            decided := enforced_rate(
                {"bandwidth": str(g)},
                rules(burst="Allowed" if may_burst else "Denied"),
                link,
                share,
            )
        )
    ]
    ceilings += [share] * unreserved
    rounded = sum(((g + 7) // 8 * 8) - g for g, _ in reserved)  # tc's whole bytes a second
    if link - granted >= max(takers, 1) * SHARE_FLOOR_BPS:
        assert sum(ceilings) <= link + rounded
