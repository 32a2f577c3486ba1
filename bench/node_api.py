"""A pod's networks read through cnidra's node API against the same read through the
apiserver, on the test bed (numbers, one run; not a test).

    python -m bench.node_api [--json] [--reads 500]

node API   QueryPodNetwork over the root-only unix socket (one gRPC channel, as `cnidra node`
           or a node agent keeps it): the pod's attachments with addresses, MAC, state.
apiserver  what a client needs for the same answer there: GET the pod (its
           status.resourceClaimStatuses names the claim), then GET the claim (status.devices),
           with the driver's synchronous client (http.client over HTTPS, a kept-alive
           connection), as an agent would.
The last line is one JSON object: {"reads", "node_api_ms": {p50, p99}, "apiserver_ms": {...}}.

The pod's network (macvlan on a bridge) takes its address from cnidra's cluster IPAM at
prepare, a CNIIPPool of 198.18.250.0/24 made for the run (host-local written by a claim is
refused; bench/pools.py): the reads measured are the same, only the address's source changed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from bench import grpc_stubs as api_grpc
from bench.driver_latency import pct
from bench.pools import in_namespace, ip_pool, pool_name, pool_object
from cnidra._proto.node.v1alpha1 import api_pb2 as api
from cnidra.kube.api import Pod, ResourceClaim
from cnidra.kube.client import make_sync_client
from testbed import cluster as tb
from testbed.harness import Cluster, DriverProcess
from tests.testbed.test_lifecycle import claiming_pod, cni_config, ready, template

SUBNET = "198.18.250.0/24"


def ms(values: list[float]) -> dict[str, float]:
    return {"p50": round(pct(values, 0.5) * 1000, 3), "p99": round(pct(values, 0.99) * 1000, 3)}


def objects(parent: str, pool: str) -> list[dict[str, Any]]:
    """The pod and its claim's template: a macvlan on `parent` with an address of `pool`."""
    conf = cni_config("bench", parent, pool)
    return [template("net", [("net", parent, conf, "net1")]), claiming_pod("p", "net")]


def policy_samples() -> list[dict[str, Any]]:
    """What the run sends, for tests/bench's check against the shipped policy."""
    return [
        pool_object("bench-node-api", SUBNET, ["bench-ns"]),
        *in_namespace("bench-ns", *objects("bn0", "bench-node-api")),
    ]


def measure(bed: Cluster, driver: DriverProcess, namespace: str, reads: int) -> dict[str, object]:
    socket = driver.state_root / "node.sock"
    node_times: list[float] = []
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        client = api_grpc.NodeNetworksStub(channel)
        request = api.QueryPodNetworkRequest(namespace=namespace, name="p")
        for i in range(reads + 20):
            start = time.perf_counter()
            view = client.QueryPodNetwork(request, timeout=5)
            if i >= 20:  # warm-up
                node_times.append(time.perf_counter() - start)
        assert view.attachments[0].ips
    kube = make_sync_client(bed.env["KUBECONFIG"])
    api_times: list[float] = []
    for i in range(reads + 20):
        start = time.perf_counter()
        pod = kube.get(Pod, "p", namespace=namespace)
        [claim_status] = pod["status"].get("resourceClaimStatuses") or []
        claim = kube.get(ResourceClaim, claim_status["resourceClaimName"], namespace=namespace)
        if i >= 20:
            api_times.append(time.perf_counter() - start)
    assert claim["status"]["devices"][0]["networkData"]["ips"]
    return {"reads": reads, "node_api_ms": ms(node_times), "apiserver_ms": ms(api_times)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--reads", type=int, default=500)
    args = parser.parse_args()
    with tb.session() as bins, tempfile.TemporaryDirectory() as tmp:
        bed = Cluster(bins, tb.env_dict())
        bed.install_cnidra_api()  # the CRDs and DeviceClasses, as the chart ships them
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        parent = f"bn{uuid.uuid4().hex[:6]}"
        subprocess.run(["ip", "link", "add", parent, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", parent, "up"], check=True)
        driver = DriverProcess(bed, Path(tmp))
        driver.start()
        try:
            bed.kubectl("create", "namespace", namespace)
            bed.wait("the namespace's ServiceAccount", lambda: bed.kubectl(
                "get", "sa", "default", "-n", namespace, check=False).returncode == 0)  # fmt: skip
            with ip_pool(bed, pool_name("node_api"), SUBNET, [namespace]) as pool:
                bed.apply_in(namespace, *objects(parent, pool))
                ready(bed, namespace, "p")
                bed.wait("the claim status", lambda: "networkData" in bed.kubectl(
                    "get", "resourceclaims", "-n", namespace, "-o", "json").stdout, 30)  # fmt: skip
                result = measure(bed, driver, namespace, args.reads)
                bed.kubectl("delete", "namespace", namespace, "--timeout=120s", check=False,
                            timeout=150)  # fmt: skip
        finally:
            driver.stop()
            subprocess.run(["ip", "link", "del", parent], check=False)
    if not args.json:
        for key in ("node_api_ms", "apiserver_ms"):
            print(f"{key:14} {result[key]}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
