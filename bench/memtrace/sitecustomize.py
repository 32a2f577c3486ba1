"""Loaded by Python at start when this directory is on PYTHONPATH (bench.driver_latency
--tracemalloc puts it on the driver's). SIGUSR2 takes a snapshot: the first is the baseline,
each later one writes what grew since the baseline to $CNIDRA_BENCH_TRACEMALLOC (text).

$CNIDRA_BENCH_TRACE_FROM says when tracemalloc starts: "start" traces from the interpreter's
start (every allocation's place, but slow enough to change what it measures), "idle" (the
default) only from the baseline on, $CNIDRA_BENCH_TRACE_FRAMES frames deep: the growth's places
at a small cost; 0 frames: no tracemalloc, the report's other parts with the driver untraced.
Beside the traced places the report has what tracemalloc cannot see: the mappings of
/proc/self/smaps whose Rss changed (C extensions' malloc, thread stacks, pymalloc's 1 MiB
arenas, glibc's heap), glibc's malloc totals, the threads, the modules imported since, and the
gc-tracked objects by type. A benchmark's tool, never the driver's."""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
import tempfile
import threading
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

_OUT = os.environ.get("CNIDRA_BENCH_TRACEMALLOC")
_FROM = os.environ.get("CNIDRA_BENCH_TRACE_FROM", "idle")
_FRAMES = int(os.environ.get("CNIDRA_BENCH_TRACE_FRAMES", "2"))
MIB = 1024 * 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def mallinfo() -> dict[str, int]:
    """glibc's totals over all arenas: in use (uordblks + hblkhd, the mmapped blocks), free."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {
        "malloc_in_use": info.uordblks + info.hblkhd,
        "malloc_free": info.fordblks,
        "malloc_mmapped": info.hblkhd,
        "malloc_arena": info.arena,
    }


def mappings() -> dict[tuple[str, str], tuple[int, int, int]]:
    """(start address, path) -> (size, Rss, Anonymous) in bytes, from /proc/self/smaps."""
    out: dict[tuple[str, str], tuple[int, int, int]] = {}
    key: tuple[str, str] | None = None
    size = rss = anon = 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if not head:
                continue
            if not head[0].endswith(":"):
                if key is not None:
                    out[key] = (size, rss, anon)
                start, end = (int(x, 16) for x in head[0].split("-"))
                key = (head[0].split("-")[0], head[5] if len(head) > 5 else "[anon]")
                size, rss, anon = end - start, 0, 0
            elif head[0] == "Rss:":
                rss = int(head[1]) * 1024
            elif head[0] == "Anonymous:":
                anon = int(head[1]) * 1024
    if key is not None:
        out[key] = (size, rss, anon)
    return out


def pymalloc() -> dict[str, int]:
    """pymalloc's own totals (sys._debugmallocstats, which prints them on the C stderr): its
    arenas, the bytes in blocks in use, free in its pools, and lost to their rounding."""
    wanted = {
        "arenas allocated current": "arenas",
        "bytes in allocated blocks": "in_blocks",
        "bytes in available blocks": "free_blocks",
        "bytes lost to pool headers": "pool_headers",
        "bytes lost to quantization": "quantization",
        "bytes lost to arena alignment": "alignment",
    }
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+") as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read()
    found = {}
    for line in text.splitlines():
        name, _, value = line.rpartition("=")
        name = name.strip().removeprefix("# ")
        key = "free_pools" if name.endswith("unused pools * 16384 bytes") else wanted.get(name)
        if key is not None:
            found[key] = int(value.strip().replace(",", ""))
    return found


def status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "Threads"):
                out[name] = int(value.split()[0])
    return out


@dataclass
class State:
    status: dict[str, int]
    maps: dict[tuple[str, str], tuple[int, int, int]]
    malloc: dict[str, int]
    pymalloc: dict[str, int]
    blocks: int
    modules: set[str]
    threads: list[str]
    types: Counter[str]
    snapshot: tracemalloc.Snapshot | None = field(default=None)


def state() -> State:
    gc.collect()
    return State(
        status=status(),
        maps=mappings(),
        malloc=mallinfo(),
        pymalloc=pymalloc(),
        blocks=sys.getallocatedblocks(),
        modules=set(sys.modules),
        threads=[t.name for t in threading.enumerate()],
        types=Counter(type(o).__qualname__ for o in gc.get_objects()),
    )


_baseline: list[State] = []


def report(base: State, now: State) -> list[str]:
    lines = [
        "/proc/self/status, KiB: "
        + ", ".join(f"{k} {base.status.get(k, 0)} -> {v}" for k, v in now.status.items())
    ]
    lines.append(
        "glibc malloc, MiB: "
        + ", ".join(
            f"{k} {base.malloc.get(k, 0) / MIB:.2f} -> {v / MIB:.2f}" for k, v in now.malloc.items()
        )
    )
    lines.append(f"pymalloc blocks allocated: {base.blocks} -> {now.blocks}")
    lines.append(
        "pymalloc, MiB (arenas: a count): "
        + ", ".join(
            f"{k} {base.pymalloc.get(k, 0) / (1 if k == 'arenas' else MIB):.2f} -> "
            f"{v / (1 if k == 'arenas' else MIB):.2f}"
            for k, v in now.pymalloc.items()
        )
    )
    lines.append(f"Python threads: {base.threads} -> {now.threads}")
    new_modules = sorted(now.modules - base.modules)
    lines.append(f"modules imported since the baseline ({len(new_modules)}): {new_modules}")
    grown = []
    for key, (size, rss, anon) in now.maps.items():
        before = base.maps.get(key, (0, 0, 0))
        if rss != before[1]:
            grown.append((rss - before[1], key, size, before[0] == 0, anon - before[2]))
    gone = [(key, v) for key, v in base.maps.items() if key not in now.maps]
    by_path: Counter[str] = Counter()
    for delta, key, *_ in grown:
        by_path[key[1]] += delta
    for key, (_, rss, _) in gone:
        by_path[key[1]] -= rss
    lines += ["", "smaps Rss growth by path, KiB:"]
    lines += [f"{d / 1024:9.0f}  {p}" for p, d in by_path.most_common() if d]
    lines += ["", "smaps mappings whose Rss changed (delta KiB, size KiB, new?, anon delta KiB):"]
    for delta, key, size, new, anon in sorted(grown, reverse=True)[:40]:
        lines.append(
            f"{delta / 1024:9.0f} {size / 1024:9.0f} {'new' if new else '   '}"
            f" {anon / 1024:8.0f}  {key[0]} {key[1]}"
        )
    lines.append(
        f"mappings gone: {len(gone)}, their Rss {sum(v[1] for _, v in gone) / MIB:.2f} MiB"
    )
    types = now.types.copy()
    types.subtract(base.types)
    lines += ["", "gc-tracked objects by type, growth:"]
    lines += [f"{n:9d}  {t}" for t, n in types.most_common(40) if n > 0]
    if now.snapshot is not None:
        lines += traced(now.snapshot, base.snapshot)
    return lines


def traced(snapshot: tracemalloc.Snapshot, base: tracemalloc.Snapshot | None) -> list[str]:
    if base is None:
        grown = [s for s in snapshot.statistics("traceback")]
        by_file = snapshot.statistics("filename")
        total = sum(s.size for s in grown)
        sizes: list[Any] = [(s.size, s.count, s.traceback) for s in grown]
        files = [(s.size, s.traceback[0].filename) for s in by_file]
    else:
        grown_d = snapshot.compare_to(base, "traceback")
        by_file_d = snapshot.compare_to(base, "filename")
        total = sum(s.size_diff for s in grown_d)
        sizes = [(s.size_diff, s.count_diff, s.traceback) for s in grown_d]
        files = [(s.size_diff, s.traceback[0].filename) for s in by_file_d]
    lines = ["", f"traced growth since the baseline: {total / MIB:.2f} MiB", "", "by file:"]
    lines += [f"{size / 1024:9.0f} KiB  {name}" for size, name in files[:40]]
    lines += ["", "by place:"]
    for size, count, tb in sizes[:60]:
        lines.append(f"{size / 1024:.0f} KiB in {count} blocks")
        lines += ["    " + line for line in tb.format()]
    return lines


def _snapshot(signum: int, frame: FrameType | None) -> None:
    if not _baseline:
        base = state()
        if _FROM == "start":
            base.snapshot = tracemalloc.take_snapshot()
        _baseline.append(base)
        if _FROM != "start" and _FRAMES > 0:
            tracemalloc.start(_FRAMES)
        return
    snapshot = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
    tracemalloc.stop()  # its own traces no longer counted in what follows
    now = state()
    now.snapshot = snapshot
    assert _OUT is not None
    with open(_OUT, "w") as out:
        out.write("\n".join(report(_baseline[0], now)) + "\n")


if _OUT:
    if _FROM == "start":
        tracemalloc.start(_FRAMES)
    signal.signal(signal.SIGUSR2, _snapshot)
