"""End to end on the test bed: kubelet prepares, containerd starts the sandbox, cnidra's NRI
hook ADDs the claimed interfaces, and the claim's status says what they got."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.harness import ROOT, Cluster, DriverProcess
from testbed.incluster import FAULT_PLUGINS, InClusterDriver, Release
from tests.testbed.conftest import Drivers, pool_leases
from tests.testbed.objects import (
    TEST_CLASS,
    apply,
    claiming_pod,
    claims_of,
    cni_config,
    plugins_class,
    pod_addresses,
    ready,
    template,
)

pytestmark = pytest.mark.testbed
DRIVER = "cni.dra.networking.x-k8s.io"
Driver = DriverProcess | InClusterDriver
# where the seed demo's container finds its claim's device metadata: the pod's claim "macvlan"
# (from a template), request "net"
METADATA_FILE = (
    "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/macvlan/net/"
    f"{DRIVER}-metadata.json"
)


@pytest.fixture(scope="module", autouse=True)
def device_classes(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "deviceclass.yaml"))
    cluster.apply(plugins_class())


@pytest.fixture
def driver(
    cluster: Cluster, deployment: Release | None, namespace: str, tmp_path: Path
) -> Iterator[Driver]:
    """The driver under test, ready; afterwards the namespace's pods are deleted while it still
    runs, so their interfaces go the way users' do (DEL by the hook)."""
    # what an admin does for a namespace whose claims carry configs (the chart's admission)
    cluster.kubectl("label", "namespace", namespace, "cni.networking.x-k8s.io/claim-config=true")
    cluster.kubectl(
        "annotate", "namespace", namespace, f"cni.networking.x-k8s.io/device-classes={TEST_CLASS}"
    )
    if deployment is None:  # a state root of its own; the tests' fault plugins beside
        drivers = Drivers(cluster, tmp_path)
        yield drivers.start(
            defaults=False, cni_path=f"{cluster.env['CNIDRA_CNI_PATH']}:{FAULT_PLUGINS}"
        )
        drivers.close(namespace)
        return
    proc = InClusterDriver(cluster)
    cluster.wait("the NRI plugin to connect", lambda: proc.health().get("nriConnected"), 60)
    yield proc
    cluster.kubectl(
        "delete", "pods", "--all", "-n", namespace, "--timeout=90s", check=False, timeout=120
    )


def allocations(driver: Driver, pool: str) -> set[str]:
    """The addresses the driver has leased from a CNIIPPool (cnidra IPAM's leases under its
    state root, one per address with the claim that holds it)."""
    return set(pool_leases(driver.state_root, pool))


def lease_owners(driver: Driver, pool: str) -> dict[str, str]:
    """address -> the claim UID whose request holds it (`claim/<uid>/<request>`)."""
    return {
        a: lease["owner"].split("/")[1] for a, lease in pool_leases(driver.state_root, pool).items()
    }


def test_the_seed_demo_for_real(
    cluster: Cluster,
    namespace: str,
    driver: Driver,
    parent: str,
    tmp_path: Path,
    ip_pools: Callable[..., str],
) -> None:
    pool = ip_pools("198.19.101.0/24", namespace)
    apply(
        cluster,
        namespace,
        template("macvlan", [("net", parent, cni_config("demo", parent, pool), "net1")]),
        claiming_pod("demo", "macvlan"),
    )
    ready(cluster, namespace, "demo")
    [claim] = claims_of(cluster, namespace, "demo")

    def ready_status() -> dict[str, Any] | None:
        devices = (
            cluster.get("resourceclaim", claim["metadata"]["name"], namespace)["status"].get(
                "devices"
            )
            or []
        )
        return devices[0] if devices else None

    status = cluster.wait("the claim status", ready_status, 30)
    assert (status["driver"], status["pool"], status["device"]) == (DRIVER, "testbed-node", parent)
    assert status["shareID"] == claim["status"]["allocation"]["devices"]["results"][0]["shareID"]
    # Ready, beside the conditions of network policy and shaping (their own tests)
    [cond] = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "Ready",
        "True",
        "NetworkInterfaceReady",
    )
    assert {c["type"] for c in status["conditions"]} <= {
        "Ready",
        "NetworkPolicyEnforced",
        "BandwidthLimited",
    }, status["conditions"]
    net = status["networkData"]
    assert net["interfaceName"] == "net1"
    assert pod_addresses(cluster, namespace, "demo", "net1") == set(net["ips"])
    assert net["hardwareAddress"] == status["data"]["interfaces"][0]["mac"]
    assert status["data"]["cniVersion"] == "1.1.0"
    [ip] = net["ips"]
    # the address is leased from the pool to the pod's claim, and to nothing else
    assert lease_owners(driver, pool) == {ip.split("/")[0]: claim["metadata"]["uid"]}
    # the container finds its claim's device metadata (KEP-5304) where Kubernetes says, with
    # the network data the claim status has
    metadata = cluster.kubectl("exec", "-n", namespace, "demo", "--", "cat", METADATA_FILE).stdout
    [doc] = [json.loads(line) for line in metadata.splitlines()]
    assert doc["apiVersion"] == "metadata.resource.k8s.io/v1alpha1"
    assert (doc["podClaimName"], doc["metadata"]["name"]) == ("macvlan", claim["metadata"]["name"])
    [request] = doc["requests"]
    assert request["name"] == "net"
    [device] = request["devices"]
    assert (device["driver"], device["pool"], device["name"]) == (DRIVER, "testbed-node", parent)
    assert device["networkData"] == net
    assert device["attributes"]["ifName"] == {"string": parent}  # as its ResourceSlice says

    cluster.kubectl("delete", "-n", namespace, "pod", "demo", "--timeout=60s")
    cluster.wait("the address to be freed", lambda: not allocations(driver, pool), 30)
    cluster.wait("the sandbox record to go", lambda: driver.health().get("sandboxes") == 0, 30)
    assert not list((driver.state_root / "cni" / "results").glob("*"))


def test_two_claims_three_attachments_in_a_fixed_order(
    cluster: Cluster,
    namespace: str,
    driver: Driver,
    parent: str,
    tmp_path: Path,
    ip_pools: Callable[..., str],
) -> None:
    x, y, z = (ip_pools(f"198.19.{i}.0/24", namespace) for i in (102, 103, 104))
    first = template(
        "a",
        [
            ("x", parent, cni_config("net-x", parent, x), "netx"),
            ("y", parent, cni_config("net-y", parent, y), "nety"),
        ],
    )
    second = template("b", [("z", parent, cni_config("net-z", parent, z), "netz")])
    apply(cluster, namespace, first, second, claiming_pod("multi", "a", "b"))
    ready(cluster, namespace, "multi")
    for if_name, prefix in (
        ("netx", "198.19.102."),
        ("nety", "198.19.103."),
        ("netz", "198.19.104."),
    ):
        [address] = pod_addresses(cluster, namespace, "multi", if_name)
        assert address.startswith(prefix)
    statuses = cluster.wait(
        "three status entries",
        lambda: (
            [
                d
                for c in claims_of(cluster, namespace, "multi")
                for d in cluster.get("resourceclaim", c["metadata"]["name"], namespace)[
                    "status"
                ].get("devices")
                or []
            ]
            if sum(
                len(
                    cluster.get("resourceclaim", c["metadata"]["name"], namespace)["status"].get(
                        "devices"
                    )
                    or []
                )
                for c in claims_of(cluster, namespace, "multi")
            )
            == 3
            else None
        ),
        30,
    )
    assert sorted(s["networkData"]["interfaceName"] for s in statuses) == ["netx", "nety", "netz"]
    [record] = [json.loads(p.read_text()) for p in (driver.state_root / "sandboxes").glob("*.json")]
    order = [(a["claim_name"].split("-")[1], a["request"]) for a in record["attachments"]]
    assert order == [("a", "x"), ("a", "y"), ("b", "z")]


def test_a_template_gives_every_replica_its_own_address(
    cluster: Cluster,
    namespace: str,
    driver: Driver,
    parent: str,
    tmp_path: Path,
    ip_pools: Callable[..., str],
) -> None:
    pool = ip_pools("198.19.105.0/24", namespace)
    apply(
        cluster,
        namespace,
        template("net", [("net", parent, cni_config("replicas", parent, pool), "net1")]),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": claiming_pod("x", "net")["spec"],
                },
            },
        },
    )
    cluster.kubectl(
        "rollout", "status", "-n", namespace, "deployment/web", "--timeout=120s", timeout=150
    )
    pods = json.loads(
        cluster.kubectl("get", "pods", "-n", namespace, "-l", "app=web", "-o", "json").stdout
    )["items"]
    assert len(pods) == 3
    addresses = [pod_addresses(cluster, namespace, p["metadata"]["name"], "net1") for p in pods]
    flat = {a for s in addresses for a in s}
    assert all(len(s) == 1 for s in addresses) and len(flat) == 3
    assert {a.split("/")[0] for a in flat} == allocations(driver, pool)


def failing_config(name: str, parent: str, pool: str) -> dict[str, Any]:
    """A network whose plugin fails its ADD: a macvlan larger than its parent (1500), which
    the plugin refuses ("invalid MTU 9000, must be [0, master MTU(1500)]"; the kernel would
    too). Nothing before the plugin judges a macvlan's MTU (it is the pod's own link), so the
    claim is prepared and its address leased."""
    conf = cni_config(name, parent, pool)
    conf["plugins"][0]["mtu"] = 9000
    return conf


def test_a_failing_plugin_fails_the_sandbox_and_leaves_nothing(
    cluster: Cluster,
    namespace: str,
    driver: Driver,
    parent: str,
    tmp_path: Path,
    ip_pools: Callable[..., str],
) -> None:
    pool = ip_pools("198.19.106.0/24", namespace)
    apply(
        cluster,
        namespace,
        template("fine", [("net", parent, cni_config("fine", parent, pool), "net1")]),
        template("broken", [("net", parent, failing_config("broken", parent, pool), "net1")]),
        claiming_pod("first", "fine"),
    )
    ready(cluster, namespace, "first")
    apply(cluster, namespace, claiming_pod("second", "broken"))

    def sandbox_failed() -> list[str]:
        return [
            e["message"]
            for e in cluster.events("second", namespace)
            if e["reason"] in ("FailedCreatePodSandBox", "NetworkAttachFailed")
        ]

    messages = cluster.wait("the second sandbox to fail", sandbox_failed, 60)
    assert any("invalid MTU 9000" in m and "macvlan" in m for m in messages), messages
    [claim] = claims_of(cluster, namespace, "second")
    [first_claim] = claims_of(cluster, namespace, "first")

    def not_ready() -> dict[str, Any] | None:
        devices = (
            cluster.get("resourceclaim", claim["metadata"]["name"], namespace)["status"].get(
                "devices"
            )
            or []
        )
        return devices[0]["conditions"][0] if devices else None

    cond = cluster.wait("Ready=False on the claim", not_ready, 30)
    assert (cond["status"], cond["reason"]) == ("False", "NetworkInterfaceNotReady")
    assert "invalid MTU 9000" in cond["message"]
    # one address per prepared claim: kubelet's retries of the failing sandbox take no more
    [first_address] = pod_addresses(cluster, namespace, "first", "net1")
    owners = lease_owners(driver, pool)
    assert sorted(owners.values()) == sorted(
        [first_claim["metadata"]["uid"], claim["metadata"]["uid"]]
    ), owners
    assert owners[first_address.split("/")[0]] == first_claim["metadata"]["uid"]

    def pods_with_records() -> list[str]:
        sandboxes = (driver.state_root / "sandboxes").glob("*.json")
        return [json.loads(p.read_text())["pod_name"] for p in sandboxes]

    # kubelet keeps retrying the second pod; each try writes its record and removes it again
    # when the ADD fails (behind the sandbox, a try is a container creation): between tries
    # only the first pod's record is there
    assert cluster.wait("only first's record", lambda: pods_with_records() == ["first"], 30)
    cached = [p.name for p in (driver.state_root / "cni" / "results").glob("*")]
    assert len(cached) == 1
    # the failed pod goes: its claim's address is freed, the first pod's stays
    cluster.kubectl("delete", "-n", namespace, "pod", "second", "--timeout=60s")
    cluster.wait(
        "second's address to be freed",
        lambda: (
            lease_owners(driver, pool)
            == {first_address.split("/")[0]: first_claim["metadata"]["uid"]}
        ),
        30,
    )


def burst(cluster: Cluster, namespace: str, parent: str, pool: str, count: int) -> list[str]:
    names = [f"b{i:02d}" for i in range(count)]
    apply(
        cluster,
        namespace,
        template("net", [("net", parent, cni_config("burst", parent, pool), "net1")]),
        *(claiming_pod(n, "net") for n in names),
    )
    return names


def assert_all_attached(
    cluster: Cluster, namespace: str, names: list[str], driver: Driver, pool: str
) -> None:
    for name in names:
        ready(cluster, namespace, name, "180s")
    seen = set()
    for name in names:
        addresses = pod_addresses(cluster, namespace, name, "net1")
        assert len(addresses) == 1, (name, addresses)
        seen |= addresses
    assert len(seen) == len(names)
    # no leak: exactly one lease per pod's claim (cnidra IPAM leases at prepare, to the claim:
    # a killed prepare asked again keeps its lease, and a dead sandbox holds none), and once
    # the runtime's dead sandboxes are cleaned up, one cache entry per pod
    cache = driver.state_root / "cni" / "results"
    want = {
        a.split("/")[0]: claim["metadata"]["uid"]
        for name in names
        for claim in claims_of(cluster, namespace, name)
        for a in pod_addresses(cluster, namespace, name, "net1")
    }
    cluster.wait(
        "the leases to be exactly the live pods' addresses",
        lambda: lease_owners(driver, pool) == want,
        60,
    )
    cluster.wait(
        "one cache entry per pod",
        lambda: len(list(cache.glob(f"cnidra-ns.{namespace}.burst-*"))) == len(names),
        30,
    )


def test_kill_9_during_a_burst_of_20_pods(
    cluster: Cluster,
    namespace: str,
    driver: Driver,
    parent: str,
    tmp_path: Path,
    ip_pools: Callable[..., str],
) -> None:
    pool = ip_pools("198.19.108.0/24", namespace)
    names = burst(cluster, namespace, parent, pool, 20)
    cluster.wait("some sandboxes", lambda: driver.health().get("sandboxes", 0) >= 3, 60)
    driver.stop(signal.SIGKILL)
    time.sleep(1)  # the fault's window: down while the burst's sandboxes start
    driver.start()
    assert_all_attached(cluster, namespace, names, driver, pool)


def test_containerd_restart_during_a_burst(
    cluster: Cluster,
    namespace: str,
    driver: Driver,
    parent: str,
    tmp_path: Path,
    ip_pools: Callable[..., str],
) -> None:
    from testbed import cluster as tb

    pool = ip_pools("198.19.118.0/24", namespace)
    names = burst(cluster, namespace, parent, pool, 10)
    cluster.wait("some sandboxes", lambda: driver.health().get("sandboxes", 0) >= 2, 60)
    tb.stop("containerd")
    cluster.wait("the NRI plugin to notice", lambda: not driver.health().get("nriConnected"), 15)
    health = driver.health()  # the driver stays up for kubelet meanwhile, and says it is degraded
    assert health["ok"] and health["registeredWithKubelet"] and health["degraded"]
    tb.start_containerd(cluster.bins)
    cluster.wait("the NRI plugin to reconnect", lambda: driver.health().get("nriConnected"), 30)
    assert_all_attached(cluster, namespace, names, driver, pool)


def test_apiserver_down_while_a_sandbox_starts(
    cluster: Cluster,
    namespace: str,
    driver: Driver,
    parent: str,
    tmp_path: Path,
    ip_pools: Callable[..., str],
) -> None:
    """kubelet itself GETs a pod's ResourceClaims before it starts a sandbox, so with the
    apiserver down it starts none; the sandbox is started here as kubelet would (same pod UID,
    same runtime), which exercises containerd and cnidra's hook with no apiserver at all."""
    from testbed import cluster as tb

    pool = ip_pools("198.19.107.0/24", namespace)
    apply(
        cluster,
        namespace,
        template("net", [("net", parent, cni_config("offline", parent, pool), "net1")]),
        claiming_pod("p", "net"),
    )
    ready(cluster, namespace, "p")
    uid = cluster.get("pod", "p", namespace)["metadata"]["uid"]
    [claim] = claims_of(cluster, namespace, "p")
    config = tmp_path / "sandbox.json"
    config.write_text(
        json.dumps(
            {
                "metadata": {"name": "p", "namespace": namespace, "uid": uid, "attempt": 7},
                "log_directory": str(tmp_path / "logs"),
                "linux": {},
            }
        )
    )
    tb.stop("kube-apiserver")
    sandbox = ""
    try:
        start = time.monotonic()
        sandbox = cluster.crictl("runp", str(config)).stdout.strip()
        elapsed = time.monotonic() - start
        info = json.loads(cluster.crictl("inspectp", sandbox).stdout)
        [netns] = [
            n["path"]
            for n in info["info"]["runtimeSpec"]["linux"]["namespaces"]
            if n["type"] == "network"
        ]

        def net1_addresses() -> list[str]:
            shown = subprocess.run(
                ["nsenter", f"--net={netns}", "ip", "-4", "addr", "show", "net1"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            return re.findall(r"inet (\S+) ", shown)

        # behind the sandbox (the default) the hook answers at once and the ADD follows
        address = cluster.wait("net1 in the manual sandbox", net1_addresses, 10)
        assert len(address) == 1, address
        assert elapsed < 10, elapsed
        cluster.wait(  # queued, waiting for the apiserver
            "the claim's status to be queued",
            lambda: driver.health().get("statusPending", 0) >= 1,
            10,
        )
    finally:
        tb.start_apiserver(cluster.bins)

    def status_ips() -> list[str] | None:
        devices = (
            cluster.get("resourceclaim", claim["metadata"]["name"], namespace)["status"].get(
                "devices"
            )
            or []
        )
        return devices[0]["networkData"]["ips"] if devices else None

    def live_ips() -> list[str]:
        """Addresses of net1 in the sandboxes cnidra has attached, as its records say."""
        records = [
            json.loads(p.read_text()) for p in (driver.state_root / "sandboxes").glob("*.json")
        ]
        return sorted(
            ip["address"]
            for r in records
            if r["state"] == "added"
            for a in r["attachments"]
            for ip in (a["result"] or {}).get("ips", [])
        )

    # once the apiserver is back the queued status lands; kubelet may meanwhile have replaced
    # the pod's sandboxes, so the status must match whichever sandbox is live by then
    cluster.wait(
        "the queued status to be written", lambda: driver.health().get("statusPending") == 0, 60
    )
    cluster.wait(
        "status to match the live sandbox",
        lambda: status_ips() is not None and status_ips() == live_ips(),
        60,
    )
    if sandbox in cluster.crictl("pods", "-q").stdout:
        cluster.crictl("stopp", sandbox)
        cluster.crictl("rmp", sandbox)
    # cnidra IPAM leased the claim one address at prepare, which every sandbox of the pod
    # gets: once the manual sandbox is gone, the one lease is the live sandbox's address
    uid = claim["metadata"]["uid"]
    cluster.wait(
        "one sandbox left, with the claim's leased address",
        lambda: (
            len(live := live_ips()) == 1
            and lease_owners(driver, pool) == {live[0].split("/")[0]: uid}
        ),
        30,
    )


def test_a_failing_del_holds_the_claim_with_a_finalizer_until_it_succeeds(
    cluster: Cluster, namespace: str, driver: Driver, parent: str, ip_pools: Callable[..., str]
) -> None:
    pool = ip_pools("198.19.109.0/24", namespace)
    # where the driver sees it too (the in-cluster one mounts only its state root)
    marker = driver.state_root / "test-faults" / f"del-fails-{namespace}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    try:
        conf = cni_config("sticky", parent, pool)
        conf["plugins"].append({"type": "fault-del-fails", "failDelWhile": str(marker)})
        apply(
            cluster,
            namespace,
            template("net", [("net", parent, conf, "net1")], TEST_CLASS),
            claiming_pod("p", "net"),
        )
        ready(cluster, namespace, "p")
        [claim] = claims_of(cluster, namespace, "p")
        name = claim["metadata"]["name"]
        [address] = pod_addresses(cluster, namespace, "p", "net1")
        assert lease_owners(driver, pool) == {address.split("/")[0]: claim["metadata"]["uid"]}
        cluster.kubectl("delete", "-n", namespace, "pod", "p", "--wait=false")

        def detach_failed() -> list[str]:
            return [
                e["message"]
                for e in cluster.events("p", namespace)
                if e["reason"] == "NetworkDetachFailed"
            ]

        messages = cluster.wait("the failed DEL to be reported", detach_failed, 60)
        assert "injected DEL failure" in messages[0]

        def held() -> dict[str, Any] | None:
            meta = cluster.get("resourceclaim", name, namespace)["metadata"]
            ours = "cni.dra.networking.x-k8s.io/interfaces" in (meta.get("finalizers") or [])
            return meta if ours else None

        # the claim stays (our finalizer; and kubelet cannot finish the pod while our
        # NodeUnprepareResources says the interfaces are still being removed)
        cluster.wait("the claim to be held by our finalizer", held, 30)
        failed = detach_failures(driver)
        # the driver's retry of the DEL failed too: still held after it
        cluster.wait("a retried DEL to fail", lambda: detach_failures(driver) > failed, 60)
        assert held() is not None
        # the address is still leased to the claim: DEL did not finish, so neither did unprepare
        assert lease_owners(driver, pool) == {address.split("/")[0]: claim["metadata"]["uid"]}
        marker.unlink()  # the fault clears; the retry with backoff succeeds

        def released() -> bool:
            gone = (
                cluster.kubectl(
                    "get", "resourceclaim", name, "-n", namespace, check=False
                ).returncode
                != 0
            )
            return gone and not allocations(driver, pool)

        cluster.wait("the claim to go once DEL succeeds", released, 90)
        assert driver.health()["sandboxes"] == 0
    finally:
        shutil.rmtree(marker.parent, ignore_errors=True)


def detach_failures(driver: Driver) -> float:
    """The driver's count of failed DELs (cnidra_detach_failures_total, every label)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in driver.metrics().splitlines()
        if line.startswith("cnidra_detach_failures_total{")
    )


def node_cli(driver: Driver, *args: str) -> Any:
    """`cnidra node ... -o json` against the driver's node API socket, as an operator runs it."""
    out = subprocess.run(
        [sys.executable, "-m", "cnidra", "node", *args, "-o", "json",
         "--socket", str(driver.state_root / "node.sock")],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


LIVE_COUNTERS = {"packets", "bytes", "sent_packets", "sentPackets", "drops", "overlimits"}


def at_rest(view: Any) -> Any:
    """A `describe` view without the kernel's live counters (a policy rule's packets, a
    shaped interface's drops), which the pod's own traffic moves between two reads."""
    if isinstance(view, dict):
        return {k: at_rest(v) for k, v in view.items() if k not in LIVE_COUNTERS}
    if isinstance(view, list):
        return [at_rest(v) for v in view]
    return view


def test_the_node_api_tells_a_pods_story_without_the_apiserver(
    cluster: Cluster, namespace: str, driver: Driver, parent: str, ip_pools: Callable[..., str]
) -> None:
    from testbed import cluster as tb

    pool = ip_pools("198.19.110.0/24", namespace)
    apply(
        cluster,
        namespace,
        template("net", [("net", parent, cni_config("story", parent, pool), "net1")]),
        template("bad", [("net", parent, failing_config("story", parent, pool), "net1")]),
        claiming_pod("first", "net"),
    )
    ready(cluster, namespace, "first")
    apply(cluster, namespace, claiming_pod("second", "bad"))  # the kernel refuses its ADD

    def second_failed() -> Any:
        view = node_cli(driver, "describe", "second", "-n", namespace)
        return view if "invalid MTU 9000" in view.get("problem", "") else None

    failed = cluster.wait("the node API to say why second has no interface", second_failed, 60)
    assert failed["state"] == "prepared" and failed["events"][-1]["kind"] == "AttachFailed"
    first = node_cli(driver, "describe", "first", "-n", namespace)
    [att] = first["attachments"]
    assert (first["state"], att["if_name"], att["network"]) == ("attached", "net1", "story")
    assert att["plugins"] == ["macvlan"] and att["parent"] == parent
    assert set(att["ips"]) == pod_addresses(cluster, namespace, "first", "net1")
    listed = node_cli(driver, "pods", "-n", namespace)
    assert {p["pod"]["name"] for p in listed} == {"first", "second"}

    tb.stop("kube-apiserver")
    try:  # the same answers from the node's records alone (the kernel's live counters aside)
        assert at_rest(node_cli(driver, "describe", "first", "-n", namespace)) == at_rest(first)
        assert {p["pod"]["name"] for p in node_cli(driver, "pods", "-n", namespace)} == {
            "first",
            "second",
        }
    finally:
        tb.start_apiserver(cluster.bins)
    cluster.kubectl("delete", "pod", "second", "-n", namespace, "--timeout=60s")


def test_an_on_demand_network_is_plugged_and_unplugged_through_the_node_api(
    cluster: Cluster, namespace: str, driver: Driver, parent: str, ip_pools: Callable[..., str]
) -> None:
    hotplug_pool = ip_pools("198.19.111.0/24", namespace)
    base_pool = ip_pools("198.19.112.0/24", namespace)
    extra = template(
        "extra", [("net", parent, cni_config("hotplug", parent, hotplug_pool), "net2")]
    )
    extra["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["attach"] = "OnDemand"
    apply(
        cluster,
        namespace,
        template("base", [("net", parent, cni_config("base", parent, base_pool), "net1")]),
        extra,
        claiming_pod("vm", "base", "extra"),
    )
    ready(cluster, namespace, "vm")
    assert len(pod_addresses(cluster, namespace, "vm", "net1")) == 1
    assert pod_addresses(cluster, namespace, "vm", "net2") == set()  # not at sandbox start

    def status_of(pod_claim: str) -> list[dict[str, Any]]:
        [claim] = [
            c
            for c in claims_of(cluster, namespace, "vm")
            if c["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == pod_claim
        ]
        return list(claim.get("status", {}).get("devices") or [])

    socket = ["--socket", str(driver.state_root / "node.sock")]
    hotplug = ["vm", "-n", namespace, "--claim", "extra", "--request", "net", *socket]
    subprocess.run([sys.executable, "-m", "cnidra", "node", "attach", *hotplug], check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    [address] = pod_addresses(cluster, namespace, "vm", "net2")
    assert address.startswith("198.19.111.")
    entry = cluster.wait("the plugged interface's status", lambda: status_of("extra"), 30)
    assert entry[0]["networkData"]["ips"] == [address]
    # leased to the claim when it was prepared (cnidra IPAM leases at prepare): the address
    # the plugged interface got
    [extra_claim] = [
        c
        for c in claims_of(cluster, namespace, "vm")
        if c["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "extra"
    ]
    leased = {address.split("/")[0]: extra_claim["metadata"]["uid"]}
    assert lease_owners(driver, hotplug_pool) == leased

    subprocess.run([sys.executable, "-m", "cnidra", "node", "detach", *hotplug], check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    assert pod_addresses(cluster, namespace, "vm", "net2") == set()
    assert len(pod_addresses(cluster, namespace, "vm", "net1")) == 1  # the other one stays
    cluster.wait("the unplugged interface's status to go", lambda: not status_of("extra"), 30)
    # the address stays the claim's while it is prepared (a plug again gets it back), and is
    # freed with the claim
    assert lease_owners(driver, hotplug_pool) == leased
    cluster.kubectl("delete", "-n", namespace, "pod", "vm", "--timeout=60s")
    cluster.wait("the addresses to be freed", lambda: not allocations(driver, hotplug_pool), 30)
    assert not allocations(driver, base_pool)
