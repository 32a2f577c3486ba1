"""py-spy flame graphs of a driver process during a measurement (py-spy is not a dependency:
`pip install py-spy`). PYSPY_FORMAT / PYSPY_EXT choose another output (speedscope, raw).

    python -m bench.profile RAW... [--top 25] [--json]

sums raw profiles (PYSPY_FORMAT=raw): the on-CPU samples (those waiting dropped) by part of the
driver, by the innermost frame's library, by the innermost cnidra frame and by leaf."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testbed.harness import DriverProcess


@contextmanager
def profiled(driver: DriverProcess | None, into: Path | None, name: str) -> Iterator[None]:
    """py-spy sampling the driver (all threads, idle included: the hook waits on plugins)."""
    if driver is None or into is None or driver.proc is None:
        yield
        return
    into.mkdir(parents=True, exist_ok=True)
    # the one beside this interpreter (pip install py-spy into .venv), else the PATH's
    beside = Path(sys.executable).with_name("py-spy")
    spy_bin = str(beside) if beside.exists() else shutil.which("py-spy") or "py-spy"
    spy = subprocess.Popen(
        [spy_bin, "record", "--pid", str(driver.proc.pid), "--rate", "250",
         "--format", os.environ.get("PYSPY_FORMAT", "flamegraph"),
         "--output", str(into / f"{name}.{os.environ.get('PYSPY_EXT', 'svg')}")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)


# ----------------------------------------------------------------------------- raw profiles

# innermost frames where a thread waits rather than runs (py-spy's idle detection does not work
# on this kernel, so its raw output has the waits in it): the loop's selector, a pool worker's
# queue, a lock or condition, gRPC's completion queue, a child reaped
IDLE_LEAVES = (
    "select (selectors.py",
    "_worker (concurrent/futures/thread.py",
    "wait (threading.py",
    "_wait_once (grpc/",
    "_serve (grpc/",
    "_poll_connectivity (grpc/",
    "channel_spin (grpc/",
    "_run_once (asyncio/base_events.py",  # only when the select frame itself was folded away
    "waitpid",
    "_bootstrap_inner (threading.py",
    "Thread.run (threading.py",  # a thread whose target is C code, waiting in it
)

# where a sample's CPU is counted: the first of these found walking from the root inwards
# names the part (the task or thread it runs in), the innermost frame's file names the layer
PARTS: tuple[tuple[str, str], ...] = (
    ("NRI: StopPodSandbox (detach, DEL)", "PodHooks.stop_pod_sandbox"),
    ("NRI: RemovePodSandbox", "PodHooks.remove_pod_sandbox"),
    ("NRI: the ADDs behind the sandbox (attach)", "PodHooks._attach"),
    ("NRI: other hooks and the ttrpc mux", "cnidra/nri/plugin.py"),
    ("NRI: ttrpc and mux", "cnidra/nri/ttrpc.py"),
    ("NRI: ttrpc and mux", "cnidra/nri/mux.py"),
    ("status writer: Events", "EventWriter"),
    ("status writer: pod annotation", "PodNetworksWriter"),
    ("status writer: claim status", "ClaimStatusWriter"),
    ("status writer, other", "cnidra/status/writer.py"),
    ("pods watch and claims read ahead", "cnidra/dra/ahead.py"),
    ("prepare and unprepare (DRA gRPC)", "cnidra/dra/"),
    ("network policy watches (cluster-wide pods, ...)", "cnidra/kube/netpolicy.py"),
    ("network policy, other", "cnidra/nri/netpolicy.py"),
    ("network policy, other", "cnidra/datapath/netpolicy.py"),
    ("rate limits (BandwidthKeeper)", "cnidra/nri/bandwidth.py"),
    ("slice publisher, links", "cnidra/inventory/"),
    ("IPAM", "cnidra/ipam/"),
    ("CNINetwork watch", "cnidra/kube/networks.py"),
    ("metrics, health", "cnidra/observe/http.py"),
    ("worker threads: state files, device metadata", "concurrent/futures/thread.py"),
    ("plugin processes: exec and reaping", "asyncio/unix_events.py"),
    ("plugin processes: exec and reaping", "asyncio/base_subprocess.py"),
    ("plugin processes: exec and reaping", "asyncio/subprocess.py"),
    ("TLS reads and aiohttp's parsing (any request's)", "SSLProtocol"),
    ("TLS reads and aiohttp's parsing (any request's)", "aiohttp/"),
    ("gRPC threads", "grpc/"),
    ("cnidra, elsewhere", "cnidra/"),
    ("the event loop itself", "asyncio/"),
)

LOOP_ROOTS = ("cnidra/cli/", "cnidra/__main__")  # the frames under every task of the loop

LAYERS: tuple[tuple[str, str], ...] = (
    ("aiohttp", "aiohttp/"),
    ("yarl, multidict", "yarl/"),
    ("yarl, multidict", "multidict/"),
    ("json", "json/"),
    ("logging", "logging/"),
    ("ssl", "ssl.py"),
    ("asyncio", "asyncio/"),
    ("grpc, protobuf", "grpc"),
    ("grpc, protobuf", "google/protobuf"),
    ("prometheus_client", "prometheus_client/"),
    ("concurrent, threading", "concurrent/"),
    ("concurrent, threading", "threading.py"),
    ("pydantic", "pydantic"),
    ("lightkube", "lightkube/"),
    ("cnidra", "cnidra/"),
)


def _frames(line: str) -> tuple[list[str], int]:
    stack, _, count = line.rstrip("\n").rpartition(" ")
    return stack.split(";"), int(count)


def summarize(paths: list[Path], top: int = 25) -> dict[str, Any]:
    """On-CPU samples of py-spy raw files (`PYSPY_FORMAT=raw`), idle ones dropped, by part, by
    innermost layer, by the innermost cnidra function and by leaf."""
    parts: Counter[str] = Counter()
    layers: Counter[str] = Counter()
    inner: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    idle = total = 0
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            frames, count = _frames(line)
            leaf = frames[-1]
            if any(mark in leaf for mark in IDLE_LEAVES):
                idle += count
                continue
            total += count
            leaves[leaf] += count
            below = [f for f in frames if not any(root in f for root in LOOP_ROOTS)]
            parts[next((p for p, m in PARTS if any(m in f for f in below)), "other")] += count
            layers[next((n for n, m in LAYERS if m in leaf), "other")] += count
            ours = [f for f in frames if "cnidra/" in f]
            inner[ours[-1] if ours else "(no cnidra frame)"] += count

    def share(c: Counter[str]) -> list[tuple[str, int, float]]:
        return [(k, n, round(100 * n / max(total, 1), 1)) for k, n in c.most_common(top)]

    return {
        "samples": total,
        "idle_dropped": idle,
        "by_part": share(parts),
        "by_layer": share(layers),
        "by_innermost_cnidra_frame": share(inner),
        "by_leaf": share(leaves),
    }


def main() -> None:
    import argparse
    import json

    parser = argparse.ArgumentParser(description="sum py-spy raw profiles (idle dropped)")
    parser.add_argument("raw", type=Path, nargs="+")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = summarize(args.raw, args.top)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['samples']} on-CPU samples ({result['idle_dropped']} idle dropped)")
    for view in ("by_part", "by_layer", "by_innermost_cnidra_frame", "by_leaf"):
        print(f"\n{view}:")
        for name, n, pct in result[view]:
            print(f"  {pct:5.1f} %  {n:6d}  {name}")


if __name__ == "__main__":
    main()
