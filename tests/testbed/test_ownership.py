"""cnidra is a guest on the node: with the driver configured as deploy/ ships it (state under
/var/lib/cnidra, no cache override), restarts, crashes, a containerd restart and a dropped NRI
connection never reach the primary network's plugin (recorded by the test bed's `tb-primary`
wrapper), every pod keeps its primary and cnidra interfaces, two tenants with the same network
name and the same pool never share an address, and a plugin slower than the hook budget fails its
sandbox cleanly."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cnidra.state.layout import DEFAULT_STATE_ROOT
from testbed.harness import Cluster, DriverProcess
from tests.testbed.conftest import pool_leases
from tests.testbed.objects import (
    TEST_CLASS,
    apply,
    claiming_pod,
    claims_of,
    cni_config,
    env_image,
    plugins_class,
    pod,
    pod_addresses,
    ready,
    template,
)

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module", autouse=True)
def device_classes(cluster: Cluster) -> None:
    from testbed.harness import ROOT

    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "deviceclass.yaml"))
    cluster.apply(plugins_class())


@pytest.fixture
def tenants(cluster: Cluster) -> Iterator[tuple[str, str]]:
    names = (f"ta-{uuid.uuid4().hex[:6]}", f"tb-{uuid.uuid4().hex[:6]}")
    for name in names:
        cluster.kubectl("create", "namespace", name)
    for name in names:
        cluster.wait(
            f"the default ServiceAccount in {name}",
            lambda n=name: (
                (
                    cluster.kubectl("get", "serviceaccount", "default", "-n", n, check=False)
                ).returncode
                == 0
            ),
            60,
        )
    yield names
    for name in names:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


class PrimaryCalls:
    """Lines the recording primary plugin wrote since this object was made."""

    def __init__(self, cluster: Cluster) -> None:
        self.path = Path(cluster.env["TESTBED_ROOT"]) / "logs" / "primary-cni.log"
        self.start = self.path.stat().st_size if self.path.exists() else 0

    def lines(self) -> list[list[str]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return [line.split() for line in f.read().decode().splitlines() if line.strip()]


def sandbox_ids(cluster: Cluster, *namespaces: str) -> dict[tuple[str, str], str]:
    """Ready sandboxes of these namespaces: (namespace, pod name) -> sandbox ID."""
    items = json.loads(cluster.crictl("pods", "-o", "json").stdout)["items"]
    return {
        (p["metadata"]["namespace"], p["metadata"]["name"]): p["id"]
        for p in items
        if p["metadata"]["namespace"] in namespaces and p["state"] == "SANDBOX_READY"
    }


def snapshot(cluster: Cluster, pods: list[tuple[str, str, str]]) -> dict[tuple[str, str], set[str]]:
    """(namespace, pod) -> addresses of eth0 and of net1 where the pod has one."""
    seen = {}
    for ns, name, kind in pods:
        addresses = pod_addresses(cluster, ns, name, "eth0")
        if kind == "cnidra":
            addresses |= pod_addresses(cluster, ns, name, "net1")
        seen[(ns, name)] = addresses
    return seen


def tenant_leases(namespace: str, pool: str) -> set[str]:
    """The addresses the driver leased from the pool to claims of the namespace."""
    leases = pool_leases(DEFAULT_STATE_ROOT, pool)
    return {a for a, lease in leases.items() if lease["holder"].startswith(f"claim {namespace}/")}


def disrupt(cluster: Cluster, driver: DriverProcess) -> None:
    """Restart the driver, kill -9 it, restart containerd, drop the NRI connection (SIGHUP);
    after each, wait for the reconnect and the reconcile behind it."""
    from testbed import cluster as tb

    def reconnected(before: int = 0) -> None:
        """Connected again, and a Synchronize finished since (its GC and sweep included):
        `before` is the count of this process's Synchronize passes before the disruption."""
        cluster.wait(
            "NRI, and the reconcile behind it",
            lambda: (
                driver.health().get("nriConnected")
                and driver.health().get("synchronized", 0) > before
            ),
            30,
        )

    driver.stop(signal.SIGTERM)
    driver.start()
    reconnected()
    driver.stop(signal.SIGKILL)
    driver.start()
    reconnected()
    synchronized = driver.health()["synchronized"]
    tb.stop("containerd")
    tb.start_containerd(cluster.bins)
    reconnected(synchronized)
    health = driver.health()
    sessions, synchronized = health["nriSessions"], health["synchronized"]
    driver.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
    cluster.wait(
        "the NRI connection to be dropped and made again",
        lambda: (
            driver.health().get("nriSessions", 0) > sessions and driver.health().get("nriConnected")
        ),
        30,
    )
    reconnected(synchronized)


def test_restarts_and_reconnects_never_touch_the_primary_network(
    cluster: Cluster,
    driver: DriverProcess,
    tenants: tuple[str, str],
    test_link: Any,
    ip_pools: Callable[..., str],
) -> None:
    a, b = tenants
    shared_pool = ip_pools("198.19.150.0/24", a, b)  # one pool serving both tenants
    parent_a, parent_b = (
        test_link(f"tba{uuid.uuid4().hex[:5]}"),
        test_link(f"tbb{uuid.uuid4().hex[:5]}"),
    )
    calls = PrimaryCalls(cluster)
    # both tenants name their network like the primary one, addressed from the same pool
    for ns, parent in ((a, parent_a), (b, parent_b)):
        conf = cni_config("testbed-primary", parent, shared_pool)
        apply(cluster, ns, template("net", [("net", parent, conf, "net1")]))
        apply(cluster, ns, claiming_pod("guest", "net"))
        apply(cluster, ns, pod("plain", env_image()))
    pods = [
        (ns, name, kind) for ns in (a, b) for name, kind in (("guest", "cnidra"), ("plain", ""))
    ]
    for ns, name, _ in pods:
        ready(cluster, ns, name)
    before = snapshot(cluster, pods)
    assert all(len(v) == (2 if n == "guest" else 1) for (_, n), v in before.items()), before
    live = set(sandbox_ids(cluster, a, b).values())
    assert len(live) == 4

    # one address each from the one pool, leased to each tenant's own claim; the user's
    # network name is what status shows
    [claim] = claims_of(cluster, a, "guest")
    status = cluster.get("resourceclaim", claim["metadata"]["name"], a)["status"]["devices"][0]
    assert "network testbed-primary" in status["conditions"][0]["message"]
    [held_a], [held_b] = tenant_leases(a, shared_pool), tenant_leases(b, shared_pool)
    assert held_a != held_b
    assert {x.split("/")[0] for x in before[(a, "guest")]} >= {held_a}
    assert {x.split("/")[0] for x in before[(b, "guest")]} >= {held_b}
    # the shared directory holds the primary network's entries (eth0), and nothing of cnidra's
    shared = Path("/var/lib/cni/results")
    assert all((shared / f"testbed-primary-{sid}-eth0").exists() for sid in live)
    assert not list(shared.glob("*-net1")) and not Path("/var/lib/cni/networks").exists()

    disrupt(cluster, driver)

    assert snapshot(cluster, pods) == before
    assert set(sandbox_ids(cluster, a, b).values()) == live
    assert all((shared / f"testbed-primary-{sid}-eth0").exists() for sid in live)
    lines = calls.lines()
    assert not [line for line in lines if "python" in line[-1]], lines  # cnidra never called it
    assert not [line for line in lines if line[0] == "DEL" and line[1] in live], lines

    # one tenant's pod goes: its address is freed, the other tenant's stays
    cluster.kubectl("delete", "-n", b, "pod", "guest", "--timeout=60s")
    cluster.wait("b's address to be freed", lambda: not tenant_leases(b, shared_pool), 30)
    assert tenant_leases(a, shared_pool) == {held_a}
    assert snapshot(cluster, [(a, "guest", "cnidra")]) == {(a, "guest"): before[(a, "guest")]}
    cluster.kubectl("delete", "-n", a, "pod", "guest", "--timeout=60s")
    cluster.wait("a's address to be freed", lambda: not tenant_leases(a, shared_pool), 30)
    cluster.wait("no sandbox record", lambda: driver.health().get("sandboxes") == 0, 30)
    assert not list((DEFAULT_STATE_ROOT / "cni" / "results").glob("*"))


def test_a_plugin_slower_than_the_budget_fails_its_sandbox_and_leaves_nothing(
    cluster: Cluster,
    driver: DriverProcess,
    namespace: str,
    test_link: Any,
    ip_pools: Callable[..., str],
) -> None:
    parent = test_link(f"tbs{uuid.uuid4().hex[:5]}")
    pool = ip_pools("198.19.151.0/24", namespace)
    conf = cni_config("slow", parent, pool)
    conf["plugins"].append({"type": "tb-sleepy"})
    apply(cluster, namespace, template("slow", [("net", parent, conf, "net1")], TEST_CLASS))
    apply(cluster, namespace, claiming_pod("late", "slow"))

    def failed() -> list[str]:
        return [
            e["message"]
            for e in cluster.events("late", namespace)
            if e["reason"] == "NetworkAttachFailed"
        ]

    # behind the sandbox (the chart's default) a pod's ADDs get the plugin timeout, 10 s
    [message, *_] = cluster.wait("the sandbox to fail on the budget", failed, 90)
    assert "'tb-sleepy'" in message and "attach budget of 10s" in message, message
    cluster.kubectl("delete", "-n", namespace, "pod", "late", "--timeout=60s")
    cluster.wait("no sandbox record", lambda: driver.health().get("sandboxes") == 0, 30)
    cluster.wait("the claim's address to be freed", lambda: not tenant_leases(namespace, pool), 30)
    assert not list((DEFAULT_STATE_ROOT / "cni" / "results").glob("*"))
    cluster.wait("no tb-sleepy process left", lambda: "tb-sleepy" not in command_lines(), 30)


def command_lines() -> str:
    lines = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(path.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # the process ended meanwhile
    return "\n".join(lines)
