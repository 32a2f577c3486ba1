"""Does a node's driver grow with claims allocated to other nodes? On the test bed, N
ResourceClaims with devices of cnidra's driver, allocated to nodes that are not this one; then
the driver starts (its RSS and the bytes it received from the apiserver are measured), and
every claim changes once (a label), as claims do in a busy cluster (the bytes received
meanwhile).

    python -m bench.claims_scale --json [--claims 10000] [--source DIR]

`--source` runs the driver from another checkout (e.g. a `git worktree` of an older commit),
to measure before and after in the same way. Takes about 2 minutes for 10,000 claims.
The last line of output is one JSON object.

The claims' network takes its addresses from cnidra's cluster IPAM (`ipam: {type: cnidra,
pool: ...}`, a CNIIPPool of 198.18.16.0/20 made for the run and deleted after it), as a tenant's
must now (host-local written by a claim is refused; bench/pools.py). No claim is prepared here,
so the pool is never asked for an address; a claim's JSON is about 10 bytes shorter than with
the host-local ranges it had before (the pool's name in their place)."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus
from lightkube.types import PatchType

from bench.pools import cnidra_ipam, in_namespace, ip_pool, pool_name, pool_object
from testbed import cluster as tb
from testbed.harness import Cluster, DriverProcess

DRIVER = "cni.dra.networking.x-k8s.io"
IN_FLIGHT = 32
SUBNET = "198.18.16.0/20"


def claim(name: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "net", "exactly": {"deviceClassName": "cni.networking.x-k8s.io"}}
                ],
                "config": [
                    {
                        "requests": ["net"],
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {
                                "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                                "kind": "CNIConfig",
                                "ifName": "net1",
                                "config": {
                                    "cniVersion": "1.1.0",
                                    "name": "elsewhere",
                                    "type": "macvlan",
                                    "master": "eth1",
                                    "ipam": cnidra_ipam(pool),
                                },
                            },
                        },
                    }
                ],
            }
        },
    }


def policy_samples() -> list[dict[str, Any]]:
    """What the run sends, for tests/bench's check against the shipped policy."""
    return [
        pool_object("bench-claims-scale", SUBNET, ["scale-ns"]),
        *in_namespace("scale-ns", claim("c00000", "bench-claims-scale")),
    ]


def allocation(node: str) -> dict[str, Any]:
    return {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "net", "driver": DRIVER, "pool": node, "device": "eth1"}
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            }
        }
    }


async def each(names: list[str], work: Any) -> None:
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def one(name: str) -> None:
        async with slots:
            await work(name)

    await asyncio.gather(*(one(n) for n in names))


async def make_claims(kubeconfig: str, namespace: str, count: int, pool: str) -> list[str]:
    names = [f"c{i:05d}" for i in range(count)]
    client = AsyncClient(config=KubeConfig.from_file(kubeconfig), field_manager="bench")

    async def create(name: str) -> None:
        await client.create(ResourceClaim.from_dict(claim(name, pool)), namespace=namespace)  # type: ignore[arg-type]
        node = f"other-node-{hash(name) % 100}"
        await client.patch(
            ResourceClaimStatus,
            name,
            allocation(node),
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )

    await each(names, create)
    await client.close()
    return names


async def touch_claims(kubeconfig: str, namespace: str, names: list[str]) -> None:
    client = AsyncClient(config=KubeConfig.from_file(kubeconfig), field_manager="bench")

    async def touch(name: str) -> None:
        patch = {"metadata": {"labels": {"touched": "yes"}}}
        await client.patch(
            ResourceClaim, name, patch, namespace=namespace, patch_type=PatchType.MERGE
        )

    await each(names, touch)
    await client.close()


def read_bytes(driver: DriverProcess) -> int:
    """Bytes the driver received from the apiserver over its open connections (ss's TCP
    bytes_received): its list and watch traffic."""
    assert driver.proc is not None
    out = subprocess.run(
        ["ss", "-tinpH", f"dport = :{tb.APISERVER_PORT}"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.splitlines()
    total = 0
    for head, info in zip(out[::2], out[1::2], strict=False):
        if f"pid={driver.proc.pid}," in head:
            match = re.search(r"bytes_received:(\d+)", info)
            total += int(match[1]) if match else 0
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--claims", type=int, default=10_000)
    parser.add_argument("--source", type=Path, help="run the driver from this checkout")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out: dict[str, Any] = {"claims": args.claims}
    with tb.session() as bins, tempfile.TemporaryDirectory() as tmp:
        bed = Cluster(bins, tb.env_dict())
        bed.install_cnidra_api()  # the CRDs and DeviceClasses, as the chart ships them
        kubeconfig = bed.env["KUBECONFIG"]
        namespace = f"scale-{uuid.uuid4().hex[:6]}"
        bed.kubectl("create", "namespace", namespace)
        try:
            with ip_pool(bed, pool_name("claims_scale"), SUBNET, [namespace]) as pool:
                start = time.monotonic()
                names = asyncio.run(make_claims(kubeconfig, namespace, args.claims, pool))
                out["setup_s"] = round(time.monotonic() - start, 1)
                driver = DriverProcess(bed, Path(tmp), source=args.source)
                driver.start()
                try:
                    time.sleep(10)  # a watch-backed cache has listed everything by now
                    out["rss_mib"] = round(driver.rss_kib() / 1024, 1)
                    out["received_at_start_mib"] = round(read_bytes(driver) / 2**20, 2)
                    before = read_bytes(driver)
                    asyncio.run(touch_claims(kubeconfig, namespace, names))
                    time.sleep(5)
                    during = read_bytes(driver) - before
                    out["received_during_churn_mib"] = round(during / 2**20, 2)
                    out["rss_after_churn_mib"] = round(driver.rss_kib() / 1024, 1)
                finally:
                    driver.stop()
        finally:
            bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
