"""Loaded by Python at start when this directory is on PYTHONPATH (bench.driver_latency
--tracemalloc puts it on the driver's): traces allocations from the start, and on SIGUSR2 takes
a snapshot; the first is the baseline, each later one writes what grew since the baseline, by
source line, to $CNIDRA_BENCH_TRACEMALLOC (text). A benchmark's tool, never the driver's."""

from __future__ import annotations

import gc
import os
import signal
import tracemalloc
from types import FrameType

_OUT = os.environ.get("CNIDRA_BENCH_TRACEMALLOC")
_baseline: list[tracemalloc.Snapshot] = []


def _snapshot(signum: int, frame: FrameType | None) -> None:
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    if not _baseline:
        _baseline.append(snapshot)
        return
    grown = snapshot.compare_to(_baseline[0], "traceback")
    by_file = snapshot.compare_to(_baseline[0], "filename")
    total = sum(s.size_diff for s in grown)
    lines = [f"traced growth since the baseline: {total / 1024 / 1024:.2f} MiB", "", "by file:"]
    lines += [f"{s.size_diff / 1024:9.0f} KiB  {s.traceback[0].filename}" for s in by_file[:40]]
    lines += ["", "by place:"]
    for stat in grown[:50]:
        lines.append(f"{stat.size_diff / 1024:.0f} KiB in {stat.count_diff} blocks")
        lines += ["    " + line for line in stat.traceback.format()]
    assert _OUT is not None
    with open(_OUT, "w") as out:
        out.write("\n".join(lines) + "\n")


if _OUT:
    tracemalloc.start(6)
    signal.signal(signal.SIGUSR2, _snapshot)
