"""A failed link tells the scheduler (issue 25, KEP-5055): on the test bed with the shipped
defaults, a parent link set down is tainted in the ResourceSlice within seconds, a new pod that
needs it stays Pending, and once the link is up the taint goes and the pod runs; with
NoExecute, the pods using a dead link are evicted unless they tolerate it."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from testbed.harness import Cluster, DriverProcess, wait_for_log
from tests.testbed.objects import (
    apply,
    claiming_pod,
    cni_config,
    pod_addresses,
    ready,
    select_link,
)

pytestmark = pytest.mark.testbed
DRIVER = "cni.dra.networking.x-k8s.io"
TAINT_KEY = f"{DRIVER}/link-failure"


def device_taints(cluster: Cluster, link: str) -> list[dict[str, Any]] | None:
    """The taints of the device for `link` (None: no such device)."""
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    for item in slices:
        if item["spec"]["driver"] != DRIVER:
            continue
        for device in item["spec"].get("devices") or []:
            if device["attributes"].get("ifName", {}).get("string") == link:
                return list(device.get("taints") or [])
    return None


def wait_untainted(cluster: Cluster, link: str, what: str, timeout: float) -> None:
    """Until `link`'s device is published without a taint; on a timeout the message says what
    the slices held instead (every device of the driver's, with its taints) and how the node
    sees the link, so a failure on CI can be read without the test bed."""
    try:
        cluster.wait(what, lambda: device_taints(cluster, link) == [], timeout)
    except AssertionError as exc:
        slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)
        devices = [
            (item["metadata"]["name"], item["spec"]["pool"].get("generation"),
             device["attributes"].get("ifName", {}).get("string"), device.get("taints"))
            for item in slices["items"] if item["spec"]["driver"] == DRIVER
            for device in item["spec"].get("devices") or []
        ]  # fmt: skip
        shown = subprocess.run(
            ["ip", "-d", "link", "show", link],
            check=False, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        raise AssertionError(
            f"{exc}; the driver's devices (slice, generation, ifName, taints): {devices}; "
            f"the link: {(shown.stdout or shown.stderr).strip()[:300]}"
        ) from None


def template(name: str, parent: str, pool: str, tolerate: str | None = None) -> dict[str, Any]:
    """A claim template for a macvlan on `parent`, addressed from the CNIIPPool `pool`."""
    request: dict[str, Any] = {
        "name": "net",
        "exactly": {
            "deviceClassName": "cni.networking.x-k8s.io",
            "selectors": [{"cel": {"expression": select_link(parent)}}],
        },
    }
    if tolerate:
        request["exactly"]["tolerations"] = [
            {"key": TAINT_KEY, "operator": "Exists", "effect": tolerate}
        ]
    params = {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIConfig",
        "ifName": "net1",
        "config": cni_config(name, parent, pool),
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {
            "requests": [request],
            "config": [{"requests": ["net"], "opaque": {"driver": DRIVER, "parameters": params}}],
        }}},
    }  # fmt: skip


def link(name: str, state: str) -> None:
    subprocess.run(["ip", "link", "set", name, state], check=True)


def device_health(cluster: Cluster, namespace: str, name: str) -> list[str]:
    """The health kubelet reports for the devices of the pod's container."""
    pod = json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)
    found = []
    for status in pod["status"].get("containerStatuses") or []:
        for claim in status.get("allocatedResourcesStatus") or []:
            found += [r.get("health", "") for r in claim.get("resources") or []]
    return found


def phase(cluster: Cluster, namespace: str, name: str) -> str:
    pod = json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)
    return str(pod["status"].get("phase"))


def test_a_link_that_goes_down_is_tainted_and_new_pods_wait_for_it(
    cluster: Cluster,
    namespace: str,
    start_driver: Callable[..., DriverProcess],
    test_link: Callable[[str], str],
    ip_pools: Callable[..., str],
) -> None:
    parent = test_link(f"tt{uuid.uuid4().hex[:5]}")
    pool = ip_pools("198.19.160.0/24", namespace)
    start_driver()
    wait_untainted(cluster, parent, "the link's device", 60)
    apply(cluster, namespace, template("data", parent, pool), claiming_pod("a", "data"))
    ready(cluster, namespace, "a")

    link(parent, "down")
    went_down = time.monotonic()
    taints = cluster.wait("the taint", lambda: device_taints(cluster, parent), 30)
    tainted_after = time.monotonic() - went_down
    assert taints[0]["key"] == TAINT_KEY and taints[0]["effect"] == "NoSchedule"
    assert taints[0]["value"] in ("admin-down", "down", "no-carrier")
    assert tainted_after < 10, tainted_after

    # KEP-4680: kubelet shows the pod already using it what its device's health is
    cluster.wait(
        "pod a's status to say its device is unhealthy",
        lambda: device_health(cluster, namespace, "a") == ["Unhealthy"],
        60,
    )

    apply(cluster, namespace, claiming_pod("b", "data"))
    # the scheduler's attempt is what decides: once it has said no, b is Pending for the taint
    scheduling = cluster.wait(
        "the scheduler's attempt at pod b",
        lambda: [
            e["message"]
            for e in cluster.events("b", namespace)
            if e["reason"] == "FailedScheduling"
        ],
        60,
    )
    assert phase(cluster, namespace, "b") == "Pending"  # the scheduler keeps it off the link
    assert phase(cluster, namespace, "a") == "Running"  # NoSchedule: who uses it stays
    print("scheduler said:", scheduling[-1])

    link(parent, "up")
    wait_untainted(cluster, parent, "the taint to go", 30)
    cluster.wait(
        "pod a's device healthy again",
        lambda: device_health(cluster, namespace, "a") == ["Healthy"],
        60,
    )
    ready(cluster, namespace, "b", "120s")
    assert pod_addresses(cluster, namespace, "b", "net1")


def test_with_noexecute_the_pods_on_a_dead_link_are_evicted_unless_they_tolerate_it(
    cluster: Cluster,
    namespace: str,
    start_driver: Callable[..., DriverProcess],
    test_link: Callable[[str], str],
    ip_pools: Callable[..., str],
) -> None:
    parent = test_link(f"tx{uuid.uuid4().hex[:5]}")
    pool = ip_pools("198.19.161.0/24", namespace)
    start_driver(link_failure_taint="NoExecute")  # the chart's driver.linkFailureTaint
    wait_untainted(cluster, parent, "the link's device", 60)
    apply(
        cluster,
        namespace,
        template("plain", parent, pool),
        template("patient", parent, pool, tolerate="NoExecute"),
        claiming_pod("evicted", "plain"),
        claiming_pod("stays", "patient"),
    )
    ready(cluster, namespace, "evicted")
    ready(cluster, namespace, "stays")
    link(parent, "down")
    cluster.wait(
        "the pod on the dead link to be evicted",
        lambda: (
            cluster.kubectl("get", "pod", "evicted", "-n", namespace, check=False).returncode != 0
            or phase(cluster, namespace, "evicted") in ("Failed", "Succeeded")
        ),
        90,
    )
    assert phase(cluster, namespace, "stays") == "Running"
    link(parent, "up")


def test_on_a_cluster_without_the_optional_features_the_driver_leaves_them_out(
    cluster: Cluster,
    namespace: str,
    start_driver: Callable[..., DriverProcess],
    test_link: Callable[[str], str],
    ip_pools: Callable[..., str],
) -> None:
    """As on a cluster whose apiserver has consumable capacity and device taints off (1.34/1.35
    defaults): nothing the driver writes is refused, a pod still gets its interface, and the
    log and a Node Event say what was left out."""
    from testbed import cluster as tb

    parent = test_link(f"tf{uuid.uuid4().hex[:5]}")
    pool = ip_pools("198.19.162.0/24", namespace)
    tb.stop("kube-apiserver")
    try:
        # DRADeviceTaintRules (GA and on in 1.37) depends on DRADeviceTaints: off with it
        tb.start_apiserver(
            cluster.bins,
            {
                "DRAConsumableCapacity": False,
                "DRADeviceTaints": False,
                "DRADeviceTaintRules": False,
            },
        )
        driver = start_driver()
        health = driver.health()["clusterFeatures"]
        assert health == {"consumableCapacity": False, "deviceTaints": False, "known": True}
        wait_untainted(cluster, parent, "the link's device", 60)
        link(parent, "down")
        # the driver's decision: it saw the device fail (its log says so, after what it
        # published of the round) and wrote no taint
        wait_for_log(driver.log, f"device {parent} unhealthy: link {parent}: ", 30)
        assert device_taints(cluster, parent) == []  # not written where it would be dropped
        link(parent, "up")
        slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)
        ours = [s for s in slices["items"] if s["spec"]["driver"] == DRIVER]
        assert not any(d.get("capacity") for s in ours for d in s["spec"]["devices"])
        log = driver.log.read_text()
        assert "this cluster lacks consumable capacity" in log
        assert "publishing ResourceSlices failed" not in log  # nothing it wrote was refused
        events = cluster.kubectl(
            "get", "events", "-n", "default", "--field-selector",
            "reason=CnidraFeaturesLeftOut", "-o", "json",
        )  # fmt: skip
        assert json.loads(events.stdout)["items"], "no Event on the Node"
        apply(cluster, namespace, template("plain", parent, pool),
              claiming_pod("p", "plain"))  # fmt: skip
        ready(cluster, namespace, "p")
        assert pod_addresses(cluster, namespace, "p", "net1")
    finally:
        # the pod goes while kubelet still watches this apiserver: after the restart below
        # its reflector backs off (up to 30 s), and the fixture's deletion waited that out
        cluster.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--timeout=60s", check=False, timeout=90
        )
        tb.stop("kube-apiserver")
        tb.start_apiserver(cluster.bins)
