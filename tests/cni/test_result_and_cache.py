from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra.cni.cache import ResultCache
from cnidra.cni.result import Result, ResultError
from cnidra.cni.types import RuntimeConf

V1_1 = {
    "cniVersion": "1.1.0",
    "interfaces": [
        {"name": "cni0", "mac": "02:00:00:00:00:01"},
        {
            "name": "net1",
            "mac": "02:00:00:00:00:02",
            "sandbox": "/run/netns/p",
            "socketPath": "/x",
            "pciID": "0000:00:01.0",
        },
    ],
    "ips": [
        {"address": "198.18.0.5/24", "gateway": "198.18.0.1", "interface": 1},
        {"address": "2001:db8::5/64", "interface": 1},
    ],
    "routes": [{"dst": "0.0.0.0/0", "gw": "198.18.0.1", "mtu": 1400, "table": 5}],
    "dns": {"nameservers": ["192.0.2.53"]},
}


def test_down_conversion_adds_ip_versions_and_drops_1_1_fields() -> None:
    old = Result.parse(V1_1, "1.1.0").as_version("0.4.0").raw
    assert old["cniVersion"] == "0.4.0"
    assert [ip["version"] for ip in old["ips"]] == ["4", "6"]
    assert "mtu" not in old["routes"][0] and "table" not in old["routes"][0]
    assert "socketPath" not in old["interfaces"][1]
    assert V1_1["routes"][0]["mtu"] == 1400  # the input is untouched


def test_up_conversion_drops_ip_version() -> None:
    old = {
        **V1_1,
        "cniVersion": "0.3.1",
        "ips": [{"address": "198.18.0.5/24", "version": "4", "interface": 1}],
    }
    new = Result.parse(old, "0.3.1").as_version("1.0.0").raw
    assert new["ips"] == [{"address": "198.18.0.5/24", "interface": 1}]


def test_missing_version_means_the_configs() -> None:
    assert Result.parse({"ips": []}, "0.4.0").cni_version == "0.4.0"


def test_sandbox_interface_and_its_ips() -> None:
    result = Result.parse(V1_1, "1.1.0")
    assert [i for i, _ in result.sandbox_interfaces()] == [1]
    assert result.ips_of(1) == ["198.18.0.5/24", "2001:db8::5/64"]


@pytest.mark.parametrize(
    "bad,fragment",
    [
        ([], "JSON object"),
        ({"ips": [{"gateway": "x"}]}, "ips.0.address"),
        ({"ips": [{"address": "198.18.0.5"}]}, "with a prefix"),
        ({"interfaces": [{"mac": "x"}]}, "interfaces.0.name"),
        ({"cniVersion": "0.9.0"}, "not supported"),
    ],
)
def test_bad_results_are_refused(bad: Any, fragment: str) -> None:
    with pytest.raises(ResultError, match=fragment):
        Result.parse(bad, "1.0.0")


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "cniVersion",
                    "interfaces",
                    "ips",
                    "routes",
                    "dns",
                    "address",
                    "name",
                    "interface",
                    "gateway",
                    "dst",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(json_values, st.sampled_from(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]))
def test_result_parser_never_crashes(data: Any, target: str) -> None:
    try:
        result = Result.parse(data, "1.0.0")
    except ResultError:
        return
    converted = result.as_version(target)
    assert Result.parse(converted.to_json(), target).cni_version == target


def test_cache_entry_is_libcni_format_and_atomic(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path)
    rt = RuntimeConf("cid", "/run/netns/p", "net1", (("K", "V"),), {"mac": "02:00:00:00:00:09"})
    config = b'{"cniVersion":"1.1.0","name":"n","plugins":[{"type":"bridge"}]}'
    cache.store("n", rt, config, Result.parse(V1_1, "1.1.0"))
    path = tmp_path / "results" / "n-cid-net1"
    data = json.loads(path.read_bytes())
    assert data["kind"] == "cniCacheV1"
    assert base64.b64decode(data["config"]) == config
    assert data["cniArgs"] == [["K", "V"]] and data["capabilityArgs"] == {
        "mac": "02:00:00:00:00:09"
    }
    assert (data["containerId"], data["ifName"], data["networkName"], data["netns"]) == (
        "cid",
        "net1",
        "n",
        "/run/netns/p",
    )
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in (tmp_path / "results").iterdir()] == ["n-cid-net1"]  # no temp files
    entry = cache.load("n", rt)
    assert entry is not None and entry.runtime_conf() == rt
    assert [e.container_id for e in cache.attachments("cid")] == ["cid"]
    assert list(cache.attachments("other")) == []
    cache.remove("n", rt)
    cache.remove("n", rt)  # idempotent
    assert cache.load("n", rt) is None
