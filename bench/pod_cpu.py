"""The driver's CPU and apiserver requests per pod, in one process, without the test bed (not a
test: numbers).

    python -m bench.pod_cpu [--pods 200] [--fake-plugins] [--multus]
                            [--normal-events added|all|none] [--claim-finalizer on-attach]
                            [--profile top|FILE.prof] [--json]

Each pod goes through the driver itself (cnidra.agent.driver.Driver, tests/fakenode.py):
kubelet's NodePrepareResources for its claim (made from a template: the GET of the claim, the
DeviceClass policy and the claim's CNIConfig validated, the checkpoint, the device metadata and
CDI spec), containerd's RunPodSandbox and CreateContainer NRI hooks (the ADD behind the sandbox,
the write-ahead records), StopPodSandbox and RemovePodSandbox (the DEL), NodeUnprepareResources,
then the claim controller's deallocation and deletion; the status writer runs throughout and is
drained at the end. The apiserver is tests/kube/fakeapi.py, an aiohttp.web application on
loopback in a thread of its own (that thread's CPU, its HTTP included, is subtracted), so the
driver's client work (requests built, answers decoded, plain HTTP on loopback) is measured but
not TLS framing; the plugins are a shell script exec'd by the CNI runtime (the child's CPU is
not the driver's), or in-memory fakes with --fake-plugins.

CPU is time.process_time() (user + system of every thread of this process) over the pods after
a warm-up, less what the fake apiserver spent answering, divided by the pods; requests are what
the fake apiserver was asked (the same labels as the driver's cnidra_apiserver_requests_total).
Between a pod's start and its stop the writer writes what is due (the pod runs a while). What
it leaves out, which the driver in a cluster also pays:
the gRPC and ttrpc transports, the link re-reads of the slice publisher after netlink events,
/metrics scrapes, TLS."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cnidra.util.memory import settle_gc
from tests.fakenode import NAMESPACE, FakeNode, configs
from tests.kube.fakeapi import FakeApiserver, allocated_claim


def policy_samples() -> list[dict[str, Any]]:
    """The claim each pod has (tests/fakenode.py's: a macvlan with no IPAM, an L2 network),
    for tests/bench's check against the shipped policy."""
    return [allocated_claim(NAMESPACE, "p0-dev-x0", "claim-uid-0", "p0", "pod-uid-0", configs())]


async def run(
    pods: int,
    warmup: int,
    fake_plugins: bool,
    profile: cProfile.Profile | None,
    multus: bool = False,
    **settings: Any,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        api = FakeApiserver()
        node = FakeNode(Path(tmp), api, fake_plugins=fake_plugins, **settings)
        async with node.running():
            for i in range(warmup):
                await node.pod(i, multus=multus)
            await node.driver.status.flushed()
            settle_gc()  # as `cnidra driver` does once up
            before = len(api.log)
            cpu, wall, served = time.process_time(), time.perf_counter(), api.cpu
            if profile is not None:
                profile.enable()
            for i in range(warmup, warmup + pods):
                await node.pod(i, multus=multus)
            await node.driver.status.flushed()
            if profile is not None:
                profile.disable()
            # the fake apiserver's own work (answers made, objects copied) is not the driver's
            cpu = time.process_time() - cpu - (api.cpu - served)
            wall = time.perf_counter() - wall
        requests = api.log[before:]
        kinds = Counter(f"{verb} {resource}" for verb, resource, _ in requests)
        return {
            "pods": pods,
            "plugins": "fake" if fake_plugins else "exec",
            "settings": settings,
            "multus": multus,
            "cpu_ms_per_pod": round(cpu * 1000 / pods, 2),
            "wall_ms_per_pod": round(wall * 1000 / pods, 2),
            "apiserver_requests_per_pod": round(len(requests) / pods, 2),
            "apiserver_requests_per_pod_by_kind": {
                k: round(v / pods, 2) for k, v in sorted(kinds.items())
            },
            "claims_left": len(api.claims),
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--fake-plugins", action="store_true")
    parser.add_argument(
        "--profile",
        help="'top' prints the costliest functions; a path ending .prof writes cProfile's stats",
    )
    parser.add_argument("--multus", action="store_true",
                        help="Multus writes each pod's network-status annotation too")  # fmt: skip
    parser.add_argument("--normal-events", choices=("added", "all", "none"),
                        help="the driver's Normal Events (its default: added)")  # fmt: skip
    parser.add_argument("--no-normal-events", action="store_true", help="--normal-events none")
    parser.add_argument("--claim-finalizer", choices=("on-failure", "on-attach"))
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()
    settings: dict[str, Any] = {}
    if args.normal_events or args.no_normal_events:
        settings["normal_events"] = "none" if args.no_normal_events else args.normal_events
    if args.claim_finalizer:
        settings["claim_finalizer"] = args.claim_finalizer
    # CPU time, not wall time: the machine may be busy with other work
    profile = cProfile.Profile(time.process_time) if args.profile else None
    result = asyncio.run(
        run(args.pods, args.warmup, args.fake_plugins, profile, args.multus, **settings)
    )
    if profile is not None:
        if args.profile.endswith(".prof"):
            profile.dump_stats(args.profile)
        else:
            out = io.StringIO()
            stats = pstats.Stats(profile, stream=out).sort_stats("tottime")
            stats.print_stats(25)
            out.write("\n--- by cumulative time\n")
            stats.sort_stats("cumulative").print_stats(45)
            print(out.getvalue())
    if not args.json:
        print(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
