"""cnidra IPAM on the test bed, two nodes and real pods: one pool, no address twice across the
nodes; an exhausted pool keeps the pod Pending with the pool named; a persistent IP follows its
IPAMClaim from a pod on one node to a pod on the other and is freed with the IPAMClaim; a deleted
node's blocks are collected by the garbage collector while its IPAMClaims' addresses stay held;
churn with driver kills and apiserver restarts leaks nothing.

Node 1's driver runs with deploy/'s defaults but a 1 s reconcile pass and a 5 s grace for a
killed prepare's addresses (the defaults, 30 s and 120 s, would make these tests wait minutes);
node 2's has its own state root."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from cnidra.ipam.accounting import LEASE_NAME
from cnidra.state.store import read_records
from testbed import cluster as tb
from testbed.harness import ROOT, Cluster, DriverProcess, read_checkpoint
from tests.testbed.conftest import Drivers
from tests.testbed.objects import pod_addresses, ready
from tests.testbed.test_named_networks import (
    claimed_pod,
    network_template,
    node_conf_network,
    on_node,
)

pytestmark = pytest.mark.testbed
DRIVER = "cni.dra.networking.x-k8s.io"
RECONCILE = {
    "ipam_reconcile_seconds": "1",
    "ipam_grace_seconds": "5",
    "pool_status_seconds": "1",  # blocks' and pools' counts (the default, 5 s, also passes)
    # the accountant's Lease (default 60 s): a killed accountant is replaced within seconds
    "pool_accountant_lease_seconds": "6",
}
NODE2_SETTINGS = RECONCILE  # node2_driver's (conftest)


@pytest.fixture(scope="module")
def ipam_crds(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds.yaml"))
    cluster.wait(
        "the CRDs to be served",
        lambda: (
            cluster.kubectl(
                "get", "cniippools,cniipblocks,ipamclaims", "-A", check=False
            ).returncode
            == 0
        ),
        60,
    )
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "deviceclass.yaml"))


@pytest.fixture(scope="module")
def node1(
    cluster: Cluster, ipam_crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverProcess]:
    drivers = Drivers(cluster, tmp_path_factory.mktemp("ipam1"))
    yield drivers.start(cni_conf_dir=str(tb.Paths.cni_conf), **RECONCILE)
    drivers.close()


@pytest.fixture(scope="module")
def node2(node2_driver: DriverProcess) -> DriverProcess:
    return node2_driver


@pytest.fixture
def ns(cluster: Cluster, namespace: str) -> Iterator[str]:
    yield namespace
    cluster.kubectl(
        "delete", "pods", "--all", "-n", namespace, "--timeout=90s", check=False, timeout=120
    )


@pytest.fixture
def network(
    cluster: Cluster, ns: str, node1: DriverProcess, test_link: Any, second_node: tb.Node
) -> Iterator[str]:
    """A CNINetwork by NetworkID whose node confs put macvlan on each node's own link and ask
    cnidra IPAM for addresses from one pool (named like the network); the test makes the pool."""
    tag = uuid.uuid4().hex[:5]
    name = f"tb-ipam-{tag}"
    link_a, link_b = test_link(f"iA{tag}"), f"iB{tag}"
    node2_ip = ["ip", "-n", str(second_node.netns)]
    subprocess.run([*node2_ip, "link", "add", link_b, "type", "bridge"], check=True)
    subprocess.run([*node2_ip, "link", "set", link_b, "up"], check=True)
    confs = {tb.Paths.cni_conf / f"{name}.conflist": link_a}
    confs[second_node.cni_conf / f"{name}.conflist"] = link_b
    for path, link in confs.items():
        path.write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": name,
                    "plugins": [
                        {
                            "type": "macvlan",
                            "master": link,
                            "ipam": {"type": "cnidra", "pool": name},
                        }
                    ],
                }
            )
        )
    cluster.apply(node_conf_network(name, ns))
    cluster.apply_in(ns, network_template("net", name))
    try:
        yield name
    finally:
        cluster.kubectl(
            "delete", "pods", "--all", "-n", ns, "--timeout=90s", check=False, timeout=120
        )
        for path in confs:
            path.unlink(missing_ok=True)
        cluster.kubectl("delete", "cninetwork", name, "--wait=false", check=False)
        cluster.kubectl("delete", "cniippool", name, "--ignore-not-found", check=False)
        cluster.kubectl(
            "delete", "cniipblocks", "-l", f"cni.networking.x-k8s.io/pool={name}", check=False
        )
        subprocess.run([*node2_ip, "link", "del", link_b], check=False, capture_output=True)


def make_pool(cluster: Cluster, name: str, **spec: Any) -> None:
    cluster.apply(
        {
            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
            "kind": "CNIIPPool",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def blocks(cluster: Cluster, pool: str) -> dict[str, str]:
    """block name -> node, as `kubectl get cniipblocks` shows them."""
    items = json.loads(
        cluster.kubectl(
            "get", "cniipblocks", "-l", f"cni.networking.x-k8s.io/pool={pool}", "-o", "json"
        ).stdout
    )["items"]
    return {b["metadata"]["name"]: b["spec"]["node"] for b in items}


def served(cluster: Cluster, network: str, *nodes: tb.Node) -> None:
    def published() -> bool:
        slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)
        have = {
            s["spec"]["nodeName"]
            for s in slices["items"]
            if s["spec"]["driver"] == DRIVER
            for d in s["spec"]["devices"]
            if d["attributes"].get("network", {}).get("string") == network
        }
        return {n.name for n in nodes} <= have

    cluster.wait("the nodes to publish the network", published, 60)


def test_pods_on_two_nodes_never_get_the_same_address(
    cluster: Cluster, ns: str, network: str, node2: DriverProcess, second_node: tb.Node
) -> None:
    make_pool(
        cluster,
        network,
        ranges=[{"subnet": "198.18.140.0/27", "gateway": "198.18.140.1"}],
        blockSize=4,
    )
    served(cluster, network, tb.NODE1, second_node)
    pods = {f"a{i}": tb.NODE1 for i in range(6)} | {f"b{i}": second_node for i in range(6)}
    for name, node in pods.items():
        cluster.apply_in(ns, on_node(claimed_pod(name, "net"), node))
    for name in pods:
        ready(cluster, ns, name)
    got = {name: pod_addresses(cluster, ns, name, "net1") for name in pods}
    addresses = [a for found in got.values() for a in found]
    assert len(addresses) == 12 == len(set(addresses)), got
    pool = ipaddress.ip_network("198.18.140.0/27")
    assert all(ipaddress.ip_interface(a).network == pool for a in addresses)
    assert "198.18.140.1/27" not in addresses  # the gateway
    held = blocks(cluster, network)
    assert set(held.values()) == {tb.NODE1.name, second_node.name}
    for name, node in pods.items():  # each pod's address is in a block its node holds
        (address,) = got[name]
        index = (int(ipaddress.ip_interface(address).ip) - int(pool.network_address)) // 4
        assert held[f"{network}.0.{index}"] == node.name


def network_device_of(cluster: Cluster, network: str, node: tb.Node) -> dict[str, Any]:
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    (device,) = [
        d
        for s in slices
        if s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == node.name
        for d in s["spec"]["devices"]
        if d["attributes"].get("network", {}).get("string") == network
    ]
    return device


def lease_holder(cluster: Cluster) -> str:
    """The driver (its node) holding the pool accountant's Lease; "" when there is none."""
    found = cluster.kubectl(
        "get", "lease", LEASE_NAME, "-n", "default", "-o",
        "jsonpath={.spec.holderIdentity}", check=False,
    )  # fmt: skip
    return found.stdout.strip() if found.returncode == 0 else ""


def test_the_pool_accountant_fails_over_to_the_other_node(
    cluster: Cluster,
    ns: str,
    node1: DriverProcess,
    node2: DriverProcess,
    ip_pools: Callable[..., str],
) -> None:
    """The driver holding the accountant's Lease is killed (SIGKILL: no release); the other
    node's driver takes the Lease once it lapsed, within the lease and one candidate's
    interval (2 x 6 s here, with its jitter), and the pools' status goes on being written: a
    pool made after the kill is counted by the new holder. It runs before the exhausted-pool
    test below, which then sees the new holder name the pool in Events."""
    lease = float(RECONCILE["pool_accountant_lease_seconds"])
    drivers = {tb.NODE1.name: node1, tb.NODE2.name: node2}

    def holder() -> str:
        return lease_holder(cluster)

    def counted(pool: str) -> object:
        return (cluster.get("cniippool", pool, None).get("status") or {}).get("size")

    first = cluster.wait("a driver to hold the Lease", lambda: holder() in drivers and holder(), 30)
    before = ip_pools("198.18.143.0/28", ns)
    cluster.wait(f"{first} to count a new pool", lambda: counted(before), 30)
    [other] = [name for name in drivers if name != first]
    started = time.monotonic()
    drivers[first].stop(signal.SIGKILL)
    try:
        cluster.wait(f"{other} to take the Lease", lambda: holder() == other, 2.2 * lease + 10)
        took = time.monotonic() - started
        print(f"\nthe Lease moved from {first} to {other} {took:.1f} s after the kill")
        assert took <= 2.2 * lease + 3, f"took {took:.1f} s for a {lease:g} s Lease"
        after = ip_pools("198.18.143.16/28", ns)
        cluster.wait(f"{other} to count a pool made after the kill", lambda: counted(after), 20)
    finally:
        drivers[first].start()
        cluster.wait(
            f"{first}'s NRI plugin to connect",
            lambda: drivers[first].health().get("nriConnected"),
            60,
        )
    assert holder() == other  # the restarted driver waits for its turn


def test_an_exhausted_pool_keeps_the_pod_pending_naming_the_pool(
    cluster: Cluster, ns: str, network: str
) -> None:
    """The network's device carries the pool and its addresses as consumable capacity: the
    scheduler, counting claims, leaves the third pod unscheduled."""
    make_pool(
        cluster,
        network,
        ranges=[
            {
                "subnet": "198.18.141.0/29",
                "rangeStart": "198.18.141.1",
                "rangeEnd": "198.18.141.2",
            }
        ],
        blockSize=4,
    )
    served(cluster, network, tb.NODE1)

    def published() -> tuple[str, str]:
        device = network_device_of(cluster, network, tb.NODE1)
        return (
            device["attributes"].get("ipPool", {}).get("string", ""),
            device.get("capacity", {}).get("addresses", {}).get("value", ""),
        )

    cluster.wait("the pool's addresses to be published", lambda: published() == (network, "2"), 60)
    for name in ("p1", "p2"):
        cluster.apply_in(ns, on_node(claimed_pod(name, "net"), tb.NODE1))
        ready(cluster, ns, name)
    cluster.apply_in(ns, on_node(claimed_pod("p3", "net"), tb.NODE1))

    def unschedulable() -> str:
        conditions = cluster.get("pod", "p3", ns)["status"].get("conditions") or []
        return " ".join(
            c.get("message", "")
            for c in conditions
            if c["type"] == "PodScheduled" and c["status"] == "False"
        )

    cluster.wait("the scheduler to leave p3 Pending", lambda: "claim" in unschedulable(), 60)
    assert cluster.get("pod", "p3", ns)["status"]["phase"] == "Pending"
    assert published() == (network, "2")  # the device names the pool it ran out of

    # the pool accountant names the pool, its size and what is held, on the pod and its claim,
    # within seconds of the scheduler's attempt; kubectl shows the counts as columns
    def exhausted(name: str) -> list[str]:
        events = json.loads(
            cluster.kubectl(
                "get", "events", "-n", ns, "-o", "json",
                "--field-selector", f"involvedObject.name={name},reason=PoolExhausted",
            ).stdout
        )["items"]  # fmt: skip
        return [e["message"] for e in events if e["type"] == "Warning"]

    said = f"CNIIPPool {network} has no address left on any node: 2 addresses, 2 held, 0 free"
    cluster.wait(
        "p3's Events to name the pool", lambda: any(said in m for m in exhausted("p3")), 30
    )
    print(f"\nPoolExhausted named by the accountant on {lease_holder(cluster)}")
    statuses = cluster.get("pod", "p3", ns)["status"].get("resourceClaimStatuses") or []
    [claim] = [s["resourceClaimName"] for s in statuses if s.get("resourceClaimName")]
    cluster.wait(  # written right after the pod's
        "the claim's Events to name the pool",
        lambda: any(said in m and claim in m for m in exhausted(claim)),
        10,
    )

    # the pool's status is written at most once per pool every FLUSH_SECONDS (5 s): it may
    # trail the Event, which the accountant writes from the same in-memory counts at once
    def counts() -> tuple[int, int, int] | None:
        status = cluster.get("cniippool", network).get("status") or {}
        found = (status.get("size"), status.get("held"), status.get("free"))
        return found if found == (2, 2, 0) else None

    cluster.wait("the pool's status to count 2 held", counts, 20)
    header, row = cluster.kubectl("get", "cniippool", network).stdout.splitlines()[:2]
    assert header.split()[-4:] == ["SIZE", "HELD", "FREE", "AGE"]
    assert row.split()[-4:-1] == ["2", "2", "0"]  # an unset PERSISTENT may print nothing
    cluster.kubectl("delete", "pod", "p1", "-n", ns, "--timeout=90s", timeout=120)
    ready(cluster, ns, "p3", timeout="120s")  # its claim now fits, and p1's address is free
    assert pod_addresses(cluster, ns, "p3", "net1") <= {"198.18.141.1/29", "198.18.141.2/29"}
    cluster.wait(
        "the pool's status to count p1's address freed and p3's held",
        lambda: cluster.get("cniippool", network)["status"]["held"] == 2,
        30,
    )


def ipamclaim(name: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """An IPAMClaim as KubeVirt makes one for a VM's network (`owner`: the VM's object)."""
    meta: dict[str, Any] = {"name": name}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {
        "apiVersion": "k8s.cni.cncf.io/v1alpha1",
        "kind": "IPAMClaim",
        "metadata": meta,
        "spec": {"network": "data", "interface": "net1"},
    }


def persistent_pod(
    cluster: Cluster, ns: str, name: str, network: str, claim: str
) -> dict[str, Any]:
    template = f"keep-{name}"
    doc = network_template(template, network)
    doc["spec"]["spec"]["devices"]["config"] = [
        {
            "requests": ["data"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                    "kind": "CNIConfig",
                    "ipamClaimReference": claim,
                },
            },
        }
    ]
    cluster.apply_in(ns, doc)
    return claimed_pod(name, template)


def test_a_persistent_ip_follows_its_ipamclaim_to_the_other_node(
    cluster: Cluster,
    ns: str,
    network: str,
    node2: DriverProcess,
    second_node: tb.Node,
) -> None:
    make_pool(
        cluster,
        network,
        ranges=[{"subnet": "198.18.142.0/24"}],
        blockSize=16,
        allowPersistentIPs=True,
    )
    served(cluster, network, tb.NODE1, second_node)
    # the VM, for garbage collection: a ConfigMap stands in for KubeVirt's VirtualMachine
    cluster.kubectl("create", "configmap", "vm-a", "-n", ns)
    vm = cluster.get("configmap", "vm-a", ns)
    cluster.apply_in(ns, ipamclaim("vm-a.data", owner=vm))
    cluster.apply_in(
        ns, on_node(persistent_pod(cluster, ns, "vm1", network, "vm-a.data"), tb.NODE1)
    )
    ready(cluster, ns, "vm1")
    (address,) = pod_addresses(cluster, ns, "vm1", "net1")
    held = cluster.get("ipamclaim", "vm-a.data", ns)
    assert held["status"]["ips"] == [address]
    assert held["status"]["ownerPod"] == {"name": "vm1"}
    assert "cni.dra.networking.x-k8s.io/ipam" in held["metadata"]["finalizers"]
    cluster.kubectl("delete", "pod", "vm1", "-n", ns, "--timeout=90s", timeout=120)
    # an ordinary pod meanwhile never gets the held address
    cluster.apply_in(ns, on_node(claimed_pod("other", "net"), tb.NODE1))
    ready(cluster, ns, "other")
    assert address not in pod_addresses(cluster, ns, "other", "net1")
    vm2 = on_node(persistent_pod(cluster, ns, "vm2", network, "vm-a.data"), second_node)
    cluster.apply_in(ns, vm2)
    ready(cluster, ns, "vm2")
    assert pod_addresses(cluster, ns, "vm2", "net1") == {address}
    cluster.kubectl("delete", "pod", "vm2", "-n", ns, "--timeout=90s", timeout=120)
    # the VM is deleted, garbage collection deletes its IPAMClaim: node 1, which holds the
    # address, frees it and lets the IPAMClaim go
    cluster.kubectl("delete", "configmap", "vm-a", "-n", ns, "--cascade=background")
    cluster.wait(
        "the IPAMClaim to be released",
        lambda: (
            cluster.kubectl("get", "ipamclaim", "vm-a.data", "-n", ns, check=False).returncode != 0
        ),
        60,
    )
    cluster.apply_in(ns, on_node(claimed_pod("reuse", "net"), tb.NODE1))
    ready(cluster, ns, "reuse")
    assert pod_addresses(cluster, ns, "reuse", "net1") == {address}  # lowest free again


def test_an_ipamclaim_on_a_pool_without_persistent_ips_is_refused(
    cluster: Cluster, ns: str, network: str
) -> None:
    make_pool(cluster, network, ranges=[{"subnet": "198.18.143.0/24"}])
    served(cluster, network, tb.NODE1)
    cluster.apply_in(ns, ipamclaim("vm-b.data"))
    cluster.apply_in(ns, on_node(persistent_pod(cluster, ns, "vm", network, "vm-b.data"), tb.NODE1))

    def refusal() -> str:
        events = cluster.kubectl(
            "get", "events", "-n", ns, "--field-selector", "involvedObject.name=vm", "-o", "json"
        )
        return " ".join(e["message"] for e in json.loads(events.stdout)["items"])

    cluster.wait("the pod's prepare to be refused", lambda: "allowPersistentIPs" in refusal(), 60)
    assert "does not allow persistent IPs" in refusal()
    assert not cluster.get("ipamclaim", "vm-b.data", ns).get("status")


def allocated_claim(name: str, node: tb.Node, device: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A claim as the scheduler leaves it: allocated to the network's device on `node`."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "data",
                        "exactly": {"deviceClassName": "cni-network.networking.x-k8s.io"},
                    }
                ]
            }
        },
    }
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "data", "driver": DRIVER, "pool": node.name, "device": device}
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node.name]}
                        ]
                    }
                ]
            },
        }
    }
    return claim, status


def held_addresses(*drivers: DriverProcess) -> list[str]:
    """The addresses of every claim the drivers have prepared, as their checkpoints hold them."""
    return [
        a["address"]
        for driver in drivers
        for c in read_checkpoint(driver.state_root)
        for d in c["devices"]
        for p in d["network"]["plugins"]
        if (p.get("ipam") or {}).get("type") == "static"
        for a in p["ipam"]["addresses"]
    ]


def leases(driver: DriverProcess) -> list[dict[str, Any]]:
    """The driver's leases: its lease store's files with the log replayed (read_records)."""
    records = read_records(driver.state_root / "pools" / "addresses")
    return [records[key] for key in sorted(records)]


def attempt(driver: DriverProcess, batch: list[tuple[str, str, str]]) -> None:
    with contextlib.suppress(grpc.RpcError):
        driver.prepare(*batch)


def test_churn_with_driver_kills_and_apiserver_restarts_leaks_nothing_and_never_doubles(
    cluster: Cluster,
    ns: str,
    network: str,
    node1: DriverProcess,
    node2: DriverProcess,
    second_node: tb.Node,
) -> None:
    """1,000 claims prepared and unprepared on two nodes, 20 at a time per node, as kubelet
    does for pods; node 1's driver is killed (SIGKILL) in the middle of a prepare every 8
    rounds, and the apiserver is stopped during the prepares of every 10th round. At every
    round the prepared claims' addresses are unique across the nodes; at the end nothing is
    leased."""
    make_pool(
        cluster,
        network,
        ranges=[{"subnet": "198.18.146.0/25"}],  # 126 addresses for 40 claims held at once
        blockSize=8,
    )
    served(cluster, network, tb.NODE1, second_node)
    devices = {
        n.name: network_device_of(cluster, network, n)["name"] for n in (tb.NODE1, second_node)
    }
    drivers = {tb.NODE1.name: node1, second_node.name: node2}
    rounds, per_node = 25, 20
    names: dict[str, list[tuple[str, str, str]]] = {tb.NODE1.name: [], second_node.name: []}
    docs, statuses = [], {}
    for node in (tb.NODE1, second_node):
        for i in range(rounds * per_node):
            name = f"churn-{node.name[-1]}-{i}"
            claim, status = allocated_claim(name, node, devices[node.name])
            docs.append(claim)
            statuses[name] = status
    cluster.kubectl(
        "create", "-n", ns, "-f", "-", input_="\n---\n".join(json.dumps(d) for d in docs),
        timeout=300,
    )  # fmt: skip
    uids = {
        c["metadata"]["name"]: c["metadata"]["uid"]
        for c in json.loads(
            cluster.kubectl("get", "resourceclaims", "-n", ns, "-o", "json").stdout
        )["items"]
    }
    # the scheduler's allocations, all in one server-side apply of the status subresource
    # (one kubectl, not 2,000)
    allocations = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "status": status,
        }
        for name, status in statuses.items()
    ]
    cluster.kubectl(
        "apply", "--server-side", "--subresource=status", "--field-manager=testbed-scheduler",
        "-f", "-", input_="\n---\n".join(json.dumps(d) for d in allocations), timeout=300,
    )  # fmt: skip
    for node in (tb.NODE1, second_node):
        names[node.name] = [
            (ns, f"churn-{node.name[-1]}-{i}", uids[f"churn-{node.name[-1]}-{i}"])
            for i in range(rounds * per_node)
        ]
    failed = refused = 0
    for r in range(rounds):
        if r and r % 8 == 0:  # killed in the middle of a prepare, then kubelet's retry
            batch = names[tb.NODE1.name][r * per_node : (r + 1) * per_node]
            killed = threading.Thread(target=attempt, args=(node1, batch))
            killed.start()
            time.sleep(0.05)
            node1.stop(signal.SIGKILL)
            killed.join()
            node1.start()
        if r and r % 10 == 0:
            tb.stop("kube-apiserver")
        for node_name, driver in drivers.items():
            batch = names[node_name][r * per_node : (r + 1) * per_node]
            try:
                answer = driver.prepare(*batch)
            except grpc.RpcError:
                failed += 1
                continue
            refused += sum(1 for c in answer.claims.values() if c.error)
        if r and r % 10 == 0:
            tb.start_apiserver(cluster.bins)
        held = held_addresses(node1, node2)
        assert len(held) == len(set(held)), f"round {r}: an address held twice: {sorted(held)}"
        for node_name, driver in drivers.items():
            batch = names[node_name][r * per_node : (r + 1) * per_node]
            driver.unprepare(*batch)
    assert held_addresses(node1, node2) == []
    # what a killed prepare leased and never checkpointed is freed after the grace
    cluster.wait("every lease to be freed", lambda: not leases(node1) and not leases(node2), 60)
    assert refused <= per_node * 2 * 2, refused  # only the two rounds the apiserver was down


def test_a_lost_nodes_blocks_are_collected_and_its_ipamclaims_addresses_stay_held(
    cluster: Cluster,
    ns: str,
    network: str,
    node1: DriverProcess,
    node2: DriverProcess,
    second_node: tb.Node,
) -> None:
    """Last in the module: it takes node 2 away. No node writes another's block: node 2's go
    with its Node (the garbage collector, by their owner references). The VM's pod, moved to
    node 1, keeps its IPAMClaim's address: node 1 reserves that block again and leases it
    before any other pod gets an address there. Its IPAMClaim deleted while the pod runs keeps
    the address (Terminating, an AddressesKept Event) until the pod goes."""
    make_pool(  # .1 to .6 in blocks of two: four blocks
        cluster,
        network,
        ranges=[{"subnet": "198.18.144.0/29"}],
        blockSize=2,
        allowPersistentIPs=True,
    )
    served(cluster, network, second_node)
    cluster.apply_in(ns, ipamclaim("vm-c.data"))
    cluster.apply_in(
        ns, on_node(persistent_pod(cluster, ns, "vm", network, "vm-c.data"), second_node)
    )
    cluster.apply_in(ns, on_node(claimed_pod("p0", "net"), second_node))
    for name in ("vm", "p0"):
        ready(cluster, ns, name)
    (address,) = pod_addresses(cluster, ns, "vm", "net1")
    before = blocks(cluster, network)
    assert set(before.values()) == {second_node.name}
    node2.stop()
    tb.node2_down(cluster.bins)  # the node is lost: its Node object goes
    cluster.wait(
        "the garbage collector to delete the lost node's blocks",
        lambda: blocks(cluster, network) == {},
        90,
    )
    cluster.kubectl("delete", "pods", "--all", "-n", ns, "--force", "--grace-period=0", check=False)
    cluster.apply_in(ns, on_node(claimed_pod("vm", "keep-vm"), tb.NODE1))  # the VM, moved
    ready(cluster, ns, "vm")
    assert pod_addresses(cluster, ns, "vm", "net1") == {address}
    assert tb.NODE1.name in blocks(cluster, network).values()
    kept = leases(node1)
    assert [x["owner"].split("/")[:3] for x in kept if x["address"] == address.split("/")[0]] == [
        ["ipamclaim", ns, "vm-c.data"]
    ]
    cluster.kubectl("delete", "ipamclaim", "vm-c.data", "-n", ns, "--wait=false")
    cluster.wait(
        "an AddressesKept Event on the IPAMClaim",
        lambda: (
            "AddressesKept"
            in cluster.kubectl(
                "get",
                "events",
                "-n",
                ns,
                "--field-selector",
                "involvedObject.name=vm-c.data",
                "-o",
                "jsonpath={.items[*].reason}",
            ).stdout
        ),
        30,
    )
    passes = node1.health()["ipamPasses"]
    cluster.wait(
        "three more IPAM reconcile passes",
        lambda: node1.health().get("ipamPasses", 0) >= passes + 3,
        30,
    )  # and the claim is still held:
    assert cluster.get("ipamclaim", "vm-c.data", ns)["metadata"]["deletionTimestamp"]
    for i in range(4):  # the rest of the pool (the VM's claim counts against it too)
        cluster.apply_in(ns, on_node(claimed_pod(f"n{i}", "net"), tb.NODE1))
    for i in range(4):
        ready(cluster, ns, f"n{i}")
        assert address not in pod_addresses(cluster, ns, f"n{i}", "net1")
    cluster.kubectl("delete", "pod", "vm", "-n", ns, "--wait=true", "--timeout=60s")
    cluster.wait(
        "the IPAMClaim to go once its pod went",
        lambda: (
            cluster.kubectl("get", "ipamclaim", "vm-c.data", "-n", ns, check=False).returncode != 0
        ),
        60,
    )
