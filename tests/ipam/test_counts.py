"""A pool's accounting, the pure part: counts, the message a Pending pod gets, the pools an
unallocated claim asks of, and the CRDs that carry the counts (the chart's equal to the code's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra.api.ipam import (
    PoolCounts,
    block_crd,
    claim_pools,
    exhausted_message,
    pool_crd,
    selector_names,
)

ROOT = Path(__file__).parents[2]
DRIVER = "cni.dra.networking.x-k8s.io"


def test_counts_free_used_and_status() -> None:
    counts = PoolCounts("data", size=10, held=9, blocks=3, pool_blocks=4)
    assert counts.free == 1 and counts.used == pytest.approx(0.9)
    assert counts.status() == {"size": 10, "held": 9, "free": 1, "blocks": 3, "poolBlocks": 4}
    # held beyond the size (a pool shrunk under leases) is never negative free
    assert PoolCounts("x", size=2, held=3).free == 0
    assert PoolCounts("x", size=0, held=0).used == 1.0


def test_the_message_names_the_pool_its_size_and_what_is_held() -> None:
    text = exhausted_message(PoolCounts("tb-ipam", 2, 2, 1, 2), claim="ns/p3-c0")
    assert text == (
        "claim ns/p3-c0: CNIIPPool tb-ipam has no address left on any node: 2 addresses, "
        "2 held, 0 free (1 of 2 blocks reserved by nodes)"
    )


def test_selectors_name_networks_and_pools_of_this_driver_only() -> None:
    cel = (
        f'device.attributes["{DRIVER}"].network == "data" && '
        f"device.attributes['{DRIVER}'].ipPool == 'p2' || "
        'device.attributes["other.example.com"].network == "no"'
    )
    assert selector_names(cel, DRIVER) == {"network": {"data"}, "ipPool": {"p2"}}
    assert selector_names("device.driver == 'x'", DRIVER) == {"network": set(), "ipPool": set()}


def claim(*expressions: str, first_available: bool = False) -> dict[str, Any]:
    selectors = [{"cel": {"expression": e}} for e in expressions]
    if first_available:
        # a subrequest has a name (the apiserver requires one; the claim reader reads it so)
        request: dict[str, Any] = {
            "name": "r",
            "firstAvailable": [{"name": "s", "deviceClassName": "c", "selectors": selectors}],
        }
    else:
        request = {"name": "r", "exactly": {"deviceClassName": "c", "selectors": selectors}}
    return {"spec": {"devices": {"requests": [request, "junk"]}}}


def test_a_claims_pools_from_its_networks_and_its_pool_selectors() -> None:
    network = f'device.attributes["{DRIVER}"].network == "data"'
    pool = f'device.attributes["{DRIVER}"].ipPool == "direct"'
    pools = {"data": "data-pool"}
    assert claim_pools(claim(network), DRIVER, pools) == {"data-pool"}
    assert claim_pools(claim(network, first_available=True), DRIVER, pools) == {"data-pool"}
    assert claim_pools(claim(pool, network), DRIVER, {}) == {"direct"}
    assert claim_pools({"spec": None}, DRIVER, pools) == set()


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (pool_crd, "cniippools.cni.networking.x-k8s.io"),
        (block_crd, "cniipblocks.cni.networking.x-k8s.io"),
    ],
)
def test_the_chart_crds_are_the_ones_the_code_defines(make: Any, name: str) -> None:
    path = ROOT / "charts" / "cnidra" / "crds" / f"{name}.yaml"
    assert yaml.safe_load(path.read_text()) == make()
    assert path.read_text() in (ROOT / "deploy" / "crds.yaml").read_text()


def test_kubectl_shows_size_held_and_free_from_the_status_subresource() -> None:
    version = pool_crd()["spec"]["versions"][0]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Held"] == ".status.held" and columns["Free"] == ".status.free"
    assert columns["Size"] == ".status.size"
    assert version["subresources"] == {"status": {}}
    block = block_crd()["spec"]["versions"][0]
    assert block["subresources"] == {"status": {}}
