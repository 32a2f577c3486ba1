"""The driver as clusters run it: the image `make image` builds, loaded into the test bed's
containerd, installed with `helm install` from charts/cnidra, its DaemonSet pod registering
with kubelet, publishing its slice, serving NRI and passing its /healthz probes, attaching a
pod's interface and writing the claim's status with its own ServiceAccount; `helm upgrade` rolls
it while the pod keeps its interface; `helm uninstall` leaves no slice and no finalizer, and a
second install (from the image that bundles the CNI plugins, onto a node without them) takes
over what the first left. The rest of the e2e suite runs against the in-cluster driver too
(test_lifecycle.py, its `in-cluster` half)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cnidra.state.layout import DEFAULT_STATE_ROOT
from testbed import cluster as tb
from testbed.harness import ROOT, Cluster
from testbed.incluster import (
    IMAGE_ARCHIVE,
    NAMESPACE,
    InClusterDriver,
    Release,
    build_image,
    wait_gone,
)
from tests.testbed.conftest import pool_leases
from tests.testbed.objects import claiming_pod, cni_config, pod_addresses, ready, template

pytestmark = pytest.mark.testbed


@pytest.fixture
def release(cluster: Cluster, image: str, tmp_path: Path) -> Iterator[Release]:
    assert not DEFAULT_STATE_ROOT.exists() or not any(DEFAULT_STATE_ROOT.glob("*/*"))
    release = Release(cluster, tmp_path / "values.yaml")
    release.install()
    try:
        yield release
    finally:
        if release.installed():
            release.uninstall()
        shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)


@pytest.fixture
def tenant_ns(cluster: Cluster) -> Iterator[str]:
    """A tenant namespace, deleted after the test whether it passed or not."""
    ns = tenant_namespace(cluster)
    try:
        yield ns
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def tenant_namespace(cluster: Cluster) -> str:
    ns = f"ic-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("label", "namespace", ns, "cni.networking.x-k8s.io/claim-config=true")
    cluster.wait(
        "the namespace's ServiceAccount",
        lambda: cluster.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
    )
    return ns


def start_pod(cluster: Cluster, ns: str, name: str) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input_=json.dumps(claiming_pod(name, "net")))


def net1(cluster: Cluster, ns: str, name: str) -> set[str]:
    return pod_addresses(cluster, ns, name, "net1")


def allocated(ns: str, pool: str) -> set[str]:
    """The addresses the driver (its state under the chart's hostPaths.state) leased from the
    pool to claims of the namespace."""
    leases = pool_leases(DEFAULT_STATE_ROOT, pool)
    return {a for a, lease in leases.items() if lease["holder"].startswith(f"claim {ns}/")}


def test_installed_with_helm_the_driver_serves_pods(
    cluster: Cluster,
    release: Release,
    test_link: Any,
    tmp_path: Path,
    ip_pools: Callable[..., str],
    tenant_ns: str,
) -> None:
    driver = InClusterDriver(cluster)
    driver.wait_ready()
    state = driver.health()
    assert state["ok"] and all(t["running"] for t in state["tasks"].values()), state
    assert "cnidra_dra_requests_total" in driver.metrics()

    ns = tenant_ns
    parent = test_link(f"tbi{uuid.uuid4().hex[:5]}")
    cluster.wait("the slice", lambda: parent in cluster.kubectl(
        "get", "resourceslices", "-o", "json").stdout, 30)  # fmt: skip
    pool = ip_pools("198.19.180.0/24", ns)
    conf = cni_config("incluster", parent, pool)
    cluster.apply_in(ns, template("net", [("net", parent, conf, "net1")]))
    start_pod(cluster, ns, "p1")
    ready(cluster, ns, "p1")
    before = net1(cluster, ns, "p1")
    assert len(before) == 1
    status = cluster.wait(
        "the claim status, written by the in-cluster driver",
        lambda: json.loads(cluster.kubectl("get", "resourceclaims", "-n", ns, "-o", "json").stdout)[
            "items"][0].get("status", {}).get("devices"),
        30,
    )  # fmt: skip
    assert status[0]["networkData"]["ips"] == sorted(before)
    # the network-status annotation, written with the driver's node-bound token through the
    # pod-writes admission policy
    annotation = cluster.wait(
        "the network-status annotation",
        lambda: cluster.get("pod", "p1", ns)["metadata"].get("annotations", {}).get(
            "k8s.v1.cni.cncf.io/network-status"),
        30,
    )  # fmt: skip
    [entry] = [e for e in json.loads(annotation) if e["interface"] == "net1"]
    assert sorted(entry["ips"]) == sorted(ip.split("/")[0] for ip in before)

    upgrade_while_pods_come_and_go(cluster, release, driver, ns, pool, before)
    reinstall_with_bundled_plugins(cluster, release, driver, ns, tmp_path / "opt-cni-bin")

    for name in ("p2", "p3"):
        cluster.kubectl("delete", "pod", name, "-n", ns, "--timeout=60s")
    cluster.wait("no sandbox record", lambda: driver.health().get("sandboxes") == 0, 30)

    def none_held() -> bool:
        claims = json.loads(cluster.kubectl("get", "resourceclaims", "-n", ns, "-o", "json").stdout)
        held = {c["metadata"]["name"]: c["metadata"].get("finalizers") for c in claims["items"]}
        assert not any(held.values()), held
        return True

    # the releases follow the DELs through the status queue; kube's own claim controller
    # removes its delete-protection once the pods are gone
    cluster.wait("no claim held", none_held, 30)
    release.uninstall()
    wait_gone(cluster)


def upgrade_while_pods_come_and_go(
    cluster: Cluster,
    release: Release,
    driver: InClusterDriver,
    ns: str,
    pool: str,
    before: set[str],
) -> None:
    """A rolling upgrade (a new pod spec) while p1 runs, p2 starts and "gone" is deleted: p1
    keeps its interface and address (the new driver's Synchronize finds its record: no DEL, no
    second ADD); whichever driver saw the others' hooks, or the new one's Synchronize, p2 gets
    its interface and gone's address is freed."""
    start_pod(cluster, ns, "gone")
    ready(cluster, ns, "gone")
    start = time.monotonic()
    # an upgrade to another of the chart's ci/ values sets, as chart-testing's `ct install
    # --upgrade` does: the metrics Service and the dashboard come with it
    metrics = ROOT / "charts" / "cnidra" / "ci" / "metrics-values.yaml"
    with ThreadPoolExecutor(1) as executor:
        upgrade = executor.submit(release.upgrade, "driver.logLevel=debug", values=[metrics])
        time.sleep(0.5)
        cluster.kubectl("delete", "pod", "gone", "-n", ns, "--wait=false")
        start_pod(cluster, ns, "p2")
        upgrade.result()
    driver.listen_on_node()  # the metrics Service's values: the node's address, not loopback
    driver.wait_ready()
    print(f"helm upgrade to a ready driver: {time.monotonic() - start:.1f} s")
    made = cluster.kubectl(
        "get", "services,configmaps", "-n", NAMESPACE, "-l", "app.kubernetes.io/instance=cnidra",
        "-o", "jsonpath={range .items[*]}{.kind}/{.metadata.name} {end}",
    ).stdout.split()  # fmt: skip
    assert "Service/cnidra-metrics" in made and "ConfigMap/cnidra-dashboard" in made, made
    cluster.wait(
        "the metrics Service's endpoint (the driver pod, port 9177)",
        lambda: "9177" in cluster.kubectl(
            "get", "endpointslices", "-n", NAMESPACE, "-l",
            "kubernetes.io/service-name=cnidra-metrics", "-o", "jsonpath={..port}",
        ).stdout,
        30,
    )  # fmt: skip
    assert net1(cluster, ns, "p1") == before
    ready(cluster, ns, "p2")
    cluster.wait("p2's interface", lambda: len(net1(cluster, ns, "p2")) == 1, 30)
    live = {a.split("/")[0] for a in before | net1(cluster, ns, "p2")}
    cluster.wait("only live pods' addresses leased", lambda: allocated(ns, pool) == live, 60)


def reinstall_with_bundled_plugins(
    cluster: Cluster, release: Release, driver: InClusterDriver, ns: str, node_plugins: Path
) -> None:
    """Uninstall while p2 still holds its interface (README: its record stays), then install
    again over what the first release left, from the image that bundles the CNI plugins, onto
    a node without any (an empty plugin directory): the init step installs them, and the new
    driver takes p2 over from its record."""
    cluster.kubectl("delete", "pod", "p1", "-n", ns, "--timeout=60s")
    cluster.wait("p1's sandbox record to go", lambda: driver.health().get("sandboxes") == 1, 30)
    release.uninstall()
    wait_gone(cluster)
    assert len(list((DEFAULT_STATE_ROOT / "sandboxes").glob("*.json"))) == 1
    # the image with the plugins, built and loaded beside the plain one by the `image` fixture
    release.install("cniPlugins.install=true", f"hostPaths.cniBin={node_plugins}")
    driver.listen_on_node(False)  # the defaults again
    driver.wait_ready()
    installed = {p.name for p in node_plugins.iterdir()}
    assert {"macvlan", "host-local", "bridge", "tuning"} <= installed, installed
    assert driver.health().get("sandboxes") == 1
    assert len(net1(cluster, ns, "p2")) == 1
    start_pod(cluster, ns, "p3")
    ready(cluster, ns, "p3")
    assert len(net1(cluster, ns, "p3")) == 1


def layer_names(archive: Path) -> set[str]:
    import gzip
    import io
    import tarfile

    names: set[str] = set()
    with tarfile.open(archive) as oci:

        def blob(digest: str) -> bytes:
            member = oci.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert member is not None
            return member.read()

        index = json.loads(oci.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layer["digest"])))) as t:
                names |= set(t.getnames())
    return names


def test_the_image_has_no_shell(image: str) -> None:
    names = layer_names(IMAGE_ARCHIVE)
    assert "usr/local/bin/cnidra" in names and "usr/bin/python3.11" in names
    assert "usr/sbin/nft" in names  # network policy, on by default
    assert not names & {"usr/bin/sh", "usr/bin/bash", "usr/bin/dash", "usr/bin/apt-get"}
    assert not names & {"usr/bin/gcc", "usr/bin/cc", "usr/bin/g++", "usr/bin/make"}
    size = IMAGE_ARCHIVE.stat().st_size
    print(f"image archive: {size / 2**20:.1f} MiB")


@pytest.mark.full
def test_the_image_is_reproducible(image: str) -> None:
    """A second build of the same commit (make test-full: `make test` builds the image once)."""
    assert build_image() == image  # same commit, same digest


@pytest.mark.full
def test_the_chart_installs_upgrades_and_uninstalls_with_each_ci_values_file(
    cluster: Cluster, image: str, tmp_path: Path, tenant_ns: str
) -> None:
    """chart-testing's `ct install --upgrade`, on the test bed: the chart installed with
    ci/webhook-values.yaml (the webhook, its two replicas, PodDisruptionBudget and priority
    class), the webhook judging a claim from its pod, upgraded to ci/metrics-values.yaml
    as well, still judging, uninstalled with nothing of the release left."""
    ci = ROOT / "charts" / "cnidra" / "ci"
    release = Release(cluster, tmp_path / "values.yaml")
    forwarders: list[subprocess.Popen[bytes]] = []
    try:
        release.install(values=[ci / "webhook-values.yaml"])
        made = cluster.kubectl(
            "get", "deployments,poddisruptionbudgets", "-n", NAMESPACE,
            "-l", "app.kubernetes.io/instance=cnidra", "-o", "name",
        ).stdout.split()  # fmt: skip
        assert {
            "deployment.apps/cnidra-webhook",
            "poddisruptionbudget.policy/cnidra-webhook",
        } <= set(made), made
        priority = cluster.kubectl(
            "get", "deployment", "cnidra-webhook", "-n", NAMESPACE,
            "-o", "jsonpath={.spec.template.spec.priorityClassName}",
        ).stdout  # fmt: skip
        assert priority == "system-cluster-critical", priority
        # the webhook's pods reach the apiserver at the test bed's loopback (apiServer.host),
        # which a relay puts into each pod's network namespace
        for netns in webhook_pod_netns(cluster):
            relay = [sys.executable, str(ROOT / "testbed" / "forward.py"), netns]
            forwarders.append(subprocess.Popen([*relay, str(tb.APISERVER_PORT)]))
        judged(cluster, tenant_ns)
        release.upgrade(
            "driver.logLevel=debug", values=[ci / "webhook-values.yaml", ci / "metrics-values.yaml"]
        )
        judged(cluster, tenant_ns)
        release.uninstall()
        wait_gone(cluster)
        left = cluster.kubectl(
            "get", "all,poddisruptionbudgets,configmaps,secrets,serviceaccounts", "-n", NAMESPACE,
            "-l", "app.kubernetes.io/instance=cnidra", "-o", "name",
        ).stdout.split()  # fmt: skip
        assert left == [], left
        hooks = cluster.kubectl("get", "validatingwebhookconfigurations", "-o", "name").stdout
        assert "cnidra" not in hooks, hooks
    finally:
        for proc in forwarders:
            proc.terminate()
            proc.wait(10)
        if release.installed():
            release.uninstall()
        shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)


def webhook_pod_netns(cluster: Cluster) -> list[str]:
    """The network namespaces of the webhook's running pods (their sandboxes')."""
    ids = cluster.crictl(
        "pods", "-q", "--state", "ready", "--namespace", NAMESPACE,
        "--label", "app=cnidra-webhook",
    ).stdout.split()  # fmt: skip
    assert len(ids) == 2, ids
    paths = []
    for sandbox in ids:
        info = json.loads(cluster.crictl("inspectp", sandbox).stdout)
        [path] = [
            n["path"]
            for n in info["info"]["runtimeSpec"]["linux"]["namespaces"]
            if n["type"] == "network"
        ]
        paths.append(path)
    return paths


def judged(cluster: Cluster, ns: str) -> None:
    """The webhook refuses a claim template whose CNIConfig has a field no CNIConfig has,
    naming it (the admission policies cannot: they do not decode the config), and admits one
    without it."""
    macvlan = {"cniVersion": "1.0.0", "name": "x", "plugins": [{"type": "macvlan"}]}
    bad = template("judged", [("net", "tbnone", macvlan, "net1")])
    bad["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["mtuu"] = 1500

    def refused() -> str:
        out = cluster.kubectl("apply", "-n", ns, "-f", "-", input_=json.dumps(bad), check=False)
        return out.stderr if out.returncode != 0 and "webhook" in out.stderr else ""

    said = cluster.wait("the webhook to refuse the claim template", refused, 60)
    assert "mtuu" in said, said
    good = template("judged", [("net", "tbnone", macvlan, "net1")])
    cluster.kubectl("apply", "-n", ns, "-f", "-", input_=json.dumps(good))
    cluster.kubectl("delete", "resourceclaimtemplate", "judged", "-n", ns)
