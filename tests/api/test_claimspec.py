"""The one reader of a claim's spec (cnidra.api.claimspec): whatever JSON it is handed, it
answers a ClaimSpec or a SpecError naming the field; a valid spec reads back as written."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra.api.claimspec import (
    MAX_REQUESTS,
    ClaimSpec,
    ConfigSpec,
    Request,
    decode_configs,
    decode_spec,
    devices_of,
    request_classes,
)
from cnidra.api.constants import DRIVER_NAME
from cnidra.api.errors import SpecError
from cnidra.api.issues import ROOT, FieldPath

DEVICES = ROOT / "spec" / "devices"

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
keys = st.sampled_from(
    ["name", "exactly", "firstAvailable", "deviceClassName", "count", "allocationMode",
     "requests", "config", "opaque", "driver", "parameters", "source", "x"]
) | st.text(max_size=4)  # fmt: skip
json_ish = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(json_ish)
def test_any_input_is_a_spec_or_a_spec_error(devices: Any) -> None:
    try:
        spec = decode_spec(devices)
    except SpecError as exc:
        assert str(exc.path).startswith(str(DEVICES))
    else:
        assert isinstance(spec, ClaimSpec)
    with contextlib.suppress(SpecError):
        decode_configs(devices, DEVICES / "config")


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(keys, json_ish, max_size=4))
def test_any_request_or_config_entry_reads_or_is_refused(entry: dict[str, Any]) -> None:
    try:
        spec = decode_spec({"requests": [entry], "config": [entry]})
    except SpecError as exc:
        assert exc.path is not None and str(exc)
    else:
        assert len(spec.configs) == 1


labels = st.from_regex(r"[a-z]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)


@st.composite
def specs(draw: st.DrawFn) -> ClaimSpec:
    names = draw(st.lists(labels, min_size=1, max_size=6, unique=True))
    requests: list[Request] = []
    for i, name in enumerate(names):
        path = DEVICES / "requests" / i
        subs = draw(st.lists(labels, max_size=3, unique=True))
        cls = draw(st.none() | labels.map(lambda n: f"{n}.example.com"))
        if subs:
            requests += [
                Request(f"{name}/{sub}", cls, path / "firstAvailable" / j)
                for j, sub in enumerate(subs)
            ]
        else:
            requests.append(Request(name, cls, path, 1, "ExactCount", path / "exactly"))
    configs = [
        ConfigSpec(
            DEVICES / "config" / i,
            tuple(draw(st.lists(st.sampled_from(names), max_size=2))),
            draw(st.sampled_from([DRIVER_NAME, "other.example.com"])),
            draw(st.dictionaries(st.text(max_size=4), scalars, max_size=3)),
            draw(st.none() | st.sampled_from(["FromClass", "FromClaim"])),
        )
        for i in range(draw(st.integers(0, 4)))
    ]
    return ClaimSpec(tuple(requests), tuple(configs))


@settings(max_examples=200, deadline=None)
@given(specs())
def test_a_valid_spec_reads_back_as_written(spec: ClaimSpec) -> None:
    assert decode_spec(spec.to_devices()) == spec
    assert decode_spec(decode_spec(spec.to_devices()).to_devices()) == spec


def test_errors_name_the_field_and_what_is_allowed() -> None:
    with pytest.raises(SpecError) as caught:
        decode_spec({"requests": [{"name": "a", "exactly": {}}], "config": [{"opaque": 3}]})
    assert caught.value.path == DEVICES / "config" / 0 / "opaque"
    assert "must be an object" in str(caught.value)
    with pytest.raises(SpecError, match="at most 32"):
        decode_spec({"requests": [{"name": f"r{i}"} for i in range(MAX_REQUESTS + 1)]})
    with pytest.raises(SpecError, match="DNS label"):
        decode_spec({"requests": [{"name": "Not_A_Label"}]})


def test_a_template_s_spec_is_one_level_deeper() -> None:
    devices = {"requests": []}
    found, path = devices_of(
        {"kind": "ResourceClaimTemplate", "spec": {"spec": {"devices": devices}}}
    )
    assert found is devices and path == FieldPath(("spec", "spec", "devices"))


def test_request_classes_name_each_request_s_and_subrequest_s_class_leniently() -> None:
    devices = {
        "requests": [
            {"name": "a", "exactly": {"deviceClassName": "cnidra.example.com"}},
            {"name": "b", "deviceClassName": "flat.example.com"},  # v1beta1's field on the request
            {
                "name": "c",
                "firstAvailable": [
                    {"name": "x", "deviceClassName": "x.example.com"},
                    {"name": "y", "deviceClassName": 3},  # not a class: left out
                    {"name": "z"},
                ],
            },
            {"name": "d", "exactly": {}},
            "not a request",
        ]
    }
    assert request_classes(devices, DEVICES) == {
        "a": "cnidra.example.com",
        "b": "flat.example.com",
        "c/x": "x.example.com",
    }
    assert request_classes({}, DEVICES) == {}


@settings(max_examples=100, deadline=None)
@given(specs())
def test_request_classes_are_the_spec_s(spec: ClaimSpec) -> None:
    classes = {r.name: r.device_class for r in spec.requests if r.device_class is not None}
    assert request_classes(spec.to_devices(), DEVICES) == classes
