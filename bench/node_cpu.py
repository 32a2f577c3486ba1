"""The CPU a node spends on pods, read from /proc, for bench.pod_ready's "node CPU per pod".

What is counted, for one way's rounds (its single pod and its burst, created and deleted):

- the node's processes, each's user + system time and the user + system time of the children
  it reaped (`utime + stime + cutime + cstime` of /proc/<pid>/stat): containerd (and so every
  CNI plugin containerd execs and waits for: Multus thin, multus-shim, the primary plugin, and
  the plugins Multus thin execs, which Multus reaps before containerd reaps it), kubelet, and
  the way's own daemon (cnidra's driver, with the plugins it execs; Multus' thick daemon, with
  the plugins it execs; dra-example-driver's kubelet plugin);
- containerd's shims (containerd-shim-runc-v2, with the runc calls they reap): a shim is not
  containerd's child once started (it is re-parented to init), so its time is in no process we
  can read after it exits. Each is sampled while it lives (every SHIM_INTERVAL s) and charged
  whole to the way whose rounds saw it start; the time it spends after its last sample (its
  exit, at most one interval) is lost, for every way alike.

What is not: the pods' own processes (pause, the container's `sleep`: the same for every way,
and in the pods' cgroups), processes nobody reaps (an orphan's time is lost to /proc), and the
control plane (kube-apiserver, etcd, the scheduler, the controller-manager), which in a real
cluster runs on other machines: bench.pod_ready reports it beside, as `control_plane`. The
figure for a way is its node CPU per pod minus the `none` way's: what the secondary network
costs the node beyond a pod without one (the idle CPU of kubelet and containerd over the
window is in both and mostly cancels; windows of different lengths leave some of it).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SHIM_INTERVAL = 0.5
NODE_PARTS = ("containerd", "shims", "kubelet", "daemon")
CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager")


def process_cpu_s(pid: int) -> float | None:
    """A process's CPU seconds so far with its reaped children's (utime + stime + cutime +
    cstime), or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the fields after the command, which is in parentheses and may hold spaces
    fields = text.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLOCK_TICKS


class Window:
    """The CPU of named processes between `Window(pids)` and `end()` (a process not running at
    the start, or gone by the end, counts zero: end the window before stopping a daemon)."""

    def __init__(self, pids: Mapping[str, int | None]) -> None:
        self.pids = dict(pids)
        self.start = {name: _cpu(pid) for name, pid in self.pids.items()}

    def end(self) -> dict[str, float]:
        out = {}
        for name, pid in self.pids.items():
            now = _cpu(pid)
            out[name] = max(0.0, now - self.start[name]) if now else 0.0  # gone: unknown
        return out


def _cpu(pid: int | None) -> float:
    return (process_cpu_s(pid) or 0.0) if pid else 0.0


class ShimLedger:
    """Every shim `find()` returns, sampled every `interval` s while it lives, its CPU charged
    to `owner` at the time it was first seen (a shim seen first while `owner` is None, or alive
    when the ledger started, is nobody's)."""

    def __init__(self, find: Callable[[], list[int]], interval: float = SHIM_INTERVAL) -> None:
        self.find = find
        self.interval = interval
        self.owner: str | None = None
        self._owners: dict[int, str | None] = {}
        self._last: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="shim-ledger")

    def start(self) -> None:
        for pid in self.find():  # shims that were there before: nobody's
            self._owners[pid] = None
        self._thread.start()

    def sample(self) -> None:
        with self._lock:
            for pid in self.find():
                if pid not in self._owners:
                    self._owners[pid] = self.owner
                cpu = process_cpu_s(pid)
                if cpu is not None:
                    self._last[pid] = cpu

    def alive(self, way: str) -> int:
        """How many of `way`'s shims are still running."""
        with self._lock:
            return sum(
                1
                for pid, owner in self._owners.items()
                if owner == way and process_cpu_s(pid) is not None
            )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):  # a /proc race: the next sample has it
                self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.sample()

    def charged(self) -> dict[str, float]:
        """CPU seconds of the shims by the way they were charged to."""
        out: dict[str, float] = {}
        with self._lock:
            for pid, owner in self._owners.items():
                if owner is not None:
                    out[owner] = out.get(owner, 0.0) + self._last.get(pid, 0.0)
        return out


@dataclass
class Ledger:
    """CPU seconds by way and part (a process, or "shims") over the ways' rounds, and the
    pods they were for."""

    seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    pods: dict[str, int] = field(default_factory=dict)

    def add(self, way: str, parts: Mapping[str, float], pods: int) -> None:
        mine = self.seconds.setdefault(way, {})
        for part, value in parts.items():
            mine[part] = mine.get(part, 0.0) + value
        self.pods[way] = self.pods.get(way, 0) + pods

    def per_pod(self, parts: tuple[str, ...], baseline: str = "none") -> dict[str, object]:
        """{"ms_per_pod": way -> total ms a pod beyond `baseline`'s, "by_part": way -> part ->
        ms a pod (the baseline not taken off), with "total"}."""
        by_part: dict[str, dict[str, float]] = {}
        for way, seconds in self.seconds.items():
            pods = max(self.pods.get(way, 0), 1)
            row = {part: round(seconds.get(part, 0.0) * 1000 / pods, 2) for part in parts}
            row["total"] = round(sum(seconds.get(p, 0.0) for p in parts) * 1000 / pods, 2)
            by_part[way] = row
        base = by_part.get(baseline, {}).get("total", 0.0)
        beyond = {way: round(row["total"] - base, 2) for way, row in by_part.items()}
        return {"ms_per_pod": beyond, "by_part": by_part}
