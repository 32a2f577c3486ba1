"""Property-based tests: no input crashes the validator or the converter, every error has a path,
and conversion round-trips the CNI config exactly."""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cnidra.api.convert import OutputKind, Source, extract_config, render_yaml, to_document
from cnidra.api.validate import validate_documents
from tests.api.helpers import conflist, params

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=25,
)

FIELDS = [
    "type",
    "master",
    "mode",
    "mtu",
    "vlan",
    "vlanId",
    "ipam",
    "ranges",
    "subnet",
    "gateway",
    "rangeStart",
    "rangeEnd",
    "addresses",
    "address",
    "routes",
    "dst",
    "gw",
    "plugins",
    "name",
    "cniVersion",
    "ifName",
    "config",
    "capabilities",
    "ips",
    "args",
    "hairpinMode",
    "sysctl",
]

SEED = params(
    conflist(
        {
            "type": "macvlan",
            "master": "eth0",
            "mode": "bridge",
            "mtu": 1500,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "198.18.0.0/24", "gateway": "198.18.0.1"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        },
        {"type": "tuning", "sysctl": {"net.ipv4.conf.all.arp_notify": "1"}},
        {"type": "static", "addresses": [{"address": "192.0.2.1/24"}]},
    )
)


def mutate(doc: Any, draw: st.DrawFn, depth: int = 0) -> Any:
    """Replace, drop or add one value somewhere in `doc`."""
    if isinstance(doc, dict) and doc and depth < 8 and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(doc)))
        doc[key] = mutate(doc[key], draw, depth + 1)
        return doc
    if isinstance(doc, list) and doc and depth < 8 and draw(st.booleans()):
        i = draw(st.integers(0, len(doc) - 1))
        doc[i] = mutate(doc[i], draw, depth + 1)
        return doc
    action = draw(st.sampled_from(["replace", "drop", "add"]))
    if action == "replace" or not isinstance(doc, dict | list):
        return draw(json_values)
    if action == "drop" and isinstance(doc, dict) and doc:
        doc.pop(draw(st.sampled_from(sorted(doc))))
    elif isinstance(doc, dict):
        doc[draw(st.sampled_from(FIELDS))] = draw(json_values)
    else:
        doc.append(draw(json_values))
    return doc


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    doc = copy.deepcopy(SEED)
    for _ in range(draw(st.integers(1, 4))):
        doc = mutate(doc, draw)
    if draw(st.booleans()) and isinstance(doc, dict) and isinstance(doc.get("config"), dict):
        doc["config"] = json.dumps(doc["config"])
    return doc


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_documents())
def test_mutated_configs_never_crash_and_every_error_has_a_path(doc: Any) -> None:
    for report in validate_documents([doc]):
        for issue in report.issues.items:
            assert issue.message
            assert str(issue.path)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_random_documents_never_crash(doc: Any) -> None:
    for report in validate_documents(
        [doc, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "spec": doc}]
    ):
        assert all(str(i.path) for i in report.issues.items)


cni_configs = st.fixed_dictionaries(
    {
        "cniVersion": st.sampled_from(["0.3.1", "1.0.0"]),
        "name": st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
    },
    optional={
        "plugins": st.lists(
            st.dictionaries(st.text(max_size=10), json_values, max_size=5).map(
                lambda d: {"type": "bridge", **d}
            ),
            min_size=1,
            max_size=3,
        )
    },
).map(lambda d: d if "plugins" in d else {**d, "type": "macvlan"})


@settings(max_examples=300, deadline=None)
@given(cni_configs, st.sampled_from(list(OutputKind)))
def test_convert_round_trips_the_cni_config_exactly(
    config: dict[str, Any], kind: OutputKind
) -> None:
    text = render_yaml(to_document(Source(config, config.get("name")), kind))
    back = extract_config(yaml.safe_load(text))
    assert back == config
    assert list(back) == list(config)  # key order survives
