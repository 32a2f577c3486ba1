"""resolve_claim (pure) and the checkpoint, without a cluster."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.naming import NamingError
from cnidra.api.networks import NamedNetwork, StaticCatalog, cninetwork
from cnidra.api.nodes import NodeView
from cnidra.api.ownership import PrivateDirs
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.dra.prepare import PrepareError, Preparer, name_pod_interfaces, resolve_claim
from cnidra.state.checkpoint import Checkpoint, PreparedClaim
from cnidra.state.layout import StateLayout

DRIVER = "cni.dra.networking.x-k8s.io"
REF = ObjectRef("ns", "c", "uid-1")
DIRS = PrivateDirs(ipam="/state/ipam", tuning="/state/tuning")
VIEW = NodeView(links={"eth1": "eth1", "eth2": "eth2"}, protected=frozenset({"eth0"}))
# the admin's policy, as DRA copies it from the DeviceClass into the allocation
POLICY = {
    "source": "FromClass",
    "opaque": {
        "driver": DRIVER,
        "parameters": {
            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
            "kind": "CNIPolicy",
            "claims": {
                "defineNetworks": True,
                "plugins": ["macvlan", "static"],
                "fields": ["args"],
                "ipRanges": ["198.18.0.0/15"],
            },
        },
    },
}


def params(**extra: Any) -> dict[str, Any]:
    """A claim's CNIConfig; a keyword set to None leaves that field out."""
    full = {
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
                }
            ],
        },
        **extra,
    }
    return {k: v for k, v in full.items() if v is not None}


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
                    "config": [copy.deepcopy(POLICY), *configs]
                    if configs is not None
                    else [
                        copy.deepcopy(POLICY),
                        {
                            "source": "FromClaim",
                            "requests": ["net"],
                            "opaque": {"driver": DRIVER, "parameters": params()},
                        },
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
    prepared = resolve_claim(claim(), REF, "n1", DIRS, VIEW)
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
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": params(ifName=None)}},
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
    [dev] = resolve_claim(claim(configs), REF, "n1", DIRS, VIEW).devices
    assert dev.if_name == "mine0" and dev.cni_args == (("A", "1"),)
    # the network is wholly the class's (the claim set no config): one cluster-wide name
    assert dev.network["name"] == "cnidra-cluster.n" and dev.network_label == "n"


def test_a_network_the_claim_defines_is_named_for_its_namespace() -> None:
    [dev] = resolve_claim(claim(), REF, "n1", DIRS, VIEW).devices
    assert dev.network["name"] == "cnidra-ns.ns.n" and dev.network_label == "n"


def class_then_claim(claim_params: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": params(ifName=None)}},
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": claim_params}},
    ]


def test_a_claim_that_adds_to_the_class_network_gets_its_own() -> None:
    configs = class_then_claim({"ifName": "net2", "config": {"disableCheck": True}})
    [dev] = resolve_claim(claim(configs), REF, "n1", DIRS, VIEW).devices
    assert dev.network["name"] == "cnidra-ns.ns.n" and dev.network["disableCheck"] is True


@pytest.mark.parametrize(
    "change",
    [
        {"config": {"plugins": [{"type": "macvlan", "master": "eth0"}]}},  # override
        {"config": {"plugins": None}},  # remove
        {"config": {"name": "mine"}},
    ],
)
def test_what_the_class_sets_a_claim_can_neither_change_nor_remove(change: Any) -> None:
    configs = class_then_claim({"ifName": "net2", **change})
    with pytest.raises(PrepareError, match="is set by the DeviceClass") as info:
        resolve_claim(claim(configs), REF, "n1", DIRS, VIEW)
    assert "config[2].opaque.parameters.config" in str(info.value)


def test_the_primary_networks_name_is_only_a_label() -> None:
    c = claim()
    c["status"]["allocation"]["devices"]["config"][1]["opaque"]["parameters"]["config"]["name"] = (
        "k8s-pod-network"
    )
    [dev] = resolve_claim(c, REF, "n1", DIRS, VIEW).devices
    assert dev.network["name"] == "cnidra-ns.ns.k8s-pod-network"
    assert dev.network_label == "k8s-pod-network"


def test_a_state_directory_in_the_claim_is_refused() -> None:
    c = claim()
    plugin = c["status"]["allocation"]["devices"]["config"][1]["opaque"]["parameters"]["config"][
        "plugins"
    ][0]
    plugin["ipam"] = {"type": "host-local", "subnet": "198.18.0.0/24", "dataDir": "/etc"}
    with pytest.raises(PrepareError, match=r"plugins\[0\]\.ipam\.dataDir: is chosen by cnidra"):
        resolve_claim(c, REF, "n1", DIRS, VIEW)


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


def limited(tmp_path: Path) -> tuple[Checkpoint, Preparer]:
    """Claims a and b of one pod, two interfaces each, a limit of three per pod."""
    cp = Checkpoint(StateLayout(tmp_path))
    claims = Claims(named("a", "u-a", 2), named("b", "u-b", 2))
    return cp, Preparer("n1", claims, cp, DIRS, max_attachments=3, view=lambda: VIEW)


async def test_prepare_refuses_more_interfaces_per_pod_than_the_limit(tmp_path: Path) -> None:
    cp, preparer = limited(tmp_path)
    await preparer.prepare(ObjectRef("ns", "a", "u-a"))
    with pytest.raises(PrepareError, match="would get 4 cnidra interfaces; at most 3 per pod"):
        await preparer.prepare(ObjectRef("ns", "b", "u-b"))
    assert cp.get("u-b") is None


async def test_the_limit_counts_the_claims_of_one_batch_written_together(tmp_path: Path) -> None:
    """A kubelet batch is checkpointed concurrently; the limit still sees the whole batch."""
    cp, preparer = limited(tmp_path)
    first, second = await preparer.prepare_batch(
        [ObjectRef("ns", "a", "u-a"), ObjectRef("ns", "b", "u-b")]
    )
    assert isinstance(first, PreparedClaim) and cp.get("u-a") is not None
    assert isinstance(second, PrepareError) and "would get 4 cnidra interfaces" in str(second)
    assert cp.get("u-b") is None
    # prepared again as one batch (kubelet after a restart): not counted twice
    again = await preparer.prepare_batch([ObjectRef("ns", "a", "u-a")])
    assert isinstance(again[0], PreparedClaim)


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
            lambda c: c["status"]["allocation"]["devices"]["config"][1]["opaque"]["parameters"][
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
        resolve_claim(bad, REF, "n1", DIRS, VIEW)
    assert fragment in str(info.value)


def test_duplicate_ifnames_within_a_claim() -> None:
    results = [{"request": r, "driver": DRIVER, "pool": "n1", "device": "eth1"} for r in ("a", "b")]
    configs = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params()}}]
    resolved = resolve_claim(claim(configs, results), REF, "n1", DIRS, VIEW)
    with pytest.raises(NamingError, match="interface name 'net1' is already used by claim"):
        name_pod_interfaces([resolved], [])


def test_other_drivers_devices_and_configs_are_ignored() -> None:
    c = claim()
    c["status"]["allocation"]["devices"]["results"].append(
        {"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "g0"}
    )
    c["status"]["allocation"]["devices"]["config"].append(
        {"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": {"x": 1}}}
    )
    assert [d.request for d in resolve_claim(c, REF, "n1", DIRS, VIEW).devices] == ["net"]


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


async def test_a_batch_is_checkpointed_with_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch is one frame of the checkpoint's log, fsynced once; no claim's file and not
    their directory (cnidra.state.store)."""
    import os

    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")) else "file")
        real(fd)

    cp = Checkpoint(StateLayout(tmp_path))  # its log made, once
    monkeypatch.setattr(os, "fsync", fsync)
    await cp.put_many([prepared(f"u{i}", f"c{i}", ("pod",)) for i in range(5)])
    assert synced == ["file"]
    assert len(Checkpoint(StateLayout(tmp_path)).for_pod("pod")) == 5


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


def test_the_network_is_bound_to_the_allocated_link() -> None:
    c = claim()
    plugin = c["status"]["allocation"]["devices"]["config"][1]["opaque"]["parameters"]["config"][
        "plugins"
    ][0]
    del plugin["master"]
    [dev] = resolve_claim(c, REF, "n1", DIRS, VIEW).devices
    assert dev.network["plugins"][0]["master"] == "eth1" and dev.parent == "eth1"
    plugin["master"] = "eth0"  # the node's uplink, while the scheduler allocated eth1
    with pytest.raises(PrepareError, match=r"names 'eth0', but the scheduler allocated 'eth1'"):
        resolve_claim(c, REF, "n1", DIRS, VIEW)


def test_a_link_that_carries_the_node_needs_a_class_that_names_it() -> None:
    view = NodeView(links={"eth1": "eth1"}, protected=frozenset({"eth1"}))
    with pytest.raises(PrepareError, match="carries the node itself"):
        resolve_claim(claim(), REF, "n1", DIRS, view)
    c = claim()
    c["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["nodeLinks"] = [
        "eth1"
    ]
    [dev] = resolve_claim(c, REF, "n1", DIRS, view).devices
    assert dev.node_link_allowed


def test_a_device_that_is_no_link_of_this_node_is_refused() -> None:
    with pytest.raises(PrepareError, match="not a link or network of this node"):
        resolve_claim(claim(), REF, "n1", DIRS, NodeView())


def test_a_config_nested_thousands_deep_is_refused_without_recursion() -> None:
    deep: dict[str, Any] = {}
    for _ in range(5000):
        deep = {"x": deep}
    c = claim()
    c["status"]["allocation"]["devices"]["config"][1]["opaque"]["parameters"]["config"] = deep
    with pytest.raises(PrepareError, match="nested more than 32 levels"):
        resolve_claim(c, REF, "n1", DIRS, VIEW)


class Labels:
    def __init__(self, labels: dict[str, str] | None) -> None:
        self.value = labels

    async def labels(self, namespace: str) -> dict[str, str] | None:
        return self.value


async def test_a_namespace_selector_is_checked_against_the_namespace_labels(
    tmp_path: Path,
) -> None:
    c = claim()
    c["metadata"]["name"] = "c"
    c["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"][
        "namespaceSelector"
    ] = {"matchLabels": {"networks": "self-service"}}
    cp = Checkpoint(StateLayout(tmp_path))
    allowed = Labels({"networks": "self-service"})
    preparer = Preparer("n1", Claims(c), cp, DIRS, view=lambda: VIEW, namespaces=allowed)
    assert (await preparer.prepare(REF)).devices
    await preparer.unprepare(REF)
    for unknown in (Labels({}), Labels(None)):
        preparer = Preparer("n1", Claims(c), cp, DIRS, view=lambda: VIEW, namespaces=unknown)
        with pytest.raises(PrepareError, match="may not define its network"):
            await preparer.prepare(REF)


SUBNET = {"subnet": "198.18.9.0/24"}


class Networks:
    """A NetworkLookup with nothing to read again: the view's networks stand."""

    async def catalog(self, refs: Any) -> StaticCatalog:
        return StaticCatalog()

    async def refresh(self, network: NamedNetwork) -> NamedNetwork:
        return network


async def test_a_network_devices_namespace_selector_reads_the_namespace_labels(
    tmp_path: Path,
) -> None:
    """A claim with no config, allocated the device of a CNINetwork that selects namespaces by
    label: the labels are read (no CNIPolicy asks for them) and decide."""
    data = cninetwork(
        {
            "metadata": {"name": "data"},
            "spec": {
                "config": {
                    "type": "macvlan",
                    "ipam": {"type": "host-local", "subnet": "198.18.9.0/24"},
                },
                "namespaceSelector": {"matchLabels": {"tier": "data"}},
            },
        }
    )
    assert isinstance(data, NamedNetwork)
    view = NodeView(links={"net-data": "eth1"}, networks={"net-data": data})
    results = [{"request": "net", "driver": DRIVER, "pool": "n1", "device": "net-data"}]
    c = claim(configs=[], results=results)
    c["metadata"]["name"] = "c"
    for labels, ok in (({"tier": "data"}, True), ({}, False)):
        cp = Checkpoint(StateLayout(tmp_path / str(ok)))
        preparer = Preparer(
            "n1",
            Claims(c),
            cp,
            DIRS,
            view=lambda: view,
            namespaces=Labels(labels),
            networks=Networks(),
        )
        if ok:
            [dev] = (await preparer.prepare(REF)).devices
            assert (dev.if_name, dev.parent) == ("net1", "eth1")
        else:
            with pytest.raises(PrepareError, match="namespaceSelector does not select ns"):
                await preparer.prepare(REF)


def test_a_device_of_a_pool_that_is_not_this_nodes_is_refused() -> None:
    """A slice another principal published (or another node's) may name a device this node
    also has: only this node's pool is its devices."""
    c = claim()
    c["status"]["allocation"]["devices"]["results"][0]["pool"] = "n2"
    with pytest.raises(PrepareError, match=r"pool 'n2', which is not this node's \('n1'\)"):
        resolve_claim(c, REF, "n1", DIRS, VIEW)


def admin_network(config: dict[str, Any]) -> NamedNetwork:
    made = cninetwork({"metadata": {"name": "uplink"}, "spec": {"config": config}})
    assert isinstance(made, NamedNetwork) and made.trusted
    return made


def test_a_claim_cannot_aim_an_admins_network_at_the_link_it_was_allocated() -> None:
    """A CNINetwork's trusted config (here with ipMasq and isGateway, which no claim may set)
    runs where its admin bound it: a claim on the default class that references it by name
    and was allocated some link does not get it bound there."""
    trusting = {"cniVersion": "1.0.0", "name": "uplink"}
    cases = [
        ({"type": "bridge", "isGateway": True, "ipMasq": True}, "names no bridge"),
        ({"type": "macvlan", "master": "eth2"}, "master is 'eth2'"),
    ]
    reference = [
        {
            "source": "FromClaim",
            "requests": ["net"],
            "opaque": {
                "driver": DRIVER,
                "parameters": params(config=None, network={"name": "uplink"}),
            },
        }
    ]
    for plugin, why in cases:
        network = admin_network({**trusting, "plugins": [plugin]})
        known = StaticCatalog({"CNINetwork uplink": network})
        with pytest.raises(PrepareError, match=why + ".*cannot aim it at link 'eth1'"):
            resolve_claim(claim(reference), REF, "n1", DIRS, VIEW, catalog=known)
    # bound by its own config to the very link allocated: that is where the admin meant
    network = admin_network({**trusting, "plugins": [{"type": "macvlan", "master": "eth1"}]})
    known = StaticCatalog({"CNINetwork uplink": network})
    [dev] = resolve_claim(claim(reference), REF, "n1", DIRS, VIEW, catalog=known).devices
    assert dev.parent == "eth1"
    # through the network's own device, the admin's binding stands as published
    results = [{"request": "net", "driver": DRIVER, "pool": "n1", "device": "net-uplink"}]
    bridge = admin_network({**trusting, "plugins": [{"type": "bridge", "isGateway": True}]})
    view = NodeView(links={"net-uplink": "eth2"}, networks={"net-uplink": bridge})
    [dev] = resolve_claim(claim([], results), REF, "n1", DIRS, view).devices
    assert dev.network["plugins"][0]["bridge"] == "eth2"


async def test_a_claim_prepared_anew_is_told_once_for_its_event(tmp_path: Path) -> None:
    from cnidra.agent.driver import prepared_message

    _, preparer = limited(tmp_path)
    told: list[PreparedClaim] = []
    preparer.on_prepared = told.append
    await preparer.prepare_batch([ObjectRef("ns", "a", "u-a")])
    await preparer.prepare_batch([ObjectRef("ns", "a", "u-a")])  # kubelet again: no new event
    assert [c.uid for c in told] == ["u-a"]
    message = prepared_message(told[0], "node-a")
    assert message.startswith("Prepared on node node-a: request ")
    assert " as " in message and " on " in message
    # and an unprepare that removed it is told (the bandwidth keeper counts grants until then)
    gone: list[ObjectRef] = []
    preparer.on_unprepared = gone.append
    await preparer.unprepare(ObjectRef("ns", "a", "u-a"))
    await preparer.unprepare(ObjectRef("ns", "a", "u-a"))  # nothing left: not told again
    assert [r.uid for r in gone] == ["u-a"]


async def test_claims_unprepared_together_are_one_change_of_the_checkpoint(tmp_path: Path) -> None:
    """NodeUnprepareResources' claims forgotten together: one frame of the checkpoint's log
    for all of them (not one per claim), each told once, a claim not prepared left alone."""
    from cnidra.state import store as store_module

    cp = Checkpoint(StateLayout(tmp_path))
    claims = Claims(*(named(n, f"u-{n}", 1) for n in "abc"))
    preparer = Preparer("n1", claims, cp, DIRS, view=lambda: VIEW)
    refs = [ObjectRef("ns", n, f"u-{n}") for n in "abc"]
    await preparer.prepare_batch(refs)
    frames = len(store_module._frames(cp.log_path.read_bytes()))
    gone: list[ObjectRef] = []
    preparer.on_unprepared = gone.append
    await preparer.unprepare_batch([*refs, ObjectRef("ns", "never", "u-never")])
    logged = store_module._frames(cp.log_path.read_bytes())
    assert len(logged) == frames + 1
    assert sorted(logged[-1]["remove"]) == ["u-a", "u-b", "u-c"]
    assert [r.name for r in gone] == ["a", "b", "c"]
    assert len(cp) == 0 and len(Checkpoint(StateLayout(tmp_path))) == 0


async def test_a_claim_whose_interfaces_cannot_be_removed_stays_the_others_are_forgotten(
    tmp_path: Path,
) -> None:
    from cnidra._proto.dra.v1 import api_pb2 as dra
    from cnidra.dra.plugin import DRAService

    cp = Checkpoint(StateLayout(tmp_path))
    claims = Claims(*(named(n, f"u-{n}", 1) for n in "abc"))
    preparer = Preparer("n1", claims, cp, DIRS, view=lambda: VIEW)
    refs = [ObjectRef("ns", n, f"u-{n}") for n in "abc"]
    await preparer.prepare_batch(refs)
    order: list[str] = []

    async def before(ref: ObjectRef) -> None:
        order.append(ref.name)
        if ref.name == "b":
            raise RuntimeError("interfaces of claim ns/b in sandbox 1234 are still being removed")

    service = DRAService(preparer, before_unprepare=before)
    request = dra.NodeUnprepareResourcesRequest(
        claims=[dra.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
    )
    answer = await service.node_unprepare_resources(request, None)
    assert order == ["a", "b", "c"]  # one claim at a time, in kubelet's order
    assert {uid: a.error for uid, a in answer.claims.items()} == {
        "u-a": "",
        "u-b": "claim ns/b: interfaces of claim ns/b in sandbox 1234 are still being removed",
        "u-c": "",
    }
    assert [c.uid for c in cp.all()] == ["u-b"]
