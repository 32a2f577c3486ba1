"""The DRA side of `cnidra driver` against real kubelet, scheduler and apiserver."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testbed.harness import Cluster, DriverProcess
from tests.testbed.conftest import Attached, slice_devices
from tests.testbed.objects import env_image, pod

pytestmark = pytest.mark.testbed
DRIVER = "cni.dra.networking.x-k8s.io"
KUBELET_LOG = Path("/var/lib/cnidra-testbed/logs/kubelet.log")


def network_claim(
    parent: str,
    *,
    pool: str,
    if_name: str = "net1",
    bad: dict[str, Any] | None = None,
    sub_interfaces: int | None = None,
    plugin: str = "macvlan",
) -> dict[str, Any]:
    selector = (
        f'device.attributes["{DRIVER}"].ifName == "{parent}" && '
        f'device.attributes["{DRIVER}"].cniMacvlan'
    )
    exactly: dict[str, Any] = {
        "deviceClassName": DRIVER.replace("cni.dra.", "cni."),
        "selectors": [{"cel": {"expression": selector}}],
    }
    if sub_interfaces is not None:
        exactly["capacity"] = {"requests": {"subInterfaces": str(sub_interfaces)}}
    exactly["deviceClassName"] = "cni.networking.x-k8s.io"
    plugin_conf = {
        "type": plugin,
        "master": parent,
        **(bad or {}),
        # cnidra's cluster IPAM from a CNIIPPool serving the namespace (host-local written by
        # a claim is refused: two namespaces or nodes on one segment would share its pool)
        "ipam": {"type": "cnidra", "pool": pool},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "net"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "data", "exactly": exactly}],
                    "config": [
                        {
                            "requests": ["data"],
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": {
                                    "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                                    "kind": "CNIConfig",
                                    "ifName": if_name,
                                    "config": {
                                        "cniVersion": "1.0.0",
                                        "name": "data",
                                        "plugins": [plugin_conf],
                                    },
                                },
                            },
                        }
                    ],
                }
            }
        },
    }


def claim_pod(name: str) -> dict[str, Any]:
    spec = pod(
        name, env_image(), resourceClaims=[{"name": "net", "resourceClaimTemplateName": "net"}]
    )
    spec["spec"]["containers"][0]["resources"] = {"claims": [{"name": "net"}]}
    return spec


def apply_ns(cluster: Cluster, namespace: str, *docs: dict[str, Any]) -> None:
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input_="\n---\n".join(json.dumps(d) for d in docs)
    )


def test_kubelet_registers_the_plugin_and_again_after_a_restart(
    cluster: Cluster, start_driver: Callable[..., DriverProcess]
) -> None:
    mark = KUBELET_LOG.stat().st_size
    driver = start_driver()
    health = driver.health()
    assert health["ok"] and health["registeredWithKubelet"]
    assert all(t["running"] for t in health["tasks"].values()), health["tasks"]
    log = KUBELET_LOG.read_text(errors="replace")[mark:]
    assert f'driverName="{DRIVER}"' in log and "connected=true" in log
    driver.stop()
    mark = KUBELET_LOG.stat().st_size
    driver.start()
    log = KUBELET_LOG.read_text(errors="replace")[mark:]
    assert "RegisterPlugin started" in log and DRIVER in log
    metrics = driver.metrics()
    assert (
        "cnidra_published_devices" in metrics and "cnidra_last_publish_timestamp_seconds" in metrics
    )


def test_slice_carries_test_made_links_and_follows_changes(
    cluster: Cluster, start_driver: Callable[..., DriverProcess], test_link: Callable[[str], str]
) -> None:
    first = test_link(f"tb{uuid.uuid4().hex[:6]}")
    start_driver()
    devices = cluster.wait("the slice to carry the link", lambda: slice_devices(cluster).get(first))
    attrs = devices["attributes"]
    assert attrs["ifName"] == {"string": first}
    assert attrs["type"] == {"string": "bridge"}
    assert attrs["cniMacvlan"] == {"bool": True} and attrs["cniHostLocal"] == {"bool": True}
    assert "mac" in attrs and "mtu" in attrs
    assert devices["allowMultipleAllocations"] is True
    assert devices["capacity"]["subInterfaces"]["value"] == "64"
    assert attrs["nodeLink"] == {"bool": False}
    # links that carry the node are not published: the uplink (default route) and the test
    # bed's primary bridge (the node's InternalIP)
    assert "eth0" not in slice_devices(cluster)
    assert "cnidra-tb0" not in slice_devices(cluster)
    second = test_link(f"tb{uuid.uuid4().hex[:6]}")
    cluster.wait("the new link", lambda: second in slice_devices(cluster), 15)
    import subprocess

    subprocess.run(["ip", "link", "del", second], check=True)
    cluster.wait("the removed link to go", lambda: second not in slice_devices(cluster), 15)
    assert not any(name.startswith("veth") for name in slice_devices(cluster))


def test_a_node_link_is_published_only_when_the_admin_names_it(
    cluster: Cluster, start_driver: Callable[..., DriverProcess]
) -> None:
    start_driver(publish_node_links="eth0")
    devices = cluster.wait("eth0 published", lambda: slice_devices(cluster).get("eth0"), 30)
    assert devices["attributes"]["nodeLink"] == {"bool": True}
    assert "cnidra-tb0" not in slice_devices(cluster)


def test_pod_is_scheduled_where_its_parent_exists_and_prepare_is_checkpointed(
    cluster: Cluster, namespace: str, attach: Callable[..., Attached]
) -> None:
    other = f"{namespace}-b"
    bed = attach("198.19.120.0/24")
    parent, pool, driver = bed.parent, bed.pool, bed.driver
    uid = cluster.get("pod", "p1", namespace)["metadata"]["uid"]
    [entry] = [c for c in driver.checkpoint() if c["namespace"] == namespace]
    assert entry["pod_uids"] == [uid]
    [device] = entry["devices"]
    assert (device["device"], device["pool"], device["if_name"]) == (parent, "testbed-node", "net1")
    assert device["network"]["plugins"][0]["master"] == parent
    # prepare leased the pod's address and handed the plugin static IPAM with it
    [address] = device["network"]["plugins"][0]["ipam"]["addresses"]
    assert device["network"]["plugins"][0]["ipam"]["type"] == "static"
    assert address["address"].startswith("198.19.120.")
    assert device["share_id"]

    # a claim on a link no node has (never prepared: the pool need not serve its namespace)
    lacking = network_claim("no-such-nic", pool=pool)
    lacking["metadata"]["name"] = "net"
    cluster.kubectl("create", "namespace", other)
    try:
        apply_ns(cluster, other, lacking, claim_pod("p2"))

        def unschedulable() -> list[str]:
            return [
                e["message"]
                for e in cluster.events("p2", other)
                if e["reason"] == "FailedScheduling"
            ]

        messages = cluster.wait("the scheduler to refuse the pod", unschedulable, 60)
        assert any("cannot allocate all claims" in m for m in messages), messages
        assert cluster.get("pod", "p2", other)["status"]["phase"] == "Pending"
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_consumable_capacity_refuses_the_pod_beyond_the_parents_limit(
    cluster: Cluster,
    namespace: str,
    start_driver: Callable[..., DriverProcess],
    parent: str,
    ip_pools: Callable[..., str],
) -> None:
    pool = ip_pools("198.19.121.0/24", namespace)
    start_driver(sub_interfaces="2")
    cluster.wait(
        "slice",
        lambda: (
            slice_devices(cluster)
            .get(parent, {})
            .get("capacity", {})
            .get("subInterfaces", {})
            .get("value")
            == "2"
        ),
    )
    apply_ns(
        cluster,
        namespace,
        network_claim(parent, pool=pool, sub_interfaces=1),
        *(claim_pod(f"p{i}") for i in range(3)),
    )

    def outcome() -> dict[str, str] | None:
        phases = {
            f"p{i}": cluster.get("pod", f"p{i}", namespace)["status"].get("phase", "")
            for i in range(3)
        }
        return phases if sorted(phases.values()) == ["Pending", "Running", "Running"] else None

    phases = cluster.wait("two pods running, one pending", outcome, 90)
    pending = next(p for p, phase in phases.items() if phase == "Pending")
    messages = [
        e["message"]
        for e in cluster.events(pending, namespace)
        if e["reason"] == "FailedScheduling"
    ]
    assert any("cannot allocate all claims" in m for m in messages), messages


def test_prepare_with_the_apiserver_stopped_answers_from_the_checkpoint(
    cluster: Cluster, namespace: str, attach: Callable[..., Attached]
) -> None:
    from testbed import cluster as tb

    bed = attach("198.19.122.0/24")
    driver, parent = bed.driver, bed.parent
    claim = json.loads(
        cluster.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout
    )["items"][0]
    ref = (namespace, claim["metadata"]["name"], claim["metadata"]["uid"])
    assert [c for c in driver.checkpoint() if c["namespace"] == namespace]
    tb.stop("kube-apiserver")
    try:
        response = driver.prepare(ref, (namespace, "never-cached", "0000"))
        ok = response.claims[ref[2]]
        assert not ok.error, ok.error
        assert [(d.pool_name, d.device_name) for d in ok.devices] == [("testbed-node", parent)]
        missing = response.claims["0000"]
        assert "never prepared" in missing.error and "apiserver" in missing.error
    finally:
        tb.start_apiserver(cluster.bins)


def test_bad_opaque_config_fails_prepare_with_the_validators_message(
    cluster: Cluster,
    namespace: str,
    start_driver: Callable[..., DriverProcess],
    parent: str,
    ip_pools: Callable[..., str],
) -> None:
    pool = ip_pools("198.19.123.0/24", namespace)
    driver = start_driver()
    cluster.wait("slice", lambda: parent in slice_devices(cluster))
    apply_ns(
        cluster,
        namespace,
        network_claim(parent, pool=pool, bad={"mode": "bridged", "mtu": 20}),
        claim_pod("p1"),
    )

    def prepare_failed() -> list[str]:
        return [
            e["message"]
            for e in cluster.events("p1", namespace)
            if e["reason"] == "FailedPrepareDynamicResources"
        ]

    messages = cluster.wait("kubelet to report the failed prepare", prepare_failed, 60)
    text = " ".join(messages)
    assert "config.plugins[0].mode" in text and "'bridged' is not allowed" in text
    assert "config.plugins[0].mtu" in text
    assert not [c for c in driver.checkpoint() if c["namespace"] == namespace]
