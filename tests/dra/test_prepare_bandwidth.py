"""Issue 44: what an allocation granted of a link's bandwidth becomes the rate limit prepare
checkpoints with the attachment (claim reading, resolution, the checkpoint's format)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.bandwidth import MAX_RATE_BPS, Rate
from cnidra.api.hostside import LinkFacts, NodeFacts
from cnidra.api.issues import FieldPath, Issues
from cnidra.api.nodes import NodeView
from cnidra.dra.claim import read_claim
from cnidra.dra.prepare import PrepareError, resolve_claim
from cnidra.dra.resolve import Device, resolve_attachment
from cnidra.state.checkpoint import VERSION, Checkpoint, PreparedClaim
from cnidra.state.layout import StateLayout
from tests.dra.test_prepare import DIRS, REF, VIEW, claim, prepared


def granting(bandwidth: Any, policy: dict[str, Any] | None = None) -> dict[str, Any]:
    c = claim()
    if bandwidth is not None:
        c["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {
            "bandwidth": bandwidth,
            "subInterfaces": "1",
        }
    if policy is not None:
        c["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["bandwidth"] = (
            policy
        )
    return c


def fast_link_view(speed_mbps: int | None) -> NodeView:
    facts = NodeFacts({"eth1": LinkFacts("eth1", "physical", 1500, (), None, speed_mbps)})
    return NodeView(links=VIEW.links, protected=VIEW.protected, facts=facts)


def test_the_claim_reads_each_results_consumed_capacity() -> None:
    [result] = read_claim(granting("1G")).results
    assert result.consumed_capacity == {"bandwidth": "1G", "subInterfaces": "1"}
    [none] = read_claim(claim()).results
    assert none.consumed_capacity == {}


@pytest.mark.parametrize("bad", [["1G"], {"bandwidth": {"v": 1}}, {"bandwidth": True}])
def test_a_consumed_capacity_of_the_wrong_shape_names_the_field(bad: Any) -> None:
    c = claim()
    c["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = bad
    with pytest.raises(PrepareError, match=r"results\[0\]\.consumedCapacity"):
        resolve_claim(c, REF, "n1", DIRS, VIEW)


def test_the_reserved_bandwidth_is_the_rate_both_ways() -> None:
    [dev] = resolve_claim(granting("1G"), REF, "n1", DIRS, VIEW).devices
    assert dev.rate == Rate(10**9, 10**9)


def test_nothing_reserved_and_no_policy_is_no_limit() -> None:
    [dev] = resolve_claim(claim(), REF, "n1", DIRS, VIEW).devices
    assert dev.rate is None
    [zero] = resolve_claim(granting("0"), REF, "n1", DIRS, VIEW).devices
    assert zero.rate is None


def test_the_policys_default_holds_a_claim_that_reserved_nothing() -> None:
    c = granting(None, {"whenUnreserved": "100M"})
    [dev] = resolve_claim(c, REF, "n1", DIRS, VIEW).devices
    assert dev.rate == Rate(100 * 10**6, 100 * 10**6)


def test_bursts_reach_the_links_speed_as_the_inventory_read_it() -> None:
    c = granting("1G", {"burst": "Allowed"})
    [dev] = resolve_claim(c, REF, "n1", DIRS, fast_link_view(10_000)).devices
    assert dev.rate == Rate(10**9, 10**10)
    [unknown] = resolve_claim(c, REF, "n1", DIRS, fast_link_view(None)).devices
    assert unknown.rate == Rate(10**9, MAX_RATE_BPS)
    capped = granting("1G", {"burst": "Allowed", "burstCeiling": "2G"})
    [dev] = resolve_claim(capped, REF, "n1", DIRS, fast_link_view(10_000)).devices
    assert dev.rate == Rate(10**9, 2 * 10**9)


@pytest.mark.parametrize("bad", ["lots", "-1G", "1000T"])
def test_a_grant_that_is_no_rate_fails_prepare_naming_the_field(bad: str) -> None:
    with pytest.raises(PrepareError) as caught:
        resolve_claim(granting(bad), REF, "n1", DIRS, VIEW)
    message = str(caught.value)
    assert "status.allocation.devices.results[0].consumedCapacity.bandwidth is no rate" in message
    assert repr(bad) in message


def test_the_rate_survives_the_checkpoint(tmp_path: Path) -> None:
    old = prepared("u1", "a", ("p",))
    shaped = PreparedClaim(
        old.ref,
        old.pod_uids,
        tuple(replace(d, rate=Rate(8000, 16000)) for d in old.devices),
        old.generation,
    )
    data = shaped.to_json()
    assert data["version"] == VERSION >= 3
    assert data["devices"][0]["rate"] == {"rate": 8000, "ceil": 16000}
    cp = Checkpoint(StateLayout(tmp_path))
    cp.put_blocking(shaped)
    [dev] = Checkpoint(StateLayout(tmp_path)).for_pod("p")[0].devices
    assert dev.rate == Rate(8000, 16000)


def test_a_version_2_checkpoint_reads_as_no_limit(tmp_path: Path) -> None:
    data = prepared("u1", "a", ("p",)).to_json()
    data["version"] = 2
    del data["devices"][0]["rate"]
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "u1.json").write_text(json.dumps(data))
    [dev] = Checkpoint(StateLayout(tmp_path)).for_pod("p")[0].devices
    assert dev.rate is None and dev.if_name == "net1"


def test_a_checkpointed_rate_that_is_none_is_set_aside(tmp_path: Path) -> None:
    data = prepared("u1", "a", ("p",)).to_json()
    data["devices"][0]["rate"] = {"rate": 7, "ceil": 7}
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "u1.json").write_text(json.dumps(copy.deepcopy(data)))
    assert Checkpoint(StateLayout(tmp_path)).for_pod("p") == []


def test_resolve_attachment_names_the_grant_it_cannot_enforce() -> None:
    """`cnidra.dra.resolve` on its own (prepare checks the grant first): the issue is at the
    field given."""
    typed = read_claim(claim())
    issues = Issues()
    where = FieldPath(("status", "allocation", "devices", "results", 0))
    device = Device("n1", "eth1", None, "eth1")
    att = resolve_attachment(
        typed.configs, "net", REF, device, DIRS, issues, FieldPath(), granted={"bandwidth": "x"},
        granted_where=where,
    )  # fmt: skip
    assert att is None
    [error] = issues.errors
    assert str(error.path) == "status.allocation.devices.results[0].consumedCapacity.bandwidth"
    ok = resolve_attachment(
        typed.configs, "net", REF, device, DIRS, Issues(), FieldPath(), granted={"bandwidth": "2M"}
    )
    assert ok is not None and ok.rate == Rate(2 * 10**6, 2 * 10**6)
