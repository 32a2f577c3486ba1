"""Named networks on the test bed: node-local confs in the runtime's own CNI conf directory
through a CNINetwork, Multus NetworkAttachmentDefinitions applied as they are, interface names
mixed across claims, collisions refused at prepare, and the network-status annotation."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import cluster as tb
from testbed.crds import NAD_CRD
from testbed.harness import ROOT, Cluster, DriverProcess, read_checkpoint
from testbed.incluster import InClusterDriver, Release
from tests.testbed.conftest import Drivers
from tests.testbed.objects import (
    SLEEP,
    claims_of,
    device_template,
    env_image,
    pod,
    pod_addresses,
    ready,
    select_link,
)
from tests.testbed.test_lifecycle import Driver

pytestmark = pytest.mark.testbed
DRIVER = "cni.dra.networking.x-k8s.io"
NETWORK_CLASS = "cni-network.networking.x-k8s.io"
LINK_CLASS = "cni.networking.x-k8s.io"
NET1, DATA1, PREFIX = {"ifName": "net1"}, {"ifName": "data1"}, {"ifNamePrefix": "data"}


@pytest.fixture(scope="module")
def conf_dir() -> Path:
    """The runtime's CNI conf directory, where the primary network's conf lives too (what the
    chart mounts for hostPaths.cniConf)."""
    return tb.Paths.cni_conf


@pytest.fixture(scope="module")
def node_driver(
    cluster: Cluster,
    deployment: Release | None,
    conf_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Driver]:
    """Each test runs with the host driver (deploy/'s defaults) and the chart's DaemonSet."""
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds.yaml"))
    cluster.apply(NAD_CRD)
    cluster.wait(
        "the CRDs to be served",
        lambda: (
            cluster.kubectl("get", "cninetworks,net-attach-def", "-A", check=False).returncode == 0
        ),
        60,
    )
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "deviceclass.yaml"))
    if deployment is not None:
        in_cluster = InClusterDriver(cluster)
        in_cluster.wait_ready()
        yield in_cluster
        return
    # deploy/'s defaults but for the conf dir, the test bed's runtime's (as the chart's
    # hostPaths.cniConf is in the in-cluster run)
    drivers = Drivers(cluster, tmp_path_factory.mktemp("named"))
    yield drivers.start(cni_conf_dir=str(conf_dir))
    drivers.close(expect_no_records=True)


@pytest.fixture
def ns(cluster: Cluster, namespace: str, node_driver: Driver) -> Iterator[str]:
    cluster.kubectl("label", "namespace", namespace, "cni.networking.x-k8s.io/claim-config=true")
    yield namespace
    cluster.kubectl(
        "delete", "pods", "--all", "-n", namespace, "--timeout=90s", check=False, timeout=120
    )


def network_devices(cluster: Cluster) -> dict[str, dict[str, Any]]:
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    return {
        d["attributes"]["network"]["string"]: d
        for s in slices
        if s["spec"]["driver"] == DRIVER
        for d in s["spec"]["devices"]
        if d["attributes"].get("type", {}).get("string") == "network"
    }


def network_template(name: str, network: str) -> dict[str, Any]:
    """Users reference the network by name and nothing else: no config, an implicit name."""
    selector = f'device.attributes["{DRIVER}"].network == "{network}"'
    return device_template(name, NETWORK_CLASS, [("data", selector, None)])


def claimed_pod(name: str, *templates: str) -> dict[str, Any]:
    claims = [{"name": f"c{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
    return pod(
        name,
        env_image(),
        resourceClaims=claims,
        containers=[
            {
                "name": "c",
                "image": env_image(),
                "command": SLEEP,
                "resources": {"claims": [{"name": c["name"]} for c in claims]},
            }
        ],
    )


def parents_in_checkpoint(driver: Driver, namespace: str) -> dict[str, str]:
    return {
        d["if_name"] + "@" + c["name"]: d["parent"]
        for c in read_checkpoint(driver.state_root)
        if c["namespace"] == namespace
        for d in c["devices"]
    }


def node_conf_network(network_id: str, namespace: str) -> dict[str, Any]:
    """A CNINetwork whose config is each node's conf file `<network_id>.conflist`."""
    return {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNINetwork",
        "metadata": {"name": network_id},
        "spec": {"type": "macvlan", "networkID": network_id, "namespaces": [namespace]},
    }


def macvlan_conf(network_id: str, parent: str, subnet: str) -> str:
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": network_id,
            "plugins": [
                {
                    "type": "macvlan",
                    "master": parent,
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]]},
                }
            ],
        }
    )


def test_one_template_follows_each_nodes_wiring_of_a_node_conf(
    cluster: Cluster, ns: str, node_driver: Driver, conf_dir: Path, test_link: Any
) -> None:
    """The same claim template: served through eno-like link A while the node's conf names A,
    through B after the admin rewires the node's conf, and Pending with the scheduler's reason
    when the node has no such conf at all."""
    tag = uuid.uuid4().hex[:5]
    link_a, link_b = test_link(f"nA{tag}"), test_link(f"nB{tag}")
    network_id = f"tb-data-{uuid.uuid4().hex[:6]}"
    conf = conf_dir / f"{network_id}.conflist"
    cluster.apply(node_conf_network(network_id, ns))
    try:
        cluster.apply_in(ns, network_template("data", network_id))
        # no conf on the node: the scheduler finds no device, the pod stays Pending
        cluster.apply_in(ns, claimed_pod("p0", "data"))
        cluster.wait(
            "the scheduler to say why p0 cannot run",
            lambda: any(e.get("reason") == "FailedScheduling" for e in cluster.events("p0", ns)),
            60,
        )
        assert cluster.get("pod", "p0", ns)["status"]["phase"] == "Pending"
        cluster.kubectl("delete", "pod", "p0", "-n", ns, "--wait=false")
        # the node's conf names link A
        conf.write_text(macvlan_conf(network_id, link_a, "198.18.210.0/24"))
        cluster.wait(
            "the node to publish the network",
            lambda: network_devices(cluster).get(network_id, {}).get("attributes", {}),
            60,
        )
        assert network_devices(cluster)[network_id]["attributes"]["ifName"]["string"] == link_a
        cluster.apply_in(ns, claimed_pod("pa", "data"))
        ready(cluster, ns, "pa")
        assert pod_addresses(cluster, ns, "pa", "net1") & {"198.18.210.2/24"}
        assert set(parents_in_checkpoint(node_driver, ns).values()) == {link_a}
        # the admin rewires the node: the same network is now on link B
        conf.write_text(macvlan_conf(network_id, link_b, "198.18.211.0/24"))
        cluster.wait(
            "the node to publish the network on B",
            lambda: (
                network_devices(cluster)[network_id]["attributes"]["ifName"]["string"] == link_b
            ),
            60,
        )
        cluster.apply_in(ns, claimed_pod("pb", "data"))
        ready(cluster, ns, "pb")
        assert pod_addresses(cluster, ns, "pb", "net1") & {"198.18.211.2/24"}
        assert sorted(parents_in_checkpoint(node_driver, ns).values()) == sorted([link_a, link_b])
        # a link going down takes the network off the node's slice
        conf.unlink()
        cluster.wait(
            "the network to leave the slice",
            lambda: network_id not in network_devices(cluster),
            60,
        )
    finally:
        conf.unlink(missing_ok=True)
        cluster.kubectl("delete", "cninetwork", network_id, "--wait=false", check=False)


def devices_by_node(cluster: Cluster) -> dict[tuple[str, str], dict[str, Any]]:
    """(node, network) -> the network's device in that node's slice."""
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    return {
        (s["spec"]["nodeName"], d["attributes"]["network"]["string"]): d
        for s in slices
        if s["spec"]["driver"] == DRIVER
        for d in s["spec"]["devices"]
        if d["attributes"].get("type", {}).get("string") == "network"
    }


def on_node(doc: dict[str, Any], node: tb.Node) -> dict[str, Any]:
    doc["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    if node != tb.NODE1:
        doc["spec"]["tolerations"] = [{**tb.SECOND_NODE_TAINT, "operator": "Equal"}]
    return doc


def test_one_template_lands_on_two_differently_wired_nodes(
    cluster: Cluster,
    ns: str,
    node_driver: Driver,
    conf_dir: Path,
    test_link: Any,
    second_node: tb.Node,
    node2_driver: DriverProcess,
) -> None:
    """Two nodes side by side, one CNINetwork by NetworkID: node 1's conf names its link A
    and one range, node 2's names its own link B (in node 2's namespace) and another. One
    claim template lands on each node through that node's own wiring."""
    tag = uuid.uuid4().hex[:5]
    link_a, link_b = test_link(f"nA{tag}"), f"nB{tag}"
    node2_ip = ["ip", "-n", str(second_node.netns)]
    subprocess.run([*node2_ip, "link", "add", link_b, "type", "bridge"], check=True)
    subprocess.run([*node2_ip, "link", "set", link_b, "up"], check=True)
    network_id = f"tb-wired-{tag}"
    confs = (conf_dir / f"{network_id}.conflist", second_node.cni_conf / f"{network_id}.conflist")
    cluster.apply(node_conf_network(network_id, ns))
    try:
        confs[0].write_text(macvlan_conf(network_id, link_a, "198.18.214.0/24"))
        confs[1].write_text(macvlan_conf(network_id, link_b, "198.18.215.0/24"))
        where = {(tb.NODE1.name, network_id): link_a, (second_node.name, network_id): link_b}
        cluster.wait(
            "both nodes to publish the network, each on its own link",
            lambda: (
                {
                    k: d["attributes"]["ifName"]["string"]
                    for k, d in devices_by_node(cluster).items()
                    if k[1] == network_id
                }
                == where
            ),
            60,
        )
        cluster.apply_in(ns, network_template("wired", network_id))
        cluster.apply_in(ns, on_node(claimed_pod("p1", "wired"), tb.NODE1))
        cluster.apply_in(ns, on_node(claimed_pod("p2", "wired"), second_node))
        ready(cluster, ns, "p1")
        ready(cluster, ns, "p2")
        assert pod_addresses(cluster, ns, "p1", "net1") & {"198.18.214.2/24"}
        assert pod_addresses(cluster, ns, "p2", "net1") & {"198.18.215.2/24"}
        assert set(parents_in_checkpoint(node_driver, ns).values()) == {link_a}
        assert set(parents_in_checkpoint(node2_driver, ns).values()) == {link_b}
        for name in ("p1", "p2"):
            cluster.kubectl("delete", "pod", name, "-n", ns, "--timeout=90s", timeout=120)
    finally:
        for conf in confs:
            conf.unlink(missing_ok=True)
        cluster.kubectl("delete", "cninetwork", network_id, "--wait=false", check=False)
        subprocess.run([*node2_ip, "link", "del", link_b], check=False, capture_output=True)


def nad(name: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name},
        "spec": {"config": json.dumps(config)},
    }


def nad_template(name: str, requests: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """(request, link, extra CNIConfig fields) per request, each referencing a NAD."""
    return device_template(
        name, LINK_CLASS, [(req, select_link(link), fields) for req, link, fields in requests]
    )


def multus_macvlan(name: str, pool: str) -> dict[str, Any]:
    # as Multus users write them (no master: the allocated link is bound; no cniVersion
    # games), addressed from a CNIIPPool serving the namespace: host-local in a NAD of the
    # tenant's namespace is refused (two namespaces or nodes on one segment share its pool)
    return {
        "cniVersion": "0.3.1",
        "name": name,
        "type": "macvlan",
        "mode": "bridge",
        "ipam": {"type": "cnidra", "pool": pool},
    }


def test_nads_as_they_are_with_names_mixed_across_two_claims(
    cluster: Cluster, ns: str, test_link: Any, ip_pools: Callable[..., str]
) -> None:
    """Two NADs applied unchanged; claim c0 names nothing (implicit), claim c1 names `net1`
    explicitly and uses a prefix for its second request: c1's explicit name wins net1, c0 gets
    net2, the prefixed one data0. The network-status annotation lists them as the claims'
    status does."""
    tag = uuid.uuid4().hex[:5]
    link_a, link_b = test_link(f"mA{tag}"), test_link(f"mB{tag}")
    blue, green = ip_pools("198.19.130.0/24", ns), ip_pools("198.19.131.0/24", ns)
    cluster.apply_in(
        ns,
        nad("blue", multus_macvlan("blue-net", blue)),
        nad("green", multus_macvlan("green-net", green)),
    )
    cluster.apply_in(
        ns,
        nad_template("implicit", [("a", link_a, {"network": {"attachmentDefinition": "blue"}})]),
        nad_template(
            "explicit",
            [
                (
                    "b",
                    link_b,
                    {"network": {"attachmentDefinition": f"{ns}/green"}, "ifName": "net1"},
                ),
                (
                    "c",
                    link_a,
                    {"network": {"attachmentDefinition": "blue"}, "ifNamePrefix": "data"},
                ),
            ],
        ),
    )
    cluster.apply_in(ns, claimed_pod("mixed", "implicit", "explicit"))
    ready(cluster, ns, "mixed")
    for if_name, subnet in (
        ("net1", "198.19.131."),
        ("net2", "198.19.130."),
        ("data0", "198.19.130."),
    ):
        [address] = pod_addresses(cluster, ns, "mixed", if_name)
        assert address.startswith(subnet) and address.endswith("/24"), (if_name, address)
    status_ifaces = {
        d["networkData"]["interfaceName"]: d["networkData"]
        for c in claims_of(cluster, ns, "mixed")
        for d in c["status"].get("devices", [])
    }
    assert set(status_ifaces) == {"net1", "net2", "data0"}

    def annotation() -> list[dict[str, Any]]:
        meta = cluster.get("pod", "mixed", ns)["metadata"]
        raw = (meta.get("annotations") or {}).get("k8s.v1.cni.cncf.io/network-status")
        return json.loads(raw) if raw else []

    entries = cluster.wait(
        "the network-status annotation", lambda: len(annotation()) == 3 and annotation(), 30
    )
    by_iface = {e["interface"]: e for e in entries}
    assert by_iface["net1"]["name"] == f"{ns}/green"
    assert by_iface["net2"]["name"] == f"{ns}/blue"
    for iface, entry in by_iface.items():
        assert entry["ips"] == [ip.split("/")[0] for ip in status_ifaces[iface]["ips"]]
        assert entry["mac"] == status_ifaces[iface]["hardwareAddress"]


def test_a_name_collision_across_claims_is_refused_at_prepare(
    cluster: Cluster, ns: str, test_link: Any, ip_pools: Callable[..., str]
) -> None:
    link = test_link(f"cA{uuid.uuid4().hex[:5]}")
    pool = ip_pools("198.19.132.0/24", ns)
    cluster.apply_in(ns, nad("blue", multus_macvlan("blue-net", pool)))
    for name in ("one", "two"):
        cluster.apply_in(
            ns,
            nad_template(
                name,
                [("a", link, {"network": {"attachmentDefinition": "blue"}, "ifName": "data1"})],
            ),
        )
    cluster.apply_in(ns, claimed_pod("clash", "one", "two"))

    def refusal() -> str:
        return " ".join(
            e.get("message", "")
            for e in cluster.events("clash", ns)
            if "already used" in e.get("message", "")
        )

    message = cluster.wait("kubelet to report the refusal", refusal, 60)
    assert "interface name 'data1' is already used by claim" in message
    assert cluster.get("pod", "clash", ns)["status"]["phase"] == "Pending"
