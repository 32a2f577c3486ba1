"""resolve_claim (pure) and the checkpoint, without a cluster."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.ownership import PrivateDirs
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.dra.prepare import PrepareError, Preparer, resolve_claim
from cnidra.state.checkpoint import Checkpoint, PreparedClaim
from cnidra.state.layout import StateLayout

DRIVER = "cni.dra.networking.x-k8s.io"
REF = ObjectRef("ns", "c", "uid-1")
DIRS = PrivateDirs(ipam="/state/ipam", tuning="/state/tuning")


def params(**extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIConfig",
        "ifName": "net1",
        "config": {
            "cniVersion": "1.0.0",
            "name": "n",
            "plugins": [
                {
                    "type": "macvlan",
                    "master": "eth1",
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.18.0.0/24"}]]},
                }
            ],
        },
        **extra,
    }


def claim(
    configs: list[dict[str, Any]] | None = None,
    results: list[dict[str, Any]] | None = None,
    node: str = "n1",
) -> dict[str, Any]:
    return {
        "metadata": {"uid": "uid-1", "generation": 2},
        "status": {
            "allocation": {
                "devices": {
                    "results": results
                    if results is not None
                    else [
                        {
                            "request": "net",
                            "driver": DRIVER,
                            "pool": "n1",
                            "device": "eth1",
                            "shareID": "s-1",
                        }
                    ],
                    "config": configs
                    if configs is not None
                    else [
                        {
                            "source": "FromClaim",
                            "requests": ["net"],
                            "opaque": {"driver": DRIVER, "parameters": params()},
                        }
                    ],
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}],
        },
    }


def test_a_valid_claim_resolves_to_its_attachment() -> None:
    prepared = resolve_claim(claim(), REF, "n1", DIRS)
    assert prepared.pod_uids == ("pod-1",) and prepared.generation == 2
    [dev] = prepared.devices
    assert (dev.request, dev.pool, dev.device, dev.if_name, dev.share_id) == (
        "net",
        "n1",
        "eth1",
        "net1",
        "s-1",
    )
    assert dev.network["plugins"][0]["master"] == "eth1"


def test_class_config_then_claim_config() -> None:
    configs = [
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": params(ifName="cls0")}},
        {
            "source": "FromClaim",
            "requests": ["net"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                    "kind": "CNIConfig",
                    "ifName": "mine0",
                    "args": {"A": "1"},
                },
            },
        },
    ]
    [dev] = resolve_claim(claim(configs), REF, "n1", DIRS).devices
    assert dev.if_name == "mine0" and dev.cni_args == (("A", "1"),)
    # the network is wholly the class's (the claim set no config): one cluster-wide name
    assert dev.network["name"] == "cnidra-cluster.n" and dev.network_label == "n"


def test_a_network_the_claim_defines_is_named_for_its_namespace() -> None:
    [dev] = resolve_claim(claim(), REF, "n1", DIRS).devices
    assert dev.network["name"] == "cnidra-ns.ns.n" and dev.network_label == "n"
    assert dev.network["plugins"][0]["ipam"]["dataDir"] == "/state/ipam"


def test_a_claim_that_changes_the_class_network_gets_its_own() -> None:
    configs = [
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": params()}},
        {
            "source": "FromClaim",
            "opaque": {
                "driver": DRIVER,
                "parameters": {"ifName": "net2", "config": {"plugins": [{"type": "macvlan"}]}},
            },
        },
    ]
    [dev] = resolve_claim(claim(configs), REF, "n1", DIRS).devices
    assert dev.network["name"] == "cnidra-ns.ns.n"


def test_the_primary_networks_name_is_only_a_label() -> None:
    c = claim()
    c["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["config"]["name"] = (
        "k8s-pod-network"
    )
    [dev] = resolve_claim(c, REF, "n1", DIRS).devices
    assert dev.network["name"] == "cnidra-ns.ns.k8s-pod-network"
    assert dev.network_label == "k8s-pod-network"


def test_a_state_directory_in_the_claim_is_refused() -> None:
    c = claim()
    plugin = c["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["config"][
        "plugins"
    ][0]
    plugin["ipam"]["dataDir"] = "/etc"
    with pytest.raises(PrepareError, match=r"plugins\[0\]\.ipam\.dataDir: is chosen by cnidra"):
        resolve_claim(c, REF, "n1", DIRS)


class Claims:
    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {c["metadata"]["name"]: c for c in claims}

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get(name)


def named(name: str, uid: str, requests: int) -> dict[str, Any]:
    results = [
        {"request": f"r{i}", "driver": DRIVER, "pool": "n1", "device": "eth1"}
        for i in range(requests)
    ]
    configs = [
        {
            "source": "FromClaim",
            "requests": [f"r{i}"],
            "opaque": {"driver": DRIVER, "parameters": params(ifName=f"{name}{i}")},
        }
        for i in range(requests)
    ]
    c = claim(configs, results)
    c["metadata"].update(name=name, uid=uid)
    return c


async def test_prepare_refuses_more_interfaces_per_pod_than_the_limit(tmp_path: Path) -> None:
    cp = Checkpoint(StateLayout(tmp_path))
    preparer = Preparer(
        "n1", Claims(named("a", "u-a", 2), named("b", "u-b", 2)), cp, DIRS, max_attachments=3
    )
    await preparer.prepare(ObjectRef("ns", "a", "u-a"))
    with pytest.raises(PrepareError, match="would get 4 cnidra interfaces; at most 3 per pod"):
        await preparer.prepare(ObjectRef("ns", "b", "u-b"))
    assert cp.get("u-b") is None


def test_a_checkpoint_of_cnidra_0_1_gets_owned_names_on_load(tmp_path: Path) -> None:
    old = prepared("u1", "a", ("p",))
    data = old.to_json()
    data["version"] = 1
    data["devices"][0]["network"] = {
        "cniVersion": "1.0.0",
        "name": "n",
        "plugins": [{"type": "macvlan", "ipam": {"type": "host-local"}}],
    }
    del data["devices"][0]["network_label"]
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "u1.json").write_text(json.dumps(data))
    [dev] = Checkpoint(StateLayout(tmp_path)).for_pod("p")[0].devices
    assert dev.network["name"] == "cnidra-ns.ns.n" and dev.network_label == "n"
    assert dev.network["plugins"][0]["ipam"]["dataDir"] == str(tmp_path / "ipam")


@pytest.mark.parametrize(
    "change,fragment",
    [
        (lambda c: c["metadata"].update(uid="other"), "deleted and created again"),
        (lambda c: c["status"].pop("allocation"), "not allocated"),
        (
            lambda c: c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0][
                "matchFields"
            ][0].update(values=["n2"]),
            "not to this node n1",
        ),
        (lambda c: c["status"]["allocation"]["devices"].update(results=[]), "no devices of driver"),
        (lambda c: c["status"]["allocation"]["devices"].update(config=[]), "has no cni.dra"),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"].append(
                {"request": "net", "driver": DRIVER, "pool": "n1", "device": "eth2"}
            ),
            "count 1",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"][
                "config"
            ]["plugins"][0].update(mode="bridged"),
            "config.plugins[0].mode",
        ),
    ],
)
def test_problems_a_person_can_act_on(change: Any, fragment: str) -> None:
    bad = copy.deepcopy(claim())
    change(bad)
    with pytest.raises(PrepareError, match="ns/c") as info:
        resolve_claim(bad, REF, "n1", DIRS)
    assert fragment in str(info.value)


def test_duplicate_ifnames_within_a_claim() -> None:
    results = [{"request": r, "driver": DRIVER, "pool": "n1", "device": "eth1"} for r in ("a", "b")]
    configs = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params()}}]
    with pytest.raises(PrepareError, match="both use ifName 'net1'"):
        resolve_claim(claim(configs, results), REF, "n1", DIRS)


def test_other_drivers_devices_and_configs_are_ignored() -> None:
    c = claim()
    c["status"]["allocation"]["devices"]["results"].append(
        {"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "g0"}
    )
    c["status"]["allocation"]["devices"]["config"].append(
        {"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": {"x": 1}}}
    )
    assert [d.request for d in resolve_claim(c, REF, "n1", DIRS).devices] == ["net"]


def prepared(uid: str, name: str, pods: tuple[str, ...]) -> PreparedClaim:
    ref = ObjectRef("ns", name, uid)
    dev = Attachment(
        claim=ref,
        request="net",
        if_name="net1",
        network={"cniVersion": "1.0.0", "name": "cnidra-ns.ns.n", "plugins": [{"type": "bridge"}]},
        pool="n1",
        device="eth1",
        capability_args={"mac": "02:00:00:00:00:01"},
        cni_args=(("A", "1"),),
        share_id="s",
        network_label="n",
    )
    return PreparedClaim(ref, pods, (dev,), 1)


async def test_checkpoint_survives_a_restart_and_orders_a_pods_claims(tmp_path: Path) -> None:
    cp = Checkpoint(StateLayout(tmp_path))
    await cp.put(prepared("u2", "zeta", ("pod-a",)))
    await cp.put(prepared("u1", "alpha", ("pod-a", "pod-b")))
    again = Checkpoint(StateLayout(tmp_path))
    assert [c.ref.name for c in again.for_pod("pod-a")] == ["alpha", "zeta"]
    assert again.get("u1") == prepared("u1", "alpha", ("pod-a", "pod-b"))
    assert await again.remove("u1") and not await again.remove("u1")
    assert [c.ref.name for c in Checkpoint(StateLayout(tmp_path)).for_pod("pod-a")] == ["zeta"]
    assert [p.name for p in (tmp_path / "claims").iterdir()] == ["u2.json"]


def test_a_corrupt_checkpoint_entry_is_moved_aside(tmp_path: Path) -> None:
    Checkpoint(StateLayout(tmp_path)).put_blocking(prepared("u1", "a", ("p",)))
    (tmp_path / "claims" / "bad.json").write_text("{not json")
    (tmp_path / "claims" / "half.json").write_text(json.dumps({"uid": "x"}))
    cp = Checkpoint(StateLayout(tmp_path))
    assert len(cp) == 1
    assert sorted(p.name for p in (tmp_path / "claims").iterdir()) == [
        "bad.corrupt",
        "half.corrupt",
        "u1.json",
    ]
