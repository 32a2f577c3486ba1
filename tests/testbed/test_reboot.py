"""A node reboot (issue 27), simulated on the test bed: kubelet, containerd, every pod process,
sandbox and network namespace gone, the runtime's tmpfs state and /var/run/cdi's CDI specs
with them; the disks kept, /var/lib/cnidra included. The driver runs with the shipped
defaults and is down while the node is."""

from __future__ import annotations

import json
import shutil
import uuid
from typing import Any

import pytest

from cnidra.state.layout import DEFAULT_STATE_ROOT
from testbed import cluster as tb
from testbed.harness import Cluster, DriverProcess
from tests.testbed.objects import apply, claiming_pod, pod_addresses, ready
from tests.testbed.test_fail_closed import sandbox_of

pytestmark = pytest.mark.testbed
DRIVER = "cni.dra.networking.x-k8s.io"


def objects(namespace: str, parent: str) -> list[dict[str, Any]]:
    config = {
        "cniVersion": "1.0.0",
        "name": "rebooted",
        "plugins": [{"type": "macvlan", "mode": "bridge",
                     "ipam": {"type": "cnidra", "pool": f"rb-{namespace}"}}],
    }  # fmt: skip
    params = {"apiVersion": "cni.networking.x-k8s.io/v1alpha1", "kind": "CNIConfig",
              "ifName": "net1", "config": config}  # fmt: skip
    selector = f'device.attributes["{DRIVER}"].ifName == "{parent}"'
    return [
        {
            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
            "kind": "CNIIPPool",
            "metadata": {"name": f"rb-{namespace}"},
            "spec": {"ranges": [{"subnet": "198.18.214.0/24"}], "namespaces": [namespace]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "net"},
            "spec": {"spec": {"devices": {
                "requests": [{"name": "net", "exactly": {
                    "deviceClassName": "cni.networking.x-k8s.io",
                    "selectors": [{"cel": {"expression": selector}}]}}],
                "config": [{"requests": ["net"],
                            "opaque": {"driver": DRIVER, "parameters": params}}]}}},
        },
    ]  # fmt: skip


def records() -> set[str]:
    """The sandbox records on the node's state root, by sandbox id."""
    return {p.stem for p in (DEFAULT_STATE_ROOT / "sandboxes").glob("*.json")}


def container_id(cluster: Cluster, namespace: str, name: str) -> str:
    pod = json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return str(statuses[0].get("containerID") or "") if statuses[0].get("ready") else ""


def test_a_rebooted_node_gives_its_pods_their_interfaces_and_addresses_back(
    cluster: Cluster, namespace: str, driver: DriverProcess, test_link: Any
) -> None:
    parent = test_link(f"rb{uuid.uuid4().hex[:5]}")
    slices = lambda: cluster.kubectl("get", "resourceslices", "-o", "json").stdout  # noqa: E731
    cluster.wait("the slice", lambda: parent in slices(), 60)
    names = ["r0", "r1", "r2"]
    apply(cluster, namespace, *objects(namespace, parent), *(claiming_pod(n, "net") for n in names))
    for name in names:
        ready(cluster, namespace, name)
    before = {n: pod_addresses(cluster, namespace, n, "net1") for n in names}
    assert all(len(a) == 1 for a in before.values()) and len(set().union(*before.values())) == 3
    old_records = records()
    assert len(old_records) == 3
    old_containers = {n: container_id(cluster, namespace, n) for n in names}

    def while_down() -> None:
        driver.stop(9)  # the driver dies with the node
        for spec in tb.NODE1.cdi.glob(f"{DRIVER}_*"):
            spec.unlink()  # /var/run/cdi is a tmpfs, the device metadata files on it too
        shutil.rmtree(tb.NODE1.cdi / f"{DRIVER}-metadata", ignore_errors=True)

    tb.reboot(cluster.bins, tb.NODE1, between=while_down)
    driver.start(wait_registered=False)  # its DaemonSet pod comes back with the node
    for name in names:  # the pod's status says Ready from before until kubelet looks again
        cluster.wait(
            f"{name} to run a new container",
            lambda n=name: container_id(cluster, namespace, n) not in ("", old_containers[n]),
            240,
        )
        ready(cluster, namespace, name, "240s")
    after = {n: pod_addresses(cluster, namespace, n, "net1") for n in names}
    assert after == before  # the same address each, from the claim's lease
    # Kubelet may make more than one sandbox for a pod as the node comes back (one it gave up
    # on while the driver was not yet registered); each dead sandbox's record, the old ones and
    # any such new one, is cleaned, and what is left is one record for each pod's live sandbox.
    live = {n: sandbox_of(cluster, namespace, n) for n in names}
    assert all(live.values()), live
    cluster.wait(
        "the records to be exactly the pods' live sandboxes",
        lambda: records() == set(live.values()),
        90,
    )
    assert not records() & old_records
    cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--timeout=90s", timeout=120)
    cluster.wait(
        "every claim gone (no finalizer kept)",
        lambda: (
            not json.loads(
                cluster.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout
            )["items"]
        ),
        90,
    )
