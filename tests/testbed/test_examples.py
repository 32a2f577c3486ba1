"""The README's example on the test bed, as a new user applies it: the shipped classes, the
driver with deploy/'s defaults, the example's claim template and pod as they are except for
two things the test bed cannot have: its data links are host-only bridges standing in for NICs
(type "bridge", not "physical"), so the selector asks for the test's own link, and its image is
the test bed's busybox."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra.state.layout import DEFAULT_STATE_ROOT
from testbed import cluster as tb
from testbed.harness import ROOT, Cluster, DriverProcess
from tests.testbed.conftest import cnidra_crds, pool_leases
from tests.testbed.objects import SLEEP, env_image, pod_addresses, ready

pytestmark = pytest.mark.testbed
DRIVER = "cni.dra.networking.x-k8s.io"


def readme_example(
    namespace: str,
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], str]:
    """examples/macvlan-claim.yaml: its CNIIPPools (the admin's, cluster-scoped, made to serve
    `namespace`), its claim template, its pod, and the prefix of the address it gets."""
    text = (ROOT / "examples" / "macvlan-claim.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    pools = [d for d in docs if d["kind"] == "CNIIPPool"]
    template, pod = [d for d in docs if d["kind"] != "CNIIPPool"]
    assert (template["kind"], pod["kind"]) == ("ResourceClaimTemplate", "Pod")
    for pool in pools:
        assert pool["spec"].get("namespaces"), "a tenant's pool names the namespaces it serves"
        pool["spec"]["namespaces"] = [namespace]
    subnet = pools[0]["spec"]["ranges"][0]["subnet"] if pools else "198.18.10.0/24"
    return pools, template, pod, subnet.rsplit(".", 1)[0] + "."


def test_the_readme_example_runs_with_the_shipped_defaults(
    cluster: Cluster, namespace: str, test_link: Callable[[str], str], tmp_path: Path
) -> None:
    """The example is the admin's CNIIPPool (applied with its spec.namespaces naming the
    test's namespace), the tenant's claim template and the pod; the example's older shape,
    template and pod alone, is read too."""
    link = test_link(f"tbex{uuid.uuid4().hex[:5]}")
    cnidra_crds(cluster)
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "deviceclass.yaml"))
    cluster.kubectl("label", "namespace", namespace, "cni.networking.x-k8s.io/claim-config=true")
    pools, template, pod, prefix = readme_example(namespace)
    [request] = template["spec"]["spec"]["devices"]["requests"]
    [selector] = request["exactly"]["selectors"]
    assert '.type == "physical"' in selector["cel"]["expression"]
    selector["cel"]["expression"] = f'device.attributes["{DRIVER}"].ifName == "{link}"'
    [container] = pod["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": "data"}]  # the container gate holds it
    container.update(image=env_image(), command=SLEEP)
    container.pop("args", None)
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    driver = DriverProcess(cluster, tmp_path, defaults=True)  # as deploy/ runs it
    try:
        driver.start()
        cluster.wait("the NRI plugin to connect", lambda: driver.health().get("nriConnected"), 60)
        for pool in pools:
            cluster.apply(pool)
        cluster.apply_in(namespace, template)
        cluster.apply_in(namespace, pod)
        ready(cluster, namespace, pod["metadata"]["name"])
        [address] = pod_addresses(cluster, namespace, pod["metadata"]["name"], "net1")
        assert address.startswith(prefix), (address, prefix)
        if pools:  # leased to the pod's claim from the example's pool
            [claim] = json.loads(
                cluster.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout
            )["items"]
            leased = pool_leases(DEFAULT_STATE_ROOT, pools[0]["metadata"]["name"])
            assert {a: x["holder"] for a, x in leased.items()} == {
                address.split("/")[0]: f"claim {namespace}/{claim['metadata']['name']}"
            }
            # its block reserved once: ahead, when the pod was bound, or at its prepare, never
            # both (none when the node held one of the pool's blocks already)
            reserved = {
                line.split('when="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                for line in driver.metrics().splitlines()
                if line.startswith("cnidra_ipam_blocks_reserved_total{")
            }
            assert sum(reserved.values()) <= 1, reserved

        def listed() -> bool:
            meta = cluster.get("pod", pod["metadata"]["name"], namespace)["metadata"]
            text = (meta.get("annotations") or {}).get("k8s.v1.cni.cncf.io/network-status")
            return any(e.get("interface") == "net1" for e in json.loads(text or "[]"))

        cluster.wait("net1 in the pod's network-status annotation", listed, 30)

        def added() -> list[dict[str, Any]]:
            return [
                e
                for e in cluster.events(pod["metadata"]["name"], namespace)
                if e["reason"] == "AddedInterface"
            ]

        # the shipped defaults write the Normal Events, with when and where they happened:
        # `kubectl get events` shows their age beside kubelet's, not "<unknown>"
        [event] = cluster.wait("the Normal Event AddedInterface", added, 30)
        assert event["type"] == "Normal" and "net1" in event["message"]
        assert event["firstTimestamp"] and event["lastTimestamp"], event
        assert event["source"] == {"component": "cnidra", "host": tb.NODE1.name}
        shown = cluster.kubectl("get", "events", "-n", namespace).stdout
        assert "AddedInterface" in shown and "<unknown>" not in shown, shown
    finally:
        cluster.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--timeout=90s", check=False, timeout=120
        )
        driver.stop()
        shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)
        for pool in pools:
            name = pool["metadata"]["name"]
            cluster.kubectl("delete", "cniippool", name, "--ignore-not-found", check=False)
            cluster.kubectl(
                "delete", "cniipblocks", "-l", f"cni.networking.x-k8s.io/pool={name}", check=False
            )


def test_a_multus_deployment_converted_runs(
    cluster: Cluster, namespace: str, test_link: Callable[[str], str], tmp_path: Path
) -> None:
    """docs/migrating-from-multus.md on the test bed: examples/convert/multus-deployment.yaml
    (whereabouts, a host-local dataDir, a Deployment asking for two NADs) with the test bed's
    names put in, through `cnidra convert`, `cnidra validate --policy` and `kubectl apply`, with
    the shipped classes and the driver with deploy/'s defaults: both replicas get n3 from the
    converted pool and net2 from the bridge network (Multus' name: the second in the
    annotation, unnamed), and no two share an address."""
    tag = uuid.uuid4().hex[:4]
    data, bridge = test_link(f"tbmd{tag}"), test_link(f"tbmb{tag}")
    source = (ROOT / "examples" / "convert" / "multus-deployment.yaml").read_text()
    have = tmp_path / "have.yaml"
    have.write_text(
        source.replace('"eth1"', f'"{data}"')
        .replace('"br-stor"', f'"{bridge}"')
        .replace("namespace: telco", f"namespace: {namespace}")
        .replace('"namespace": "telco"', f'"namespace": "{namespace}"')
    )
    cnidra = [sys.executable, "-m", "cnidra"]
    converted = subprocess.run(
        [*cnidra, "convert", str(have)], capture_output=True, text=True, timeout=60, check=True
    )
    assert "whereabouts IPAM became CNIIPPool" in converted.stderr
    out = tmp_path / "cnidra.yaml"
    out.write_text(converted.stdout)
    checked = subprocess.run(
        [*cnidra, "validate", "--policy", str(ROOT / "deploy" / "deviceclass.yaml"),
         "--namespace-labels", "cni.networking.x-k8s.io/claim-config=true", str(out)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout
    docs = [d for d in yaml.safe_load_all(converted.stdout) if d]
    # whereabouts' range and host-local's subnet both become CNIIPPools (host-local in a
    # claim's network is refused: one pool per network name and node)
    pools = [d for d in docs if d["kind"] == "CNIIPPool"]
    assert len(pools) == 2, [p["metadata"]["name"] for p in pools]
    for doc in docs:  # the test bed's busybox, which stays up
        if doc["kind"] == "Deployment":
            [container] = doc["spec"]["template"]["spec"]["containers"]
            container.update(image=env_image(), command=SLEEP, args=[])
            doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds.yaml"))
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "deviceclass.yaml"))
    cluster.kubectl("label", "namespace", namespace, "cni.networking.x-k8s.io/claim-config=true")
    (tmp_path / "driver").mkdir()
    driver = DriverProcess(cluster, tmp_path / "driver", defaults=True)
    try:
        driver.start()
        cluster.wait("the NRI plugin to connect", lambda: driver.health().get("nriConnected"), 60)
        cluster.wait(
            "the CNIIPPool CRD",
            lambda: cluster.kubectl("get", "cniippools", check=False).returncode == 0,
            60,
        )
        for doc in docs:
            if doc["kind"] == "CNIIPPool":
                cluster.apply(doc)  # cluster-scoped: the admin's
            else:
                cluster.apply_in(namespace, doc)
        cluster.kubectl(
            "rollout", "status", "deployment/upf", "-n", namespace, "--timeout=120s", timeout=150
        )
        pods = json.loads(
            cluster.kubectl("get", "pods", "-n", namespace, "-l", "app=upf", "-o", "json").stdout
        )["items"]
        assert len(pods) == 2
        n3 = [pod_addresses(cluster, namespace, p["metadata"]["name"], "n3") for p in pods]
        net2 = [pod_addresses(cluster, namespace, p["metadata"]["name"], "net2") for p in pods]
        assert all(a.startswith("198.18.60.") for [a] in n3) and len({*n3[0], *n3[1]}) == 2
        assert all(a.startswith("198.18.61.") for [a] in net2) and len({*net2[0], *net2[1]}) == 2
        assert not any(int(a.split(".")[3].split("/")[0]) < 16 for [a] in n3)  # excluded /28
    finally:
        cluster.kubectl(
            "delete", "deployment", "upf", "-n", namespace, "--wait=true", "--timeout=90s",
            check=False, timeout=120,
        )  # fmt: skip
        cluster.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--timeout=90s", check=False, timeout=120
        )
        driver.stop()
        shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)
        for pool in pools:
            cluster.kubectl("delete", "cniippool", pool["metadata"]["name"], check=False)
            cluster.kubectl(
                "delete", "cniipblocks", "-l",
                f"cni.networking.x-k8s.io/pool={pool['metadata']['name']}", check=False,
            )  # fmt: skip


RUNNABLE = {
    # example file: (the interface its pod gets, the IPv4 prefix of its address)
    "dual-stack-pool.yaml": ("net1", "198.18.20."),
    "named-network.yaml": ("data0", "198.18.70."),
    "ipamclaim.yaml": ("net1", "198.18.30."),
}


@pytest.mark.parametrize("example", sorted(RUNNABLE))
def test_each_runnable_example_runs(
    cluster: Cluster,
    namespace: str,
    test_link: Callable[[str], str],
    tmp_path: Path,
    example: str,
) -> None:
    """The examples as files, with the test bed's link, namespace and image put in; a
    CNINetwork's node conf is written where the driver reads it (the admin's part). The SR-IOV
    example needs an SR-IOV NIC, which the test bed has not; validate checks it."""
    if_name, prefix = RUNNABLE[example]
    link = test_link(f"tbrx{uuid.uuid4().hex[:5]}")
    text = (ROOT / "examples" / example).read_text()
    for ns in ("default", "vms"):
        text = text.replace(f"namespace: {ns}", f"namespace: {namespace}")
        text = text.replace(f"namespaces: [{ns}]", f"namespaces: [{namespace}]")
    text = text.replace('.type == "physical"', f'.ifName == "{link}"')
    docs = [d for d in yaml.safe_load_all(text) if d]
    confs = []
    for doc in docs:
        if doc["kind"] == "CNINetwork" and doc["spec"].get("networkID"):
            pools = [d["metadata"]["name"] for d in docs if d["kind"] == "CNIIPPool"]
            ipam = (
                {"type": "cnidra", "pool": pools[0]}
                if pools
                else {"type": "host-local", "ranges": [[{"subnet": "198.18.70.0/24"}]]}
            )
            conf = tb.Paths.cni_conf / f"{doc['spec']['networkID']}.conflist"
            conf.write_text(json.dumps({"cniVersion": "1.0.0", "name": doc["metadata"]["name"],
                "plugins": [{"type": "macvlan", "master": link, "ipam": ipam}]}))  # fmt: skip
            confs.append(conf)
    pods = [d for d in docs if d["kind"] == "Pod"]
    for template in [d for d in docs if d["kind"] == "ResourceClaimTemplate"] if not pods else []:
        name = template["metadata"]["name"]
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"run-{name}"},
                     "spec": {"resourceClaims": [{"name": "n", "resourceClaimTemplateName": name}],
                              "containers": []}})  # fmt: skip
        docs.append(pods[-1])
    for pod in pods:
        pod["spec"]["containers"] = [{"name": "c", "image": env_image(), "command": SLEEP}]
        pod["spec"]["terminationGracePeriodSeconds"] = 1
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds.yaml"))
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "deviceclass.yaml"))
    cluster.kubectl("label", "namespace", namespace, "cni.networking.x-k8s.io/claim-config=true")
    scoped = [d for d in docs if d["kind"] in ("CNINetwork", "CNIIPPool")]
    driver = DriverProcess(cluster, tmp_path, defaults=True, cni_conf_dir=str(tb.Paths.cni_conf))
    try:
        driver.start()
        cluster.wait("the NRI plugin to connect", lambda: driver.health().get("nriConnected"), 60)
        cluster.wait(
            "the CRDs",
            lambda: (
                cluster.kubectl("get", "cniippools,ipamclaims", "-A", check=False).returncode == 0
            ),
            60,
        )
        for doc in docs:
            if doc in scoped:
                cluster.apply(doc)
            else:
                cluster.apply_in(namespace, doc)
        for pod in pods:
            ready(cluster, namespace, pod["metadata"]["name"], timeout="120s")
            [address] = pod_addresses(cluster, namespace, pod["metadata"]["name"], if_name)
            assert address.startswith(prefix), (example, address)
    finally:
        cluster.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--timeout=90s", check=False, timeout=120
        )
        for claim in json.loads(
            cluster.kubectl("get", "ipamclaims", "-n", namespace, "-o", "json", check=False).stdout
            or '{"items": []}'
        )["items"]:  # the driver's finalizer: it is stopped before it would drop it
            cluster.kubectl(
                "patch", "ipamclaim", claim["metadata"]["name"], "-n", namespace, "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False,
            )  # fmt: skip
        driver.stop()
        shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)
        for doc in scoped:
            cluster.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], check=False)
            if doc["kind"] == "CNIIPPool":
                cluster.kubectl(
                    "delete", "cniipblocks", "-l",
                    f"cni.networking.x-k8s.io/pool={doc['metadata']['name']}", check=False,
                )  # fmt: skip
        for conf in confs:
            conf.unlink(missing_ok=True)
