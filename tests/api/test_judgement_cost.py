"""The judgement of a tenant's config costs time and memory linear in its size, and what it
reports is bounded (issue 39): the worst shapes the readers' bounds admit (identical ranges,
distinct ranges, long plugin chains, a class locking many paths against a claim writing many,
a claim whose requests share one config), counted in calls, not timed, so a quadratic step
fails the test and a slow machine does not; the fast paths (the overlap sweep, the locked-path
tree, the bounded issues, the prefix lookups) agree with the plain definitions they replace."""

from __future__ import annotations

import ipaddress
import sys
import time
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra.admission.webhook import review
from cnidra.api.issues import MAX_SHOWN, ROOT, FieldPath, Issue, Issues, Omitted, Severity
from cnidra.api.merge import ConfigEntry, Source
from cnidra.api.netconf import _overlapping, validate_network_config
from cnidra.api.nodes import NodeView
from cnidra.api.ownership import PrivateDirs
from cnidra.api.policy import _folded, _Locked, check_claim, leaves
from cnidra.api.refs import ObjectRef
from cnidra.api.tenant import address_outside, written_by
from cnidra.api.validate import validate_documents
from cnidra.dra.prepare import PrepareError, resolve_claim
from tests.api.test_policy import DEFAULT_CLASSES

DRIVER = "cni.dra.networking.x-k8s.io"
API = "cni.networking.x-k8s.io/v1alpha1"
CLASS = DEFAULT_CLASSES[0]["metadata"]["name"]


def network(ranges: list[dict[str, Any]], *extra: dict[str, Any]) -> dict[str, Any]:
    ipam = {"type": "host-local", "ranges": [ranges]}
    return {
        "cniVersion": "1.0.0",
        "name": "n",
        "plugins": [{"type": "macvlan", "ipam": ipam}, *extra],
    }


def identical(n: int) -> list[dict[str, Any]]:
    return [{"subnet": "198.18.0.0/24"}] * n


def distinct(n: int) -> list[dict[str, Any]]:
    return [{"subnet": f"198.18.{i // 64}.{i % 64 * 4}/30"} for i in range(n)]


def cniconfig(config: dict[str, Any]) -> dict[str, Any]:
    """A bare CNIConfig document: the validator alone, no class's policy."""
    return {"apiVersion": API, "kind": "CNIConfig", "ifName": "net1", "config": config}


def resource_claim(config: dict[str, Any]) -> dict[str, Any]:
    params = {"apiVersion": API, "kind": "CNIConfig", "ifName": "net1", "config": config}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "team-a"},
        "spec": {
            "devices": {
                "requests": [{"name": "net", "exactly": {"deviceClassName": CLASS}}],
                "config": [
                    {"requests": ["net"], "opaque": {"driver": DRIVER, "parameters": params}}
                ],
            }
        },
    }


def calls(judge: Callable[[], object]) -> int:
    """Function calls (Python and C) `judge()` makes: a count that does not depend on the
    machine, the load or the moment."""
    count = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        judge()
    finally:
        sys.setprofile(None)
    return count


def assert_linear(judge_of: Callable[[int], Callable[[], object]], n: int) -> None:
    """Twice the input costs about twice the calls (a quadratic step would cost four times)."""
    judge_of(n)()  # schemas loaded, validators built: not the input's cost
    small, large = calls(judge_of(n)), calls(judge_of(2 * n))
    assert large < 2.6 * small, (small, large)


# ------------------------------------------------------------------ the issue's configs


def test_800_identical_ranges_report_a_bounded_number_of_errors_and_count_the_rest() -> None:
    start = time.process_time()  # this process's CPU: a loaded machine's wait does not count
    [report] = validate_documents([cniconfig(network(identical(800)))])
    assert time.process_time() - start < 5  # 46 s and 361 MB before
    errors = report.issues.errors
    shown = list(errors)
    # each range after the first overlaps the first: 799 errors found, once each
    assert len(errors) == report.issues.error_count == 799
    assert len(shown) == MAX_SHOWN + 1
    assert shown[0].message == (
        "198.18.0.0/24 overlaps 198.18.0.0/24 at config.plugins[0].ipam.ranges[0][0]; "
        "ranges must not overlap"
    )
    assert str(shown[0].path) == "config.plugins[0].ipam.ranges[0][1].subnet"
    last = shown[-1]
    assert isinstance(last, Omitted) and last.count == 699
    assert last.message == "... and 699 more problems not shown"
    assert str(last.path) == "config.plugins[0].ipam.ranges[0]"  # where they all are
    assert sum(len(str(i)) for i in report.issues.items) < 20_000  # 62 MB before


def test_800_identical_ranges_in_a_claim_are_refused_with_a_short_message_everywhere() -> None:
    doc = resource_claim(network(identical(800)))
    [report] = validate_documents([doc], DEFAULT_CLASSES, {})
    assert len(list(report.issues.errors)) <= MAX_SHOWN + 1
    assert "more problems not shown" in str(list(report.issues.errors)[-1])
    body = {"request": {"uid": "u", "operation": "CREATE", "namespace": "team-a", "object": doc}}
    answer = review(body, {CLASS: DEFAULT_CLASSES[0]}.get, lambda ns: {})["response"]
    assert answer["allowed"] is False and len(answer["status"]["message"]) <= 4096
    allocated = {
        "metadata": {"uid": "u-1", "generation": 1},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "net", "driver": DRIVER, "pool": "n1", "device": "e"}],
                    "config": [
                        {"source": "FromClass", **DEFAULT_CLASSES[0]["spec"]["config"][0]},
                        {"source": "FromClaim", **doc["spec"]["devices"]["config"][0]},
                    ],
                },
            },
        },
    }
    ref = ObjectRef("team-a", "c", "u-1")
    dirs = PrivateDirs(ipam="/s/ipam", tuning="/s/tuning")
    try:
        resolve_claim(allocated, ref, "n1", dirs, NodeView(links={"e": "e"}))
    except PrepareError as exc:
        message = str(exc)
    else:
        raise AssertionError("prepared")
    assert "more problems not shown" in message and len(message) < 40_000


def test_2200_distinct_ranges_are_valid() -> None:
    start = time.process_time()  # this process's CPU: a loaded machine's wait does not count
    [report] = validate_documents([cniconfig(network(distinct(2200)))])
    assert time.process_time() - start < 5  # 2.5 s of CPU on every prepare before
    assert not report.issues.errors, list(report.issues.errors)[:3]


def test_overlapping_ranges_are_each_reported_once_against_the_first_they_overlap() -> None:
    ranges = [
        {"subnet": "10.0.0.0/16"},
        {"subnet": "10.1.0.0/24"},
        {"subnet": "10.0.3.0/24"},  # inside [0]
        {"subnet": "10.1.0.0/16"},  # holds [1]
        {"subnet": "fd00::/64"},
        {"subnet": "10.0.3.0/24"},  # [0] and [2]: named once, the first
    ]
    issues = Issues()
    validate_network_config(network(ranges), ROOT, issues)
    assert {str(i.path): i.message for i in issues.errors} == {
        "plugins[0].ipam.ranges[0][2].subnet": (
            "10.0.3.0/24 overlaps 10.0.0.0/16 at plugins[0].ipam.ranges[0][0]; "
            "ranges must not overlap"
        ),
        "plugins[0].ipam.ranges[0][3].subnet": (
            "10.1.0.0/16 overlaps 10.1.0.0/24 at plugins[0].ipam.ranges[0][1]; "
            "ranges must not overlap"
        ),
        "plugins[0].ipam.ranges[0][5].subnet": (
            "10.0.3.0/24 overlaps 10.0.0.0/16 at plugins[0].ipam.ranges[0][0]; "
            "ranges must not overlap"
        ),
        "plugins[0].ipam.ranges[0]": (
            "mixes IPv4 and IPv6 subnets in one range set; put each family in its own range set"
        ),
    }


# ------------------------------------------------------------------ not quadratic, in calls


def judge_network(
    config_of: Callable[[int], dict[str, Any]],
) -> Callable[[int], Callable[[], object]]:
    return lambda n: lambda: validate_documents([cniconfig(config_of(n))])


def test_identical_ranges_cost_linear_calls() -> None:
    assert_linear(judge_network(lambda n: network(identical(n))), 400)


def test_distinct_ranges_cost_linear_calls() -> None:
    assert_linear(judge_network(lambda n: network(distinct(n))), 400)


def test_a_long_plugin_chain_costs_linear_calls() -> None:
    def chain(n: int) -> dict[str, Any]:
        return {"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "tuning"}] * n}

    assert_linear(judge_network(chain), 300)


def test_a_class_locking_many_paths_against_a_claim_writing_many_costs_linear_calls() -> None:
    def judge(n: int) -> Callable[[], object]:
        locked = ConfigEntry(
            Source.CLASS,
            {"apiVersion": API, "kind": "CNIConfig", "args": {f"K{i}": "v" for i in range(n)}},
            (),
            FieldPath(("class",)),
        )
        claim = ConfigEntry(
            Source.CLAIM,
            {"apiVersion": API, "kind": "CNIConfig", "args": {f"J{i}": "v" for i in range(n)}},
            ("net",),
            FieldPath(("claim",)),
        )
        return lambda: check_claim([locked, claim], {}, "ns", None, Issues())

    assert_linear(judge, 500)


def test_requests_sharing_one_config_judge_it_once() -> None:
    def judge(n: int) -> Callable[[], object]:
        doc = resource_claim(network(distinct(100)))
        devices = doc["spec"]["devices"]
        devices["requests"] = [
            {
                "name": f"r{i}",
                "firstAvailable": [{"name": f"s{j}", "deviceClassName": CLASS} for j in range(8)],
            }
            for i in range(n)
        ]
        devices["config"][0]["requests"] = []  # one config for every request
        del devices["config"][0]["opaque"]["parameters"]["ifName"]  # named net1, net2...
        return lambda: validate_documents([doc], DEFAULT_CLASSES, {})

    judge(1)()
    one, many = calls(judge(1)), calls(judge(32))
    # 8 subrequests, then 256: the config is judged once either way
    assert many < 3 * one, (one, many)


def test_a_claim_beyond_dras_bounds_is_refused_and_judged_within_them() -> None:
    doc = resource_claim(network(distinct(2)))
    devices = doc["spec"]["devices"]
    devices["requests"] = [
        {"name": f"r{i}", "exactly": {"deviceClassName": CLASS}} for i in range(1000)
    ]
    devices["config"] = devices["config"] * 100
    [report] = validate_documents([doc], DEFAULT_CLASSES, {})
    messages = {str(i.path): i.message for i in report.issues.errors}
    assert messages["spec.devices.requests"].startswith("has 1,000 requests; DRA allows at most 32")
    assert messages["spec.devices.config"].startswith("has 100 configs; DRA allows at most 32")


# ------------------------------------------------------------------ the bounded issues


@given(st.lists(st.tuples(st.integers(0, 300), st.booleans()), max_size=600))
def test_issues_keep_a_bounded_few_and_count_every_one(reported: list[tuple[int, bool]]) -> None:
    issues = Issues(limit=20)
    before = len(issues.errors)
    for n, error in reported:
        (issues.error if error else issues.warn)(FieldPath(("a", n % 7, "b")), f"m{n}")
        # what callers rely on: the count grows with every error reported, kept or not
        assert len(issues.errors) == issues.error_count
    errors = sum(1 for _, error in reported if error)
    assert len(issues.errors) - before == errors
    assert bool(issues.errors) == (errors > 0)
    for severity, shown in ((Severity.ERROR, issues.errors), (Severity.WARNING, issues.warnings)):
        mine = [n for n, e in reported if e == (severity is Severity.ERROR)]
        first = list(dict.fromkeys(mine))[:20]  # kept once each
        kept = [i for i in shown if not isinstance(i, Omitted)]
        assert [i.message for i in kept] == [f"m{n}" for n in first]
        # the rest counted as reported (a repeat of a kept one is not news: not counted)
        rest = sum(1 for n in mine if n not in first)
        omitted = [i for i in shown if isinstance(i, Omitted)]
        assert [o.count for o in omitted] == ([rest] if rest else [])
    assert len(issues.items) <= 2 * 20 + 2


def test_issues_carried_over_keep_the_count_of_those_left_out() -> None:
    inner = Issues(limit=3)
    for i in range(10):
        inner.error(FieldPath(("config", "x", i)), f"e{i}")
    outer = Issues(limit=5)
    outer.error(ROOT, "first")
    before = outer.error_count
    outer.extend(inner.items)
    assert outer.error_count - before == 10  # 3 kept + 7 counted
    assert [str(i) for i in outer.errors] == [
        "<document>: first",
        "config.x[0]: e0",
        "config.x[1]: e1",
        "config.x[2]: e2",
        "config.x: ... and 7 more problems not shown",
    ]


# ------------------------------------------------------------------ fast paths = definitions

# subnets of a small space, so that many overlap: 10.x.y.0 with prefixes /8 to /30, and a few
# IPv6 ones beside them
subnets = st.one_of(
    st.builds(
        lambda a, p: ipaddress.ip_network((10 << 24 | a << 8, p), strict=False),
        st.integers(0, 2**16 - 1),
        st.integers(8, 30),
    ),
    st.builds(
        lambda a, p: ipaddress.ip_network((0xFD00 << 112 | a << 100, p), strict=False),
        st.integers(0, 255),
        st.integers(96, 126),
    ),
)


@settings(max_examples=300)
@given(st.lists(subnets, max_size=25))
def test_the_overlap_sweep_finds_what_comparing_every_pair_finds(nets: list[Any]) -> None:
    located = [(FieldPath(("r", i)), net) for i, net in enumerate(nets)]
    plain = []
    for i, net in enumerate(nets):
        earlier = (j for j in range(i) if net.version == nets[j].version)
        first = next((j for j in earlier if net.overlaps(nets[j])), None)
        if first is not None:
            plain.append((i, first))
    assert _overlapping(located) == plain


keys = st.sampled_from(["a", "A", "b", "mtu", "MTU", "c"])
paths = st.lists(keys, max_size=4).map(tuple)


def overlaps(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    n = min(len(a), len(b))
    return _folded(a[:n]) == _folded(b[:n])


@settings(max_examples=300)
@given(st.lists(paths, max_size=12), st.lists(paths, max_size=12))
def test_the_locked_tree_finds_the_first_class_path_comparing_every_pair_finds(
    locked: list[tuple[str, ...]], claimed: list[tuple[str, ...]]
) -> None:
    tree = _Locked()
    written = [(p, FieldPath(("class", i))) for i, p in enumerate(locked)]
    for order, (p, where) in enumerate(written):
        tree.add(p, order, where)
    for path in claimed:
        plain = next((where for p, where in written if overlaps(p, path)), None)
        assert tree.clash(path) == plain


trees = st.recursive(
    st.one_of(st.none(), st.integers(0, 3), st.just({})),
    lambda inner: st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300)
@given(st.lists(trees, max_size=4), st.lists(paths, max_size=12))
def test_the_locked_tree_of_class_configs_is_their_leaves(
    configs: list[Any], claimed: list[tuple[str, ...]]
) -> None:
    tree = _Locked()
    order = 0
    for i, config in enumerate(configs):
        order = tree.write(config, order, FieldPath(("class", i)))
    written = [(p, FieldPath(("class", i))) for i, c in enumerate(configs) for p, _ in leaves(c)]
    assert order == len(written)
    for path in claimed:
        plain = next((where for p, where in written if overlaps(p, path)), None)
        assert tree.clash(path) == plain


@given(st.frozensets(paths, max_size=10), paths)
def test_written_by_looks_up_prefixes_as_comparing_every_path_would(
    admin: frozenset[tuple[str, ...]], raw: tuple[str, ...]
) -> None:
    assert written_by(raw, admin) == any(raw[: len(p)] == p for p in admin)


@settings(max_examples=300)
@given(st.lists(subnets, max_size=10), subnets)
def test_address_outside_looks_up_prefixes_as_comparing_every_range_would(
    allowed: list[Any], net: Any
) -> None:
    plain = not any(net.version == a.version and net.subnet_of(a) for a in allowed)
    assert address_outside(str(net), allowed) == plain


def test_many_allowed_ranges_cost_one_lookup_per_prefix_length() -> None:
    allowed = [ipaddress.ip_network(f"10.{i // 256}.{i % 256}.0/24") for i in range(4000)]
    assert address_outside("10.3.7.9/32", allowed) is False
    assert address_outside("10.3.7.0/23", allowed) is True
    assert calls(lambda: address_outside("10.9.9.9", allowed)) < 100


def test_an_omitted_line_is_an_issue_of_its_severity() -> None:
    issues = Issues(limit=1)
    issues.warn(ROOT / "a", "w1")
    issues.warn(ROOT / "b", "w2")
    [kept, rest] = issues.warnings
    assert kept == Issue(ROOT / "a", "w1", Severity.WARNING)
    assert isinstance(rest, Omitted) and rest.severity is Severity.WARNING
    assert rest.message == "... and 1 more warning not shown" and not issues.errors


@given(
    st.lists(
        st.tuples(st.integers(1, 60), st.integers(0, 8)).map(lambda t: (t[0], t[0] + t[1])),
        max_size=8,
    ),
    st.integers(1, 70),
    st.integers(0, 10),
)
def test_allowed_vlan_spans_agree_with_the_plain_definition(
    spans: list[tuple[int, int]], low: int, width: int
) -> None:
    """The VLAN IDs a class allows, parsed and merged once, answer as checking each ID would."""
    from cnidra.api.policy import ClaimRules

    ids = [f"{lo}-{hi}" if hi != lo else str(lo) for lo, hi in spans]
    rules = ClaimRules.model_validate({"vlanIDs": ids})
    high = low + width
    every = all(any(lo <= v <= hi for lo, hi in spans) for v in range(low, high + 1))
    assert rules.span_allowed(low, high) == every
    assert rules.vlan_allowed(low) == any(lo <= low <= hi for lo, hi in spans)
