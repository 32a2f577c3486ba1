"""bench.fleet's pure parts, without a control plane: the synthetic inventory through the
driver's own publisher, dra-example-driver's slice shape, the claims and pods, the figures and
the last line's shape, the request counting, and the test bed's command lines left as they
were."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench import fleet
from cnidra.api.constants import DRIVER_NAME
from cnidra.api.networks import cninetwork
from cnidra.api.validate import validate_documents
from cnidra.dra import ahead
from cnidra.inventory.slices import MAX_ATTRIBUTES, MAX_DEVICES_PER_SLICE
from cnidra.kube.api import Node, Pod, Resource, ResourceClaim, ResourceSlice
from testbed import components
from testbed.layout import APISERVER_PORT, ETCD_CLIENT, ETCD_PEER, Bins, Paths

ROOT = Path(__file__).parents[2]
OWNER = {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u", "controller": True}


def shaped(kind: Resource, obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` is an object of `kind` as the apiserver takes it: its apiVersion and kind when
    given, a name and a spec."""
    assert obj.get("apiVersion", kind.api_version) == kind.api_version
    assert obj.get("kind", kind.kind) == kind.kind
    assert obj["metadata"]["name"]
    assert isinstance(obj.get("spec"), dict)
    return obj


class RecordingClient:
    """What the publisher writes (server-side apply), kept instead of sent."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    async def patch(self, kind: Any, name: str, body: Any, **kwargs: Any) -> Any:
        assert kwargs["patch_type"] == "apply" and kwargs["force"]
        self.applied.append(dict(body))
        return body

    async def delete(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("nothing to delete on a first publish")


def served() -> list[tuple[str, Any]]:
    out = []
    for obj in fleet.cninetworks():
        network = cninetwork(obj)
        assert not hasattr(network, "message"), network
        out.append((obj["metadata"]["name"], network))
    return out


async def publish(index: int, tmp_path: Path, addresses: int = 240) -> list[dict[str, Any]]:
    """One fake node's slices as the driver's SlicePublisher writes them."""
    client = RecordingClient()
    name = fleet.node_name(index)
    links = fleet.node_links(index, fleet.node_ip(index))

    async def capacity(_: str) -> int:
        return addresses

    publisher = fleet.FleetPublisher(
        client,  # type: ignore[arg-type]
        fleet.SliceSettings(name),
        [str(fleet.plugin_dir(tmp_path))],
        fleet.LinkFilter(),
        links=fleet.constant(links),
        networks=fleet.StaticNetworks(served()),
        pool_capacity=capacity,
    )
    publisher.node_ips = (fleet.node_ip(index),)
    publisher.node_known = True
    assert await publisher.publish_if_changed(OWNER)
    return client.applied


def attribute(device: dict[str, Any], name: str) -> Any:
    value = device["attributes"].get(name)
    return None if value is None else next(iter(value.values()))


async def test_the_synthetic_inventory_publishes_a_realistic_mix(tmp_path: Path) -> None:
    counts = []
    fast_lane = 0
    for index in range(40):
        slices = await publish(index, tmp_path)
        assert len(slices) == 1
        spec = slices[0]["spec"]
        assert spec["driver"] == DRIVER_NAME and spec["nodeName"] == fleet.node_name(index)
        devices = {d["name"]: d for d in spec["devices"]}
        links = [d for d in devices.values() if attribute(d, "type") != "network"]
        networks = [d for d in devices.values() if attribute(d, "type") == "network"]
        counts.append(len(links))
        # never published: loopback, the node's own NIC, the primary bridge, pods' veths
        names = {attribute(d, "ifName") for d in links}
        assert not names & {"lo", "eth0", "cni0"}
        assert not any(n.startswith("veth") for n in names)
        assert {"ens2f0", "ens2f1"} <= names
        ens2f0 = devices["ens2f0"]
        assert attribute(ens2f0, "cniMacvlan") is True
        assert attribute(ens2f0, "nodeLink") is False
        assert attribute(ens2f0, "pciVendor") == "0x15b3"
        assert attribute(ens2f0, "resource.kubernetes.io/pcieRoot") == "pci0000:3b"
        assert ens2f0["capacity"]["subInterfaces"]["value"] == "64"
        assert ens2f0["allowMultipleAllocations"] is True
        served_here = {attribute(d, "network") for d in networks}
        assert {"storage", "tenant-data"} <= served_here
        assert ("fast-lane" in served_here) == ("ens3f0" in names)
        fast_lane += "fast-lane" in served_here
        pool = devices["net-tenant-data"]
        assert attribute(pool, "ipPool") == fleet.POOL
        assert pool["capacity"]["addresses"]["value"] == "240"
        for device in devices.values():
            assert len(device["attributes"]) + len(device.get("capacity", {})) <= MAX_ATTRIBUTES
        assert len(devices) <= MAX_DEVICES_PER_SLICE
        assert shaped(ResourceSlice, slices[0])["spec"]
    assert min(counts) == 4 and max(counts) == 8
    assert 0 < fast_lane < 40


async def test_the_inventory_is_the_same_on_every_run(tmp_path: Path) -> None:
    assert await publish(7, tmp_path) == await publish(7, tmp_path)
    assert fleet.node_links(7, "10.0.0.1", seed=1) != fleet.node_links(7, "10.0.0.1", seed=2)


def test_dra_example_driver_slice_shape() -> None:
    obj = fleet.example_slice("fleet-00003", "uid-3")
    spec = obj["spec"]
    assert spec["driver"] == fleet.EXAMPLE_DRIVER
    assert spec["pool"] == {"name": "fleet-00003", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]
    for i, device in enumerate(spec["devices"]):
        assert set(device["attributes"]) == {"index", "uuid", "model", "driverVersion"}
        assert device["attributes"]["index"] == {"int": i}
        assert device["attributes"]["driverVersion"] == {"version": "1.0.0"}
        assert device["attributes"]["uuid"]["string"].startswith("gpu-")
        assert device["capacity"] == {"memory": {"value": "80Gi"}}
    assert len({d["attributes"]["uuid"]["string"] for d in spec["devices"]}) == 8
    assert fleet.example_slice("fleet-00003", "x")["spec"] == spec  # uuids stable
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-3"
    shaped(ResourceSlice, obj)


def test_claims_and_pods() -> None:
    cnidra = fleet.claim_object("c0", DRIVER_NAME, "t")
    request = cnidra["spec"]["devices"]["requests"][0]["exactly"]
    assert request["deviceClassName"] == fleet.CNIDRA_CLASS
    assert 'ifName == "ens2f0"' in request["selectors"][0]["cel"]["expression"]
    assert request["capacity"] == {"requests": {"subInterfaces": "1"}}
    # the claim is one cnidra accepts, with the DeviceClass it is made for
    classes = list(yaml.safe_load_all((ROOT / "deploy" / "deviceclass.yaml").read_text()))
    reports = validate_documents([cnidra], policy_docs=classes)
    assert reports[0].skipped is None and len(reports[0].resolved) == 1
    assert not reports[0].issues.errors, reports[0].issues.errors
    example = fleet.claim_object("c1", fleet.EXAMPLE_DRIVER, "t")
    assert example["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": fleet.EXAMPLE_DRIVER
    }
    for obj in (cnidra, example):
        assert obj["metadata"]["labels"] == {fleet.ROUND_LABEL: "t"}
        shaped(ResourceClaim, obj)
    pod = fleet.pod_object("p0", "fleet-00001", "c0", "t")
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "fleet-00001"}
    assert pod["spec"]["resourceClaims"] == [{"name": "dev", "resourceClaimName": "c0"}]
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "dev"}]
    shaped(Pod, pod)


def test_claims_ahead_pods_are_what_the_read_ahead_reads() -> None:
    """The pods bound to the measured node, with claims as the scheduler leaves them: the
    read-ahead (cnidra.dra.ahead) reads each pod's claim and keeps it."""
    pod = fleet.bound_pod_object("ahead-n0001", "fleet-00007", "ahead-n0001", fleet.AHEAD_TAG)
    assert pod["spec"]["nodeName"] == "fleet-00007"
    assert "nodeSelector" not in pod["spec"]
    assert ahead.claim_names(pod) == ["ahead-n0001"]
    shaped(Pod, pod)
    claim = fleet.claim_object("ahead-n0001", DRIVER_NAME, fleet.AHEAD_TAG)
    status = fleet.reserved_status("ahead-n0001", "fleet-00007", "ahead-n0001", "uid-1")
    result = status["status"]["allocation"]["devices"]["results"][0]
    assert result["request"] == claim["spec"]["devices"]["requests"][0]["name"]
    assert result["driver"] == DRIVER_NAME
    with_status = {**claim, "status": status["status"]}
    assert ahead._reserved_for(with_status, "uid-1")
    assert not ahead._reserved_for(with_status, "uid-2")
    shaped(ResourceClaim, with_status)


def test_nodes() -> None:
    obj = fleet.node_object("fleet-00002", fleet.node_ip(2), "2026-01-01T00:00:00Z")
    assert obj["metadata"]["labels"]["kubernetes.io/hostname"] == "fleet-00002"
    assert obj["status"]["conditions"][0]["type"] == "Ready"
    assert obj["status"]["addresses"][0] == {"type": "InternalIP", "address": "198.18.0.3"}
    shaped(Node, obj)
    assert len({fleet.node_ip(i) for i in range(5000)}) == 5000


def test_percentile() -> None:
    values = [float(v) for v in range(1, 101)]
    assert fleet.percentile(values, 0.5) == pytest.approx(50.5)
    assert fleet.percentile(values, 0.99) == pytest.approx(99.01)
    assert fleet.percentile(list(reversed(values)), 0.0) == 1.0
    assert fleet.percentile(values, 1.0) == 100.0
    assert fleet.percentile([3.0], 0.99) == 3.0
    assert math.isnan(fleet.percentile([], 0.5))


@pytest.mark.parametrize(
    ("method", "path", "query", "content_type", "kind"),
    [
        ("GET", "/apis/cni.networking.x-k8s.io/v1alpha1/cninetworks", "watch=true", "",
         "WATCH cninetworks"),
        ("GET", "/apis/cni.networking.x-k8s.io/v1alpha1/cninetworks", "", "", "LIST cninetworks"),
        ("GET", "/apis/cni.networking.x-k8s.io/v1alpha1/cniippools/p", "", "", "GET cniippools"),
        ("GET", "/apis/k8s.cni.cncf.io/v1alpha1/ipamclaims", "labelSelector=x", "",
         "LIST ipamclaims"),
        ("PATCH", "/apis/resource.k8s.io/v1/resourceslices/n-cni-dra-0", "force=true",
         "application/apply-patch+yaml", "APPLY resourceslices"),
        ("GET", "/api/v1/nodes/fleet-00001", "", "", "GET nodes"),
        ("GET", "/api/v1/namespaces/default/pods", "watch=1", "", "WATCH pods"),
        ("PUT", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status", "", "",
         "UPDATE resourceclaims/status"),
        ("POST", "/apis/resource.k8s.io/v1/resourceslices", "dryRun=All", "",
         "CREATE resourceslices"),
    ],
)  # fmt: skip
def test_request_kind(method: str, path: str, query: str, content_type: str, kind: str) -> None:
    assert fleet.request_kind(method, path, query, content_type) == kind


def test_per_node_per_minute() -> None:
    assert fleet.per_node_per_minute(150, 50, 60.0) == 3.0
    assert fleet.per_node_per_minute(30, 10, 300.0) == pytest.approx(0.6)
    assert math.isnan(fleet.per_node_per_minute(1, 0, 60.0))


async def test_requests_are_counted_by_the_hook() -> None:
    log = fleet.RequestLog()

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    async with (
        TestServer(app) as server,
        aiohttp.ClientSession(trace_configs=[log.tracer("fleet-00001")]) as http,
    ):
        base = str(server.make_url("/apis/cni.networking.x-k8s.io/v1alpha1"))
        async with http.get(f"{base}/cninetworks?watch=true") as response:
            await response.read()
        async with http.get(f"{base}/cniipblocks") as response:
            await response.read()
    assert [(n, k) for _, n, k in log.entries] == [
        ("fleet-00001", "WATCH cninetworks"),
        ("fleet-00001", "LIST cniipblocks"),
    ]
    assert log.between(0.0, float("inf")) == {"WATCH cninetworks": 1, "LIST cniipblocks": 1}
    assert not log.between(0.0, log.entries[0][0])


def test_the_driver_client_gets_the_hook(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    client = fleet.counted_client(config, fleet.RequestLog(), "n", 10.0)
    # one session carries the requests and the watches: a watch started again at rest is
    # counted too
    assert len(client.trace_configs) == 1


def detail() -> dict[str, Any]:
    schedule = {
        "allocated_p50_ms": 12.5,
        "allocated_p99_ms": 40.0,
        "bound_p50_ms": 20.0,
        "bound_p99_ms": 50.0,
    }
    return {
        "nodes": 50,
        "cnidra": {"slices": 50, "slice_bytes_per_node": 4328},
        "idle": {"requests_per_node_per_min": 3.2},
        "schedule": {"cnidra": schedule, "dra_example": {**schedule, "allocated_p99_ms": 30.0}},
        "apiserver": {"rss_mib_cnidra_fleet": 310.5},
    }


def test_the_last_line() -> None:
    line = fleet.summary(detail())
    assert tuple(line) == fleet.SUMMARY_KEYS
    assert set(line) == {
        "nodes",
        "slices",
        "slice_bytes_per_node",
        "idle_requests_per_node_per_min",
        "schedule_p50_ms",
        "schedule_p99_ms",
        "dra_example_schedule_p99_ms",
        "apiserver_rss_mib",
        "claims_ahead_vmrss_mib",
        "claims_ahead_added_rssanon_mib",
        "claims_ahead_requests_per_min",
    }
    assert line["claims_ahead_vmrss_mib"] is None  # --ahead-pods 0: not measured
    measured = detail()
    measured["claims_ahead"] = {
        "vmrss_mib": 40.2,
        "added_rssanon_mib": 0.7,
        "rest_requests_per_min": 0.0,
    }
    got = fleet.summary(measured)
    assert got["claims_ahead_vmrss_mib"] == 40.2
    assert got["claims_ahead_added_rssanon_mib"] == 0.7
    assert got["claims_ahead_requests_per_min"] == 0.0
    assert line["schedule_p99_ms"] == 40.0 and line["dra_example_schedule_p99_ms"] == 30.0
    assert json.loads(json.dumps(line)) == line


def test_free_ports_are_distinct_and_never_the_test_beds() -> None:
    ports = fleet.free_ports(8)
    assert len(set(ports)) == 8
    assert not set(ports) & fleet.RESERVED_PORTS
    assert {APISERVER_PORT, 23790, 23800} <= fleet.RESERVED_PORTS


def test_the_test_beds_command_lines_are_unchanged() -> None:
    """bench.fleet parametrizes the test bed's command lines; their defaults stay the test
    bed's own paths and ports."""
    bins = Bins(*(Path(f"/bins/{n}") for n in "abcdefg"))
    etcd = components.etcd_argv(bins)
    assert f"http://{ETCD_CLIENT}" in etcd and f"testbed=http://{ETCD_PEER}" in etcd
    assert str(Paths.pki.parent / "etcd") in etcd
    api = components.apiserver_argv(bins)
    assert f"--secure-port={APISERVER_PORT}" in api
    assert f"--etcd-servers=http://{ETCD_CLIENT}" in api
    assert f"--client-ca-file={Paths.pki / 'ca.crt'}" in api
    assert components.scheduler_argv(bins)[1] == f"--kubeconfig={Paths.etc}/scheduler.kubeconfig"
    other = components.apiserver_argv(bins, pki=Path("/p"), etcd="127.0.0.1:1", port=2)
    assert "--secure-port=2" in other and "--client-ca-file=/p/ca.crt" in other


ATTEMPT = "scheduler_scheduling_attempt_duration_seconds"
PLUGIN = "scheduler_plugin_execution_duration_seconds"
DRA = 'plugin="DynamicResources"'
METRICS = "\n".join(
    [
        f"# HELP {ATTEMPT} [STABLE] Scheduling attempt latency in seconds",
        f'{ATTEMPT}_bucket{{profile="p",result="scheduled",le="0.001"}} 1',
        f'{ATTEMPT}_sum{{profile="p",result="scheduled"}} 0.5',
        f'{ATTEMPT}_count{{profile="p",result="scheduled"}} 10',
        f'{ATTEMPT}_sum{{profile="p",result="unschedulable"}} 9',
        f'{ATTEMPT}_count{{profile="p",result="unschedulable"}} 1',
        f'{PLUGIN}_sum{{extension_point="Filter",{DRA},status="Success"}} 0.02',
        f'{PLUGIN}_count{{extension_point="Filter",{DRA},status="Success"}} 4',
        f'{PLUGIN}_sum{{extension_point="Filter",{DRA},status="Unschedulable"}} 0.01',
        f'{PLUGIN}_count{{extension_point="Filter",{DRA},status="Unschedulable"}} 1',
        f'{PLUGIN}_sum{{extension_point="PreBind",{DRA},status="Success"}} 0.3',
        f'{PLUGIN}_count{{extension_point="PreBind",{DRA},status="Success"}} 3',
        f'{PLUGIN}_sum{{extension_point="Filter",plugin="NodeAffinity",status="Success"}} 7',
        f'{PLUGIN}_count{{extension_point="Filter",plugin="NodeAffinity",status="Success"}} 7',
    ]
)


def test_the_schedulers_own_histograms() -> None:
    before = fleet.scheduler_times("")
    after = fleet.scheduler_times(METRICS)
    assert after["attempt_ms"] == {"": (0.5, 10.0)}
    assert after["dra_plugin_ms"] == {"Filter": (0.03, 5.0), "PreBind": (0.3, 3.0)}
    assert after["prebind_ms"] == {}
    totals: dict[str, tuple[float, float]] = {}
    fleet.histogram_delta(before["attempt_ms"], after["attempt_ms"], totals)
    fleet.histogram_delta(before["attempt_ms"], after["attempt_ms"], totals)  # a second round
    assert fleet.means_ms(totals) == {"all": 50.0}
    assert fleet.means_ms(fleet.histogram_delta({}, after["dra_plugin_ms"])) == {
        "Filter": 6.0,
        "PreBind": 100.0,
    }
    assert fleet.means_ms(fleet.histogram_delta(after["attempt_ms"], after["attempt_ms"])) == {}


def test_a_figure_not_measured_is_null() -> None:
    unmeasured = detail()
    unmeasured["schedule"]["cnidra"]["allocated_p99_ms"] = float("nan")
    line = fleet.summary(unmeasured)
    assert line["schedule_p99_ms"] is None
    assert json.dumps(line, allow_nan=False)
    assert fleet.finite({"a": [1.0, float("inf")], "b": (float("nan"),)}) == {
        "a": [1.0, None],
        "b": [None],
    }


def test_pods_are_spread_within_what_a_node_has() -> None:
    rng = fleet.random.Random(1)
    nodes = [fleet.node_name(i) for i in range(5)]
    picked = fleet.pick_nodes(nodes, 40, rng)  # every GPU of the fleet
    assert sorted(picked) == sorted(nodes * fleet.GPUS)
    many = [fleet.node_name(i) for i in range(1000)]
    assert len(set(fleet.pick_nodes(many, 100, rng))) > 90
    with pytest.raises(ValueError):
        fleet.pick_nodes(nodes * 10, 41, rng)
    with pytest.raises(ValueError):
        fleet.pick_nodes(nodes, 41, rng)
    with pytest.raises(SystemExit):
        fleet.main(["--nodes", "5", "--pods", "41"])


def test_pool_accounting_costs_nothing_at_rest_and_coalesces_allocations() -> None:
    from bench import fleet_pools

    result = fleet_pools.measure(pools=5, nodes=20, blocks_per_node=2, allocations=200)
    assert result["blocks"] == 40
    assert result["at_rest_requests_per_min"] == 0  # FailedScheduling with no pool exhausted
    assert result["startup_requests"]["PATCH cniipblocks/status"] == 40
    # 200 allocations between two flushes: at most a write per block and per pool
    assert sum(result["burst_requests"].values()) <= 40 + 5
    # one allocation an interval, each written once it settled (a block's and a pool's write;
    # fewer when the same block changed at the next interval too)
    assert 1.5 < result["one_allocation_per_interval_requests_per_allocation"] <= 2.0
    assert result["accountant_memory_bytes"] > 0
    assert "pool accounting: 5 pools, 20 nodes, 40 blocks" in fleet_pools.report(result)


@pytest.mark.slow
def test_pool_accounting_on_a_real_apiserver() -> None:
    """`--pool-accounting --control-plane` at a small size, on the fleet's own etcd and
    kube-apiserver (the test bed's build): nothing at rest, the FailedScheduling Events
    ignored without a call, a burst written once per changed block and per pool, and every
    pool's status following within an interval or so."""
    from bench import fleet_pools_apiserver

    bins = Bins.locate()
    if not (bins.k8s / "kube-apiserver").exists():
        pytest.skip("no built control plane (testbed/build.sh)")
    plane = fleet.ControlPlane(bins)
    try:
        plane.start()
        result = asyncio.run(
            fleet_pools_apiserver.run(
                plane,
                pools=3,
                nodes=10,
                blocks_per_node=2,
                allocations=30,
                interval=0.5,
                rest_seconds=1.0,
                events=20,
                singles=2,
            )
        )
    finally:
        plane.stop()
    assert result["blocks"] == 20
    assert result["startup"]["requests"]["APPLY cniippools/status"] == 3
    rest = result["at_rest"]
    assert rest["requests"] == {}
    assert rest["events_ignored_by_the_accountant"] == rest["failed_scheduling_events"] == 20
    burst = result["burst"]
    assert burst["requests"]["APPLY cniipblocks/status"] == burst["blocks_written"] <= 20
    # coalesced: each pool written once per accountant tick that saw a change, and the writers'
    # flush spans 1 + flush/interval ticks (two when it straddles one, more on a loaded machine:
    # 6 writes were seen with the flush beside three other test runs), plus the tick after it
    ticks = 2 + int(burst["writers_flush_s"] / 0.5)
    assert burst["requests"]["APPLY cniippools/status"] <= 3 * ticks, burst
    assert all(s < 5 for s in result["one_allocation"]["seconds_until_pool_status"])
    assert "pool accounting on a real apiserver: 3 pools, 10 nodes, 20 blocks" in (
        fleet_pools_apiserver.report(result)
    )


class PlacingClient:
    """What place_claims_ahead sends: creates (a made pod gets a UID) and status applies."""

    def __init__(self) -> None:
        self.created: list[Any] = []
        self.patched: list[tuple[Any, str, dict[str, Any], dict[str, Any]]] = []

    async def create(self, kind: Any, obj: Any) -> Any:
        obj = {**obj, "metadata": dict(obj["metadata"])}
        self.created.append((kind, obj))
        if kind == Pod:
            obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}"
        return obj

    async def patch(self, kind: Any, name: str, body: dict[str, Any], **kwargs: Any) -> None:
        self.patched.append((kind, name, body, kwargs))


async def test_claims_ahead_are_placed_on_the_node_and_elsewhere() -> None:
    client = PlacingClient()
    nodes = [fleet.node_name(i) for i in range(4)]
    placed = await fleet.place_claims_ahead(
        client,  # type: ignore[arg-type]
        nodes,
        nodes[-1],
        5,
        2,
    )
    assert placed["pods_on_node"] == 5 and placed["pods_elsewhere"] == 6
    pods = [o for k, o in client.created if k == Pod]
    claims = [o for k, o in client.created if k == ResourceClaim]
    assert len(pods) == len(claims) == 11
    on_node = [p for p in pods if p["spec"]["nodeName"] == nodes[-1]]
    assert len(on_node) == 5
    assert {p["spec"]["nodeName"] for p in pods} == set(nodes)
    assert all(p["metadata"]["labels"][fleet.ROUND_LABEL] == fleet.AHEAD_TAG for p in pods)
    # only the node's own claims are allocated and reserved, each for its pod's UID
    assert len(client.patched) == 5
    for kind, name, body, kwargs in client.patched:
        assert kind == fleet.ResourceClaimStatus
        assert body["status"]["reservedFor"] == [
            {"resource": "pods", "name": name, "uid": f"uid-{name}"}
        ]
        assert kwargs["force"] and kwargs["namespace"] == fleet.NAMESPACE


def test_claims_ahead_flags() -> None:
    with pytest.raises(SystemExit):
        fleet.main(["--ahead-pods", str(fleet.NODE_PODS + 1)])
    with pytest.raises(SystemExit):
        fleet.main(["--ahead-elsewhere", "-1"])
