"""Cluster-wide IPAM side by side on the test bed's apiserver: cnidra's (node blocks, creation of
an object is the reservation) and whereabouts (one IPPool per range, one cluster-wide leader
lease per allocation), both as the IPAM of one network, for N simulated nodes x M pods at once.

    python -m bench.ipam [--nodes 10] [--pods 50] [--parallel 10] [--rounds 1] [--json]

Per pod, what the pod's plugin would need before it can set up the interface, exec'd through
cnidra's CNI runtime in a throwaway namespace:

  cnidra       prepare's allocation (`Allocator.assign`, each simulated node with its own
               apiserver client and state directory, and a Node object without a kubelet:
               a node's blocks are owned by its Node), then the `static` IPAM plugin's ADD
               with the addresses it chose
  whereabouts  the whereabouts IPAM plugin's ADD (v0.9.4, built from the Go module proxy by
               hack/install-peers.sh), with the test bed's admin kubeconfig

Each simulated node runs its pods `--parallel` at a time, all nodes at once. Then every pod's
DEL (cnidra: the static DEL, then unprepare's release). Reported per way: allocations per
second over the ADD phase, p50/p99 of one pod's allocation, duplicates (an address held by two
pods at once), leaks (addresses still held after every DEL: whereabouts' IPPool allocations and
OverlappingRangeIPReservations, cnidra's leases on the nodes' disks), and the calls that failed
(a plugin past the runtime's 120 s timeout, an error) with the first one's error: a failure is
counted, the pod's DEL still made, and the run goes on. The two ways alternate round by round.
The last line is one JSON object:

  {"cnidra": {"allocs_per_s", "p50_ms", "p99_ms", "duplicates", "leaks", "failed",
              "failed_deletes", "first_failure"},
   "whereabouts": {the same}, "ratio": cnidra allocs_per_s / whereabouts allocs_per_s}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.driver_latency import pct
from cnidra.api.refs import ObjectRef
from cnidra.cni import CNIRuntime, NetworkConfigList, RuntimeConf, netns
from cnidra.cni.attach import Attachment
from cnidra.ipam.allocator import Allocator
from cnidra.kube.client import make_client
from cnidra.kube.ipam import KubeIPAM
from cnidra.state.checkpoint import PreparedClaim
from cnidra.state.ipam import IPAMState
from cnidra.state.layout import StateLayout
from testbed import cluster as tb
from testbed.harness import ROOT, Cluster

WAYS = ("cnidra", "whereabouts")
RANGES = {"cnidra": "198.18.152.0/22", "whereabouts": "198.18.156.0/22"}


def peer_paths() -> dict[str, str]:
    script = ROOT / "hack" / "install-peers.sh"
    subprocess.run([script], check=True)
    out = subprocess.run([script, "env"], check=True, capture_output=True, text=True).stdout
    found = dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())
    plugins = subprocess.run(
        [ROOT / "hack" / "install-cni.sh", "env"], check=True, capture_output=True, text=True
    ).stdout
    cni = dict(line.removeprefix("export ").split("=", 1) for line in plugins.splitlines())
    return {"whereabouts": found["CNIDRA_PEER_WHEREABOUTS"], "plugins": cni["CNIDRA_TEST_CNI_PATH"]}


def pod_conf(pod: str, index: int, netns_path: str) -> RuntimeConf:
    args = (
        ("IgnoreUnknown", "1"),
        ("K8S_POD_NAMESPACE", "bench"),
        ("K8S_POD_NAME", pod),
        ("K8S_POD_UID", f"uid-{pod}"),
    )
    return RuntimeConf(f"c-{pod}-{index}", netns_path, "net1", args, {})


def ipam_only(name: str, ipam: dict[str, Any]) -> NetworkConfigList:
    """A conflist whose one plugin is the IPAM plugin itself: its ADD allocates and answers,
    touching no namespace, as it would under macvlan."""
    return NetworkConfigList.from_dict(
        {"cniVersion": "1.0.0", "name": name, "plugins": [{"type": ipam["type"], "ipam": ipam}]}
    )


class Way:
    name = ""

    async def add(self, node: int, pod: str) -> str: ...

    async def delete(self, node: int, pod: str) -> None: ...

    def leaks(self) -> int: ...

    async def close(self) -> None:
        return None


def fake_node(name: str) -> dict[str, Any]:
    """A Node object with no kubelet behind it, unschedulable so nothing else lands on it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"cnidra.bench/ipam": "true"}},
        "spec": {"unschedulable": True},
    }


class CnidraWay(Way):
    name = "cnidra"

    def __init__(self, bed: Cluster, runtime: CNIRuntime, work: Path, nodes: int, pod_ns: str):
        self.bed = bed
        self.runtime = runtime
        self.pod_ns = pod_ns
        self.pool = f"bench-{uuid.uuid4().hex[:6]}"
        bed.apply(
            {
                "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                "kind": "CNIIPPool",
                "metadata": {"name": self.pool},
                "spec": {"ranges": [{"subnet": RANGES["cnidra"]}], "blockSize": 16},
            }
        )
        # a node's blocks are owned by its Node object (the garbage collector deletes a lost
        # node's blocks), so each simulated node is a Node, without a kubelet; deleted at close
        self.node_names = [f"{self.pool}-node-{n}" for n in range(nodes)]
        bed.apply(*(fake_node(name) for name in self.node_names))
        kubeconfig = str(tb.Paths.admin_kubeconfig)
        self.clients = [make_client(kubeconfig) for _ in range(nodes)]
        self.states = [IPAMState(StateLayout(work / f"node{n}")) for n in range(nodes)]
        self.nodes = [
            Allocator(self.node_names[n], self.states[n], KubeIPAM(self.clients[n]))
            for n in range(nodes)
        ]
        self.held: dict[str, NetworkConfigList] = {}

    def claim(self, pod: str) -> PreparedClaim:
        ref = ObjectRef("bench", f"claim-{pod}", f"uid-claim-{pod}")
        network = {
            "cniVersion": "1.0.0",
            "name": "bench-net",
            "plugins": [{"type": "static", "ipam": {"type": "cnidra", "pool": self.pool}}],
        }
        att = Attachment(ref, "net", "net1", network, "pool", "dev", network_label="bench-net")
        return PreparedClaim(ref, (f"uid-{pod}",), (att,))

    async def add(self, node: int, pod: str) -> str:
        prepared = await self.nodes[node].assign(self.claim(pod), [pod])
        plugin = prepared.devices[0].network["plugins"][0]
        net = ipam_only("bench-net", plugin["ipam"])
        result = await self.runtime.add(net, pod_conf(pod, node, self.pod_ns))
        self.held[pod] = net
        return str(result.raw["ips"][0]["address"])

    async def delete(self, node: int, pod: str) -> None:
        net = self.held.pop(pod, None)  # None: its ADD failed; its claim is released anyway
        if net is not None:
            await self.runtime.delete(net, pod_conf(pod, node, self.pod_ns))
        await self.nodes[node].release_claim(f"uid-claim-{pod}")

    def leaks(self) -> int:
        return sum(len(s.leases) for s in self.states)

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        self.bed.kubectl("delete", "cniippool", self.pool, "--wait=false", check=False)
        self.bed.kubectl(
            "delete", "cniipblocks", "-l", f"cni.networking.x-k8s.io/pool={self.pool}", check=False
        )
        self.bed.kubectl("delete", "node", *self.node_names, "--wait=false", check=False)


class WhereaboutsWay(Way):
    name = "whereabouts"

    def __init__(self, bed: Cluster, runtime: CNIRuntime, work: Path, pod_ns: str):
        self.bed = bed
        self.runtime = runtime
        self.pod_ns = pod_ns
        flat = work / "whereabouts.conf"
        kubeconfig = str(tb.Paths.admin_kubeconfig)
        flat.write_text(
            json.dumps({"datastore": "kubernetes", "kubernetes": {"kubeconfig": kubeconfig}})
        )
        self.net = ipam_only(
            f"bench-wb-{uuid.uuid4().hex[:6]}",
            {
                "type": "whereabouts",
                "range": RANGES["whereabouts"],
                "configuration_path": str(flat),
                "kubernetes": {"kubeconfig": kubeconfig},
                "log_level": "error",
            },
        )

    async def add(self, node: int, pod: str) -> str:
        result = await self.runtime.add(self.net, pod_conf(pod, node, self.pod_ns))
        return str(result.raw["ips"][0]["address"])

    async def delete(self, node: int, pod: str) -> None:
        await self.runtime.delete(self.net, pod_conf(pod, node, self.pod_ns))

    def leaks(self) -> int:
        pools = json.loads(
            self.bed.kubectl("get", "ippools.whereabouts.cni.cncf.io", "-A", "-o", "json").stdout
        )["items"]
        allocations = sum(
            len(p["spec"].get("allocations") or {})
            for p in pools
            if p["spec"]["range"] == RANGES["whereabouts"]
        )
        reservations = json.loads(
            self.bed.kubectl(
                "get", "overlappingrangeipreservations.whereabouts.cni.cncf.io", "-A", "-o", "json"
            ).stdout
        )["items"]
        return allocations + len(reservations)

    async def close(self) -> None:
        self.bed.kubectl(
            "delete", "ippools.whereabouts.cni.cncf.io", "--all", "-A", "--wait=false", check=False
        )


async def burst(
    nodes: int, pods: int, parallel: int, op: Callable[[int, str], Awaitable[Any]]
) -> tuple[float, list[float], list[Any], list[str]]:
    """Every node's pods, `parallel` at a time per node, all nodes at once: (wall seconds, each
    successful call's seconds, its answer, and what each failed call raised). A failed call (a
    plugin that timed out: whereabouts under this load once held an ADD past the runtime's
    120 s) is part of the measurement, not the end of it."""
    times: list[float] = []
    answers: list[Any] = []
    failures: list[str] = []

    async def node(n: int) -> None:
        gate = asyncio.Semaphore(parallel)

        async def one(p: int) -> None:
            async with gate:
                start = time.perf_counter()
                try:
                    answer = await op(n, f"n{n}-p{p}")
                except Exception as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")
                    return
                answers.append(answer)
                times.append(time.perf_counter() - start)

        await asyncio.gather(*(one(p) for p in range(pods)))

    start = time.perf_counter()
    await asyncio.gather(*(node(n) for n in range(nodes)))
    return time.perf_counter() - start, times, answers, failures


async def measure(way: Way, nodes: int, pods: int, parallel: int) -> dict[str, Any]:
    wall, times, addresses, failed = await burst(nodes, pods, parallel, way.add)
    duplicates = len(addresses) - len(set(addresses))
    _, _, _, failed_deletes = await burst(nodes, pods, parallel, way.delete)
    return {
        "allocs_per_s": round(len(addresses) / wall, 1),
        "p50_ms": round(pct(times, 0.5) * 1000, 1) if times else None,
        "p99_ms": round(pct(times, 0.99) * 1000, 1) if times else None,
        "duplicates": duplicates,
        "leaks": way.leaks(),
        "failed": len(failed),
        "failed_deletes": len(failed_deletes),
        "first_failure": (failed + failed_deletes or [None])[0],
        "wall_s": round(wall, 2),
    }


def install_crds(bed: Cluster, whereabouts: str) -> None:
    bed.kubectl("apply", "-f", str(ROOT / "deploy" / "crds.yaml"))
    for crd in sorted((Path(whereabouts).parent / "crds").glob("*.yaml")):
        bed.kubectl("apply", "-f", str(crd))
    bed.wait(
        "the CRDs to be served",
        lambda: bed.kubectl(
            "get", "cniippools,ippools.whereabouts.cni.cncf.io", "-A", check=False
        ).returncode == 0,
        60,
    )  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    paths = peer_paths()
    cni_path = [str(Path(paths["whereabouts"]).parent), *paths["plugins"].split(":")]
    rounds: dict[str, list[dict[str, Any]]] = {w: [] for w in WAYS}
    with (
        tb.session() as bins,
        tempfile.TemporaryDirectory() as tmp,
        netns.temporary("cnidra-bench-ipam") as pod_ns,
    ):
        bed = Cluster(bins, tb.env_dict())
        install_crds(bed, paths["whereabouts"])
        work = Path(tmp)
        for r in range(args.rounds):
            order = WAYS if r % 2 == 0 else tuple(reversed(WAYS))
            for name in order:
                runtime = CNIRuntime(cni_path, str(work / f"cache-{name}-{r}"), 120.0)
                way: Way = (
                    CnidraWay(bed, runtime, work / f"cnidra-{r}", args.nodes, str(pod_ns))
                    if name == "cnidra"
                    else WhereaboutsWay(bed, runtime, work, str(pod_ns))
                )
                try:
                    result = await measure(way, args.nodes, args.pods, args.parallel)
                finally:
                    await way.close()
                rounds[name].append(result)
                if not args.json:
                    print(f"round {r + 1} {name}: {result}", flush=True)
    out: dict[str, Any] = {}
    for name in WAYS:
        runs = rounds[name]
        timed = [x for x in runs if x["p50_ms"] is not None]
        out[name] = {
            "allocs_per_s": round(statistics.median(x["allocs_per_s"] for x in runs), 1),
            "p50_ms": round(statistics.median(x["p50_ms"] for x in timed), 1) if timed else None,
            "p99_ms": round(statistics.median(x["p99_ms"] for x in timed), 1) if timed else None,
            "duplicates": sum(x["duplicates"] for x in runs),
            "leaks": sum(x["leaks"] for x in runs),
            # calls that failed (ADDs, then DELs), over the rounds, and the first one's error
            "failed": sum(x["failed"] for x in runs),
            "failed_deletes": sum(x["failed_deletes"] for x in runs),
            "first_failure": next((x["first_failure"] for x in runs if x["first_failure"]), None),
        }
    out["ratio"] = round(out["cnidra"]["allocs_per_s"] / out["whereabouts"]["allocs_per_s"], 1)
    out["setup"] = {
        "nodes": args.nodes,
        "pods_per_node": args.pods,
        "parallel_per_node": args.parallel,
        "rounds": args.rounds,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--pods", type=int, default=50, help="pods per simulated node")
    parser.add_argument("--parallel", type=int, default=10, help="pods at once per node")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()
    logging.getLogger("cnidra.cni").setLevel(logging.ERROR)  # whereabouts logs to stderr
    started = time.monotonic()
    result = asyncio.run(run(args))
    setup = result.pop("setup")
    setup["seconds"] = round(time.monotonic() - started, 1)
    if not args.json:
        print(json.dumps(setup))
        print(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
