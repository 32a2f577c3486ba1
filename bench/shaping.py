"""What a claim's rate limit (cnidra.datapath.shaping) costs the traffic it holds: CPU and
latency, shaped against the same traffic unshaped, over a veth pair between two namespaces of
its own (tests/datapath/traffic.py; 198.18.44.0/30, nothing leaves them).

    python -m bench.shaping [--seconds 2] [--rate-mbps 200] [--round-trips 2000] [--json]

Four measurements, each unshaped then shaped:

  round trips, idle      64-byte request/response over TCP (TCP_NODELAY), no other traffic;
                         shaped at --rate-mbps: what HTB and the IFB add to a packet's way
  round trips, loaded    the same while a bulk flow from the pod fills the link (unshaped: the
                         veth at full speed; shaped: the limit): the queueing a limit adds
  CPU at one rate        --rate-mbps of TCP for --seconds, each direction: shaped by the limit,
                         unshaped paced by the sender to the same rate; CPU of the whole machine
                         (/proc/stat: user, system, irq, softirq; the IFB runs in softirq) and
                         of this process, in ms per second of traffic
  CPU per GB, unlimited  bulk from the pod, unshaped against a limit above what the veth
                         reaches (100G): the cost of the tree on every byte, in CPU-ms per GB

The machine's CPU counts everything, the IFB's softirq work included, but also whatever else
runs (its load average is in the result): read it on a quiet machine. The process's CPU (both
ends of the traffic, and softirq work the kernel's tick finds it running) is steadier under
load, but at one rate it includes the unshaped sender's own pacing (sleeps and wake-ups the
shaped sender does not make), so it understates the limit's cost there.

The figures of a run on this project's machine, and what they say, are in docs/performance.md
("A claim's rate limit").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from cnidra.api.bandwidth import Rate
from cnidra.datapath import shaping
from cnidra.util.netns import entered
from tests.datapath.traffic import (
    CHUNK,
    PEER_IP,
    POD_IF,
    POD_IP,
    Pair,
    round_trips,
    send,
    veth_pair,
)

M = 1_000_000
UNLIMITED = Rate(100_000 * M, 100_000 * M)  # above anything a veth here reaches


def machine_cpu() -> float:
    """Seconds of CPU the whole machine spent (all CPUs): user, nice, system, irq, softirq."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:8]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields)
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def cpu_meter() -> Iterator[dict[str, float]]:
    out: dict[str, float] = {}
    wall, machine, process = time.monotonic(), machine_cpu(), process_cpu()
    yield out
    out["wall_s"] = time.monotonic() - wall
    out["machine_cpu_s"] = machine_cpu() - machine
    out["process_cpu_s"] = process_cpu() - process


@contextmanager
def limited(pair: Pair, rate: Rate | None) -> Iterator[None]:
    if rate is None:
        yield
        return
    shaping.apply(pair.pod, POD_IF, rate)
    try:
        yield
    finally:
        shaping.remove(pair.pod, POD_IF)


def summary_us(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_us": statistics.median(ordered) * 1e6,
        "p99_us": ordered[max(int(len(ordered) * 0.99) - 1, 0)] * 1e6,
        "count": len(ordered),
    }


def paced_send(src: Path, dst: Path, dst_ip: str, seconds: float, mbps: float) -> float:
    """TCP at `mbps` paced by the sender (64 KiB at a time, never ahead of the rate); the
    payload rate the receiver saw, in Mbit/s."""
    with entered(dst):
        listener = socket.socket()
    with entered(src):
        client = socket.socket()
    received = 0
    with listener, client:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((dst_ip, 5203))
        listener.listen(1)
        client.settimeout(5)
        client.connect((dst_ip, 5203))
        conn, _ = listener.accept()

        def receive() -> None:
            nonlocal received
            conn.settimeout(5)
            with conn:
                while data := conn.recv(CHUNK):
                    received += len(data)

        receiver = threading.Thread(target=receive, daemon=True)
        receiver.start()
        payload = b"\0" * CHUNK
        byte_rate = mbps * M / 8
        start = time.monotonic()
        sent = 0
        while (now := time.monotonic()) < start + seconds:
            ahead = sent / byte_rate - (now - start)
            if ahead > 0:
                time.sleep(ahead)
                continue
            sent += client.send(payload)
        client.shutdown(socket.SHUT_WR)
        receiver.join(10)
    return received * 8 / seconds / M


def loaded_round_trips(pair: Pair, seconds: float) -> list[float]:
    """Round trips from the pod while a bulk flow from the pod fills the link."""
    done = threading.Event()

    def bulk() -> None:
        send(pair.pod, pair.peer, PEER_IP, seconds, port=5204)
        done.set()

    flow = threading.Thread(target=bulk, daemon=True)
    flow.start()
    time.sleep(0.5)  # past slow start: the queue is full
    samples = round_trips(pair.pod, pair.peer, PEER_IP, 100_000, port=5205, until=done)
    flow.join(seconds + 10)
    return samples


def both(
    pair: Pair, rate: Rate, measure: Callable[[Rate | None], dict[str, float]], order: str = "ABBA"
) -> dict[str, dict[str, float]]:
    """`measure` unshaped (A) and shaped (B) in `order`, so that a drift of the machine's load
    hits both alike; each figure the mean of its runs."""
    runs: dict[str, list[dict[str, float]]] = {"unshaped": [], "shaped": []}
    for step in order:
        name, limit = ("unshaped", None) if step == "A" else ("shaped", rate)
        with limited(pair, limit):
            runs[name].append(measure(limit))
    return {
        name: {key: round(statistics.fmean(r[key] for r in done), 1) for key in done[0]}
        for name, done in runs.items()
    }


def run(seconds: float, rate_mbps: int, count: int) -> dict[str, Any]:
    rate = Rate(rate_mbps * M, rate_mbps * M)
    began = time.monotonic()
    result: dict[str, Any] = {
        "rate_mbps": rate_mbps,
        "seconds": seconds,
        "load_average": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    with veth_pair() as pair:

        def idle(_: Rate | None) -> dict[str, float]:
            return summary_us(round_trips(pair.pod, pair.peer, PEER_IP, count))

        result["round_trips_idle"] = both(pair, rate, idle, "ABBAABBAAB")

        def loaded(_: Rate | None) -> dict[str, float]:
            return summary_us(loaded_round_trips(pair, seconds + 0.5))

        result["round_trips_loaded"] = both(pair, rate, loaded, "AB")
        for way, src, dst, ip in (
            ("egress", pair.pod, pair.peer, PEER_IP),
            ("ingress", pair.peer, pair.pod, POD_IP),
        ):

            def at_rate(
                limit: Rate | None, src: Path = src, dst: Path = dst, ip: str = ip
            ) -> dict[str, float]:
                with cpu_meter() as cpu:
                    if limit is None:
                        mbps = paced_send(src, dst, ip, seconds, rate_mbps)
                    else:
                        mbps = send(src, dst, ip, seconds, skip=0.0).mbps
                return {
                    "mbps": mbps,
                    "machine_cpu_ms_per_s": cpu["machine_cpu_s"] / cpu["wall_s"] * 1e3,
                    "process_cpu_ms_per_s": cpu["process_cpu_s"] / cpu["wall_s"] * 1e3,
                }

            result[f"cpu_at_rate_{way}"] = both(pair, rate, at_rate)

        def bulk(_: Rate | None) -> dict[str, float]:
            with cpu_meter() as cpu:
                moved = send(pair.pod, pair.peer, PEER_IP, seconds, skip=0.0)
            gigabytes = moved.total_bytes / 1e9
            return {
                "gbps": moved.total_bytes * 8 / cpu["wall_s"] / 1e9,
                "machine_cpu_ms_per_gb": cpu["machine_cpu_s"] / gigabytes * 1e3,
                "process_cpu_ms_per_gb": cpu["process_cpu_s"] / gigabytes * 1e3,
            }

        result["cpu_per_gb_unlimited"] = both(pair, UNLIMITED, bulk)
    result["wall_s"] = round(time.monotonic() - began, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rate-mbps", type=int, default=200)
    parser.add_argument("--round-trips", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with suppress(KeyboardInterrupt):  # the namespaces go either way (veth_pair)
        result = run(args.seconds, args.rate_mbps, args.round_trips)
        print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
