"""A Multus shop migrates, on the test bed (issue 41): Multus (its thin plugin, as the node's
CNI, delegating to the primary network) with whereabouts runs a StatefulSet and a Deployment
with three networks each (named, unnamed, another namespace's); their objects, as `kubectl get
-o yaml` prints them, go through `cnidra convert` and `cnidra validate --policy`, and the output
is applied beside them with the shipped classes and the driver with deploy/'s defaults:

- the converted Deployment, running beside the Multus one, gets the same interface names and
  no address any Multus pod holds;
- the StatefulSet, moved (the Multus one deleted, the converted one applied under its name),
  keeps every pod's addresses, from the pool's reservations that convert made of whereabouts'
  allocations;
- no container starts before its interfaces exist: each container checks its interfaces when
  it starts and exits if one is missing, and none restarts.

Multus v4.3.0 and whereabouts v0.9.4 are built from the Go module proxy into the cache
(hack/install-peers.sh), as the benchmarks build them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra.state.layout import DEFAULT_STATE_ROOT
from testbed import cluster as tb
from testbed.crds import NAD_CRD
from testbed.harness import ROOT, Cluster, DriverProcess
from tests.testbed.conftest import cnidra_crds
from tests.testbed.objects import env_image, pod_addresses

pytestmark = pytest.mark.testbed
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"
INTERFACES = ("data", "net2", "net3")  # named; unnamed second; another namespace's, third
RANGES = ("198.18.150.0/27", "198.18.151.0/27", "198.18.152.0/27")
# each container checks its interfaces as it starts: one started before them exits 3 (and
# restarts), so a restart count of 0 says none did
CHECKED = [
    "sh",
    "-c",
    "for i in " + " ".join(INTERFACES) + "; do test -e /sys/class/net/$i || exit 3; done; "
    "trap 'exit 0' TERM; sleep 3600 & wait",
]


WHEREABOUTS_CONF = tb.ROOT / "whereabouts.conf"


def peers() -> dict[str, Path]:
    """Multus and whereabouts from the cache, built the first time (a few minutes)."""
    script = ROOT / "hack" / "install-peers.sh"
    subprocess.run([str(script), "multus", "whereabouts"], check=True, timeout=1800)
    env = subprocess.run([str(script), "env"], capture_output=True, text=True, check=True)
    found = dict(
        line.removeprefix("export ").split("=", 1) for line in env.stdout.splitlines() if line
    )
    return {
        "multus": Path(found["CNIDRA_PEER_MULTUS"]),
        "whereabouts": Path(found["CNIDRA_PEER_WHEREABOUTS"]),
    }


@pytest.fixture
def multus(cluster: Cluster) -> Iterator[None]:
    """Multus' thin plugin as node 1's CNI config (ahead of the primary network's, which it
    delegates to), multus and whereabouts on containerd's plugin path, whereabouts' CRDs;
    all of it gone afterwards (the test deletes its pods first, through Multus)."""
    built = peers()
    node = tb.NODE1
    bins = [tb.Paths.cni_bin / "multus", tb.Paths.cni_bin / "whereabouts"]
    shutil.copy2(built["multus"], bins[0])
    shutil.copy2(built["whereabouts"], bins[1])
    cache = tb.ROOT / "multus-cache"
    # the primary network as one plugin's config: Multus v4.3.0 keeps a conflist delegate
    # only as the fields every plugin has (LoadDelegateNetConfFromConfList marshals its
    # NetConfList), and DELs with that, so the bridge's host-local, without its ranges,
    # refuses the DEL and the pod never goes; a single config is kept as written
    listed = json.loads((node.cni_conf / "10-testbed.conflist").read_text())
    primary = tb.ROOT / "multus-primary.conf"
    primary.write_text(
        json.dumps(
            {"cniVersion": listed["cniVersion"], "name": listed["name"], **listed["plugins"][0]}
        )
    )
    conf = node.cni_conf / "00-multus.conf"
    conf.write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "multus-cni-network",
                "type": "multus",
                "kubeconfig": str(tb.Paths.admin_kubeconfig),
                "clusterNetwork": str(primary),
                "binDir": str(tb.Paths.cni_bin),
                "cniDir": str(cache),
                "logFile": str(tb.Paths.logs / "multus.log"),
                "logLevel": "verbose",
            }
        )
    )
    WHEREABOUTS_CONF.write_text(
        json.dumps(
            {
                "datastore": "kubernetes",
                "kubernetes": {"kubeconfig": str(tb.Paths.admin_kubeconfig)},
                "log_file": str(tb.Paths.logs / "whereabouts.log"),
                "log_level": "debug",
            }
        )
    )
    cluster.apply(NAD_CRD)  # Multus' own CRD, and whereabouts'
    cluster.kubectl("apply", "-f", str(built["whereabouts"].parent / "crds"))
    served = "net-attach-def,ippools.whereabouts.cni.cncf.io"
    cluster.wait(
        "the NAD and whereabouts CRDs to be served",
        lambda: cluster.kubectl("get", served, "-A", check=False).returncode == 0,
        60,
    )
    try:
        yield
    finally:
        conf.unlink(missing_ok=True)
        WHEREABOUTS_CONF.unlink(missing_ok=True)
        primary.unlink(missing_ok=True)
        for path in bins:
            path.unlink(missing_ok=True)
        shutil.rmtree(cache, ignore_errors=True)
        cluster.kubectl(
            "delete", "ippools.whereabouts.cni.cncf.io,"
            "overlappingrangeipreservations.whereabouts.cni.cncf.io", "--all", "-A",
            check=False, timeout=60,
        )  # fmt: skip


def nad(name: str, namespace: str, master: str, subnet: str) -> dict[str, Any]:
    config = {
        "cniVersion": "0.3.1",
        "name": name,
        "type": "macvlan",
        "master": master,
        "mode": "bridge",
        "ipam": {
            "type": "whereabouts",
            "range": subnet,
            # whereabouts reads its datastore from a file of its own (its DaemonSet writes
            # /etc/cni/net.d/whereabouts.d/whereabouts.conf), which the `multus` fixture writes
            "configuration_path": str(WHEREABOUTS_CONF),
        },
    }
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"config": json.dumps(config)},
    }


def workload(kind: str, name: str, shared: str) -> dict[str, Any]:
    networks = json.dumps(
        [
            {"name": "mig-a", "interface": "data"},
            {"name": "mig-b"},
            {"name": "mig-c", "namespace": shared},
        ]
    )
    spec: dict[str, Any] = {
        "replicas": 2,
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}, "annotations": {NETWORKS_ANNOTATION: networks}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": tb.NODE1.name},
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "image": env_image(), "command": CHECKED}],
            },
        },
    }
    if kind == "StatefulSet":
        spec.update(serviceName=name, podManagementPolicy="Parallel")
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


def pods(cluster: Cluster, namespace: str, app: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", f"app={app}", "-o", "json")
    return list(json.loads(out.stdout)["items"])


def interfaces(pod: dict[str, Any]) -> dict[str, set[str]]:
    """The pod's secondary interfaces and their addresses, from its network-status annotation
    (Multus writes it; cnidra writes the same)."""
    status = json.loads(pod["metadata"].get("annotations", {}).get(STATUS_ANNOTATION, "[]"))
    return {
        entry["interface"]: set(entry.get("ips") or [])
        for entry in status
        if entry.get("interface") in INTERFACES
    }


def annotated(cluster: Cluster, namespace: str, app: str, count: int) -> list[dict[str, Any]]:
    """The workload's `count` pods, Ready, each with all three interfaces in its annotation."""

    def check() -> list[dict[str, Any]] | None:
        found = pods(cluster, namespace, app)
        live = [p for p in found if not p["metadata"].get("deletionTimestamp")]
        if len(live) != count:
            return None
        for p in live:
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
            if not ready or set(interfaces(p)) != set(INTERFACES):
                return None
        return live

    return list(cluster.wait(f"{count} pods of {app} Ready with their interfaces", check, 150))


def restarts(pod: dict[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", []))


def addresses(found: list[dict[str, Any]]) -> set[str]:
    return {ip for p in found for ips in interfaces(p).values() for ip in ips}


def convert(
    cluster: Cluster, namespace: str, shared: str, tmp_path: Path
) -> dict[str, list[dict[str, Any]]]:
    """docs/migrating-from-multus.md's recipe with this cluster's objects: the workloads, the
    NADs of both namespaces and whereabouts' objects as `kubectl get -o yaml` prints them,
    joined by `---`, through `cnidra convert` and `cnidra validate --policy`; the output by
    kind."""
    whereabouts = (
        "ippools.whereabouts.cni.cncf.io,overlappingrangeipreservations.whereabouts.cni.cncf.io"
    )
    parts = [
        cluster.kubectl("get", "statefulset/db", "deployment/web", "-n", namespace, "-o", "yaml"),
        cluster.kubectl("get", "net-attach-def", "-n", namespace, "-o", "yaml"),
        cluster.kubectl("get", "net-attach-def", "-n", shared, "-o", "yaml"),
        cluster.kubectl("get", whereabouts, "-A", "-o", "yaml"),
    ]
    have = tmp_path / "have.yaml"
    have.write_text("\n---\n".join(p.stdout for p in parts))
    cnidra = [sys.executable, "-m", "cnidra"]
    converted = subprocess.run(
        [*cnidra, "convert", str(have)], capture_output=True, text=True, timeout=60, check=False
    )
    assert converted.returncode == 0, converted.stderr
    assert "reserved for the pods holding them" in converted.stderr, converted.stderr
    out = tmp_path / "cnidra.yaml"
    out.write_text(converted.stdout)
    checked = subprocess.run(
        [*cnidra, "validate", "--policy", str(ROOT / "deploy" / "deviceclass.yaml"),
         "--namespace-labels", "cni.networking.x-k8s.io/claim-config=true", str(out)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all(converted.stdout):
        if doc:
            by_kind.setdefault(doc["kind"], []).append(doc)
    # every container lists the claim: the fail-closed gate holds it until its interfaces exist
    for kind in ("StatefulSet", "Deployment"):
        [made] = by_kind[kind]
        template = made["spec"]["template"]
        [claim] = template["spec"]["resourceClaims"]
        for container in template["spec"]["containers"]:
            assert {"name": claim["name"]} in container["resources"]["claims"], container
        assert NETWORKS_ANNOTATION not in template["metadata"].get("annotations", {})
    return by_kind


def test_a_multus_statefulset_and_deployment_move_to_cnidra_beside_multus(
    cluster: Cluster,
    namespace: str,
    multus: None,
    test_link: Callable[[str], str],
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:4]
    links = [test_link(f"tbmm{n}{tag}") for n in "abc"]
    shared = f"{namespace}-shared"
    cluster.kubectl("create", "namespace", shared)
    cnidra_crds(cluster)
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "deviceclass.yaml"))
    cluster.kubectl("label", "namespace", namespace, "cni.networking.x-k8s.io/claim-config=true")
    cluster.apply(
        nad("mig-a", namespace, links[0], RANGES[0]),
        nad("mig-b", namespace, links[1], RANGES[1]),
        nad("mig-c", shared, links[2], RANGES[2]),
    )
    (tmp_path / "driver").mkdir()
    driver = DriverProcess(cluster, tmp_path / "driver", defaults=True)
    pools: list[str] = []
    try:
        driver.start()
        cluster.wait("the NRI plugin to connect", lambda: driver.health().get("nriConnected"), 60)
        # under Multus
        cluster.apply_in(
            namespace, workload("StatefulSet", "db", shared), workload("Deployment", "web", shared)
        )
        before = {
            p["metadata"]["name"]: p
            for app in ("db", "web")
            for p in annotated(cluster, namespace, app, 2)
        }
        multus_ips = addresses(list(before.values()))
        assert len(multus_ips) == 12, multus_ips  # 4 pods x 3 networks, none shared

        by_kind = convert(cluster, namespace, shared, tmp_path)
        assert len(by_kind["CNIIPPool"]) == 3
        for pool in by_kind["CNIIPPool"]:
            reserved = {r["pod"] for r in pool["spec"].get("reservations", [])}
            assert reserved == {f"{namespace}/{n}" for n in before}, pool
            pools.append(pool["metadata"]["name"])
        cluster.apply(*by_kind["CNIIPPool"])  # cluster-scoped: the admin's
        cluster.apply_in(namespace, *by_kind["ResourceClaimTemplate"])

        # the Deployment beside the Multus one (a copy under another name)
        [web] = by_kind["Deployment"]
        web["metadata"]["name"] = "web-cnidra"
        web["spec"]["selector"]["matchLabels"]["app"] = "web-cnidra"
        web["spec"]["template"]["metadata"]["labels"]["app"] = "web-cnidra"
        cluster.apply_in(namespace, web)
        beside = annotated(cluster, namespace, "web-cnidra", 2)
        cnidra_ips = addresses(beside)
        assert len(cnidra_ips) == 6 and not cnidra_ips & multus_ips, (cnidra_ips, multus_ips)
        # the annotation says what the pod has
        name = beside[0]["metadata"]["name"]
        shown = {a.split("/")[0] for a in pod_addresses(cluster, namespace, name, "net2")}
        assert shown == interfaces(beside[0])["net2"]

        # the StatefulSet moved: its pods, made again under their names, keep their addresses
        cluster.kubectl(
            "delete", "statefulset", "db", "-n", namespace, "--wait=true", "--timeout=60s",
            timeout=90,
        )  # fmt: skip
        cluster.wait(
            "the Multus StatefulSet's pods to go", lambda: not pods(cluster, namespace, "db"), 60
        )
        [db] = by_kind["StatefulSet"]
        cluster.apply_in(namespace, db)
        moved = {p["metadata"]["name"]: p for p in annotated(cluster, namespace, "db", 2)}
        for name, p in moved.items():
            assert interfaces(p) == interfaces(before[name]), name
        # nothing handed out twice while both ran: the Multus Deployment still runs
        still = addresses(pods(cluster, namespace, "web"))
        assert len(still) == 6 and not still & (addresses(list(moved.values())) | cnidra_ips)
        for p in [*pods(cluster, namespace, "db"), *pods(cluster, namespace, "web-cnidra")]:
            assert restarts(p) == 0, p["metadata"]["name"]
    finally:
        clean_up(cluster, driver, pools, namespace, shared)


def clean_up(
    cluster: Cluster, driver: DriverProcess, pools: list[str], namespace: str, shared: str
) -> None:
    """The workloads and their pods first (Multus' through Multus, while it is still the
    node's CNI), then the driver, its state and the pools."""
    for ns in (namespace, shared):
        cluster.kubectl(
            "delete", "statefulsets,deployments", "--all", "-n", ns, "--wait=true",
            "--timeout=90s", check=False, timeout=120,
        )  # fmt: skip
        cluster.kubectl(
            "delete", "pods", "--all", "-n", ns, "--timeout=90s", check=False, timeout=120
        )
    driver.stop()
    shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)
    for name in pools:
        cluster.kubectl("delete", "cniippool", name, "--ignore-not-found", check=False)
        cluster.kubectl(
            "delete", "cniipblocks", "-l", f"cni.networking.x-k8s.io/pool={name}", check=False
        )
    cluster.kubectl("delete", "namespace", shared, "--wait=false", check=False)
