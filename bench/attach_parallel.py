"""Is it worth ADDing a pod's independent attachments concurrently? One run, real plugins.

    python -m bench.attach_parallel [--attachments 3] [--rounds 40] [--json]

Each round ADDs then DELs N macvlan + host-local attachments (each on its own parent and
network) into one pod namespace, sequentially and concurrently, alternating; all inside a
throwaway node namespace."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cni_overhead import tool_paths
from cnidra.api.refs import ObjectRef
from cnidra.cni import CNIRuntime, netns
from cnidra.cni.attach import Attachment, attach_all, detach_all


def attachments(count: int, data_dir: str) -> list[Attachment]:
    return [
        Attachment(
            ObjectRef("bench", "claim", "uid"),
            f"r{i}",
            f"net{i + 1}",
            {
                "cniVersion": "1.1.0",
                "name": f"par{i}",
                "plugins": [
                    {
                        "type": "macvlan",
                        "master": f"data{i}",
                        "mode": "bridge",
                        "ipam": {
                            "type": "host-local",
                            "dataDir": data_dir,
                            "ranges": [[{"subnet": f"198.18.{120 + i}.0/24"}]],
                        },
                    }
                ],
            },
            "bench",
            f"data{i}",
        )
        for i in range(count)
    ]


async def measure(plugins: str, count: int, rounds: int) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="cnidra-par-"))
    times: dict[str, list[float]] = {"sequential": [], "concurrent": []}
    with netns.temporary("cnidra-par-node") as node:
        for i in range(count):
            subprocess.run(
                [
                    "ip",
                    "-n",
                    node.name,
                    "link",
                    "add",
                    f"data{i}",
                    "type",
                    "veth",
                    "peer",
                    "name",
                    f"data{i}p",
                ],
                check=True,
            )
            subprocess.run(["ip", "-n", node.name, "link", "set", f"data{i}", "up"], check=True)
        with netns.entered(node), netns.temporary("cnidra-par-pod") as pod:
            runtime = CNIRuntime([plugins], cache_dir=str(scratch / "cache"))
            atts = attachments(count, str(scratch / "ipam"))
            for r in range(rounds + 3):
                for mode in ("sequential", "concurrent"):
                    start = time.perf_counter()
                    await attach_all(
                        runtime, atts, f"c{r}{mode[0]}", str(pod), concurrent=mode == "concurrent"
                    )
                    elapsed = (time.perf_counter() - start) * 1000
                    await detach_all(runtime, atts, f"c{r}{mode[0]}", str(pod))
                    if r >= 3:
                        times[mode].append(elapsed)
    subprocess.run(["rm", "-rf", str(scratch)], check=False)
    seq, par = statistics.median(times["sequential"]), statistics.median(times["concurrent"])
    return {
        "attachments": count,
        "rounds": rounds,
        "sequential_add_ms": round(seq, 1),
        "concurrent_add_ms": round(par, 1),
        "speedup": round(seq / par, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--attachments", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(
        measure(tool_paths()["CNIDRA_TEST_CNI_PATH"], args.attachments, args.rounds)
    )
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
